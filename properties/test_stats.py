"""The statistics engine on its own: pooling, exact tests, Holm, calibration and stated power."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from specsample.properties.stats import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    MIN_EXPECTED,
    GoodnessOfFit,
    binomial_detectable,
    binomial_pvalues,
    binomial_test,
    deviance,
    goodness_of_fit,
    holm_adjusted,
    min_discrepancy,
    min_num_samples,
    pool_cells,
    two_sample_test,
    williams_bound,
    worst_case_deviation,
    zero_cell_detectable,
)

# Every statistical assertion below has false-failure rate ALPHA (split across its cells where it has
# several); the simulations are seeded, so each outcome is fixed, and ALPHA bounds the chance that a
# correct engine drew a failing seed.
ALPHA = 1e-6
TRIALS = 4000  # simulated experiments per power and calibration case


def max_misses(trials: int, miss_rate: float, alpha: float = ALPHA) -> int:
    """The largest miss count consistent with a true miss rate ``miss_rate`` at level ``alpha``."""
    return int(stats.binom.isf(alpha, trials, miss_rate))


def zipf(vocab_size: int, exponent: float) -> np.ndarray:
    """A Zipf law over ``vocab_size`` tokens: the usual shape of a language model's next-token law."""
    weights = 1.0 / np.arange(1, vocab_size + 1) ** exponent
    return weights / weights.sum()


# ---------------------------------------------------------------------------------------------
# Sizing


@given(
    eps=st.floats(0.005, 0.5),
    num_cells=st.integers(2, 2000),
    alpha=st.sampled_from([1e-3, 1e-6, 1e-9]),
)
def test_min_num_samples_and_min_discrepancy_round_trip(eps: float, num_cells: int, alpha: float) -> None:
    """min_num_samples(eps) is the first sample size whose detectable deviation is at most eps."""
    n = min_num_samples(eps, alpha, DEFAULT_BETA, num_cells)
    assert min_discrepancy(n, alpha, DEFAULT_BETA, num_cells) <= eps
    if n > 1:
        assert min_discrepancy(n - 1, alpha, DEFAULT_BETA, num_cells) > eps


def test_detectable_deviation_shrinks_as_one_over_root_n() -> None:
    """Quadrupling the sample size halves the detectable total variation."""
    assert min_discrepancy(4000, num_cells=10) == pytest.approx(min_discrepancy(1000, num_cells=10) / 2)
    assert min_discrepancy(1000, num_cells=100) > min_discrepancy(1000, num_cells=10)
    assert min_discrepancy(1000, alpha=1e-9) > min_discrepancy(1000, alpha=1e-3)


def test_sizing_rejects_meaningless_arguments() -> None:
    """Sizing needs a positive sample size, a deviation in (0, 1] and at least two cells."""
    with pytest.raises(ValueError, match="num_samples"):
        min_discrepancy(0)
    with pytest.raises(ValueError, match="eps"):
        min_num_samples(0.0)
    with pytest.raises(ValueError, match="num_cells"):
        min_discrepancy(100, num_cells=1)


# ---------------------------------------------------------------------------------------------
# Pooling


def greedy_pooling(probs: np.ndarray, num_samples: int) -> np.ndarray:
    """The definition of `pool_cells`, one cell at a time."""
    groups = np.full(probs.shape[0], -1)
    members: list[list[int]] = [[]]
    expected = 0.0
    for i in np.argsort(-probs, kind="stable"):
        if probs[i] <= 0:
            continue
        members[-1].append(int(i))
        expected += probs[i] * num_samples
        if expected >= MIN_EXPECTED * (1 - 1e-12):
            members.append([])
            expected = 0.0
    if not members[-1]:
        members.pop()
    elif len(members) > 1:
        members[-2].extend(members.pop())
    for g, cells in enumerate(members):
        groups[cells] = g
    return groups


