"""`properties.checks` on its own: the verdict API, replay from a seed, and planted bugs it kills."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

from specsample.properties.batching import select_requests
from specsample.properties.checks import (
    CHECKS,
    FAILED_EXACT_DISCREPANCY,
    Deviation,
    Verdict,
    check,
    compare_variants,
    discrepancy,
    run_checks,
)
from specsample.properties.checks.coupled import Coupled
from specsample.reference.contract import RequestData, SpecBatch, SpecOutput, make_batch
from specsample.reference.methods import Method
from specsample.reference.schemes import CANONICAL, Noise, RandomScheme
from specsample.reference.walk import BatchRows, F64Array, I64Array, WalkSampler

# Each statistical verdict below has alpha 1e-6 (Holm-split across its tests); at N = 2000 trials the
# law-of-m check detects a shift of about 0.07 in any P(m = j) and the law-of-y check a total
# variation of about 0.12 on the joint law of (m, y), both with power 0.999 (the verdicts say so).
ALPHA = 1e-6
NUM_SAMPLES = 2000


class Planted:
    """A sampler with a planted bug, built from the reference by changing its inputs or its noise."""

    def __init__(
        self, name: str, sample: Callable[[SpecBatch], SpecOutput], streams: RandomScheme | None
    ) -> None:
        self.name = name
        self.streams = streams
        self._sample = sample

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample ``batch`` with the bug."""
        return self._sample(batch)


def _batch(method: str = "probabilistic", slots: bool = False) -> SpecBatch:
    """Two requests with draft logits, one greedy row mixed in, ragged counts."""
    rng = np.random.default_rng(7)
    vocab_size = 24
    requests = [
        RequestData(
            rng.normal(size=(4, vocab_size)) * 1.5, [1, 2, 3], rng.normal(size=(3, vocab_size)) * 1.5, 1.0
        ),
        RequestData(rng.normal(size=(3, vocab_size)), [4, -1], rng.normal(size=(2, vocab_size)), 0.7, step=5),
        RequestData(rng.normal(size=(2, vocab_size)), [0], rng.normal(size=(1, vocab_size)), 0.0),
    ]
    return make_batch(
        requests,
        method=method,
        synthetic_rates=[0.8, 0.5, 0.4],
        slots=[2, 0, 3] if slots else None,
        num_slots=4,
    )


class ZeroUniform(WalkSampler):
    """M02 (vllm-ascend #13730): the acceptance uniform is always 0, so every draft with p > 0 is accepted."""

    def accept_uniforms(self, seed: I64Array, step: I64Array, position: int) -> F64Array:
        return np.zeros(seed.shape)


class UnclampedResidual(WalkSampler):
    """M03: ``p - q`` used without ``max(., 0)``, normalised by the mass of its positive part."""

    def rejection_token(
        self, method: Method, p: F64Array, q: F64Array, ids: I64Array, noise: Noise, u: F64Array
    ) -> I64Array:
        residual = p - q
        mass = np.maximum(residual, 0.0).sum(axis=-1, keepdims=True)
        # Negative weights make log() NaN, as they would in a kernel; argmax then takes the first NaN.
        with np.errstate(invalid="ignore"):
            return self.sample(np.where(mass > 0, residual / np.maximum(mass, 1e-300), p), noise)


class FirstSeedOnly(WalkSampler):
    """M18 (FlashInfer #4861): every request uses ``seed[0]``."""

    def read(self, batch: SpecBatch) -> BatchRows:
        rows = super().read(batch)
        return dataclasses.replace(rows, seed=np.full_like(rows.seed, rows.seed[0]))


class GreedySampled(WalkSampler):
    """M14 (early MRV2): greedy rows sent through the sampling path at temperature 1."""

    def read(self, batch: SpecBatch) -> BatchRows:
        rows = super().read(batch)
        return dataclasses.replace(rows, temperature=np.where(rows.temperature == 0, 1.0, rows.temperature))


class SharedUniform(WalkSampler):
    """M10 (MRV2 block mode): one acceptance uniform shared by every position of a request."""

    def accept_uniforms(self, seed: I64Array, step: I64Array, position: int) -> F64Array:
        return super().accept_uniforms(seed, step, 0)


def _blind(sampler: WalkSampler) -> Planted:
    """The sampler presented as foreign: no scheme, so no coupled check."""
    return Planted(sampler.name, sampler, None)


# ---------------------------------------------------------------------------------------------
# The API


