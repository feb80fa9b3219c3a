"""The harness is honest: calibrated under a correct sampler, and as powerful as its verdicts claim."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from specsample.properties import stats
from specsample.properties.checks import CHECKS, law_of_m, law_of_y, marginal
from specsample.properties.checks.base import Component, draw_trials
from specsample.reference.contract import RequestData, SpecBatch, SpecOutput, make_batch
from specsample.reference.law import F64Array, RequestInputs, request_inputs, request_law
from specsample.reference.methods import METHODS
from specsample.reference.walk import WalkSampler

# Every assertion here has false-failure rate 1e-6, split evenly across the assertions of its test.
ALPHA = 1e-6
CALIBRATION_SEEDS = 200  # independent check runs under a correct sampler
CALIBRATION_TRIALS = 300  # trials per request in each run
POWER_RUNS = 60  # check runs per planted deviation
POWER_TRIALS = 1000
# At power 0.999 a planted deviation is missed 0.06 times in 60 runs on average; 4 or more misses
# happen with probability 4.9e-7 < 1e-6 / 2.
MAX_POWER_MISSES = 3


def _calibration_batch(method: str, one_hot: bool = False) -> SpecBatch:
    """Two ragged requests (one with a placeholder) and a greedy one, 10 tokens."""
    rng = np.random.default_rng(21)
    vocab_size = 10

    def draft(n: int) -> np.ndarray | None:
        return None if one_hot else rng.normal(size=(n, vocab_size))

    requests = [
        RequestData(rng.normal(size=(4, vocab_size)), [1, 2, 3], draft(3), 1.0),
        RequestData(rng.normal(size=(3, vocab_size)) * 2, [4, -1], draft(2), 0.7),
        RequestData(rng.normal(size=(2, vocab_size)), [5], draft(1), 0.0),
    ]
    return make_batch(requests, method=method, synthetic_rates=[0.8, 0.6, 0.4])  # type: ignore[arg-type]


def _family_pvalue(components: list[Component]) -> float:
    """The verdict's p-value: the smallest Holm-adjusted p-value of the check's tests."""
    return float(stats.holm_adjusted([c.pvalue for c in components]).min()) if components else 1.0


CALIBRATION_CASES = {
    "probabilistic": ("probabilistic", False),
    "probabilistic one-hot": ("probabilistic", True),
    "strict": ("strict", False),
    "synthetic": ("synthetic", False),
    "block": ("block", False),
}


@pytest.mark.parametrize("case", list(CALIBRATION_CASES))
def test_checks_are_calibrated_under_the_reference(case: str) -> None:
    """Over 200 seeds of the walk, no check's p-values run small and false failures stay rare.

    Per statistical check: its verdict p-values are not stochastically smaller than uniform (one-sided
    KS; Holm makes them conservative), and its failures at levels 0.01 and 0.05 stay within binomial
    bounds; the p-values of the single G-tests inside (the joint law of (m, y), the marginal at
    position 0) are uniform (two-sided KS). alpha 1e-6 split over the assertions.
    """
    method, one_hot = CALIBRATION_CASES[case]
    batch = _calibration_batch(method, one_hot)
    sampler = WalkSampler()
    verdict_pvalues: dict[str, list[float]] = {"law_of_m": [], "law_of_y": [], "marginal": [], "steps": []}
    single: dict[str, list[float]] = {"joint law": [], "marginal at 0": []}
    for seed in range(CALIBRATION_SEEDS):
        trials = draw_trials(sampler, batch, CALIBRATION_TRIALS, seed)
        law_m, _ = law_of_m.components(batch, trials, ALPHA)
        law_y, _ = law_of_y.components(batch, trials, ALPHA)
        verdict_pvalues["law_of_m"].append(_family_pvalue(law_m))
        verdict_pvalues["law_of_y"].append(_family_pvalue(law_y))
        over_steps = draw_trials(sampler, batch, CALIBRATION_TRIALS, seed, purpose="steps", vary="step")
        verdict_pvalues["steps"].append(_family_pvalue(law_of_y.components(batch, over_steps, ALPHA)[0]))
        single["joint law"].extend(
            c.pvalue for c in law_y if c.what.startswith("joint law") and c.request < 2
        )
        if METHODS[method].lossless:
            ids = marginal.drafts_from_q(batch, CALIBRATION_TRIALS, seed)
            marginal_trials = draw_trials(
                sampler, batch, CALIBRATION_TRIALS, seed, draft_token_ids=ids, purpose="marginal"
            )
            position_tests, _ = marginal.components(batch, marginal_trials, ALPHA, seed=seed)
            verdict_pvalues["marginal"].append(_family_pvalue(position_tests))
            single["marginal at 0"].extend(
                c.pvalue for c in position_tests if c.position == 0 and c.request < 2
            )
    checked = {name: np.array(p) for name, p in verdict_pvalues.items() if p}
    uniform = {name: np.array(p) for name, p in single.items() if p}
    split = ALPHA / (3 * len(checked) + len(uniform))
    for name, pvalues in checked.items():
        ks = scipy_stats.kstest(pvalues, "uniform", alternative="greater")
        assert ks.pvalue > split, f"{case} {name}: p-values run small (KS D+={ks.statistic:.3f})"
        for level in (0.01, 0.05):
            bound = int(scipy_stats.binom.isf(split, pvalues.size, level))
            assert np.sum(pvalues < level) <= bound, (
                f"{case} {name}: {np.sum(pvalues < level)} failures at {level}"
            )
    for name, pvalues in uniform.items():
        ks = scipy_stats.kstest(pvalues, "uniform")
        assert ks.pvalue > split, f"{case} {name}: G p-values not uniform (KS D={ks.statistic:.3f})"


# ---------------------------------------------------------------------------------------------
# Power: planted deviations of exactly the stated size


LawFunction = Callable[[str, RequestInputs], tuple[F64Array, F64Array]]


def exact(method: str, inputs: RequestInputs) -> tuple[F64Array, F64Array]:
    """The exact law of m and of y given m."""
    law = request_law(method, inputs)
    return law.stop_probs, law.token_probs


class LawSampler:
    """Draws (m, y) straight from a law of each request: no algorithm, so any law can be planted.

    Requests with the same inputs share one law and one generator (seeded from the first of their
    seeds): the replicas of one check run are independent draws, and runs with other seeds differ.
    """

    streams = None

    def __init__(self, name: str, law: LawFunction = exact, first_only: bool = False) -> None:
        self.name = name
        self.law = law
        self.first_only = first_only  # emit one token at position 0 and stop (for the marginal)

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample every request of ``batch`` from its (planted) law."""
        inputs = request_inputs(batch)
        width = batch.resolved_max_num_drafts() + 1
        tokens = np.full((len(inputs), width), -1, dtype=np.int64)
        emitted = np.zeros(len(inputs), dtype=np.int32)
        groups: dict[bytes, list[int]] = {}
        for b, x in enumerate(inputs):
            key = x.target_logits.tobytes() + (b"" if self.first_only else x.draft_token_ids.tobytes())
            groups.setdefault(key, []).append(b)
        seeds = batch.seed.numpy()
        for members in groups.values():
            x = inputs[members[0]]
            stop, token = self.law(batch.method, x)
            rng = np.random.default_rng(int(seeds[members[0]]) & (2**63 - 1))
            size = len(members)
            m = (
                np.zeros(size, dtype=np.int64)
                if self.first_only
                else rng.choice(stop.size, size=size, p=stop)
            )
            for j in np.unique(m):
                chosen = np.array(members)[m == j]
                y = rng.choice(token.shape[1], size=chosen.size, p=token[j] / token[j].sum())
                tokens[chosen, :j] = x.draft_token_ids[:j]
                tokens[chosen, j] = y
                emitted[chosen] = j + 1
        return SpecOutput(token_ids=torch.from_numpy(tokens), num_emitted=torch.from_numpy(emitted))