@st.composite
def laws(draw: st.DrawFn) -> np.ndarray:
    """Laws with zeros, ties, tiny cells and a heavy head, built with numpy from a drawn seed."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    vocab_size = draw(st.integers(1, 3000))
    family = draw(st.sampled_from(["dirichlet", "zipf", "flat", "sparse", "tiny"]))
    if family == "dirichlet":
        law = rng.dirichlet(np.full(vocab_size, draw(st.sampled_from([0.05, 1.0, 20.0]))))
    elif family == "zipf":
        law = zipf(vocab_size, draw(st.floats(0.5, 2.0)))
    elif family == "flat":
        law = np.full(vocab_size, 1.0 / vocab_size)
    elif family == "sparse":
        law = rng.random(vocab_size) * (rng.random(vocab_size) < 0.2)
        law[rng.integers(vocab_size)] += 1.0
        law /= law.sum()
    else:
        law = np.exp(-rng.uniform(0, 100, size=vocab_size))
        law /= law.sum()
    return np.asarray(law, dtype=np.float64)


@given(law=laws(), num_samples=st.integers(1, 100_000))
def test_pooled_cells_expect_at_least_min_expected(law: np.ndarray, num_samples: int) -> None:
    """Pooled groups are contiguous in probability rank, each expects >= 20, and zero cells stay apart."""
    groups = pool_cells(law, num_samples)
    np.testing.assert_array_equal(groups, greedy_pooling(law, num_samples))
    assert np.all((groups == -1) == (law <= 0))
    expected = np.bincount(groups[groups >= 0], weights=law[groups >= 0]) * num_samples
    if num_samples * law.sum() >= MIN_EXPECTED:
        assert np.all(expected >= MIN_EXPECTED * (1 - 1e-9))
    ranked = groups[np.argsort(-law, kind="stable")]
    ranked = ranked[ranked >= 0]
    assert np.all(np.diff(ranked) >= 0)


# ---------------------------------------------------------------------------------------------
# Goodness of fit


def test_one_observation_in_a_zero_cell_rejects() -> None:
    """A single observation of a token of probability exactly 0 gives p-value 0, whatever else is seen."""
    law = np.array([0.5, 0.5, 0.0])
    result = goodness_of_fit([500, 499, 1], law)
    assert result.reject and result.pvalue == 0.0 and "probability 0" in result.reason
    assert not goodness_of_fit([500, 500, 0], law).reject


def test_a_point_mass_detects_any_escape() -> None:
    """Against a point mass, the detectable deviation is the escape rate seen once with power 0.999."""
    law = np.array([0.0, 1.0, 0.0, 0.0])
    result = goodness_of_fit([0, 1000, 0, 0], law)
    assert not result.reject
    assert result.detectable_tv == pytest.approx(zero_cell_detectable(1000))
    assert result.detectable_tv == pytest.approx(-math.log(DEFAULT_BETA) / 1000, rel=1e-2)


def test_goodness_of_fit_validates_its_counts() -> None:
    """Counts of the wrong shape or the wrong total raise a ValueError naming counts."""
    with pytest.raises(ValueError, match="counts"):
        goodness_of_fit([1, 2], [0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="counts"):
        GoodnessOfFit([0.5, 0.5], 10).pvalues([[3, 3]])


def test_the_cells_of_a_fit_share_its_statistic() -> None:
    """Each pooled group's share of G is its deviance; the shares sum to Williams' factor times the
    corrected statistic, and every cell knows the original cells it pools."""
    law = zipf(200, 1.1)
    rng = np.random.default_rng(5)
    fit = GoodnessOfFit(law, 1000)
    counts = rng.multinomial(1000, law)
    cells = fit.cells(counts, limit=fit.num_groups)
    assert len(cells) == fit.num_groups
    assert sum(c.contribution for c in cells) == pytest.approx(float(fit.statistics(counts)) * fit.williams)
    assert [c.contribution for c in cells] == sorted((c.contribution for c in cells), reverse=True)
    for c in cells:
        assert c.observed == counts[c.members].sum() and c.expected == pytest.approx(
            1000 * law[c.members].sum()
        )
        assert np.all(fit.groups[c.members] == fit.groups[c.members[0]])
        assert np.all(np.diff(law[c.members]) <= 0)  # the most probable first
    assert sorted(np.concatenate([c.members for c in cells]).tolist()) == list(range(200))
    assert deviance([5.0, 0.0], [0.0, 5.0]).tolist() == [math.inf, 10.0]


def test_observed_cells_of_probability_0_come_first() -> None:
    """Observed cells of probability 0 lead, the most observed first; those past the limit share one cell."""
    law = np.array([0.0, 0.5, 0.0, 0.5, 0.0, 0.0])
    fit = GoodnessOfFit(law, 100)
    counts = np.array([3, 40, 7, 45, 2, 3])
    cells = fit.cells(counts, limit=3)
    assert [c.members.tolist() for c in cells] == [[2], [0], [5, 4]]
    assert [c.observed for c in cells] == [7, 3, 5] and all(c.expected == 0 for c in cells)
    assert all(c.contribution == math.inf for c in cells)
    # The total variation over the test's cells: the pooled group misses 15, the zero cells hold 15.
    assert fit.observed_tv(counts) == pytest.approx(0.15)
    assert fit.observed_tv([0, 50, 0, 50, 0, 0]) == 0.0


CALIBRATION_LAWS = {
    "zipf V=1000 N=5000": (zipf(1000, 1.1), 5000),
    "flat V=64 N=3000": (np.full(64, 1 / 64), 3000),
    "sparse V=500 N=2000": (np.where(np.arange(500) % 7 == 0, zipf(500, 0.8), 0.0), 2000),
    "tiny tail V=300 N=1000": (np.exp(-np.linspace(0, 90, 300)), 1000),
    "ten cells N=2000": (zipf(10, 1.0), 2000),
}


@pytest.mark.parametrize("case", list(CALIBRATION_LAWS))
def test_goodness_of_fit_pvalues_are_uniform_under_the_null(case: str) -> None:
    """Under the null the p-values are uniform (KS, alpha 1e-6) and false rejections at 1% stay near 1%."""
    law, n = CALIBRATION_LAWS[case]
    law = law / law.sum()
    rng = np.random.default_rng(list(CALIBRATION_LAWS).index(case))
    fit = GoodnessOfFit(law, n)
    pvalues = fit.pvalues(rng.multinomial(n, law, size=TRIALS))
    # Two-sided KS at alpha 1e-6 / 2 over 4000 p-values detects a CDF error of about 0.04.
    assert stats.kstest(pvalues, "uniform").pvalue > ALPHA / 2, case
    # At 4000 trials the false-rejection count at level 0.01 exceeds its bound with probability 1e-6 / 2.
    assert np.sum(pvalues < 0.01) <= max_misses(TRIALS, 0.01, ALPHA / 2)


def test_goodness_of_fit_holds_its_level_on_two_cells() -> None:
    """On two cells the p-values are lumpy, yet false rejections at 1% and 10% stay within their levels."""
    law, n = np.array([0.3, 0.7]), 200
    pvalues = GoodnessOfFit(law, n).pvalues(np.random.default_rng(8).multinomial(n, law, size=TRIALS))
    for level in (0.01, 0.1):
        # Binomial bounds at alpha 1e-6 / 2 each: a true rate 1.5x the level is caught.
        assert np.sum(pvalues < level) <= max_misses(TRIALS, level, ALPHA / 2)


POWER_LAWS = {
    "zipf V=1000 N=20000": (zipf(1000, 1.1), 20000),
    "zipf V=200 N=3000": (zipf(200, 1.0), 3000),
    "flat V=64 N=3000": (np.full(64, 1 / 64), 3000),
    "three cells N=500": (zipf(3, 0.5), 500),
}


@pytest.mark.parametrize("where", ["head", "tail"])
@pytest.mark.parametrize("case", list(POWER_LAWS))
def test_goodness_of_fit_rejects_the_stated_deviation_with_the_stated_power(case: str, where: str) -> None:
    """A law moved by exactly the stated detectable TV, in the head or the tail, is rejected w.p. >= 0.999."""
    law, n = POWER_LAWS[case]
    rng = np.random.default_rng([list(POWER_LAWS).index(case), where == "head"])
    fit = GoodnessOfFit(law, n)
    for sign in (1.0, -1.0):
        moved = worst_case_deviation(fit, fit.detectable_tv, where, sign)
        assert 0.5 * np.abs(moved - law).sum() == pytest.approx(fit.detectable_tv)
        misses = int(np.sum(fit.pvalues(rng.multinomial(n, moved, size=TRIALS)) >= fit.alpha))
        # Power 1 - beta means at most beta * TRIALS misses on average; the bound has alpha 1e-6 / 2.
        bound = max_misses(TRIALS, DEFAULT_BETA, ALPHA / 2)
        assert misses <= bound, f"{case} {where} sign {sign}: {misses} misses of {TRIALS}; at most {bound}"


def test_the_stated_detectable_deviation_is_tight() -> None:
    """At half the stated detectable TV the worst-shaped deviation is mostly missed: the claim is tight."""
    law, n = np.full(64, 1 / 64), 3000
    fit = GoodnessOfFit(law, n)
    moved = worst_case_deviation(fit, fit.detectable_tv / 2, "head", 1.0)
    rejected = int(
        np.sum(fit.pvalues(np.random.default_rng(9).multinomial(n, moved, size=TRIALS)) < fit.alpha)
    )
    predicted = stats.ncx2.sf(
        williams_bound(64) * stats.chi2.isf(fit.alpha, 63), 63, 4 * n * (fit.detectable_tv / 2) ** 2
    )
    assert predicted < 0.05
    # The power there is predicted at 3%; more than half of the trials rejected would mean the stated
    # deviation is loose by more than a factor 2 (binomial bound at alpha 1e-6).
    assert rejected < TRIALS / 2


# ---------------------------------------------------------------------------------------------
# Exact binomial tests


def test_binomial_pvalues_match_the_exact_tails() -> None:
    """The p-value is twice the smaller exact tail, capped at 1; impossible counts give 0."""
    assert binomial_pvalues(3, 10, 0.5) == pytest.approx(2 * stats.binom.cdf(3, 10, 0.5))
    assert binomial_pvalues(8, 10, 0.5) == pytest.approx(2 * stats.binom.sf(7, 10, 0.5))
    assert binomial_pvalues(5, 10, 0.5) == 1.0
    assert binomial_pvalues(1, 10, 0.0) == 0.0 and binomial_pvalues(0, 10, 0.0) == 1.0
    assert binomial_pvalues(9, 10, 1.0) == 0.0 and binomial_pvalues(10, 10, 1.0) == 1.0
    with pytest.raises(ValueError, match="count"):
        binomial_test(11, 10, 0.5)


@pytest.mark.parametrize(
    ("num_trials", "prob"), [(1000, 0.5), (2000, 0.03), (500, 0.0), (3000, 0.97), (40, 0.3)]
)
def test_binomial_test_has_its_level_and_its_stated_power(num_trials: int, prob: float) -> None:
    """Exact binomial p-values never reject more than alpha, and a deviation of the stated size is caught."""
    rng = np.random.default_rng(num_trials)
    null = binomial_pvalues(rng.binomial(num_trials, prob, size=TRIALS), num_trials, prob)
    for level in (0.01, 0.1):
        assert np.sum(null < level) <= max_misses(TRIALS, level, ALPHA / 6)
    delta = binomial_detectable(num_trials, prob)
    assert 0 < delta < 1
    for moved in (prob + delta, prob - delta):
        if 0.0 <= moved <= 1.0 and (moved - prob) ** 2 > 0:
            counts = rng.binomial(num_trials, moved, size=TRIALS)
            misses = int(np.sum(binomial_pvalues(counts, num_trials, prob) >= DEFAULT_ALPHA))
            assert misses <= max_misses(TRIALS, DEFAULT_BETA, ALPHA / 6), (moved, misses)


def test_binomial_detectable_promises_nothing_it_cannot_keep() -> None:
    """A direction no deviation can be detected in contributes its whole room to the detectable deviation."""
    # At N = 1000 and p = 0.01 even a probability of 0 is not rejected at 1e-6 (2 * 0.99**1000 = 9e-5).
    assert binomial_detectable(1000, 0.01) >= 0.01
    assert binomial_detectable(1000, 0.0) == pytest.approx(zero_cell_detectable(1000), rel=1e-3)
    assert math.isinf(binomial_detectable(0, 0.5))


# ---------------------------------------------------------------------------------------------
# Holm


def test_holm_adjusted_pvalues_follow_the_step_down_rule() -> None:
    """Holm's adjusted p-values are the running maximum of (k - j) p_(j), capped at 1, in input order."""
    np.testing.assert_allclose(holm_adjusted([0.01, 0.04, 0.03, 0.5]), [0.04, 0.09, 0.09, 0.5])
    np.testing.assert_array_equal(holm_adjusted([0.01, 0.04, 0.03, 0.5]) < 0.05, [True, False, False, False])
    assert holm_adjusted([]).shape == (0,)
    assert holm_adjusted([0.9, 0.8]).max() <= 1.0


