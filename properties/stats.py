"""The statistics engine: goodness-of-fit tests that state what they can detect.

Every test returns a `TestResult` carrying its statistic, p-value, sample size and the smallest
total-variation deviation it detects with the stated power. The detectable deviation comes from
the non-central chi-squared: a law at total-variation distance ``eps`` from the null has Pearson
non-centrality at least ``4 * N * eps**2`` (Cauchy-Schwarz: ``(sum |d|)**2 <= sum(d**2 / p)``),
so a test whose critical value is crossed with probability ``1 - beta`` at non-centrality
``lambda`` detects every deviation of at least ``sqrt(lambda / (4 N))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import optimize, stats

DEFAULT_ALPHA = 1e-6
DEFAULT_BETA = 1e-3
MIN_EXPECTED = 20.0


@dataclass(frozen=True)
class TestResult:
    """The outcome of one statistical test.

    Attributes:
        statistic: the test statistic (Pearson's chi-squared for `goodness_of_fit`).
        pvalue: the p-value under the null.
        df: degrees of freedom.
        reject: whether ``pvalue < alpha`` (or an impossible cell was hit).
        num_samples: the sample size ``N``.
        alpha: the false-failure rate of this assertion.
        detectable_tv: the smallest total-variation deviation (on the pooled cells) rejected with
            probability at least ``1 - beta``.
        beta: one minus the stated power.
        reason: a short human-readable account of the verdict.
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


def noncentrality_for_power(alpha: float, beta: float, df: int) -> float:
    """The non-centrality ``lambda`` at which a level-``alpha`` chi-squared test has power ``1 - beta``."""
    critical = stats.chi2.isf(alpha, df)

    def shortfall(lam: float) -> float:
        return float(stats.ncx2.sf(critical, df, lam)) - (1.0 - beta)

    high = 1.0
    while shortfall(high) < 0:
        high *= 2.0
    return float(optimize.brentq(shortfall, 0.0, high, xtol=1e-10, rtol=1e-12))


def min_discrepancy(
    num_samples: int, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA, num_cells: int = 2
) -> float:
    """The smallest total-variation deviation over ``num_cells`` cells detected with power ``1 - beta``."""
    df = max(num_cells - 1, 1)
    return math.sqrt(noncentrality_for_power(alpha, beta, df) / (4.0 * num_samples))


def min_num_samples(
    eps: float, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA, num_cells: int = 2
) -> int:
    """The sample size at which a total-variation deviation ``eps`` is detected with power ``1 - beta``."""
    df = max(num_cells - 1, 1)
    return math.ceil(noncentrality_for_power(alpha, beta, df) / (4.0 * eps * eps))


def pool_cells(
    probs: npt.ArrayLike, num_samples: int, min_expected: float = MIN_EXPECTED
) -> npt.NDArray[np.int64]:
    """Group the cells of positive probability by rank so every group expects ``>= min_expected``.

    Returns a group index per cell, ``-1`` for cells of probability 0. Cells are taken from the most
    to the least probable; a trailing group short of ``min_expected`` merges into the one before it.
    """
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    groups = np.full(p.shape[0], -1, dtype=np.int64)
    order = [int(i) for i in np.argsort(-p, kind="stable") if p[i] > 0]
    group, expected = 0, 0.0
    members: list[list[int]] = [[]]
    for i in order:
        members[group].append(i)
        expected += p[i] * num_samples
        if expected >= min_expected:
            group, expected = group + 1, 0.0
            members.append([])
    if not members[-1]:
        members.pop()
    elif len(members) > 1 and expected < min_expected:
        members[-2].extend(members.pop())
    for g, cells in enumerate(members):
        groups[cells] = g
    return groups


def goodness_of_fit(
    counts: npt.ArrayLike,
    probs: npt.ArrayLike,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
    min_expected: float = MIN_EXPECTED,
) -> TestResult:
    """Pearson's chi-squared test of observed ``counts`` against the law ``probs``.

    Cells are pooled by probability rank (`pool_cells`); one observation in a cell of probability
    exactly 0 rejects outright (p-value 0).
    """
    observed = np.asarray(counts, dtype=np.float64).reshape(-1)
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    if observed.shape != p.shape:
        raise ValueError(f"counts has shape {observed.shape}; expected the shape of probs {p.shape}")
    n = int(observed.sum())
    if n == 0:
        raise ValueError("counts sums to 0; expected at least one observation")
    impossible = float(observed[p <= 0].sum())
    groups = pool_cells(p, n, min_expected)
    num_groups = int(groups.max()) + 1 if (groups >= 0).any() else 0
    df = max(num_groups - 1, 1)
    detectable = min_discrepancy(n, alpha, beta, num_groups)
    if impossible > 0:
        cells = np.nonzero((p <= 0) & (observed > 0))[0].tolist()
        return TestResult(
            math.inf,
            0.0,
            df,
            True,
            n,
            alpha,
            detectable,
            beta,
            f"{int(impossible)} observations in cells of probability 0: {cells[:8]}",
        )
    if num_groups < 2:
        return TestResult(0.0, 1.0, df, False, n, alpha, detectable, beta, "one pooled cell: nothing to test")
    pooled_obs = np.bincount(groups[groups >= 0], weights=observed[groups >= 0], minlength=num_groups)
    pooled_exp = np.bincount(groups[groups >= 0], weights=p[groups >= 0], minlength=num_groups)
    pooled_exp = pooled_exp / pooled_exp.sum() * n
    statistic = float(np.sum((pooled_obs - pooled_exp) ** 2 / pooled_exp))
    pvalue = float(stats.chi2.sf(statistic, num_groups - 1))
    reject = pvalue < alpha
    reason = (
        f"chi2={statistic:.2f} df={num_groups - 1} p={pvalue:.3g} "
        f"{'<' if reject else '>='} alpha={alpha:g}; N={n} detects TV>={detectable:.4f}"
    )
    return TestResult(statistic, pvalue, num_groups - 1, reject, n, alpha, detectable, beta, reason)
