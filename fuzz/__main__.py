"""Entry point of ``python -m fuzz``."""

import specsample.kernels  # noqa: F401  (chooses the Triton backend before any kernel module is imported)
from specsample.fuzz.cli import main

raise SystemExit(main())