def test_run_checks_returns_one_verdict_per_applicable_check_in_order() -> None:
    """A canonical variant gets all seven checks in order; others lose coupled, synthetic batches marginal."""
    batch = _batch()
    verdicts = run_checks(WalkSampler(), batch, num_samples=200, seed=1)
    assert [v.check for v in verdicts] == list(CHECKS)
    assert all(isinstance(v, Verdict) and v.passed and v.variant == "walk" for v in verdicts)
    foreign = _blind(WalkSampler())
    assert "coupled" not in [v.check for v in run_checks(foreign, batch, num_samples=200, seed=1)]
    assert check("coupled", foreign, batch, num_samples=10) is None
    synthetic = run_checks(WalkSampler(), _batch("synthetic"), num_samples=200, seed=1)
    assert "marginal" not in [v.check for v in synthetic]
    assert check("marginal", WalkSampler(), _batch("synthetic"), num_samples=10) is None
    with pytest.raises(ValueError, match="checks"):
        run_checks(WalkSampler(), batch, checks=("invariants", "speed"))


def test_verdicts_state_their_numbers() -> None:
    """Statistical verdicts carry alpha, p-value, statistic and detectable deviation; exact ones a rate."""
    by_check = {v.check: v for v in run_checks(WalkSampler(), _batch(), num_samples=NUM_SAMPLES, seed=2)}
    units = {"law_of_m": "probability", "law_of_y": "total variation", "marginal": "total variation"}
    for name, unit in units.items():
        v = by_check[name]
        assert v.alpha == ALPHA and v.pvalue is not None and 0 <= v.pvalue <= 1 and v.statistic is not None
        assert v.detectable is not None and 0 < v.detectable.value < 0.2, (name, v.detectable)
        assert v.detectable.unit == unit and unit in v.message
        assert v.num_samples == 3 * NUM_SAMPLES and v.seconds >= 0 and "alpha=1e-06" in v.message
    for name in ("invariants", "coupled", "composition", "determinism"):
        v = by_check[name]
        assert v.pvalue is None and v.detectable is not None and 0 < v.detectable.value < 1
        assert v.detectable.unit == "rate per sample"


def test_the_seed_replays_every_verdict() -> None:
    """The same seed gives the same verdicts (time aside); another seed draws other trials."""
    batch = _batch("strict", slots=True)

    def strip(verdicts: list[Verdict]) -> list[Verdict]:
        return [dataclasses.replace(v, seconds=0.0) for v in verdicts]

    first = strip(run_checks(WalkSampler(), batch, num_samples=300, seed=11))
    assert strip(run_checks(WalkSampler(), batch, num_samples=300, seed=11)) == first
    other = strip(run_checks(WalkSampler(), batch, num_samples=300, seed=12))
    assert [v.statistic for v in other] != [v.statistic for v in first]


def test_discrepancy_grows_with_the_evidence() -> None:
    """discrepancy is -log10 of the Bonferroni-adjusted smallest p-value, 1000 for a failed exact
    check, 0 for nothing."""
    base = Verdict(
        check="law_of_m",
        status="pass",
        variant="v",
        message="",
        num_samples=10,
        seconds=0.0,
        statistic=1.0,
        pvalue=0.01,
        alpha=ALPHA,
        detectable=Deviation(0.1, "probability"),
    )
    assert discrepancy([]) == 0.0
    assert discrepancy([base]) == pytest.approx(2.0)
    assert discrepancy([base, dataclasses.replace(base, pvalue=0.0)]) == pytest.approx(300.0)
    # Two p-values of 0.01: the smallest counts twice (Bonferroni), so the score is comparable
    # across batches with different numbers of statistical checks.
    assert discrepancy([base, base]) == pytest.approx(-math.log10(0.02))
    assert discrepancy([dataclasses.replace(base, pvalue=0.9)] * 3) == 0.0
    failed = dataclasses.replace(base, check="invariants", status="fail", pvalue=None)
    assert discrepancy([base, failed]) == FAILED_EXACT_DISCREPANCY


def test_a_variant_that_raises_fails_every_check() -> None:
    """An exception from the variant on a valid batch is a failed verdict naming it, not a crash."""

    def broken(batch: SpecBatch) -> SpecOutput:
        raise RuntimeError("kernel launch failed")

    verdicts = run_checks(Planted("broken", broken, CANONICAL), _batch(), num_samples=20)
    assert [v.check for v in verdicts] == list(CHECKS)  # in the registry's order
    assert all(not v.passed and "kernel launch failed" in v.message for v in verdicts)