def test_holm_controls_the_family_wise_error_rate() -> None:
    """Under a global null of 20 independent uniform p-values, Holm at 5% errs in at most 5% of families."""
    rng = np.random.default_rng(11)
    families = rng.random((TRIALS, 20))
    false_families = sum(bool((holm_adjusted(p) < 0.05).any()) for p in families)
    assert false_families <= max_misses(TRIALS, 0.05, ALPHA)


# ---------------------------------------------------------------------------------------------
# Two samples


def test_two_sample_test_holds_its_level_and_its_stated_power() -> None:
    """Two samples of one law give uniform p-values (KS); laws the stated TV apart are told apart (0.999)."""
    rng = np.random.default_rng(12)
    law = zipf(300, 1.0)
    n_a, n_b = 4000, 2500
    null = [two_sample_test(rng.multinomial(n_a, law), rng.multinomial(n_b, law)).pvalue for _ in range(1000)]
    assert stats.kstest(null, "uniform").pvalue > ALPHA / 2
    eps = two_sample_test(rng.multinomial(n_a, law), rng.multinomial(n_b, law)).detectable_tv
    fit = GoodnessOfFit(law, min(n_a, n_b))
    moved = worst_case_deviation(fit, eps, "head", 1.0)
    misses = sum(
        not two_sample_test(rng.multinomial(n_a, law), rng.multinomial(n_b, moved)).reject
        for _ in range(1000)
    )
    assert misses <= max_misses(1000, DEFAULT_BETA, ALPHA / 2)


def test_two_sample_test_of_identical_counts_accepts() -> None:
    """Identical count vectors give a statistic of 0 and p-value 1."""
    counts = np.array([400, 300, 200, 100, 0])
    result = two_sample_test(counts, counts)
    assert result.statistic == pytest.approx(0.0, abs=1e-9) and result.pvalue == pytest.approx(1.0)
    with pytest.raises(ValueError, match="counts_b"):
        two_sample_test(counts, counts[:3])


def test_deviance_of_a_cell_the_law_all_but_rules_out_is_infinite_without_a_warning() -> None:
    """Observed counts where the law expects a subnormal mass: the share is +inf, and numpy's overflow
    of ``O / E`` is no warning (a warning here once printed in the middle of certify's progress)."""
    import warnings

    from specsample.properties.stats import deviance

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shares = deviance([3.0, 5.0, 0.0], [1e-310, 8.0, 0.0])
    assert shares[0] == float("inf") and 0.0 < shares[1] < float("inf") and shares[2] == 0.0
