"""The exact law of a rejection sampler's output, in float64: the specification.

Per request, with target laws ``p_0 .. p_n`` (row ``n`` is the bonus row), draft laws
``q_0 .. q_{n-1}`` and drafts ``d_i``, the output is ``(m, y)``: ``m`` drafts accepted, then one
emitted token ``y``. Position ``i`` follows the rules of `reference.methods` (a placeholder is any
id outside ``[0, V)``; a greedy row has ``p_i = onehot(argmax)``, ties to the lowest index); with all
``n`` accepted, ``y ~ p_n``, the bonus row.

Tree verification (``verifies_tree``: the drafts form a tree, `reference.tree`) indexes every array
by target row instead: ``stop_probs[r]`` is the probability that the walk stops at row ``r`` (the
root's, 0, or node ``v``'s, ``1 + v``: its root path is the accepted one), ``token_probs[r]`` the law
of the emitted token there, ``accept_probs[v]`` the probability of accepting node ``v`` at its
parent (`reference.tree.tree_law`). On a chain the stop row is ``m``.

Block verification (``verifies_jointly`` in the method table) has no per-position rule: its law of
``(m, y)`` is `reference.block.block_law` on the same laws ``p_i`` and ``q_i`` (after temperature;
greedy rows one-hot, one-hot drafts ``onehot(d)``, a placeholder a draft outside the vocabulary), and
``accept_probs[i]`` is ``P(m > i | m >= i)``.

Row laws: NaN logits count as ``-inf``; a row with ``+inf`` logits is uniform over them (the limit
of a growing logit); a row with no finite logit and no ``+inf`` is uniform over the vocabulary.
Temperatures above ``1e30`` act as ``1e30`` (`MAX_TEMPERATURE`: the law is uniform to within
``1e-30`` either way for logits below ``1``, and ``1 / T`` stays a normal float32).
Inputs are upcast to float64 after their own rounding, so fp16 and bf16 logits are exact.

Filtered verification: where the batch carries sampling parameters, every ``p_i`` is the processed
law ``p'_i`` of `reference.filters` (its logits masked to ``-inf`` outside the kept set, read so by
`BatchRows`), and so is every ``q_i`` when the batch's ``draft_filter`` is set; the rules above apply
to the processed laws unchanged.

A sampler that declares ``fp32-probs`` arithmetic (`reference.contract.Capabilities`) is held to
the law of the probabilities it can represent: every ``p_i`` and ``q_i`` below ``2**-126`` is zero
and the row renormalised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from . import block, methods, tree
from .contract import FP32_TINY, Arithmetic, SpecBatch, validate_batch
from .filters import FilterParams, PivotBand, kept_bounds, kept_tokens

F64Array = npt.NDArray[np.float64]
I64Array = npt.NDArray[np.int64]
MAX_TEMPERATURE = 1e30
# Which kept set a read of filtered rows gives: the exact one, or without / with its near pivots.
Pivots = Literal["exact", "lower", "upper"]


# ---------------------------------------------------------------------------------------------
# Row laws: every function works on one row [V] or on rows [..., V]


def clean(logits: npt.ArrayLike) -> F64Array:
    """Logits in float64 with NaN read as ``-inf``."""
    x = np.asarray(logits, dtype=np.float64)
    return np.where(np.isnan(x), -np.inf, x)


def greedy_token(logits: npt.ArrayLike) -> I64Array:
    """The argmax of each row, NaN read as ``-inf``, ties to the lowest index."""
    return np.asarray(np.argmax(clean(logits), axis=-1), dtype=np.int64)


def one_hot(ids: npt.ArrayLike, vocab_size: int) -> F64Array:
    """Rows ``[..., V]`` with 1 at each id, all 0 at a placeholder ``-1``."""
    return np.asarray(np.arange(vocab_size) == np.asarray(ids)[..., None], dtype=np.float64)


def row_probs(logits: npt.ArrayLike, temperature: npt.ArrayLike) -> F64Array:
    """The law ``softmax(logits / T)`` of each row, ``T`` one value or one per row; ``T == 0`` gives
    ``onehot(argmax)``."""
    x = clean(logits)
    t = np.minimum(np.asarray(temperature, dtype=np.float64), MAX_TEMPERATURE)[..., None]
    top = x.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):
        weights = np.exp((x - top) / np.where(t > 0, t, 1.0))
        weights /= weights.sum(axis=-1, keepdims=True)
    # Each case below is skipped where no row has it: the same result, without a pass over every row.
    if np.isposinf(top).any():  # uniform over the +inf entries
        posinf = np.isposinf(x)
        weights = np.where(
            posinf.any(axis=-1, keepdims=True), posinf / np.maximum(posinf.sum(-1, keepdims=True), 1), weights
        )
    if np.isneginf(top).any():  # no finite logit: uniform
        weights = np.where(np.isneginf(top), 1.0 / x.shape[-1], weights)
    if (t == 0.0).any():  # greedy: one-hot at the argmax
        weights = np.where(t == 0.0, one_hot(greedy_token(x), x.shape[-1]), weights)
    return np.asarray(weights, dtype=np.float64)


def token_logprobs(logits: F64Array, temperature: F64Array, tokens: I64Array) -> npt.NDArray[np.float32]:
    """``log softmax(logits / T)`` at each row's token, float32; ``T = 1`` for greedy rows."""
    law = row_probs(logits, np.where(temperature > 0, temperature, 1.0))
    with np.errstate(divide="ignore"):
        return np.log(law[np.arange(tokens.size), np.maximum(tokens, 0)]).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Requests