def _power_batch() -> SpecBatch:
    """One request of a Zipf-shaped 40-token law with two drafts."""
    rng = np.random.default_rng(31)
    vocab_size = 40
    zipf = -1.1 * np.log(np.arange(1, vocab_size + 1))
    target = np.stack([rng.permutation(zipf) for _ in range(3)])
    draft = np.stack([rng.permutation(zipf) for _ in range(2)])
    return make_batch([RequestData(target, [int(np.argmax(draft[0])), 7], draft, 1.0)])


def _misses(sampler: LawSampler, check: str, batch: SpecBatch) -> int:
    misses = 0
    for seed in range(POWER_RUNS):
        verdict = CHECKS[check].run(sampler, batch, num_samples=POWER_TRIALS, alpha=ALPHA, seed=1000 + seed)
        misses += bool(verdict.passed)
    return misses


@pytest.mark.parametrize("where", ["head", "tail"])
def test_law_of_y_catches_a_joint_law_moved_by_its_stated_deviation(where: str) -> None:
    """A joint law of (m, y) moved by exactly the stated detectable TV fails in at least 57 of 60 runs."""
    batch = _power_batch()
    baseline = CHECKS["law_of_y"].run(
        LawSampler("exact"), batch, num_samples=POWER_TRIALS, alpha=ALPHA, seed=1
    )
    assert baseline.passed and baseline.detectable is not None
    eps = baseline.detectable.value

    def moved(method: str, inputs: RequestInputs) -> tuple[F64Array, F64Array]:
        stop, token = exact(method, inputs)
        joint = stop[:, None] * token
        fit = stats.GoodnessOfFit(joint.reshape(-1), POWER_TRIALS)
        planted = stats.worst_case_deviation(fit, eps, where, 1.0).reshape(joint.shape)
        new_stop = planted.sum(axis=1)
        return new_stop, planted / np.where(new_stop > 0, new_stop, 1.0)[:, None]

    misses = _misses(LawSampler(f"joint moved in the {where}", moved), "law_of_y", batch)
    # alpha 1e-6 / 2 per case: power 0.999 at TV eps (about 0.2 here) means at most 3 misses in 60.
    assert misses <= MAX_POWER_MISSES, f"{misses} of {POWER_RUNS} runs missed TV {eps:.4f} in the {where}"


