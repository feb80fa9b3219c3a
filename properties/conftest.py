"""The gpu marker: tests marked ``gpu`` skip without a CUDA GPU, saying so.

The Hypothesis profiles (`properties.profiles`, chosen with ``HYPOTHESIS_PROFILE``) are registered by
the root ``conftest.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specsample.properties.suite import cuda_available

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this directory's gpu-marked tests when no CUDA GPU is present."""
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords and _HERE in Path(str(item.fspath)).parents:
            item.add_marker(skip)
