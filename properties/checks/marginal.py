"""The marginal: with drafts drawn from ``q`` afresh in every trial, every reached position follows ``p``.

The speculative-sampling theorem; it applies to lossless methods only (not synthetic sampling). Per
request and position ``k``: a G-test of the tokens at ``k`` of the trials that reached it against
``p_k`` (pooled cells; one observation of probability 0 rejects). Holm combines them at level
``alpha`` (the false-failure rate). ``detectable``: the total variation at position 0 (reached by
every trial) detected with power 0.999 at Holm's first level, the largest over requests.

Token-wise methods: a trial reaches position ``k`` when it emits more than ``k`` tokens (its first
``k`` drafts were accepted), and the token it emits there follows ``p_k``.

Methods that verify jointly (block verification): the token of a position reached that way is not
distributed as ``p_k`` (block verification keeps drafts that token-wise verification would reject,
and its weighted residuals after them make up the difference). What is lossless is the output
continued by the target: each trial's emitted tokens followed, after position ``m``, by fresh draws
from the target rows ``p_{m+1} .. p_n`` (exact float64 draws from a generator derived from the
check's seed, so a verdict replays). A trial reaches position ``k`` when the first ``k`` tokens of
that sequence equal its drafts ``d_0 .. d_{k-1}``, and its token there follows ``p_k``: the drafts
are drawn from fixed rows ``q_i``, the target rows are fixed too, so the sequence follows the
target law position by position.

A failure shows the tokens at the decisive position that weigh most (those of probability 0 first)
and the total variation seen there.
"""

from __future__ import annotations

import functools
import math

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
    derived_rng,
    draw_trials,
    fit_detail,
    impossible_detail,
    impossible_note,
    outcome_label,
    pooled_cells,
)
from specsample.reference.contract import Arithmetic, SpecBatch, Variant
from specsample.reference.methods import METHODS

I64Array = npt.NDArray[np.int64]
F64Array = npt.NDArray[np.float64]


def drafts_from_q(batch: SpecBatch | CheckedBatch, num_trials: int, seed: int) -> I64Array:
    """Draft ids for ``num_trials`` replicas of each request, drawn from each position's ``q``.

    Request-major, as `draw_trials` lays replicas out. One-hot drafts have ``q = onehot(d)``, so they
    stay as they are; placeholders stay placeholders (a placeholder rejects and emits ``y ~ p``, so the
    theorem still holds there).
    """
    rng = derived_rng(seed, "drafts")
    parts = []
    for inputs in CheckedBatch.of(batch).inputs:
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


def continued(tokens: I64Array, emitted: I64Array, target: F64Array, rng: np.random.Generator) -> I64Array:
    """``[N, n + 1]`` each trial's emitted tokens, then fresh float64 draws from the target rows
    ``p_{m+1} .. p_n`` (``target [n + 1, V]``) after its last emitted position ``m``."""
    num_trials, rows = tokens.shape[0], target.shape[0]
    cdf = np.cumsum(target, axis=1)
    u = rng.random((num_trials, rows)) * cdf[:, -1][None, :]
    fresh = np.stack([np.searchsorted(cdf[k], u[:, k], side="right") for k in range(rows)], axis=1)
    # Rounding may land past the last token of positive mass; step back to it.
    last_positive = target.shape[1] - 1 - np.argmax(target[:, ::-1] > 0, axis=1)
    fresh = np.minimum(fresh, last_positive[None, :])
    inside = np.arange(rows)[None, :] < emitted[:, None]
    return np.asarray(np.where(inside, tokens[:, :rows], fresh), dtype=np.int64)


def trial_drafts(batch: SpecBatch | CheckedBatch, trials: Trials, request: int) -> I64Array:
    """``[N, n]`` the drafts each trial of ``request`` saw (the batch's own when none were drawn)."""
    checked = CheckedBatch.of(batch)
    counts = checked.batch.num_drafts()
    n, num_trials = counts[request], trials.num_trials
    if trials.draft_token_ids is None:
        own = checked.inputs[request].draft_token_ids
        return np.repeat(own[None, :], num_trials, axis=0)
    start = num_trials * sum(counts[:request])
    return trials.draft_token_ids[start : start + num_trials * n].reshape(num_trials, n)