def test_a_malformed_output_breaks_the_invariants() -> None:
    """An int32 token tensor breaks the output contract, and the invariants say so."""

    def int32_tokens(batch: SpecBatch) -> SpecOutput:
        output = WalkSampler()(batch)
        return dataclasses.replace(output, token_ids=output.token_ids.to(torch.int32))

    verdict = check("invariants", Planted("int32", int32_tokens, CANONICAL), _batch(), num_samples=20)
    assert verdict is not None and not verdict.passed and "token_ids" in verdict.message


def test_coupled_replays_a_bounded_share_of_large_batches() -> None:
    """Coupling replays only the first trials of each request once the logits pass max_elements, and
    the trials' last replica."""
    batch = _batch()
    verdict = Coupled(max_elements=3 * 24 * 4 * 10).run(WalkSampler(), batch, num_samples=100, seed=1)
    assert verdict.passed and verdict.num_samples == 3 * 10 + 1, verdict.message


def _last_request_off(batch: SpecBatch) -> SpecOutput:
    """The walk, but the last request of every call emits what the walk gives it at step + 1: a bug on
    the batch's bound (a kernel reading the last draft id as a placeholder, say)."""
    output = WalkSampler()(batch)
    last = batch.num_requests - 1
    step = batch.step.detach().cpu().numpy()[last:] + 1
    moved = WalkSampler()(select_requests(batch, [last], step=step))
    width = moved.token_ids.shape[1]
    output.token_ids[last] = -1
    output.token_ids[last, :width] = moved.token_ids[0]
    output.num_emitted[last] = moved.num_emitted[0]
    if output.logprobs is not None and moved.logprobs is not None:
        output.logprobs[last] = float("nan")
        output.logprobs[last, :width] = moved.logprobs[0]
    return output


def test_coupled_compares_the_trials_last_replica() -> None:
    """A bug on the last request of a call touches one replica of the trials, the last: coupling
    compares it besides the first trials of each request (a fixed seed: the bug shows there)."""
    batch = select_requests(_batch(), [2, 0, 1])  # the greedy request first, a sampled one last
    bug = Planted("last request off", _last_request_off, CANONICAL)
    limit = 3 * 24 * 4 * 10  # the first 10 trials of each request
    verdict = Coupled(max_elements=limit).run(bug, batch, num_samples=40, seed=2)
    assert not verdict.passed and verdict.statistic == 1, verdict.message
    assert verdict.num_samples == 3 * 10 + 1
    assert "its trial 39" in str(verdict.subject), verdict.subject
    assert Coupled(max_elements=limit).run(WalkSampler(), batch, num_samples=40, seed=2).passed


# ---------------------------------------------------------------------------------------------
# Planted bugs the checks kill


def test_law_of_m_kills_a_zero_uniform() -> None:
    """M02 (vllm-ascend #13730): with u = 0 every draft is accepted; the law of m and coupling reject it."""
    batch = _batch()
    verdict = check("law_of_m", _blind(ZeroUniform()), batch, num_samples=500, alpha=ALPHA, seed=3)
    assert verdict is not None and not verdict.passed, verdict
    assert verdict.pvalue is not None and verdict.pvalue < ALPHA, verdict.message
    coupled = check("coupled", ZeroUniform(), batch, num_samples=100, seed=3)
    assert coupled is not None and not coupled.passed, coupled.message
    correct = check("law_of_m", WalkSampler(), batch, num_samples=NUM_SAMPLES, alpha=ALPHA, seed=3)
    assert correct is not None and correct.passed


def test_law_of_y_kills_an_unclamped_residual() -> None:
    """M03: a residual p - q without max(., 0) puts mass where p < q; law of y and marginal reject it."""
    batch = _batch()
    planted = _blind(UnclampedResidual())
    verdict = check("law_of_y", planted, batch, num_samples=500, alpha=ALPHA, seed=4)
    assert verdict is not None and not verdict.passed, verdict
    assert verdict.pvalue is not None and verdict.pvalue < ALPHA, verdict.message
    marginal = check("marginal", planted, batch, num_samples=500, alpha=ALPHA, seed=4)
    assert marginal is not None and not marginal.passed, marginal.message


def test_composition_kills_a_batch_level_seed() -> None:
    """M18 (FlashInfer #4861): every request drawing from seed[0] changes with its neighbours."""
    verdict = check("composition", FirstSeedOnly(), _batch(slots=True), seed=5)
    assert verdict is not None and not verdict.passed and "shuffled" in verdict.message, verdict
    correct = check("composition", WalkSampler(), _batch(slots=True), seed=5)
    assert correct is not None and correct.passed


