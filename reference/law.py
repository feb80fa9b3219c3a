"""The exact law of a rejection sampler's output, in float64: the specification.

Per request, with target laws ``p_0 .. p_n`` (row ``n`` is the bonus row), draft laws
``q_0 .. q_{n-1}`` and drafts ``d_i``, the output is ``(m, y)``: ``m`` drafts accepted, then one
emitted token ``y``. Position ``i`` follows the rules of `reference.methods`:

- a placeholder (``-1``, or any id outside ``[0, V)``) is rejected with certainty and ``y ~ p_i``;
- a greedy row (``T == 0``) has ``p_i = onehot(argmax)``, ties to the lowest index;
- otherwise the method's own rule gives the acceptance probability of ``d_i`` and the law of ``y``
  if it is rejected (probabilistic: ``min(1, p(d) / q(d))`` and the residual ``(p - q)+``; strict:
  ``p(d)`` and ``p`` without ``d``; synthetic: the rate ``c_i`` and ``p``);
- all ``n`` accepted: ``y ~ p_n``, the bonus row.

Block verification (``verifies_jointly`` in the method table) has no per-position rule: its law of
``(m, y)`` is `reference.block.block_law` on the same laws ``p_i`` and ``q_i`` (after temperature;
greedy rows one-hot, one-hot drafts ``onehot(d)``, a placeholder a draft outside the vocabulary), and
``accept_probs[i]`` is ``P(m > i | m >= i)``.

Row laws: NaN logits count as ``-inf``; a row with ``+inf`` logits is uniform over them (the limit
of a growing logit); a row with no finite logit and no ``+inf`` is uniform over the vocabulary.
Temperatures above ``1e30`` act as ``1e30`` (`MAX_TEMPERATURE`: the law is uniform to within
``1e-30`` either way for logits below ``1``, and ``1 / T`` stays a normal float32).
Inputs are upcast to float64 after their own rounding, so fp16 and bf16 logits are exact.

A sampler that declares ``fp32-probs`` arithmetic (`reference.contract.Capabilities`) is held to
the law of the probabilities it can represent: every ``p_i`` and ``q_i`` below ``2**-126`` is zero
and the row renormalised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from . import block, methods
from .contract import FP32_TINY, Arithmetic, SpecBatch

F64Array = npt.NDArray[np.float64]
I64Array = npt.NDArray[np.int64]
MAX_TEMPERATURE = 1e30


# ---------------------------------------------------------------------------------------------
# Row laws: every function works on one row [V] or on rows [..., V]


def clean(logits: npt.ArrayLike) -> F64Array:
    """Logits in float64 with NaN read as ``-inf``."""
    x = np.asarray(logits, dtype=np.float64)
    return np.where(np.isnan(x), -np.inf, x)


def greedy_token(logits: npt.ArrayLike) -> I64Array:
    """The argmax of each row, NaN read as ``-inf``, ties to the lowest index."""
    return np.asarray(np.argmax(clean(logits), axis=-1), dtype=np.int64)


def row_probs(logits: npt.ArrayLike, temperature: npt.ArrayLike) -> F64Array:
    """The law ``softmax(logits / T)`` of each row; ``T == 0`` gives ``onehot(argmax)``.

    ``temperature`` is one value, or one per row.
    """
    x = clean(logits)
    t = np.minimum(np.asarray(temperature, dtype=np.float64), MAX_TEMPERATURE)[..., None]
    top = x.max(axis=-1, keepdims=True)
    posinf = np.isposinf(x)
    with np.errstate(invalid="ignore", over="ignore"):
        weights = np.exp((x - top) / np.where(t > 0, t, 1.0))
        weights /= weights.sum(axis=-1, keepdims=True)
    weights = np.where(
        posinf.any(axis=-1, keepdims=True), posinf / np.maximum(posinf.sum(-1, keepdims=True), 1), weights
    )
    weights = np.where(np.isneginf(top), 1.0 / x.shape[-1], weights)
    onehot = np.arange(x.shape[-1]) == greedy_token(x)[..., None]
    return np.asarray(np.where(t == 0.0, onehot, weights), dtype=np.float64)


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
    """

    target_logits: F64Array
    draft_logits: F64Array | None
    draft_token_ids: I64Array
    temperature: float
    seed: int
    step: int
    synthetic_rates: F64Array | None

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
        vocab = np.arange(self.target_logits.shape[1])
        return np.asarray(vocab == self.draft_token_ids[:, None], dtype=np.float64)


def request_inputs(batch: SpecBatch) -> list[RequestInputs]:
    """Split a batch into per-request float64 inputs, reading slotted drafts through ``draft_slot``."""
    batch.validate()
    target = batch.target_logits.detach().cpu().double().numpy()
    draft = None if batch.draft_logits is None else batch.draft_logits.detach().cpu().double().numpy()
    slot = None if batch.draft_slot is None else batch.draft_slot.detach().cpu().numpy()
    ids = batch.draft_token_ids.detach().cpu().numpy().astype(np.int64)
    ids = np.where((ids >= 0) & (ids < batch.vocab_size), ids, -1)
    cu = batch.cu_num_drafts.detach().cpu().numpy().astype(np.int64)
    temperature = batch.temperature.detach().cpu().numpy()
    seed = batch.seed.detach().cpu().numpy()
    step = batch.step.detach().cpu().numpy()
    rates = None if batch.synthetic_rates is None else batch.synthetic_rates.detach().cpu().numpy()
    requests = []
    for b in range(batch.num_requests):
        start, end = int(cu[b]), int(cu[b + 1])
        n = end - start
        if draft is None:
            draft_rows = None
        elif slot is None:
            draft_rows = draft[start:end]
        else:
            draft_rows = draft[int(slot[b]), :n]
        requests.append(
            RequestInputs(
                target_logits=target[start + b : end + b + 1],
                draft_logits=draft_rows,
                draft_token_ids=ids[start:end],
                temperature=float(temperature[b]),
                seed=int(seed[b]),
                step=int(step[b]),
                synthetic_rates=rates[:n]
                if rates is not None and methods.METHODS[batch.method].takes_rates
                else None,
            )
        )
    return requests


@dataclass(frozen=True)
class RequestLaw:
    """The exact law of one request's output.

    Attributes:
        accept_probs: ``[n]`` probability of accepting draft ``i`` given drafts ``0..i-1`` accepted.
        stop_probs: ``[n + 1]`` law of ``m``, the number of drafts accepted.
        token_probs: ``[n + 1, V]`` law of the emitted token ``y`` given ``m = j``.
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
    if rules.verifies_jointly:
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


def exact_law(batch: SpecBatch, arithmetic: Arithmetic = "log") -> list[RequestLaw]:
    """The exact float64 law of every request's output for ``batch``, in a sampler's ``arithmetic``."""
    return [request_law(batch.method, inputs, arithmetic) for inputs in request_inputs(batch)]
