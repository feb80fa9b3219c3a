"""The statistics engine: tests that state their false-failure rate and what they can detect.

Every test returns a `TestResult` carrying its statistic, p-value, sample size and the smallest
deviation it detects with power ``1 - beta`` (total variation for token laws; for a binomial test the
absolute deviation of the probability, which is the total variation between the two Bernoulli laws).

Token laws are tested with the G-test (the likelihood-ratio statistic) on cells pooled by probability
rank, with Williams' correction. The detectable deviation comes from the non-central chi-squared: a
law at total-variation distance ``eps`` from the null has ``2 N KL >= 4 N eps**2`` (Pinsker), so a test
whose critical value is crossed with probability ``1 - beta`` at non-centrality ``lambda`` detects
every deviation of at least ``sqrt(lambda / (4 N))`` on the pooled cells. Pearson's statistic is not
offered: its power falls short of that claim when a deviation shrinks many small cells at once (at
TV 0.055 over 295 pooled cells, 0.8% misses instead of 0.1%), while the G-test keeps it.

Cells of probability exactly 0 are tested apart from the pooled cells: one observation there rejects.
`GoodnessOfFit.cells` gives the cells a test saw (each pooled group with the cells it holds, each
cell of probability 0 that was observed) with their observed and expected counts and their shares
of the G statistic, so a failure can show where it comes from.
Exact binomial tests cover few cells (the law of the number accepted) and bug-shaped sets of tokens;
Holm's procedure combines the tests of one assertion; `two_sample_test` compares two variants.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import optimize, special, stats

DEFAULT_ALPHA = 1e-6
DEFAULT_BETA = 1e-3
MIN_EXPECTED = 20.0

F64Array = npt.NDArray[np.float64]
I64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class TestResult:
    """The outcome of one statistical test.

    Attributes:
        statistic: the test statistic (Williams-corrected G for `goodness_of_fit`, the observed
            proportion for `binomial_test`).
        pvalue: the p-value under the null.
        df: degrees of freedom (pooled cells minus one; 1 for a binomial test).
        reject: whether ``pvalue < alpha``, the false-failure rate of this assertion (an observation
            in an impossible cell gives p-value 0).
        num_samples: the sample size ``N``.
        detectable_tv: the smallest deviation rejected with probability at least ``1 - beta`` (one
            minus the stated power): total variation on the pooled cells, or the absolute deviation
            of a binomial probability; ``inf`` when no deviation is detected with that power.
        reason: a one-line human-readable account of the verdict.
    """

    __test__ = False  # not a pytest test class

    statistic: float
    pvalue: float
    df: int
    reject: bool
    num_samples: int
    alpha: float
    detectable_tv: float
    beta: float
    reason: str


def williams_bound(num_cells: int, min_expected: float = MIN_EXPECTED) -> float:
    """The largest Williams factor ``q`` over pooled cells whose expected counts are all ``>= min_expected``.

    For a goodness-of-fit test ``q = 1 + (sum(1 / P_i) - 1) / (6 N (k - 1))``; with ``N P_i >= E`` it is
    below ``1 + k / (6 E (k - 1))``, whatever ``N``.
    """
    if num_cells < 2:
        return 1.0
    return 1.0 + num_cells / (6.0 * min_expected * (num_cells - 1))


@functools.lru_cache(maxsize=4096)
def noncentrality_for_power(alpha: float, beta: float, df: int, scale: float = 1.0) -> float:
    """The non-centrality at which ``chi2(df, lambda)`` exceeds ``scale * chi2.isf(alpha, df)`` w.p.
    ``1 - beta``; ``scale`` is the Williams factor ``q`` (``G / q`` crosses a value when ``G`` crosses
    ``q`` times it)."""
    critical = scale * stats.chi2.isf(alpha, df)

    def shortfall(lam: float) -> float:
        return float(stats.ncx2.sf(critical, df, lam)) - (1.0 - beta)

    high = 1.0
    while shortfall(high) < 0:
        high *= 2.0
    return float(optimize.brentq(shortfall, 0.0, high, xtol=1e-10, rtol=1e-12))


def _required_noncentrality(alpha: float, beta: float, num_cells: int) -> float:
    if num_cells < 2:
        raise ValueError(f"num_cells is {num_cells}; a goodness-of-fit test needs at least 2 cells")
    return noncentrality_for_power(alpha, beta, num_cells - 1, williams_bound(num_cells))


def min_discrepancy(
    num_samples: int, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA, num_cells: int = 2
) -> float:
    """The smallest total variation over ``num_cells >= 2`` pooled cells (``k - 1`` degrees of freedom)
    detected with power ``1 - beta`` at level ``alpha``: ``sqrt(lambda / (4 N))``, the inverse of
    `min_num_samples`."""
    if num_samples < 1:
        raise ValueError(f"num_samples is {num_samples}; expected at least 1")
    return math.sqrt(_required_noncentrality(alpha, beta, num_cells) / (4.0 * num_samples))


def min_num_samples(
    eps: float, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA, num_cells: int = 2
) -> int:
    """The smallest sample size at which a total variation ``eps`` is detected with power ``1 - beta``.

    ``min_discrepancy(min_num_samples(eps)) <= eps < min_discrepancy(min_num_samples(eps) - 1)``.
    """
    if not 0.0 < eps <= 1.0:
        raise ValueError(f"eps is {eps}; expected a total variation in (0, 1]")
    return max(1, math.ceil(_required_noncentrality(alpha, beta, num_cells) / (4.0 * eps * eps)))


def zero_cell_detectable(num_samples: int, beta: float = DEFAULT_BETA) -> float:
    """The smallest mass on impossible outcomes seen at least once in ``num_samples`` w.p. ``1 - beta``.

    A test that rejects on one observation of an impossible outcome detects every bug that produces one
    with probability at least ``1 - beta**(1 / N)`` (about ``6.9 / N`` at ``beta = 1e-3``).
    """
    if num_samples < 1:
        return math.inf
    return -math.expm1(math.log(beta) / num_samples)


def pool_cells(
    probs: npt.ArrayLike, num_samples: int, min_expected: float = MIN_EXPECTED
) -> npt.NDArray[np.int64]:
    """Group the cells of positive probability by rank so every group expects ``>= min_expected``.

    Returns a group index per cell, ``-1`` for cells of probability 0. Cells are taken from the most
    to the least probable (ties by index); a group closes once it expects ``min_expected``
    observations, and a trailing group short of that merges into the one before it.
    """
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    groups = np.full(p.shape[0], -1, dtype=np.int64)
    order = np.argsort(-p, kind="stable")
    order = order[p[order] > 0]
    expected = np.cumsum(p[order]) * num_samples
    starts = [0]
    while True:
        before = expected[starts[-1] - 1] if starts[-1] > 0 else 0.0
        # The first cell at which the running group reaches min_expected closes the group.
        end = int(np.searchsorted(expected, before + min_expected * (1 - 1e-12), side="left")) + 1
        if end >= order.shape[0]:
            break
        starts.append(end)
    if len(starts) > 1 and expected[-1] - expected[starts[-1] - 1] < min_expected * (1 - 1e-12):
        starts.pop()  # the trailing group falls short: merge it into the one before
    labels = np.zeros(order.shape[0], dtype=np.int64)
    labels[starts[1:]] = 1
    groups[order] = np.cumsum(labels)
    return groups


def _g_reason(statistic: float, df: int, pvalue: float, alpha: float, size: str, detectable: float) -> str:
    """The one-line account of a G-test's verdict."""
    return (
        f"G={statistic:.2f} df={df} p={pvalue:.3g} {'<' if pvalue < alpha else '>='} alpha={alpha:g}; "
        f"N={size} detects TV>={detectable:.4f}"
    )