def components(
    batch: SpecBatch | CheckedBatch,
    trials: Trials,
    alpha: float,
    arithmetic: Arithmetic = "log",
    seed: int = 0,
) -> tuple[list[Component], Deviation]:
    """The tests of every position's marginal, and the deviation they detect (the law of ``batch``
    in ``arithmetic``, or the one a `CheckedBatch` holds; ``seed`` derives the target's
    continuation of the outputs of a method that verifies jointly)."""
    checked = CheckedBatch.of(batch, arithmetic)
    vocab_size = checked.batch.vocab_size
    joint = METHODS[checked.batch.method].verifies_jointly
    rng = derived_rng(seed, "continuation")
    tests: list[Component] = []
    first_rows = []
    for b, law in enumerate(checked.laws):
        if checked.ambiguous[b]:
            continue
        tokens, emitted = trials.request_rows(b)
        n = law.accept_probs.shape[0]
        emitted = np.clip(emitted, 0, n + 1)
        first_rows.append(law.target_probs[0])
        if joint:
            sequence = continued(tokens, emitted, law.target_probs, rng)
            drafts = trial_drafts(checked, trials, b)
        for k in range(n + 1):
            if joint:
                reached = sequence[np.all(sequence[:, :k] == drafts[:, :k], axis=1), k]
            else:
                reached = tokens[emitted > k, k]
            if reached.size == 0:
                continue
            inside = (reached >= 0) & (reached < vocab_size)
            if not inside.all():
                bad = int(np.sum(~inside))
                what = f"ids out of range at position {k}"
                label = f"position {k}: an id outside [0, {vocab_size})"
                explain = functools.partial(impossible_detail, label, bad, reached.size)
                tests.append(Component(b, k, 0.0, float(bad), what, explain))
                continue
            counts = np.bincount(reached, minlength=vocab_size)
            fit = stats.GoodnessOfFit(law.target_probs[k], reached.size)
            pvalue = float(fit.pvalues(counts))
            what = f"position {k} vs p_{k}: G over {pooled_cells(fit.num_groups)}, N={reached.size}"
            if pvalue == 0.0:
                what += impossible_note(law.target_probs[k], counts, lambda t: f"token {t}")
            explain = functools.partial(_position_detail, law.target_probs[k], k, reached)
            tests.append(Component(b, k, pvalue, float(fit.statistics(counts)), what, explain))
    level = alpha / max(len(tests), 1)
    fits = [stats.GoodnessOfFit(p, trials.num_trials, alpha=level) for p in first_rows]
    detectable = max([fit.detectable_tv for fit in fits], default=math.inf)
    return tests, Deviation(detectable, "total variation")


def _position_detail(target: F64Array, k: int, reached: I64Array) -> Detail:
    """The detail of the G-test of position ``k`` against its target law, on the tokens ``reached``."""
    fit = stats.GoodnessOfFit(target, reached.size)
    counts = np.bincount(reached, minlength=target.size)
    return fit_detail(
        fit, counts, lambda c: f"position {k}: {outcome_label(c.members.tolist(), c.probability)}"
    )


class Marginal(StatisticalCheck):
    """Every reached position follows ``p`` when the drafts are drawn from ``q`` (lossless methods; for
    a method that verifies jointly, positions of the output continued by the target)."""

    name = "marginal"
    shares_trials = False
    varies = "each trial with a fresh seed and drafts drawn afresh from q"

    def __init__(self, max_elements: int | None = None) -> None:
        self.max_elements = max_elements

    def applies(self, variant: Variant, batch: SpecBatch) -> bool:
        """Only lossless chain methods keep the target's marginal, and only over more than one token (a
        tree's drafts are its nodes: the law of the emitted sequence, `law_of_y`, is its whole law)."""
        method = METHODS[batch.method]
        return method.lossless and not method.verifies_tree and batch.vocab_size > 1

    def draw(self, variant: Variant, checked: CheckedBatch, settings: Settings) -> Trials:
        """Trials with every trial's drafts drawn afresh from ``q``."""
        ids = drafts_from_q(checked, settings.num_samples, settings.seed)
        return draw_trials(
            variant, checked.batch, settings.num_samples, settings.seed, draft_token_ids=ids,
            purpose="marginal", max_elements=self.max_elements,
        )  # fmt: skip

    def components(
        self, checked: CheckedBatch, trials: Trials, settings: Settings
    ) -> tuple[list[Component], Deviation]:
        """The tests of every position's marginal, and the deviation they detect."""
        return components(checked, trials, settings.alpha, seed=settings.seed)


CHECK = Marginal()
