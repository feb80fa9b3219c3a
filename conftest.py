"""Root pytest configuration: the Triton backend and the Hypothesis profiles, before any test module loads.

``import kernels`` sets ``TRITON_INTERPRET=1`` when no CUDA GPU is visible (the interpreter is read when
``@triton.jit`` decorates a function, so this must run before collection). The Hypothesis profiles
(`properties.profiles`, chosen by ``HYPOTHESIS_PROFILE``) apply to every test directory.
"""

import kernels  # noqa: F401
from properties.profiles import register_hypothesis_profiles

register_hypothesis_profiles()
