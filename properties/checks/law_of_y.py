"""The law of ``y``: the emitted token follows the exact law given the number accepted.

Per request: a G-test of the joint law of ``(m, y)``, a G-test of ``y`` given each ``m = j`` that
occurred (cells pooled by probability rank, every pooled cell expecting >= 20; one observation of
probability 0 rejects, which covers the zero-probability tokens), and exact binomial tests of
`bug_shaped_sets` given each ``m = j``. On a tree, ``m`` is the stop row (which node the walk stopped
at), so the joint law is the law of the emitted sequence. Holm combines all of them at level ``alpha``.
``detectable``: the total variation on the joint law of ``(m, y)`` detected with power 0.999 (at
Holm's first level ``alpha / k``), the largest over requests. A failure shows the outcomes that weigh
most in its decisive test (those of probability 0 first) and the total variation it saw.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from specsample.properties import stats
from specsample.properties.checks.base import (
    CheckedBatch,
    Component,
    Detail,
    Deviation,
    Settings,
    StatisticalCheck,
    Trials,
    binomial_detail,
    fit_detail,
    impossible_detail,
    impossible_note,
    outcome_label,
    pooled_cells,
)
from specsample.reference.contract import Arithmetic, SpecBatch, Variant
from specsample.reference.law import RequestLaw

DEFAULT_BLOCK_SIZE = 4096
I64Array = npt.NDArray[np.int64]


def bug_shaped_sets(vocab_size: int, draft: int, block_size: int = DEFAULT_BLOCK_SIZE) -> dict[str, I64Array]:
    """Token sets where real bugs put or lose mass: the first and last ids, the last tile, the draft.

    Token 0 and ``V - 1`` are where degenerate residuals fall back (M19); the last tile of
    ``block_size`` tokens is what a dropped tile loses (M16); the draft token is what a residual that
    subtracts ``q`` only at the draft (M04) or an unclamped residual (M03) gets wrong.
    """
    sets: dict[str, I64Array] = {"token 0": np.array([0])}
    if vocab_size > 1:
        sets[f"token {vocab_size - 1}"] = np.array([vocab_size - 1])
    if vocab_size > block_size:
        first = vocab_size - (vocab_size % block_size or block_size)
        sets[f"last tile [{first}, {vocab_size})"] = np.arange(first, vocab_size)
    if 0 <= draft < vocab_size and draft not in (0, vocab_size - 1):
        sets[f"draft token {draft}"] = np.array([draft])
    return sets


def components(
    batch: SpecBatch | CheckedBatch,
    trials: Trials,
    alpha: float,
    block_size: int = DEFAULT_BLOCK_SIZE,
    arithmetic: Arithmetic = "log",
) -> tuple[list[Component], Deviation]:
    """The tests of the law of y given m, and the deviation they detect (the law of ``batch`` in
    ``arithmetic``, or the one a `CheckedBatch` holds)."""
    checked = CheckedBatch.of(batch, arithmetic)
    vocab_size = checked.batch.vocab_size
    tests: list[Component] = []
    joints = []
    for b, law in enumerate(checked.laws):
        if checked.ambiguous[b]:
            continue
        n = law.accept_probs.shape[0]
        parents = checked.inputs[b].tree_parent
        words = stop_words(parents)
        m, y = trials.outcomes(b)
        ok = (m >= 0) & (y >= 0)
        if not ok.all():
            bad = int(np.sum(~ok))
            what = "m or y out of range" if parents is None else "no path of the tree or y out of range"
            explain = functools.partial(impossible_detail, what, bad, m.size)
            tests.append(Component(b, None, 0.0, float(bad), f"{bad} trials with {what}", explain))
        m, y = m[ok], y[ok]
        if m.size == 0 or (n + 1) * vocab_size == 1:
            continue  # a request with one possible outcome has no law to get wrong
        joint_law = law.joint_probs().reshape(-1)
        joints.append(joint_law)
        joint = np.bincount(m * vocab_size + y, minlength=(n + 1) * vocab_size).astype(np.float64)
        fit = stats.GoodnessOfFit(joint_law, m.size)
        pvalue = float(fit.pvalues(joint))
        pair = "(m, y)" if parents is None else "(stop node, y)"
        what = f"joint law of {pair}: G over {pooled_cells(fit.num_groups)}, N={m.size}"
        if pvalue == 0.0:
            what += impossible_note(
                joint_law, joint, functools.partial(_joint_name, vocab_size=vocab_size, words=words)
            )
        explain = functools.partial(_joint_detail, law, m, y, words)
        tests.append(Component(b, None, pvalue, float(fit.statistics(joint)), what, explain))
        joint = joint.reshape(n + 1, vocab_size)
        for j in range(n + 1):
            reached = int(joint[j].sum())
            if reached == 0:
                continue
            fit, row = stats.GoodnessOfFit(law.token_probs[j], reached), joint[j]
            pvalue = float(fit.pvalues(row))
            what = f"y given {words(j)}: G over {pooled_cells(fit.num_groups)}, N={reached}"
            if pvalue == 0.0:
                what += impossible_note(law.token_probs[j], row, lambda t: f"token {t}")
            explain = functools.partial(_given_detail, law, j, y[m == j], words)
            tests.append(Component(b, j, pvalue, float(fit.statistics(row)), what, explain))
            # A chain's draft token at m = j is where bugs of the residual put mass (not on a tree).
            draft = int(law.draft_token_ids[j]) if j < n and parents is None else -1
            for name, chosen in bug_shaped_sets(vocab_size, draft, block_size).items():
                p = float(law.token_probs[j, chosen].sum())
                hits = int(joint[j, chosen].sum())
                pvalue = float(stats.binomial_pvalues(hits, reached, p))
                what = f"y in {name} given {words(j)}: {hits}/{reached}, P={p:.4g}"
                labels = (f"{name} given {words(j)}", f"other tokens given {words(j)}")
                explain = functools.partial(binomial_detail, labels, hits, reached, p)
                tests.append(Component(b, j, pvalue, hits / reached, what, explain))
    level = alpha / max(len(tests), 1)
    fits = [stats.GoodnessOfFit(j, trials.num_trials, alpha=level) for j in joints]
    detectable = max([fit.detectable_tv for fit in fits], default=math.inf)
    return tests, Deviation(detectable, "total variation")


def stop_words(parents: object) -> Callable[[int], str]:
    """A request's stop index in words: ``m=1`` on a chain; on a tree (``parents`` given) ``a stop at
    node 0`` (``a stop at the root``)."""
    if parents is None:
        return lambda j: f"m={j}"
    return lambda j: "a stop at the root" if j == 0 else f"a stop at node {j - 1}"


def _joint_name(index: int, vocab_size: int, words: Callable[[int], str]) -> str:
    """Outcome ``index`` of a flattened joint law of ``(m, y)`` in words: ``"token 7 with m=1"``."""
    m, y = divmod(index, vocab_size)
    return f"token {y} with {words(m)}"


def _joint_detail(law: RequestLaw, m: I64Array, y: I64Array, words: Callable[[int], str]) -> Detail:
    """The detail of the G-test of the joint law of ``(m, y)`` on trials ``(m, y)``."""
    vocab_size = law.token_probs.shape[1]
    joint_law = law.joint_probs().reshape(-1)
    counts = np.bincount(m * vocab_size + y, minlength=joint_law.size)
    fit = stats.GoodnessOfFit(joint_law, m.size)

    def label(cell: stats.FitCell) -> str:
        stops, tokens = np.divmod(cell.members, vocab_size)
        if np.all(stops == stops[0]):
            return outcome_label(tokens.tolist(), cell.probability, context=f" with {words(int(stops[0]))}")
        if cell.members.size <= 3:
            return ", ".join(_joint_name(int(i), vocab_size, words) for i in cell.members)
        mass = "probability 0" if cell.probability == 0 else f"total probability {cell.probability:.3g}"
        return f"{cell.members.size} outcomes (m, y) of {mass}"

    return fit_detail(fit, counts, label)


def _given_detail(law: RequestLaw, j: int, y: I64Array, words: Callable[[int], str]) -> Detail:
    """The detail of the G-test of ``y`` given ``m = j`` on the tokens ``y`` of the trials with ``m = j``."""
    probs = law.token_probs[j]
    fit = stats.GoodnessOfFit(probs, y.size)
    counts = np.bincount(y, minlength=probs.size)
    return fit_detail(
        fit, counts, lambda c: outcome_label(c.members.tolist(), c.probability, context=f" given {words(j)}")
    )


class LawOfY(StatisticalCheck):
    """The emitted token follows the exact law given the number accepted (tests: the module docstring)."""

    name = "law_of_y"

    def applies(self, variant: Variant, batch: SpecBatch) -> bool:
        """Some request has more than one possible outcome ``(m, y)``."""
        return batch.vocab_size > 1 or any(n > 0 for n in batch.num_drafts())

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.block_size = block_size

    def components(
        self, checked: CheckedBatch, trials: Trials, settings: Settings
    ) -> tuple[list[Component], Deviation]:
        """The tests of the law of y given m, and the deviation they detect."""
        return components(checked, trials, settings.alpha, self.block_size)


CHECK = LawOfY()
