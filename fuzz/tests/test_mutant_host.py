"""The mutants' host sampler is correct: it matches the reference on the canonical streams."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz.mutants.base import CanonicalSampler
from properties import strategies
from properties.checks import run_checks
from reference.contract import SpecBatch


@settings(max_examples=30)
@given(
    batch=strategies.spec_batches(max_vocab=300, max_requests=4, max_drafts=5), seed=st.integers(0, 2**31 - 1)
)
def test_host_is_coupled_to_the_reference(batch: SpecBatch, seed: int) -> None:
    """On generated batches (odd values included) the host passes the invariants and coupled agreement."""
    verdicts = run_checks(
        CanonicalSampler(), batch, checks=("invariants", "coupled"), num_samples=50, seed=seed
    )
    assert {v.check for v in verdicts} == {"invariants", "coupled"}
    failed = [v.message for v in verdicts if not v.passed]
    assert not failed, failed
