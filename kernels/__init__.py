"""Production Triton rejection samplers: jit code in rules.py and *_kernels.py, record layouts in
records.py, a launcher per sampler, a registry.

Importing this package chooses the Triton backend before any kernel module is decorated: without a
CUDA GPU, kernels run on the CPU under the Triton interpreter (``TRITON_INTERPRET=1``), unless the
variable is already set. Under the interpreter it then runs `interpret.install`, so that Triton's
interpreter patches ``triton.language`` once per launch, not on every helper call.
"""

import os

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

from specsample.kernels.interpret import install as _install_fast_interpreter

_install_fast_interpreter()