def deviance(observed: npt.ArrayLike, expected: npt.ArrayLike) -> F64Array:
    """Each cell's share of the G statistic, ``2 (O log(O / E) - (O - E))`` (``0 log 0 = 0``).

    The shares are ``>= 0`` and sum to G when observed and expected totals agree; ``inf`` where the
    law expects nothing (``E = 0``) and something was observed.
    """
    o = np.asarray(observed, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    impossible = (e <= 0) & (o > 0)
    safe = np.where(impossible | (e <= 0), 1.0, e)
    # A cell the law all but rules out (E subnormal) overflows O / E: its share is +inf, as it should be.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_terms = np.where(o > 0, o * np.log(np.where(o > 0, o, 1.0) / safe), 0.0)
    shares = np.maximum(2.0 * (log_terms - (o - e)), 0.0)
    return np.asarray(np.where(impossible, math.inf, shares), dtype=np.float64)


@dataclass(frozen=True, eq=False)
class FitCell:
    """One cell of a goodness-of-fit test as the test saw it: a pooled group of cells, or a cell of
    probability 0 that was observed (several such cells, where more were observed than are shown).

    Attributes:
        members: ``[k]`` the original cells it holds, the most probable first.
        probability: the law's mass on it (0 for cells of probability 0).
        observed, expected: its observed count and ``N`` times its probability.
        contribution: its share of the G statistic before Williams' correction (`deviance`);
            ``inf`` for observations where the law puts no mass.
    """

    members: I64Array
    probability: float
    observed: float
    expected: float
    contribution: float


def _g_statistic(observed: F64Array, expected: F64Array) -> F64Array:
    """``2 sum O log(O / E)`` over the last axis (``0 log 0 = 0``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(observed > 0, observed * np.log(observed / expected), 0.0)
    return np.asarray(2.0 * terms.sum(axis=-1), dtype=np.float64)


class GoodnessOfFit:
    """The G-test of counts against a fixed law at a fixed sample size, pooling computed once.

    Cells of positive probability are pooled by rank (`pool_cells`); the statistic is the G statistic
    over the pooled cells divided by Williams' factor and referred to ``chi2(k - 1)``. Any observation
    in a cell of probability exactly 0 gives p-value 0.

    Attributes:
        probs: ``[V]`` the null law.
        num_samples: ``N``, the total every count vector must have.
        groups: ``[V]`` the pooled group of each cell, ``-1`` for cells of probability 0.
        num_groups, df, williams: ``k``, ``k - 1`` and Williams' factor ``q``.
        detectable_tv: the smallest total variation on the pooled cells detected with power
            ``1 - beta`` (``inf`` with fewer than two groups).
    """

    def __init__(
        self,
        probs: npt.ArrayLike,
        num_samples: int,
        alpha: float = DEFAULT_ALPHA,
        beta: float = DEFAULT_BETA,
        min_expected: float = MIN_EXPECTED,
    ) -> None:
        p = np.asarray(probs, dtype=np.float64).reshape(-1)
        if num_samples < 1:
            raise ValueError(f"num_samples is {num_samples}; expected at least 1")
        if p.size == 0 or not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
            raise ValueError(f"probs is not a law: {p[:8].tolist()}...; expected finite values >= 0")
        self.probs = p
        self.num_samples = int(num_samples)
        self.alpha = alpha
        self.beta = beta
        self.groups = pool_cells(p, num_samples, min_expected)
        self.num_groups = int(self.groups.max()) + 1 if (self.groups >= 0).any() else 0
        self.df = max(self.num_groups - 1, 1)
        pooled = np.bincount(
            self.groups[self.groups >= 0], weights=p[self.groups >= 0], minlength=self.num_groups
        )
        self.pooled_probs: F64Array = pooled / pooled.sum()
        if self.num_groups >= 2:
            inverse_sum = float(np.sum(1.0 / self.pooled_probs))
            self.williams = 1.0 + (inverse_sum - 1.0) / (6.0 * num_samples * (self.num_groups - 1))
            self.detectable_tv = min_discrepancy(num_samples, alpha, beta, self.num_groups)
        else:
            # One pooled cell: a deviation can only show by moving mass into the cells of probability 0.
            self.williams = 1.0
            self.detectable_tv = zero_cell_detectable(num_samples, beta) if (p <= 0).any() else math.inf

    def _pooled(self, counts: F64Array) -> F64Array:
        member = self.groups >= 0
        rows = counts.reshape(-1, counts.shape[-1])[:, member]
        index = np.arange(rows.shape[0])[:, None] * self.num_groups + self.groups[member][None, :]
        pooled = np.bincount(
            index.reshape(-1), weights=rows.reshape(-1), minlength=rows.shape[0] * self.num_groups
        )
        return pooled.reshape(*counts.shape[:-1], self.num_groups)

    def statistics(self, counts: npt.ArrayLike) -> F64Array:
        """The Williams-corrected G statistic of each count vector (``[..., V]`` -> ``[...]``)."""
        observed = self._check(counts)
        if self.num_groups < 2:
            return np.zeros(observed.shape[:-1])
        return _g_statistic(self._pooled(observed), self.pooled_probs * self.num_samples) / self.williams

    def pvalues(self, counts: npt.ArrayLike) -> F64Array:
        """The p-value of each count vector (``[..., V]`` -> ``[...]``); 0 where a zero cell is hit."""
        observed = self._check(counts)
        pvalue = (
            stats.chi2.sf(self.statistics(observed), self.num_groups - 1)
            if self.num_groups >= 2
            else np.ones(observed.shape[:-1])
        )
        impossible = observed[..., self.probs <= 0].sum(axis=-1) > 0
        return np.asarray(np.where(impossible, 0.0, pvalue), dtype=np.float64)

    def test(self, counts: npt.ArrayLike) -> TestResult:
        """Test one count vector against the law."""
        observed = self._check(counts)
        if observed.ndim != 1:
            raise ValueError(f"counts has shape {observed.shape}; test() takes one count vector")
        zero_hits = np.nonzero((self.probs <= 0) & (observed > 0))[0]
        n, df, alpha, detectable = self.num_samples, self.df, self.alpha, self.detectable_tv
        if zero_hits.size:
            hits = int(observed[zero_hits].sum())
            reason = f"{hits} observations in cells of probability 0: {zero_hits[:8].tolist()}"
            return TestResult(math.inf, 0.0, df, True, n, alpha, detectable, self.beta, reason)
        if self.num_groups < 2:
            reason = "one pooled cell and no observation outside it"
            return TestResult(0.0, 1.0, df, False, n, alpha, detectable, self.beta, reason)
        statistic = float(self.statistics(observed))
        pvalue = float(stats.chi2.sf(statistic, self.num_groups - 1))
        reason = _g_reason(statistic, df, pvalue, alpha, str(n), detectable)
        return TestResult(statistic, pvalue, df, pvalue < alpha, n, alpha, detectable, self.beta, reason)

    def cells(self, counts: npt.ArrayLike, limit: int = 5) -> list[FitCell]:
        """The ``limit`` cells of one count vector that weigh most in the test, the heaviest first.

        Observed cells of probability 0 come first, the most observed first (when more of them were
        observed than fit in ``limit``, the last one shown holds the rest); then the pooled groups by
        their share of the G statistic (`deviance`).
        """
        observed = self._check(counts)
        if observed.ndim != 1:
            raise ValueError(f"counts has shape {observed.shape}; cells() takes one count vector")
        if limit < 1:
            raise ValueError(f"limit is {limit}; expected at least 1")
        zero = np.nonzero((self.probs <= 0) & (observed > 0))[0]
        zero = zero[np.argsort(-observed[zero], kind="stable")]
        shown = zero if zero.size <= limit else zero[: limit - 1]
        cells = [FitCell(np.array([i]), 0.0, float(observed[i]), 0.0, math.inf) for i in shown]
        if zero.size > shown.size:
            rest = zero[shown.size :]
            cells.append(FitCell(rest, 0.0, float(observed[rest].sum()), 0.0, math.inf))
        if len(cells) >= limit or self.num_groups == 0:
            return cells
        pooled = self._pooled(observed)
        expected = self.pooled_probs * self.num_samples
        shares = deviance(pooled, expected)
        for g in np.argsort(-shares, kind="stable")[: limit - len(cells)]:
            members = np.nonzero(self.groups == g)[0]
            members = members[np.argsort(-self.probs[members], kind="stable")]
            cell = FitCell(
                members, float(self.pooled_probs[g]), float(pooled[g]), float(expected[g]), float(shares[g])
            )
            cells.append(cell)
        return cells

    def observed_tv(self, counts: npt.ArrayLike) -> float:
        """The total variation between one count vector's frequencies and the law, over the cells the
        test sees (the pooled groups and the cells of probability 0): the deviation `detectable_tv`
        speaks of, as observed."""
        observed = self._check(counts)
        if observed.ndim != 1:
            raise ValueError(f"counts has shape {observed.shape}; observed_tv() takes one count vector")
        outside = float(observed[self.probs <= 0].sum())
        pooled = self._pooled(observed) if self.num_groups else np.zeros(0)
        inside = float(np.abs(pooled - self.pooled_probs * self.num_samples).sum())
        return 0.5 * (inside + outside) / self.num_samples

    def _check(self, counts: npt.ArrayLike) -> F64Array:
        observed = np.asarray(counts, dtype=np.float64)
        if observed.shape[-1:] != self.probs.shape:
            raise ValueError(f"counts has shape {observed.shape}; expected [..., {self.probs.shape[0]}]")
        totals = observed.sum(axis=-1)
        if np.any(np.abs(totals - self.num_samples) > 0.5):
            raise ValueError(
                f"counts sum to {np.unique(totals)[:4].tolist()}; expected N = {self.num_samples}"
            )
        return observed


def worst_case_deviation(fit: GoodnessOfFit, eps: float, where: str = "head", sign: float = 1.0) -> F64Array:
    """A law at total variation ``eps`` from ``fit.probs``, shaped as the stated power's worst case.

    The pooled cells are split at half the mass, by rank; the half in the ``head`` (the most probable
    cells) or the ``tail`` gains mass (``sign = 1``) or loses it (``sign = -1``) in proportion to its
    probabilities, the other half the opposite, each cell keeping its share of its pooled group. When
    the halves hold exactly half the mass each, the non-centrality ``4 N eps**2`` is the smallest any
    deviation of size ``eps`` has: the deviation `GoodnessOfFit.detectable_tv` promises to catch.
    """
    if where not in ("head", "tail"):
        raise ValueError(f"where is {where!r}; expected 'head' or 'tail'")
    pooled = fit.pooled_probs
    half = int(np.argmin(np.abs(np.cumsum(pooled) - 0.5))) + 1
    half = min(max(half, 1), pooled.shape[0] - 1)
    ranks = np.arange(pooled.shape[0])
    moved = ranks < half if where == "head" else ranks >= half
    mass = float(pooled[moved].sum())
    ratio = np.where(moved, 1 + sign * eps / mass, 1 - sign * eps / (1 - mass))
    if np.any(ratio < 0):
        raise ValueError(f"eps is {eps}; a half of mass {min(mass, 1 - mass):.4g} cannot lose that much")
    law = fit.probs / fit.probs.sum()
    return np.asarray(
        np.where(fit.groups >= 0, law * ratio[np.maximum(fit.groups, 0)], 0.0), dtype=np.float64
    )


def goodness_of_fit(
    counts: npt.ArrayLike,
    probs: npt.ArrayLike,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
    min_expected: float = MIN_EXPECTED,
) -> TestResult:
    """The G-test of observed ``counts`` against the law ``probs`` (`GoodnessOfFit`: pooled cells each
    expecting ``>= min_expected``, p-value 0 on a cell of probability 0); both are flattened."""
    observed = np.asarray(counts, dtype=np.float64).reshape(-1)
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    if observed.shape != p.shape:
        raise ValueError(f"counts has shape {observed.shape}; expected the shape of probs {p.shape}")
    n = round(float(observed.sum()))
    if n == 0:
        raise ValueError("counts sums to 0; expected at least one observation")
    return GoodnessOfFit(p, n, alpha, beta, min_expected).test(observed)


def binomial_pvalues(counts: npt.ArrayLike, num_trials: int, prob: float) -> F64Array:
    """Two-sided exact binomial p-values, ``min(1, 2 min(P(X <= k), P(X >= k)))`` for ``X ~ Bin(n, p)``.

    The central two-sided p-value: at most twice the smaller tail, so the test is exact and slightly
    conservative; ``p = 0`` (or 1) gives p-value 0 for any count that law cannot produce.
    """
    k = np.asarray(counts, dtype=np.float64)
    lower = special.bdtr(k, num_trials, prob)
    upper = np.where(k > 0, special.bdtrc(k - 1, num_trials, prob), 1.0)
    return np.asarray(np.minimum(1.0, 2.0 * np.minimum(lower, upper)), dtype=np.float64)


@functools.lru_cache(maxsize=65536)
def binomial_detectable(
    num_trials: int, prob: float, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA
) -> float:
    """The smallest ``delta`` such that every ``Bin(n, p +- d)``, ``d >= delta``, is rejected w.p. 1 - beta.

    Each direction that exists is solved for (``p + d <= 1``, ``p - d >= 0``) and the larger
    requirement is returned. A direction in which even the extreme law is not rejected with that power
    contributes its whole room (``p`` downwards, ``1 - p`` upwards): no deviation of that direction is
    promised. ``inf`` without trials.
    """
    if num_trials < 1:
        return math.inf
    ks = np.arange(num_trials + 1, dtype=np.float64)
    rejected = binomial_pvalues(ks, num_trials, prob) < alpha
    accepted = np.nonzero(~rejected)[0]
    low, high = int(accepted[0]), int(accepted[-1])  # the acceptance region is an interval

    def power(q: float) -> float:
        below = special.bdtr(low - 1, num_trials, q) if low > 0 else 0.0
        above = special.bdtrc(high, num_trials, q)
        return float(below + above)

    requirements = [0.0]
    for direction, room in ((1.0, 1.0 - prob), (-1.0, prob)):
        if room <= 0.0:
            continue
        if power(prob + direction * room) < 1.0 - beta:
            requirements.append(room)
            continue
        requirements.append(
            optimize.brentq(lambda d, s=direction: power(prob + s * d) - (1.0 - beta), 0.0, room, xtol=1e-9)
        )
    return max(requirements)


def binomial_test(
    count: int, num_trials: int, prob: float, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA
) -> TestResult:
    """Exact two-sided test of ``count`` successes in ``num_trials`` against success probability ``prob``."""
    if not 0 <= count <= num_trials:
        raise ValueError(f"count is {count}; expected 0 <= count <= num_trials = {num_trials}")
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f"prob is {prob}; expected a probability in [0, 1]")
    pvalue = float(binomial_pvalues(count, num_trials, prob))
    detectable = binomial_detectable(num_trials, float(prob), alpha, beta)
    reject = pvalue < alpha
    observed = count / num_trials if num_trials else math.nan
    reason = (
        f"{count}/{num_trials}={observed:.4g} vs p={prob:.4g}: p-value {pvalue:.3g} "
        f"{'<' if reject else '>='} alpha={alpha:g}; detects |delta|>={detectable:.4f}"
    )
    return TestResult(observed, pvalue, 1, reject, num_trials, alpha, detectable, beta, reason)


def holm_adjusted(pvalues: npt.ArrayLike) -> F64Array:
    """Holm's step-down adjusted p-values: test ``i`` is rejected at family level ``alpha`` iff below it.

    ``adjusted_(i) = max_{j <= i} min(1, (k - j) p_(j))`` over the p-values sorted increasingly; it
    controls the family-wise error rate under any dependence between the tests.
    """
    p = np.asarray(pvalues, dtype=np.float64).reshape(-1)
    k = p.shape[0]
    if k == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (k - np.arange(k)) * p[order])
    adjusted = np.empty(k)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def two_sample_test(
    counts_a: npt.ArrayLike,
    counts_b: npt.ArrayLike,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
    min_expected: float = MIN_EXPECTED,
) -> TestResult:
    """The G-test of homogeneity: were two count vectors drawn from the same (unknown) law?

    Compares two variants with each other. Cells are pooled by the rank of the combined counts so every
    pooled cell expects ``>= min_expected`` observations in each sample; Williams' correction for a
    ``2 x k`` table applies. The detectable total variation between the two laws uses the effective
    sample size ``N_a N_b / (N_a + N_b)`` (the non-centrality is at least ``4 N_eff TV**2``).
    """
    a = np.asarray(counts_a, dtype=np.float64).reshape(-1)
    b = np.asarray(counts_b, dtype=np.float64).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"counts_b has shape {b.shape}; expected the shape of counts_a {a.shape}")
    n_a, n_b = round(float(a.sum())), round(float(b.sum()))
    if n_a == 0 or n_b == 0:
        raise ValueError(f"samples have sizes {n_a} and {n_b}; expected both >= 1")
    n = n_a + n_b
    effective = n_a * n_b / n
    groups = pool_cells((a + b) / n, min(n_a, n_b), min_expected)
    k = int(groups.max()) + 1
    if k < 2:
        return TestResult(0.0, 1.0, 1, False, n, alpha, math.inf, beta, "one pooled cell: nothing to test")
    member = groups >= 0
    pooled_a = np.bincount(groups[member], weights=a[member], minlength=k)
    pooled_b = np.bincount(groups[member], weights=b[member], minlength=k)
    column = pooled_a + pooled_b
    table = np.stack([pooled_a, pooled_b])
    expected = np.outer([n_a, n_b], column) / n
    williams = 1.0 + (n / n_a + n / n_b - 1.0) * (float(np.sum(n / column)) - 1.0) / (6.0 * n * (k - 1))
    statistic = float(_g_statistic(table.reshape(-1), expected.reshape(-1))) / williams
    pvalue = float(stats.chi2.sf(statistic, k - 1))
    detectable = math.sqrt(_required_noncentrality(alpha, beta, k) / (4.0 * effective))
    reason = _g_reason(statistic, k - 1, pvalue, alpha, f"{n_a}+{n_b}", detectable)
    return TestResult(statistic, pvalue, k - 1, pvalue < alpha, n, alpha, detectable, beta, reason)
