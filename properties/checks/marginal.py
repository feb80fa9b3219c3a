"""The marginal: with drafts drawn from ``q`` afresh in every trial, every reached position follows ``p``.

The speculative-sampling theorem; it applies to lossless methods only (not synthetic sampling). Per
request and position ``k``: a G-test of the tokens emitted at ``k`` by the trials that reached it
against ``p_k`` (pooled cells; one observation of probability 0 rejects). Holm combines them at
level ``alpha``. ``detectable``: the total variation at position 0 (reached by every trial) detected
with power 0.999 at Holm's first level, the largest over requests.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from specsample.properties import stats
from specsample.properties.checks.base import (
    Component,
    Deviation,
    Settings,
    StatisticalCheck,
    Trials,
    derived_rng,
    draw_trials,
    largest,
)
from specsample.reference.contract import Arithmetic, SpecBatch, Variant
from specsample.reference.law import exact_law, request_inputs
from specsample.reference.methods import METHODS

I64Array = npt.NDArray[np.int64]


def drafts_from_q(batch: SpecBatch, num_trials: int, seed: int) -> I64Array:
    """Draft ids for ``num_trials`` replicas of each request, drawn from each position's ``q``.

    Request-major, as `draw_trials` lays replicas out. One-hot drafts have ``q = onehot(d)``, so they
    stay as they are; placeholders stay placeholders (a placeholder rejects and emits ``y ~ p``, so the
    theorem still holds there).
    """
    rng = derived_rng(seed, "drafts")
    parts = []
    for inputs in request_inputs(batch):
        n = inputs.num_drafts
        ids = np.repeat(inputs.draft_token_ids[None, :], num_trials, axis=0)
        if inputs.draft_logits is not None and n:
            q = inputs.draft_probs()
            cdf = np.cumsum(q, axis=1)
            u = rng.random((num_trials, n)) * cdf[:, -1]
            drawn = np.stack([np.searchsorted(cdf[i], u[:, i], side="right") for i in range(n)], axis=1)
            drawn = np.minimum(drawn, q.shape[1] - 1)
            ids = np.where(inputs.draft_token_ids[None, :] >= 0, drawn, ids)
        parts.append(ids.reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def components(
    batch: SpecBatch, trials: Trials, alpha: float, arithmetic: Arithmetic = "log"
) -> tuple[list[Component], Deviation]:
    """The tests of every position's marginal, and the deviation they detect."""
    vocab_size = batch.vocab_size
    tests: list[Component] = []
    first_rows = []
    for b, law in enumerate(exact_law(batch, arithmetic)):
        tokens, emitted = trials.request_rows(b)
        n = law.accept_probs.shape[0]
        emitted = np.clip(emitted, 0, n + 1)
        first_rows.append(law.target_probs[0])
        for k in range(n + 1):
            reached = tokens[emitted > k, k]
            if reached.size == 0:
                continue
            inside = (reached >= 0) & (reached < vocab_size)
            if not inside.all():
                tests.append(
                    Component(b, k, 0.0, float(np.sum(~inside)), f"ids out of range at position {k}")
                )
                continue
            counts = np.bincount(reached, minlength=vocab_size)
            fit = stats.GoodnessOfFit(law.target_probs[k], reached.size)
            what = f"position {k} vs p_{k}: G over {fit.num_groups} pooled cells, N={reached.size}"
            tests.append(Component(b, k, float(fit.pvalues(counts)), float(fit.statistics(counts)), what))
    level = alpha / max(len(tests), 1)
    detectable = largest(
        [stats.GoodnessOfFit(p, trials.num_trials, alpha=level).detectable_tv for p in first_rows]
    )
    return tests, Deviation(detectable, "total variation")


class Marginal(StatisticalCheck):
    """Every reached position follows ``p`` when the drafts are drawn from ``q`` (lossless methods)."""

    name = "marginal"
    shares_trials = False

    def __init__(self, max_elements: int | None = None) -> None:
        self.max_elements = max_elements

    def applies(self, variant: Variant, batch: SpecBatch) -> bool:
        """Only lossless methods keep the target's marginal, and only over more than one token."""
        return METHODS[batch.method].lossless and batch.vocab_size > 1

    def draw(self, variant: Variant, batch: SpecBatch, settings: Settings) -> Trials:
        """Trials with every trial's drafts drawn afresh from ``q``."""
        ids = drafts_from_q(batch, settings.num_samples, settings.seed)
        return draw_trials(
            variant, batch, settings.num_samples, settings.seed, draft_token_ids=ids, purpose="marginal",
            max_elements=self.max_elements,
        )  # fmt: skip

    def components(
        self, batch: SpecBatch, trials: Trials, settings: Settings
    ) -> tuple[list[Component], Deviation]:
        """The tests of every position's marginal, and the deviation they detect."""
        return components(batch, trials, settings.alpha, settings.arithmetic)


CHECK = Marginal()