@pytest.mark.parametrize("direction", [1.0, -1.0])
def test_law_of_m_catches_a_cell_moved_by_its_stated_deviation(direction: float) -> None:
    """P(m = j) moved by exactly the stated detectable deviation, up or down, fails in >= 57 of 60 runs."""
    batch = _power_batch()
    baseline = CHECKS["law_of_m"].run(
        LawSampler("exact"), batch, num_samples=POWER_TRIALS, alpha=ALPHA, seed=1
    )
    assert baseline.passed and baseline.detectable is not None
    eps = baseline.detectable.value
    stop, _ = exact(batch.method, request_inputs(batch)[0])
    # The cell whose detectable deviation is largest (the one nearest 1/2) is moved; the others
    # make up the difference in proportion.
    target_cell = int(np.argmin(np.abs(stop - 0.5)))

    def moved(method: str, inputs: RequestInputs) -> tuple[F64Array, F64Array]:
        stop, token = exact(method, inputs)
        planted = stop.copy()
        planted[target_cell] += direction * eps
        others = np.arange(stop.size) != target_cell
        planted[others] *= (1 - planted[target_cell]) / stop[others].sum()
        return planted, token

    misses = _misses(LawSampler("P(m) moved", moved), "law_of_m", batch)
    # alpha 1e-6 / 2 per case: power 0.999 at the stated deviation means at most 3 misses in 60.
    assert misses <= MAX_POWER_MISSES, f"{misses} of {POWER_RUNS} runs missed a shift of {eps:.4f}"


@pytest.mark.parametrize("where", ["head", "tail"])
def test_marginal_catches_a_position_law_moved_by_its_stated_deviation(where: str) -> None:
    """A first-position law moved by exactly the stated detectable TV fails in at least 57 of 60 runs."""
    batch = _power_batch()

    def first_position(method: str, inputs: RequestInputs) -> tuple[F64Array, F64Array]:
        law = request_law(method, inputs)
        return law.stop_probs, law.target_probs[:1]

    baseline = CHECKS["marginal"].run(
        LawSampler("p_0", first_position, True), batch, num_samples=POWER_TRIALS, seed=1
    )
    assert baseline.passed and baseline.detectable is not None
    eps = baseline.detectable.value

    def moved(method: str, inputs: RequestInputs) -> tuple[F64Array, F64Array]:
        stop, first = first_position(method, inputs)
        fit = stats.GoodnessOfFit(first[0], POWER_TRIALS)
        return stop, stats.worst_case_deviation(fit, eps, where, 1.0)[None, :]

    misses = _misses(LawSampler(f"p_0 moved in the {where}", moved, first_only=True), "marginal", batch)
    # alpha 1e-6 / 2 per case: power 0.999 at the stated TV means at most 3 misses in 60.
    assert misses <= MAX_POWER_MISSES, f"{misses} of {POWER_RUNS} runs missed TV {eps:.4f} in the {where}"
