"""Hypothesis profiles for the suite, chosen with HYPOTHESIS_PROFILE (default: dev).

- ci: the CPU interpreter in CI; derandomized, no example database, blob printed for replay.
- dev: a developer's CPU run; a local example database under .hypothesis/.
- gpu: larger budgets for a CUDA GPU.
- nightly: long runs.
"""

import os

from hypothesis import HealthCheck, settings

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile(
    "ci", parent=settings.get_profile("ci"), max_examples=25, deadline=None, suppress_health_check=_SLOW_OK
)
settings.register_profile("dev", max_examples=25, deadline=None, suppress_health_check=_SLOW_OK)
settings.register_profile("gpu", max_examples=200, deadline=None, suppress_health_check=_SLOW_OK)
settings.register_profile("nightly", max_examples=2000, deadline=None, suppress_health_check=_SLOW_OK)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