@dataclass(frozen=True)
class RequestInputs:
    """One request's inputs, upcast to float64 numpy arrays.

    Attributes:
        target_logits: ``[n + 1, V]``.
        draft_logits: ``[n, V]``, or ``None`` for one-hot drafts.
        draft_token_ids: ``[n]``; every id outside ``[0, V)`` already replaced by ``-1``.
        temperature: ``0`` means greedy.
        seed, step: the request's random stream.
        synthetic_rates: ``[n]`` conditional acceptance rates (synthetic only, else ``None``).
        tree_parent: ``[n]`` each node's parent within the request (tree verification, else ``None``).
    """

    target_logits: F64Array
    draft_logits: F64Array | None
    draft_token_ids: I64Array
    temperature: float
    seed: int
    step: int
    synthetic_rates: F64Array | None
    tree_parent: I64Array | None = None

    @property
    def num_drafts(self) -> int:
        """``n``, the number of draft positions."""
        return int(self.draft_token_ids.shape[0])

    @property
    def greedy(self) -> bool:
        """Whether the request is greedy (``T == 0``)."""
        return self.temperature == 0.0

    def target_probs(self) -> F64Array:
        """``[n + 1, V]`` the target laws ``p_i = softmax(target / T)``."""
        return row_probs(self.target_logits, self.temperature)

    def draft_probs(self) -> F64Array:
        """``[n, V]`` the draft laws ``q_i = softmax(draft / T)``, or one-hot on the drafts."""
        if self.draft_logits is not None:
            return row_probs(self.draft_logits, self.temperature)
        return one_hot(self.draft_token_ids, self.target_logits.shape[1])


def _host(tensor: torch.Tensor | None, dtype: torch.dtype = torch.float64) -> Any:
    """``tensor`` as a numpy array of ``dtype`` on the host; ``None`` stays ``None``."""
    return None if tensor is None else tensor.detach().cpu().to(dtype).numpy()


