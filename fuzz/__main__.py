"""Entry point of ``python -m fuzz``."""

import kernels  # noqa: F401  (chooses the Triton backend before any kernel module is imported)
from fuzz.cli import main

raise SystemExit(main())
