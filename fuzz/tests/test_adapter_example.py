"""The README's adapter example: a foreign-API sampler plugged in through one class passes the checks."""

from __future__ import annotations

from examples.engine_adapter import EngineAdapter
from fuzz.spec import load_variant
from fuzz.targeted import targeted_batches
from properties.checks import run_checks


def test_adapter_loads_by_file_spec_and_passes_the_checks() -> None:
    """The adapter resolves from its file spec and passes every check on the flat probabilistic case."""
    variant = load_variant("examples/engine_adapter.py:EngineAdapter")
    assert variant.name == EngineAdapter.name
    batch = dict(targeted_batches(("probabilistic",)))["probabilistic"]
    verdicts = run_checks(variant, batch, num_samples=2000, seed=1)
    assert {v.check for v in verdicts} >= {"invariants", "law_of_m", "law_of_y", "marginal"}
    failed = [v.message for v in verdicts if not v.passed]
    assert not failed, failed