@dataclass(frozen=True)
class BatchRows:
    """A batch read once into float64 numpy arrays, with accessors by request and position.

    Attributes:
        target: ``[R, V]`` target logits.
        draft: ``[D, V]`` or ``[S, K, V]`` draft logits, or ``None`` for one-hot drafts.
        slot: ``[B]`` draft slots (slotted drafts), else ``None``.
        ids: ``[D]`` draft ids, every id outside ``[0, V)`` read as ``-1``.
        starts, counts: ``[B]`` each request's first draft index and draft count.
        temperature, seed, step: ``[B]`` each, seeds and steps int64.
        rates: ``[K]`` synthetic conditional rates, else ``None``.
        parents: ``[D]`` each draft node's parent within its request (tree verification), else ``None``.
        method: the batch's method.
        filters: ``[B]`` each request's sampling parameters, or ``None`` when the batch has none.
        draft_filter: whether the draft rows are filtered too.
        pivots: which kept set `target_rows` and `draft_rows` mask with: ``"exact"``, or
            ``"lower"`` / ``"upper"``: without / with the near pivots of ``band``.
        band: the near-pivot band of ``"lower"`` and ``"upper"``.
    """

    target: F64Array
    draft: F64Array | None
    slot: I64Array | None
    ids: I64Array
    starts: I64Array
    counts: I64Array
    temperature: F64Array
    seed: I64Array
    step: I64Array
    rates: F64Array | None
    method: str
    parents: I64Array | None = None
    filters: FilterParams | None = None
    draft_filter: bool = False
    pivots: Pivots = "exact"
    band: PivotBand | None = None

    @classmethod
    def of(cls, batch: SpecBatch, pivots: Pivots = "exact", band: PivotBand | None = None) -> BatchRows:
        """Read ``batch`` (on any device) to the CPU once; anything but a valid `SpecBatch` raises
        ``ValueError`` naming the argument first."""
        validate_batch(batch)
        ids, cu = _host(batch.draft_token_ids, torch.int64), _host(batch.cu_num_drafts, torch.int64)
        filters = None
        if batch.filtered:
            off = FilterParams.off(batch.num_requests)
            filters = FilterParams(
                top_k=off.top_k if batch.top_k is None else _host(batch.top_k, torch.int64),
                top_p=off.top_p if batch.top_p is None else _host(batch.top_p),
                min_p=off.min_p if batch.min_p is None else _host(batch.min_p),
            )
        return cls(
            target=_host(batch.target_logits),
            draft=_host(batch.draft_logits),
            slot=_host(batch.draft_slot, torch.int64),
            ids=np.where((ids >= 0) & (ids < batch.vocab_size), ids, -1),
            starts=cu[:-1],
            counts=np.diff(cu),
            temperature=_host(batch.temperature),
            seed=_host(batch.seed, torch.int64),
            step=_host(batch.step, torch.int64),
            rates=_host(batch.synthetic_rates) if methods.METHODS[batch.method].takes_rates else None,
            method=batch.method,
            parents=_host(batch.tree_parent, torch.int64),
            filters=filters,
            draft_filter=batch.draft_filter,
            pivots=pivots,
            band=band,
        )

    def filter(self, logits: F64Array, requests: I64Array) -> F64Array:
        """``[A, V]`` rows of ``requests`` with what their filters drop masked to ``-inf`` (unchanged
        when the batch has no sampling parameters); the near pivots as ``pivots`` says."""
        if self.filters is None:
            return logits
        params, temperature = self.filters.take(requests), self.temperature[requests]
        if self.pivots == "exact":
            kept = kept_tokens(logits, temperature, params)
        else:
            assert self.band is not None
            lower, upper = kept_bounds(logits, temperature, params, self.band)
            kept = lower if self.pivots == "lower" else upper
        return np.asarray(np.where(kept, logits, -np.inf), dtype=np.float64)

    def raw_target_rows(self, requests: I64Array, position: npt.ArrayLike) -> F64Array:
        """``[A, V]`` row ``position`` of each request's target rows, as the batch holds them."""
        at = np.asarray(position, dtype=np.int64)
        return np.asarray(self.target[self.starts[requests] + requests + at])

    def target_rows(self, requests: I64Array, position: npt.ArrayLike) -> F64Array:
        """``[A, V]`` row ``position`` of each request's target rows, filtered (`filter`)."""
        return self.filter(self.raw_target_rows(requests, position), requests)

    def raw_draft_rows(self, requests: I64Array, position: npt.ArrayLike) -> F64Array | None:
        """``[A, V]`` draft row ``position`` of each request as the batch holds it, read through its
        slot when slotted."""
        at = np.asarray(position, dtype=np.int64)
        if self.draft is None:
            return None
        if self.slot is None:
            return np.asarray(self.draft[np.minimum(self.starts[requests] + at, self.draft.shape[0] - 1)])
        return np.asarray(self.draft[self.slot[requests], np.minimum(at, self.draft.shape[1] - 1)])

    def draft_rows(self, requests: I64Array, position: npt.ArrayLike) -> F64Array | None:
        """``[A, V]`` draft row ``position`` of each request, filtered where ``draft_filter`` says."""
        raw = self.raw_draft_rows(requests, position)
        return raw if raw is None or not self.draft_filter else self.filter(raw, requests)

    def tree_parents(self, request: int) -> I64Array:
        """``[n]`` the parents of one request's draft nodes (tree verification)."""
        assert self.parents is not None
        start = int(self.starts[request])
        return np.asarray(self.parents[start : start + int(self.counts[request])], dtype=np.int64)

    def draft_ids(self, requests: I64Array, position: npt.ArrayLike) -> I64Array:
        """``[A]`` the draft at ``position`` of each request, ``-1`` where it has none."""
        at = np.asarray(position, dtype=np.int64)
        if self.ids.size == 0:
            return np.full(requests.shape, -1, dtype=np.int64)
        index = np.minimum(self.starts[requests] + at, self.ids.shape[0] - 1)
        return np.where(at < self.counts[requests], self.ids[index], -1)


def request_inputs(
    batch: SpecBatch, pivots: Pivots = "exact", band: PivotBand | None = None
) -> list[RequestInputs]:
    """Split a batch into per-request float64 inputs, reading slotted drafts through ``draft_slot``
    (filtered rows with the kept sets ``pivots`` says, `BatchRows.filter`)."""
    rows = BatchRows.of(batch, pivots, band)
    requests = []
    for b, n in enumerate(rows.counts.tolist()):
        request, positions = np.full(n, b), np.arange(n)
        requests.append(
            RequestInputs(
                target_logits=rows.target_rows(np.full(n + 1, b), np.arange(n + 1)),
                draft_logits=rows.draft_rows(request, positions),
                draft_token_ids=rows.draft_ids(request, positions),
                temperature=float(rows.temperature[b]),
                seed=int(rows.seed[b]),
                step=int(rows.step[b]),
                synthetic_rates=None if rows.rates is None else rows.rates[:n],
                tree_parent=None if rows.parents is None else rows.tree_parents(b),
            )
        )
    return requests