def test_invariants_kill_greedy_rows_on_the_sampling_path() -> None:
    """M14 (early MRV2): a greedy row sampled at temperature 1 leaves its argmax chain."""
    verdict = check("invariants", GreedySampled(), _batch(), num_samples=200, seed=6)
    assert verdict is not None and not verdict.passed, verdict
    assert "greedy" in verdict.message and verdict.request == 2, verdict.message


def test_two_variants_are_told_apart_without_the_exact_law() -> None:
    """The two-sample comparison accepts two correct variants and rejects an unclamped residual (M03)."""
    batch = _batch()
    same = compare_variants(WalkSampler(), _blind(WalkSampler()), batch, num_samples=800)
    assert same.passed and same.detectable is not None and same.detectable.unit == "total variation", same
    differ = compare_variants(WalkSampler(), _blind(UnclampedResidual()), batch, num_samples=800, seed=1)
    assert not differ.passed, differ.message


def test_law_of_m_kills_a_uniform_shared_across_positions() -> None:
    """M10 (MRV2 block mode): one uniform for all positions couples acceptances; the law of m rejects it."""
    rng = np.random.default_rng(8)
    vocab_size = 16
    target = rng.normal(size=(4, vocab_size))
    draft = target[:3].copy()
    ids = [1, 5, 9]
    for i, d in enumerate(ids):
        p = np.exp(target[i, d]) / np.exp(target[i]).sum()
        draft[i, d] += np.log(2 * (1 - p) / (1 - 2 * p))  # q(d) = 2 p(d): every a_i = 1/2
    batch = make_batch([RequestData(target, ids, draft, 1.0, seed=1)])
    verdict = check("law_of_m", _blind(SharedUniform()), batch, num_samples=NUM_SAMPLES, alpha=ALPHA, seed=9)
    assert verdict is not None and not verdict.passed, verdict


def test_a_starved_check_is_inconclusive_never_passed() -> None:
    """With fewer trials than the profile's power needs, a clean verdict says inconclusive and why."""
    batch = _batch()
    by_check = {
        v.check: v for v in run_checks(WalkSampler(), batch, num_samples=40, required_samples=2000, seed=3)
    }
    for name in ("invariants", "law_of_m", "law_of_y", "marginal"):
        verdict = by_check[name]
        assert verdict.status == "inconclusive" and not verdict.passed and not verdict.failed, verdict
        assert verdict.trials == 40 and "needs 2000" in verdict.message, verdict.message
    # The exact invariance checks run a fixed handful of trials by design; the coupled replay its cap.
    assert all(by_check[name].passed for name in ("coupled", "composition", "determinism"))
    starved_bug = check(
        "law_of_m", _blind(ZeroUniform()), batch, num_samples=300, required_samples=2000, seed=3
    )
    assert starved_bug is not None and starved_bug.failed, starved_bug


def test_a_check_that_could_detect_nothing_is_not_a_pass() -> None:
    """A statistical verdict whose detectable deviation is infinite is inconclusive."""
    # A bonus-only request over three tokens, all possible: one trial pools them into one cell.
    batch = make_batch([RequestData(np.zeros((1, 3)), [], None, 1.0)])
    verdict = check("law_of_y", WalkSampler(), batch, num_samples=1, required_samples=1, seed=1)
    assert verdict is not None and verdict.status == "inconclusive", verdict
    assert verdict.detectable is not None and verdict.detectable.value == float("inf")


def test_a_small_memory_budget_gives_the_same_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls cut to a few requests each (as a nearly full device would force) give identical verdicts."""
    import specsample.properties.checks.base as base

    batch = _batch(slots=True)

    def strip(verdicts: list[Verdict]) -> list[Verdict]:
        return [dataclasses.replace(v, seconds=0.0) for v in verdicts]

    whole = strip(run_checks(WalkSampler(), batch, num_samples=300, seed=21))
    budget = 12 * batch.vocab_size  # twelve rows of logits per call, as a nearly full device would allow
    monkeypatch.setattr(base, "DEFAULT_MAX_ELEMENTS", budget)
    gathered = []
    sampler = WalkSampler()
    counting = Planted(
        "walk", lambda b: gathered.append(b.target_logits.numel()) or sampler(b), sampler.streams
    )
    assert strip(run_checks(counting, batch, num_samples=300, seed=21)) == whole
    assert max(gathered) <= budget and len(gathered) > 300
