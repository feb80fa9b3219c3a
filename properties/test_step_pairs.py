"""`properties.checks.step_pairs`: outputs at adjacent steps of a seed are independent; level and power."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from specsample.properties import stats
from specsample.properties.checks import CHECKS, run_checks
from specsample.properties.checks.base import CheckedBatch, Settings
from specsample.properties.checks.step_pairs import (
    Coarse,
    PairedTrials,
    adjacent_steps,
    collision_pvalue,
    components,
    pair_fit,
)
from specsample.reference.contract import MAX_STEP, RequestData, SpecBatch, SpecOutput, make_batch
from specsample.reference.law import RequestInputs, exact_law, request_inputs
from specsample.reference.schemes import CANONICAL, MRV2, Noise
from specsample.reference.walk import WalkSampler

CHECK = CHECKS["step_pairs"]
ALPHA = 1e-6
CALIBRATION_SEEDS = 200
CALIBRATION_TRIALS = 300
POWER_RUNS = 60
POWER_TRIALS = 1000
# At power 0.999 a planted deviation is missed 0.06 times in 60 runs on average; 4 or more misses
# happen with probability 4.9e-7 < 1e-6 / 2.
MAX_POWER_MISSES = 3


def _batch(method: str = "probabilistic", step: int = 7) -> SpecBatch:
    """Three ragged requests (a placeholder among the drafts, a greedy one), 12 tokens."""
    rng = np.random.default_rng(5)
    vocab_size = 12
    requests = [
        RequestData(
            rng.normal(size=(4, vocab_size)), [1, 2, 3], rng.normal(size=(3, vocab_size)), 1.0, step=step
        ),
        RequestData(rng.normal(size=(3, vocab_size)) * 2, [4, -1], rng.normal(size=(2, vocab_size)), 0.7),
        RequestData(rng.normal(size=(2, vocab_size)), [5], rng.normal(size=(1, vocab_size)), 0.0),
    ]
    return make_batch(requests, method=method, synthetic_rates=[0.8, 0.6, 0.4])  # type: ignore[arg-type]


def _repeated_rows(method: str = "probabilistic") -> SpecBatch:
    """Two requests whose positions share one target row and one draft row: two tokens carry most of
    each, the target favouring one and the draft the other, so a draft of the draft's favourite is
    accepted about half the time."""
    rng = np.random.default_rng(8)
    vocab_size, a, b = 20, 3, 17
    requests = []
    for r, n in enumerate((3, 2)):
        target, draft = (rng.normal(size=vocab_size) * 0.5 - 3.0 for _ in range(2))
        target[a], target[b], draft[b], draft[a] = np.log(2.0), 0.0, np.log(2.0), 0.0
        # Block verification restores weights below 1 with the alternating drafts (the paper's example).
        ids = [(b, a)[i % 2] for i in range(n)] if method == "block" else [b] * n
        requests.append(
            RequestData(np.tile(target, (n + 1, 1)), ids, np.tile(draft, (n, 1)), 1.0, seed=r, step=40 * r)
        )
    return make_batch(requests, method=method, synthetic_rates=[0.7, 0.6, 0.5])  # type: ignore[arg-type]


class ShiftedStreams:
    """Canonical streams read at ``(step + i, 0)``: what a seed draws at ``(s, i + 1)`` it draws again at
    ``(s + 1, i)`` (M31's scheme, written out so this module needs no fuzz import)."""

    name = "shifted"

    def accept_uniforms(self, seed: np.ndarray, step: np.ndarray, position: object) -> np.ndarray:
        shifted = np.asarray(step, dtype=np.int64) + np.asarray(position, dtype=np.int64)
        return CANONICAL.accept_uniforms(seed, shifted, np.zeros_like(shifted))

    def gumbel_noise(self, seed: np.ndarray, step: np.ndarray, position: object, vocab_size: int) -> Noise:
        shifted = np.asarray(step, dtype=np.int64) + np.asarray(position, dtype=np.int64)
        return CANONICAL.gumbel_noise(seed, shifted, np.zeros_like(shifted), vocab_size)


def _shifted_walk() -> WalkSampler:
    """The walk on `ShiftedStreams`, declared as a sampler with its own generator."""
    sampler = WalkSampler(ShiftedStreams())
    sampler.streams = None
    return sampler


# ---------------------------------------------------------------------------------------------
# Which variants, which trials


def test_it_applies_unless_the_scheme_keys_draws_by_sequence_position() -> None:
    """A variant on the canonical scheme or with its own generator is checked; one on MRV2, whose step
    is a sequence position by declaration, is not."""
    batch = _batch()
    assert CHECK.applies(WalkSampler(), batch)
    assert CHECK.applies(_shifted_walk(), batch)
    assert not CHECK.applies(WalkSampler(MRV2), batch)
    assert MRV2.step_is_position and not CANONICAL.step_is_position
    assert "step_pairs" not in [v.check for v in run_checks(WalkSampler(MRV2), batch, num_samples=20, seed=0)]


def test_partners_run_at_the_adjacent_step_with_the_same_seeds() -> None:
    """Each pair's partner has the first member's seed at step s + 1 (s - 1 at the last step)."""
    assert adjacent_steps([0, 5, MAX_STEP - 1]).tolist() == [1, 6, MAX_STEP - 2]
    batch = _batch()
    seen: list[tuple[list[int], list[int]]] = []

    class Recorder(WalkSampler):
        def __call__(self, part: SpecBatch) -> SpecOutput:
            seen.append((part.seed.tolist(), part.step.tolist()))
            return super().__call__(part)

    CHECK.run(Recorder(), batch, num_samples=10, seed=3)
    (first_seeds, first_steps), (second_seeds, second_steps) = seen
    assert first_seeds == second_seeds and len(set(first_seeds)) == len(first_seeds)
    assert second_steps == [s + 1 for s in first_steps]


def test_among_other_checks_it_reuses_the_shared_trials_and_gives_its_verdict_alone() -> None:
    """Run with the law checks it draws only the partners (the shared trials are its first members), and
    its verdict is the one it gives run on its own."""
    batch = _batch()
    calls: list[int] = []

    class Counter(WalkSampler):
        def __call__(self, part: SpecBatch) -> SpecOutput:
            calls.append(part.num_requests)
            return super().__call__(part)

    shared = run_checks(Counter(), batch, checks=("law_of_m", "step_pairs"), num_samples=50, seed=2)
    assert sum(calls) == 2 * 50 * batch.num_requests  # the shared trials, then the partners
    alone = CHECK.run(WalkSampler(), batch, num_samples=50, seed=2)
    assert shared[1].pvalue == alone.pvalue and shared[1].num_samples == alone.num_samples == 2 * 150


def test_coarse_groups_are_m_major_and_each_product_cell_expects_twenty_pairs() -> None:
    """Every group of positive mass lies within one m or spans neighbouring ones, and every cell of the
    product law expects at least 20 of N pairs; outcomes of probability 0 have no group."""
    law = exact_law(_batch())[0].joint_probs()
    for num_pairs in (50, 300, 2000, 20000):
        coarse = Coarse.of(law, num_pairs)
        assert np.outer(coarse.masses, coarse.masses).min() * num_pairs >= 20 * (1 - 1e-9)
        assert np.all(coarse.groups[law.reshape(-1) == 0] == -1)
        stops = [np.nonzero(coarse.groups == g)[0] // law.shape[1] for g in range(coarse.masses.size)]
        assert all(a.max() <= b.min() for a, b in itertools.pairwise(stops))  # groups follow m


def test_the_same_token_bound_never_undercuts_the_exact_tail() -> None:
    """Hoeffding's and Chernoff's bounds are at least the exact Poisson-binomial upper tail (so the test
    holds its level), for collision chances from tiny to large."""
    rng = np.random.default_rng(0)
    for scale in (1e-4, 0.01, 0.1, 0.5):
        chances = np.clip(rng.exponential(scale, size=300), 0.0, 0.95)
        pmf = np.array([1.0])
        for c in chances:
            pmf = np.convolve(pmf, [1.0 - c, c])
        tail = np.cumsum(pmf[::-1])[::-1]  # tail[k] = P(S >= k)
        for hits in range(0, 300, 3):
            assert collision_pvalue(hits, chances) >= tail[hits] * (1 - 1e-9), (scale, hits)


# ---------------------------------------------------------------------------------------------
# Level and power


@pytest.mark.parametrize("method", ["probabilistic", "synthetic", "block"])
def test_it_is_calibrated_under_the_walk(method: str) -> None:
    """Over 200 seeds of the walk its verdict p-values do not run small (one-sided KS) and its failures
    at levels 0.01 and 0.05 stay within binomial bounds; alpha 1e-6 split over the three assertions."""
    batch = _batch(method)
    pvalues = np.array(
        [
            CHECK.run(WalkSampler(), batch, num_samples=CALIBRATION_TRIALS, seed=seed).pvalue
            for seed in range(CALIBRATION_SEEDS)
        ]
    )
    split = ALPHA / 3
    ks = scipy_stats.kstest(pvalues, "uniform", alternative="greater")
    assert ks.pvalue > split, f"{method}: p-values run small (KS D+={ks.statistic:.3f})"
    for level in (0.01, 0.05):
        bound = int(scipy_stats.binom.isf(split, pvalues.size, level))
        assert np.sum(pvalues < level) <= bound, f"{method}: {np.sum(pvalues < level)} failures at {level}"


class PairLawSampler:
    """Draws each pair's outcomes ``(m, y)`` at once from a planted law of the pair's coarse cells:
    the member at an even step emits the first, the member at the next (odd) step the second, both
    from a generator keyed by the seed and the even step. No algorithm: any pair law can be planted.
    """

    name = "pair law"
    streams = None

    def __init__(
        self, cell_law: np.ndarray, coarse: Coarse, joint: np.ndarray, inputs: RequestInputs
    ) -> None:
        self.cell_law, self.coarse, self.joint, self.inputs = cell_law, coarse, joint, inputs

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        k = self.coarse.masses.size + 1
        vocab_size = batch.vocab_size
        n = self.inputs.draft_token_ids.size
        tokens = np.full((batch.num_requests, n + 1), -1, dtype=np.int64)
        emitted = np.zeros(batch.num_requests, dtype=np.int32)
        probs = self.joint.reshape(-1)
        for r, (seed, step) in enumerate(zip(batch.seed.tolist(), batch.step.tolist(), strict=True)):
            rng = np.random.default_rng([seed & (2**63 - 1), step - step % 2])
            g, h = divmod(int(rng.choice(self.cell_law.size, p=self.cell_law)), k)
            picks = []
            for group in (g, h):
                members = np.nonzero(self.coarse.groups == group)[0]
                picks.append(int(rng.choice(members, p=probs[members] / probs[members].sum())))
            m, y = divmod(picks[step % 2], vocab_size)
            tokens[r, :m] = self.inputs.draft_token_ids[:m]
            tokens[r, m] = y
            emitted[r] = m + 1
        return SpecOutput(token_ids=torch.from_numpy(tokens), num_emitted=torch.from_numpy(emitted))


@pytest.mark.parametrize("where", ["head", "tail"])
def test_it_catches_a_pair_law_moved_by_its_stated_deviation(where: str) -> None:
    """Pairs whose coarse law sits exactly the stated detectable TV from the product law fail in at least
    57 of 60 runs (alpha 1e-6 / 2 per case: power 0.999 means at most 3 misses)."""
    rng = np.random.default_rng(31)
    vocab_size = 40
    zipf = -1.1 * np.log(np.arange(1, vocab_size + 1))
    target = np.stack([rng.permutation(zipf) for _ in range(3)])
    draft = np.stack([rng.permutation(zipf) for _ in range(2)])
    batch = make_batch([RequestData(target, [int(np.argmax(draft[0])), 7], draft, 1.0, step=10)])
    joint = exact_law(batch)[0].joint_probs()
    coarse = Coarse.of(joint, POWER_TRIALS)
    product = pair_fit(coarse, POWER_TRIALS).probs
    inputs = request_inputs(batch)[0]
    baseline = CHECK.run(
        PairLawSampler(product, coarse, joint, inputs), batch, num_samples=POWER_TRIALS, seed=1
    )
    assert baseline.passed and baseline.detectable is not None
    eps = baseline.detectable.value
    planted = stats.worst_case_deviation(pair_fit(coarse, POWER_TRIALS), eps, where, 1.0)
    sampler = PairLawSampler(planted, coarse, joint, inputs)
    misses = sum(
        CHECK.run(sampler, batch, num_samples=POWER_TRIALS, seed=1000 + seed).passed
        for seed in range(POWER_RUNS)
    )
    assert misses <= MAX_POWER_MISSES, f"{misses} of {POWER_RUNS} runs missed TV {eps:.4f} in the {where}"


# ---------------------------------------------------------------------------------------------
# Streams that repeat shifted (M31's class)


@pytest.mark.parametrize("method", ["probabilistic", "strict", "synthetic", "block"])
def test_streams_repeated_one_position_over_fail_it_and_pass_the_law_checks(method: str) -> None:
    """A walk whose draws at (s + 1, i) are those of (s, i + 1) keeps every law (law of m, law of y,
    steps pass) and fails step_pairs on repeated rows at 4,000 pairs; the walk passes. Each verdict has
    false-failure rate 1e-6; step_pairs detects a TV of about 0.1 on the pairs' coarse law with power
    0.999 there, and the repeated rows make the pairs far more dependent than that."""
    batch = _repeated_rows(method)
    checks = ("law_of_m", "law_of_y", "steps", "step_pairs")
    shifted = {
        v.check: v for v in run_checks(_shifted_walk(), batch, checks=checks, num_samples=4000, seed=4)
    }
    assert shifted["step_pairs"].failed, shifted["step_pairs"].message
    assert all(shifted[c].passed for c in checks[:3]), [shifted[c].message for c in checks[:3]]
    assert CHECK.run(WalkSampler(), batch, num_samples=4000, seed=4).passed


def test_components_need_partner_trials() -> None:
    """The tests read both members of each pair: trials without partners are refused."""
    checked = CheckedBatch(_batch())
    trials = CHECK.draw(WalkSampler(), checked, Settings(num_samples=10))
    fields = {name: getattr(trials, name) for name in trials.__dataclass_fields__}
    with pytest.raises(ValueError, match="partner"):
        components(checked, PairedTrials(**fields), ALPHA)