@dataclass(frozen=True)
class RequestLaw:
    """The exact law of one request's output (a tree's by target row: the module docstring).

    Attributes:
        accept_probs: ``[n]`` probability of accepting draft ``i`` given drafts ``0..i-1`` accepted
            (a tree's node ``i`` at its parent).
        stop_probs: ``[n + 1]`` law of ``m``, the number of drafts accepted (a tree's stop row).
        token_probs: ``[n + 1, V]`` law of the emitted token ``y`` given ``m = j`` (a tree's stop at
            row ``j``).
        target_probs: ``[n + 1, V]`` the target laws ``p_i`` (after temperature).
        draft_token_ids: ``[n]`` the drafts, placeholders as ``-1``.
    """

    accept_probs: F64Array
    stop_probs: F64Array
    token_probs: F64Array
    target_probs: F64Array
    draft_token_ids: I64Array

    def joint_probs(self) -> F64Array:
        """``[n + 1, V]`` the joint law ``P(m = j, y = x)``."""
        return self.stop_probs[:, None] * self.token_probs


def position_law(
    method: methods.Method, target: F64Array, draft: F64Array, token: int, rate: float, greedy: bool
) -> tuple[float, F64Array]:
    """The acceptance probability of ``token`` at one position and the law of ``y`` if it is rejected."""
    if token < 0:
        return 0.0, target
    if greedy and method.greedy_accepts_argmax:
        return (1.0 if target[token] == 1.0 else 0.0), target
    return method.accept_probability(target, draft, token, rate), method.rejection_law(target, draft, token)


def flush_to_fp32(probs: F64Array) -> F64Array:
    """Rows of probabilities with every value below float32's smallest normal zeroed, renormalised."""
    kept = np.where(probs < FP32_TINY, 0.0, probs)
    total = kept.sum(axis=-1, keepdims=True)
    return np.asarray(np.where(total > 0, kept / np.where(total > 0, total, 1.0), probs), dtype=np.float64)


def request_law(method: str, inputs: RequestInputs, arithmetic: Arithmetic = "log") -> RequestLaw:
    """The exact law of one request's output (see the module docstring)."""
    rules = methods.METHODS[method]
    n, vocab_size = inputs.num_drafts, inputs.target_logits.shape[1]
    targets = inputs.target_probs().reshape(n + 1, vocab_size)
    drafts = inputs.draft_probs().reshape(n, vocab_size)
    if arithmetic == "fp32-probs":
        targets, drafts = flush_to_fp32(targets), flush_to_fp32(drafts)
    if rules.verifies_tree:
        assert inputs.tree_parent is not None
        accept_probs, stop_probs, token_probs = tree.tree_law(
            targets, inputs.tree_parent, inputs.draft_token_ids
        )
    elif rules.verifies_jointly:
        joint = block.block_law(targets, drafts, inputs.draft_token_ids)
        stop_probs, token_probs = joint.stop_probs, joint.token_probs
        reach = np.cumsum(stop_probs[::-1])[::-1]  # P(m >= j)
        with np.errstate(divide="ignore", invalid="ignore"):
            accept_probs = np.where(reach[:-1] > 0.0, np.minimum(1.0, reach[1:] / reach[:-1]), 0.0)
    else:
        rates = inputs.synthetic_rates if inputs.synthetic_rates is not None else np.zeros(n)
        accept_probs = np.zeros(n)
        token_probs = targets.copy()
        for i in range(n):
            accept_probs[i], token_probs[i] = position_law(
                rules, targets[i], drafts[i], int(inputs.draft_token_ids[i]), float(rates[i]), inputs.greedy
            )
        reach = np.concatenate([[1.0], np.cumprod(accept_probs)])  # P(m >= j)
        stop_probs = reach * np.concatenate([1.0 - accept_probs, [1.0]])
    return RequestLaw(
        accept_probs=accept_probs,
        stop_probs=stop_probs,
        token_probs=token_probs,
        target_probs=targets,
        draft_token_ids=inputs.draft_token_ids.copy(),
    )


def exact_law(
    batch: SpecBatch, arithmetic: Arithmetic = "log", pivots: Pivots = "exact", band: PivotBand | None = None
) -> list[RequestLaw]:
    """The exact float64 law of every request's output for ``batch``, in a sampler's ``arithmetic``
    (in a filtered batch, on the kept sets ``pivots`` says: `BatchRows.filter`)."""
    return [request_law(batch.method, inputs, arithmetic) for inputs in request_inputs(batch, pivots, band)]
