"""Root pytest configuration: choose the Triton backend before test modules define or import kernels.

``import kernels`` sets ``TRITON_INTERPRET=1`` when no CUDA GPU is visible (the interpreter is read when
``@triton.jit`` decorates a function, so this must run before collection).
"""

import kernels  # noqa: F401
