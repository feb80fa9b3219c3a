"""The law of ``m``: the number of accepted drafts follows the exact law, request by request.

Exact binomial tests: the count of each ``m = j`` against ``Bin(N, P(m = j))``, and at each position
``i`` the acceptances among the trials that reached it against ``Bin(reached, a_i)``. On a tree the
same tests run on its stop rows (which node the walk stopped at: its accepted path) and on each
node's acceptance among the trials that reached its parent. Holm combines all of them at level
``alpha``. ``detectable``: the absolute deviation of a probability
``P(m = j)`` detected with power 0.999 (at Holm's first level ``alpha / k``), the largest over cells
and requests. A failure shows the cells of ``m`` (or a position's acceptances and rejections) that
weigh most, and the deviation of the decisive probability.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from specsample.properties import stats
from specsample.properties.checks.base import (
    Cell,
    CheckedBatch,
    Component,
    Detail,
    Deviation,
    Settings,
    StatisticalCheck,
    Trials,
    binomial_detail,
    heaviest,
)
from specsample.reference.contract import Arithmetic, SpecBatch


def components(
    batch: SpecBatch | CheckedBatch, trials: Trials, alpha: float, arithmetic: Arithmetic = "log"
) -> tuple[list[Component], Deviation]:
    """The exact binomial tests of the law of m, and the deviation they detect (the law of
    ``batch`` in ``arithmetic``, or the one a `CheckedBatch` holds)."""
    tests: list[Component] = []
    cells: list[tuple[int, float]] = []
    checked = CheckedBatch.of(batch, arithmetic)
    for b, law in enumerate(checked.laws):
        if checked.ambiguous[b]:
            continue
        n = law.accept_probs.shape[0]
        stop, _ = trials.outcomes(b)
        parents = checked.inputs[b].tree_parent
        name, draft = _names(parents)
        size = stop.shape[0]
        impossible = int(np.sum(stop < 0))
        counts = np.bincount(np.clip(stop, 0, n), minlength=n + 1)
        m_cells = [Cell(name(j), int(counts[j]), size * float(law.stop_probs[j])) for j in range(n + 1)]
        if impossible:
            what = (
                f"{impossible} trials with m outside [0, {n}]"
                if parents is None
                else f"{impossible} trials with no path of the tree"
            )
            outside = Cell(f"m outside [0, {n}]" if parents is None else "off the tree", impossible, 0.0)
            explain = functools.partial(Detail, (outside, *heaviest(m_cells)[:-1]), impossible / size)
            tests.append(Component(b, None, 0.0, float(impossible), what, explain))
        for j in range(n + 1):
            p = float(law.stop_probs[j])
            pvalue = float(stats.binomial_pvalues(counts[j], size, p))
            what = f"{name(j)} in {counts[j]}/{size} trials, P={p:.4g}"
            others = m_cells[:j] + m_cells[j + 1 :]
            explain = functools.partial(_m_detail, m_cells[j], others, size, p)
            tests.append(Component(b, j, pvalue, counts[j] / size, what, explain))
            cells.append((size, p))
        through = trials.passes(b)
        for i in range(n):
            parent_row = i if parents is None else int(parents[i]) + 1
            reached = int(np.sum(through[:, parent_row]))
            if reached == 0:
                continue
            accepted = int(np.sum(through[:, parent_row] & through[:, i + 1]))
            a = float(law.accept_probs[i])
            pvalue = float(stats.binomial_pvalues(accepted, reached, a))
            what = f"{draft(i)} accepted in {accepted}/{reached} trials, rate {a:.4g}"
            labels = (f"{draft(i)} accepted, of {reached} reaching it", f"{draft(i)} rejected")
            explain = functools.partial(binomial_detail, labels, accepted, reached, a, heaviest(m_cells, 3))
            tests.append(Component(b, i, pvalue, accepted / reached, what, explain))
    level = alpha / max(len(tests), 1)
    detectable = max([stats.binomial_detectable(size, p, level) for size, p in cells], default=math.inf)
    return tests, Deviation(detectable, "probability")


def _names(parents: object) -> tuple[Callable[[int], str], Callable[[int], str]]:
    """How the cells of a request's law and its drafts are named: ``m=j`` and ``draft i`` on a chain;
    on a tree (``parents`` given) ``stop at node v`` (``at the root``) and ``node i``."""
    if parents is None:
        return (lambda j: f"m={j}"), (lambda i: f"draft {i}")
    return (lambda j: "stop at the root" if j == 0 else f"stop at node {j - 1}"), (lambda i: f"node {i}")


def _m_detail(tested: Cell, others: list[Cell], size: int, prob: float) -> Detail:
    """The detail of the test of one ``P(m = j)``: its cell, then the other cells of ``m`` that weigh
    most, and the deviation of the probability."""
    return Detail((tested, *heaviest(others, 4)), abs(tested.observed / size - prob))


class LawOfM(StatisticalCheck):
    """The number of accepted drafts follows the exact law (the module docstring gives the tests)."""

    name = "law_of_m"

    def components(
        self, checked: CheckedBatch, trials: Trials, settings: Settings
    ) -> tuple[list[Component], Deviation]:
        """The exact binomial tests of the law of m, and the deviation they detect."""
        return components(checked, trials, settings.alpha)


CHECK = LawOfM()
