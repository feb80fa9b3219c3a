"""The law of ``y``: the emitted token follows the exact law given the number accepted.

Per request: a G-test of the joint law of ``(m, y)``, a G-test of ``y`` given each ``m = j`` that
occurred (cells pooled by probability rank, every pooled cell expecting >= 20; one observation of
probability 0 rejects, which covers the zero-probability tokens), and exact binomial tests of
`bug_shaped_sets` given each ``m = j``. Holm combines all of them at level ``alpha``.
``detectable``: the total variation on the joint law of ``(m, y)`` detected with power 0.999 (at
Holm's first level ``alpha / k``), the largest over requests.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from specsample.properties import stats
from specsample.properties.checks.base import (
    CheckedBatch,
    Component,
    Deviation,
    Settings,
    StatisticalCheck,
    Trials,
)
from specsample.reference.contract import Arithmetic, SpecBatch, Variant

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
        tokens, emitted = trials.request_rows(b)
        n = law.accept_probs.shape[0]
        m = emitted - 1
        ok = (m >= 0) & (m <= n)
        y = np.where(ok, tokens[np.arange(m.shape[0]), np.clip(m, 0, tokens.shape[1] - 1)], -1)
        ok &= (y >= 0) & (y < vocab_size)
        if not ok.all():
            bad = int(np.sum(~ok))
            tests.append(Component(b, None, 0.0, float(bad), f"{bad} trials with m or y out of range"))
        m, y = m[ok], y[ok]
        if m.size == 0 or (n + 1) * vocab_size == 1:
            continue  # a request with one possible outcome has no law to get wrong
        joint_law = law.joint_probs().reshape(-1)
        joints.append(joint_law)
        joint = np.bincount(m * vocab_size + y, minlength=(n + 1) * vocab_size).astype(np.float64)
        fit = stats.GoodnessOfFit(joint_law, m.size)
        what = f"joint law of (m, y): G over {fit.num_groups} pooled cells, N={m.size}"
        tests.append(Component(b, None, float(fit.pvalues(joint)), float(fit.statistics(joint)), what))
        joint = joint.reshape(n + 1, vocab_size)
        for j in range(n + 1):
            reached = int(joint[j].sum())
            if reached == 0:
                continue
            fit, row = stats.GoodnessOfFit(law.token_probs[j], reached), joint[j]
            what = f"y given m={j}: G over {fit.num_groups} pooled cells, N={reached}"
            tests.append(Component(b, j, float(fit.pvalues(row)), float(fit.statistics(row)), what))
            draft = int(law.draft_token_ids[j]) if j < n else -1
            for name, chosen in bug_shaped_sets(vocab_size, draft, block_size).items():
                p = float(law.token_probs[j, chosen].sum())
                hits = int(joint[j, chosen].sum())
                pvalue = float(stats.binomial_pvalues(hits, reached, p))
                what = f"y in {name} given m={j}: {hits}/{reached}, P={p:.4g}"
                tests.append(Component(b, j, pvalue, hits / reached, what))
    level = alpha / max(len(tests), 1)
    fits = [stats.GoodnessOfFit(j, trials.num_trials, alpha=level) for j in joints]
    detectable = max([fit.detectable_tv for fit in fits], default=math.inf)
    return tests, Deviation(detectable, "total variation")


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
