"""Hypothesis profiles for the suite, chosen with HYPOTHESIS_PROFILE (default: dev), and the gpu marker.

- ci: the CPU interpreter in CI (tox sets it); derandomized, no example database, blob printed for
  replay, small sample budgets (`properties.suite.BUDGETS`).
- dev: a developer's CPU run; random, a local example database under .hypothesis/, blob printed.
- gpu: a CUDA GPU; 100 examples per property (25 for the variant tests, whose examples draw
  thousands of trials each), 20,000 trials per request, 256K-token vocabularies.
- nightly: a long GPU run; 1,000 examples per property (250), 100,000 trials per request.

Tests marked ``gpu`` skip without a CUDA GPU, saying so.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from properties.suite import cuda_available

# Generating vocab-sized batches is slow by Hypothesis's measure, and rightly so.
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile(
    "ci",
    parent=settings.get_profile("ci"),
    max_examples=25,
    deadline=None,
    suppress_health_check=_SLOW_OK,
)
settings.register_profile(
    "dev", max_examples=25, deadline=None, print_blob=True, suppress_health_check=_SLOW_OK
)
settings.register_profile(
    "gpu", max_examples=100, deadline=None, print_blob=True, suppress_health_check=_SLOW_OK
)
settings.register_profile(
    "nightly", max_examples=1000, deadline=None, print_blob=True, suppress_health_check=_SLOW_OK
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this directory's gpu-marked tests when no CUDA GPU is present."""
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords and _HERE in Path(str(item.fspath)).parents:
            item.add_marker(skip)
