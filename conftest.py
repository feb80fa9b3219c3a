"""Root pytest configuration: choose the Triton backend before any kernel module is imported.

The Triton interpreter is read when ``@triton.jit`` decorates a function, so it must be set here,
before test collection imports ``kernels``. Without a CUDA GPU the kernels run on the CPU under the
interpreter; with one, they run on the GPU unless ``TRITON_INTERPRET`` is already set.
"""

import os

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
