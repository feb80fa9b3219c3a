"""One law per batch: `run_checks` computes a batch's exact law once, and every check shares it."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

import specsample.reference.law as law
from specsample.properties.checks import CHECKS, CheckedBatch, Verdict, run_checks
from specsample.reference.contract import METHODS, RequestData, SpecBatch, make_batch
from specsample.reference.walk import WalkSampler

# The checks that read the exact law; the others never compute it.
LAW_READERS = ("invariants", "law_of_m", "law_of_y", "marginal", "steps")


def _batch(method: str) -> SpecBatch:
    """Three requests with draft logits and ragged counts, a placeholder and a greedy row among them."""
    rng = np.random.default_rng(3)
    vocab_size = 12
    requests = [
        RequestData(rng.normal(size=(4, vocab_size)), [1, 2, 3], rng.normal(size=(3, vocab_size)), 1.0),
        RequestData(rng.normal(size=(3, vocab_size)), [4, -1], rng.normal(size=(2, vocab_size)), 0.7, step=5),
        RequestData(rng.normal(size=(2, vocab_size)), [0], rng.normal(size=(1, vocab_size)), 0.0),
    ]
    if method == "tree":  # a bushy tree, a star of two, a lone node
        shapes = ([-1, -1, 0], [-1, -1], [-1])
        requests = [dataclasses.replace(r, tree_parent=p) for r, p in zip(requests, shapes, strict=True)]
    return make_batch(requests, method=method, synthetic_rates=[0.8, 0.5, 0.4])  # type: ignore[arg-type]


def _count_request_laws(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that grows by one for every request law computed from now on (`reference.law.exact_law`
    computes a batch's law request by request with `reference.law.request_law`)."""
    computed: list[str] = []
    request_law = law.request_law

    def counting(method: str, *args: Any, **kwargs: Any) -> law.RequestLaw:
        computed.append(method)
        return request_law(method, *args, **kwargs)

    monkeypatch.setattr(law, "request_law", counting)
    return computed


@pytest.mark.parametrize("method", METHODS)
def test_run_checks_computes_each_request_law_once(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One run_checks call computes the exact law of each request once, however many checks read it."""
    batch = _batch(method)
    computed = _count_request_laws(monkeypatch)
    verdicts = run_checks(WalkSampler(), batch, num_samples=50, seed=1)
    readers = [v.check for v in verdicts if v.check in LAW_READERS]
    assert len(readers) >= 4, readers  # the law is shared between checks, not skipped
    assert len(computed) == batch.num_requests, f"{len(computed)} request laws for {readers}"


def test_checks_that_never_read_the_law_leave_it_uncomputed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The coupled and invariance checks run without computing any exact law."""
    computed = _count_request_laws(monkeypatch)
    checks = ("coupled", "composition", "determinism")
    verdicts = run_checks(WalkSampler(), _batch("probabilistic"), checks=checks, num_samples=20, seed=1)
    assert [v.check for v in verdicts] == list(checks) and computed == []


def test_a_shared_law_gives_the_verdicts_of_checks_run_alone() -> None:
    """Every check reading the shared law returns the verdict it returns run on its own (time aside)."""
    batch = _batch("probabilistic")

    def strip(verdict: Verdict) -> Verdict:
        return dataclasses.replace(verdict, seconds=0.0)

    shared = run_checks(WalkSampler(), batch, checks=LAW_READERS, num_samples=100, seed=3)
    alone = [CHECKS[v.check].run(WalkSampler(), batch, num_samples=100, seed=3) for v in shared]
    assert [strip(v) for v in shared] == [strip(v) for v in alone]
    checked = CheckedBatch(batch)
    assert strip(CHECKS["law_of_y"].run(WalkSampler(), checked, num_samples=100, seed=3)) == strip(alone[2])
    assert checked.laws is checked.laws and len(checked.laws) == batch.num_requests


def test_a_law_in_another_arithmetic_is_refused() -> None:
    """A check handed a batch whose law is in another arithmetic than the variant's raises a ValueError."""
    checked = CheckedBatch(_batch("probabilistic"), "fp32-probs")
    with pytest.raises(ValueError, match="arithmetic 'fp32-probs'"):
        CHECKS["law_of_m"].run(WalkSampler(), checked, num_samples=10)
