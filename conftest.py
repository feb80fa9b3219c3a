"""Root pytest configuration: the Triton backend and the Hypothesis profiles, before any test module loads.

``import specsample.kernels`` sets ``TRITON_INTERPRET=1`` when no CUDA GPU is visible (the interpreter
is read when ``@triton.jit`` decorates a function, so this must run before collection). The
Hypothesis profiles (`properties.profiles`, chosen by ``HYPOTHESIS_PROFILE``) apply to every test
directory.
"""

import specsample.kernels  # noqa: F401
from specsample.properties.profiles import register_hypothesis_profiles

register_hypothesis_profiles()
# pytester runs the pytest plugin (fuzz/pytest_plugin.py) in a session of its own.
pytest_plugins = ("pytester",)
