"""Block verification: the drafts verified jointly, lossless, and never fewer accepted.

Block verification (Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro, Suresh, ICLR 2025) decides how
many drafts to keep from all of them at once instead of one at a time. It keeps the output lossless
(the emitted tokens, continued by the target, are distributed as the target) and keeps at least as
many drafts in expectation as token-wise verification, the same number when ``n = 1``.

One request: drafts ``d_0 .. d_{n-1}``; target laws ``p_0 .. p_n`` (row ``i`` is position ``i``
given the drafts before it, row ``n`` the bonus position); draft laws ``q_0 .. q_{n-1}``.

- **Weights.** ``w_0 = 1`` and ``w_{i+1} = min(1, w_i * p_i(d_i) / q_i(d_i))``. A draft of target
  probability 0 gives 0 (it is never kept, whatever ``q`` says, as for the other methods); a draft of
  draft probability 0 and target probability above 0 gives 1. A placeholder (``d_i = -1``) is a draft
  outside the vocabulary, proposed with certainty: its target probability is 0 and its draft law
  ``q_i`` has no mass on the vocabulary (`draft_laws`), so a stop there emits ``y ~ p_i``, as the
  other methods do.
- **Keep probabilities.** For ``1 <= i < n``, with the residual mass
  ``S_i = sum_x max(w_i * p_i(x) - q_i(x), 0)``: ``h_i = S_i / (S_i + 1 - w_i)``, and 1 when both
  ``S_i`` and ``1 - w_i`` are 0. ``h_n = w_n``.
- **Decision.** Independent uniforms ``eta_1 .. eta_n`` in ``[0, 1)``; ``m`` (the drafts kept) is the
  largest ``i`` with ``eta_i < h_i``, or 0 when there is none. So
  ``P(m = i) = h_i * prod_{j > i} (1 - h_j)``, with ``h_0 = 1``.
- **Emitted token.** After ``m = n``: ``y ~ p_n`` (the bonus). After ``m < n``: ``y`` from the
  residual ``max(w_m * p_m - q_m, 0)`` normalised, or ``p_m`` when it has no mass (as for
  probabilistic verification). At ``m = 0`` that is probabilistic verification's residual.

Greedy rows, one-hot drafts and odd values need no rule of their own: a greedy row's ``p`` is
``onehot(argmax)``, a one-hot draft's ``q`` is ``onehot(d)``, and with them the weights keep exactly
the drafts that equal the argmax chain and emit its next token, as greedy verification does.

The rules `next_weight`, `keep_probability` and `residual` work on one position of any number of
requests at once: the exact law below, the scalar reference sampler and the vectorised walk
(`reference.walk`) are all built from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64Array = npt.NDArray[np.float64]
I64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class BlockLaw:
    """The exact law of one request's output under block verification.

    Attributes:
        weights: ``[n + 1]`` the weights ``w_0 .. w_n``.
        keep: ``[n + 1]`` the keep probabilities ``h_0 .. h_n`` (``h_0 = 1``).
        stop_probs: ``[n + 1]`` ``P(m = i)``.
        token_probs: ``[n + 1, V]`` the law of the emitted token given ``m = i``.
    """

    weights: F64Array
    keep: F64Array
    stop_probs: F64Array
    token_probs: F64Array

    @property
    def expected_accepted(self) -> float:
        """``E[m]``, the drafts kept on average."""
        return float(np.dot(np.arange(self.stop_probs.size), self.stop_probs))


def draft_laws(draft: F64Array, ids: npt.ArrayLike) -> F64Array:
    """Rows ``[..., V]`` of the draft laws block verification reads: ``q_i``, and no mass at a placeholder."""
    real = np.asarray(ids)[..., None] >= 0
    return np.asarray(np.where(real, draft, 0.0), dtype=np.float64)


def next_weight(weight: npt.ArrayLike, target_prob: npt.ArrayLike, draft_prob: npt.ArrayLike) -> F64Array:
    """``w_{i+1} = min(1, w_i * p_i(d_i) / q_i(d_i))`` from ``w_i`` and the laws at the draft (the
    module docstring gives the cases ``p(d) = 0`` and ``q(d) = 0``)."""
    w, p, q = (np.asarray(x, dtype=np.float64) for x in (weight, target_prob, draft_prob))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(p <= 0.0, 0.0, np.where(q <= 0.0, np.inf, p / q))
        return np.asarray(np.where(w > 0.0, np.minimum(1.0, w * ratio), 0.0), dtype=np.float64)


def keep_probability(weight: npt.ArrayLike, target: F64Array, draft: F64Array) -> F64Array:
    """``h_i = S_i / (S_i + 1 - w_i)`` of rows ``[..., V]`` (1 where both are 0), for ``1 <= i < n``."""
    w = np.asarray(weight, dtype=np.float64)
    mass = np.maximum(w[..., None] * target - draft, 0.0).sum(axis=-1)
    total = mass + (1.0 - w)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.where(total <= 0.0, 1.0, mass / total), dtype=np.float64)


def residual(weight: npt.ArrayLike, target: F64Array, draft: F64Array) -> F64Array:
    """The law of the token emitted after a stop at ``m < n`` (rows ``[..., V]``): the weighted residual
    ``max(w_m p_m - q_m, 0)`` normalised, or ``p_m`` where it has no mass."""
    w = np.asarray(weight, dtype=np.float64)
    weighted = np.maximum(w[..., None] * target - draft, 0.0)
    total = weighted.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.where(total > 0.0, weighted / total, target), dtype=np.float64)


def block_weights(target: F64Array, draft: F64Array, ids: Sequence[int] | I64Array) -> F64Array:
    """``[n + 1]`` the weights ``w_i`` (the module docstring defines them)."""
    ids = np.asarray(ids, dtype=np.int64)
    weights = np.ones(ids.size + 1)
    for i, token in enumerate(ids):
        p, q = (target[i, token], draft[i, token]) if 0 <= token < target.shape[1] else (0.0, 0.0)
        weights[i + 1] = next_weight(weights[i], p, q)
    return weights


def keep_probabilities(target: F64Array, draft: F64Array, weights: F64Array) -> F64Array:
    """``[n + 1]`` the keep probabilities ``h_i``: ``h_0 = 1``, ``h_n = w_n``."""
    n = weights.size - 1
    keep = np.ones(n + 1)
    if n:
        keep[1:n] = keep_probability(weights[1:n], target[1:n], draft[1:n])
        keep[n] = weights[n]
    return keep


def block_law(target: F64Array, draft: F64Array, ids: Sequence[int] | I64Array) -> BlockLaw:
    """The exact law of ``(m, y)`` for one request (``target [n + 1, V]``, ``draft [n, V]``)."""
    draft = draft_laws(draft, np.asarray(ids, dtype=np.int64))
    weights = block_weights(target, draft, ids)
    keep = keep_probabilities(target, draft, weights)
    n = weights.size - 1
    # P(m = i) = h_i * prod_{j > i} (1 - h_j): the product of what lies above, from the top down.
    above = np.concatenate([np.cumprod((1.0 - keep[1:])[::-1])[::-1], [1.0]])
    stop = keep * above
    # The emitted token after m = i < n: the weighted residual at row i; after m = n: the bonus, p_n.
    tokens = np.stack([residual(weights[i], target[i], draft[i]) for i in range(n)] + [target[n]])
    return BlockLaw(weights=weights, keep=keep, stop_probs=stop, token_probs=tokens)


def kept_drafts(keep: F64Array, uniforms: F64Array) -> int:
    """``m`` from the keep probabilities and the uniforms ``eta_1 .. eta_n`` (``uniforms[i - 1]``):
    the largest ``i`` with ``eta_i < h_i``, or 0."""
    return next((i for i in range(keep.size - 1, 0, -1) if uniforms[i - 1] < keep[i]), 0)
