"""The exact law of a rejection sampler's output, in float64: the specification.

Per request, with target laws ``p_0 .. p_n`` (row ``n`` is the bonus row), draft laws
``q_0 .. q_{n-1}`` and drafts ``d_i``, the output is ``(m, y)``: ``m`` drafts accepted, then one
emitted token ``y``.

- probabilistic: accept ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))`` (the decision
  ``p_i(d_i) > u * q_i(d_i)`` is strict, so a token with ``p = 0`` is never accepted). On the first
  rejection at ``j``, ``y ~ (p_j - q_j)+`` normalised; if that residual has no mass, ``y ~ p_j``.
- strict: ``x_i ~ p_i``; accept iff ``x_i == d_i``; on rejection emit ``x_i``, so
  ``y ~ p_j`` restricted to ``x != d_j``.
- synthetic: accept with the conditional rate ``c_i`` iff ``d_i`` is a real id; ``y ~ p_j``.
- greedy rows (``T == 0``): ``p_i = onehot(argmax)``, ties to the lowest index; probabilistic and
  strict accept iff ``d_i == argmax``; synthetic still accepts with ``c_i``.
- a placeholder (``-1``, or any id outside ``[0, V)``) is rejected with certainty and ``y ~ p_j``.
- all ``n`` accepted: ``y ~ p_n``, the bonus row.

Row laws: NaN logits count as ``-inf``; a row with ``+inf`` logits is uniform over them (the limit
of a growing logit); a row with no finite logit and no ``+inf`` is uniform over the vocabulary.
Inputs are upcast to float64 after their own rounding, so fp16 and bf16 logits are exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from reference.contract import SpecBatch

F64Array = npt.NDArray[np.float64]
I64Array = npt.NDArray[np.int64]


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
                synthetic_rates=None if rates is None or batch.method != "synthetic" else rates[:n],
            )
        )
    return requests


def greedy_token(logits: F64Array) -> int:
    """The argmax of a row, NaN read as ``-inf``, ties to the lowest index."""
    return int(np.argmax(np.where(np.isnan(logits), -np.inf, logits)))


def row_probs(logits: F64Array, temperature: float) -> F64Array:
    """The law ``softmax(logits / T)`` of one row, in float64; ``T == 0`` gives ``onehot(argmax)``."""
    clean = np.where(np.isnan(logits), -np.inf, logits)
    probs = np.zeros_like(clean)
    if temperature == 0.0:
        probs[greedy_token(clean)] = 1.0
        return probs
    if np.isposinf(clean).any():
        top = np.isposinf(clean)
        probs[top] = 1.0 / top.sum()
        return probs
    if np.isneginf(clean).all():
        return np.full_like(clean, 1.0 / clean.shape[0])
    weights: F64Array = np.exp((clean - clean.max()) / temperature)
    weights /= weights.sum()
    return weights


def residual_law(target: F64Array, draft: F64Array) -> F64Array:
    """``(p - q)+`` normalised, or ``p`` itself when the residual has no mass."""
    residual = np.maximum(target - draft, 0.0)
    mass = residual.sum()
    return residual / mass if mass > 0.0 else target


def without_token(target: F64Array, token: int) -> F64Array:
    """``p`` restricted to ``x != token`` and renormalised; ``p`` itself when nothing is left."""
    if token < 0:
        return target
    rest = target.copy()
    rest[token] = 0.0
    mass = rest.sum()
    return rest / mass if mass > 0.0 else target


def probabilistic_accept_prob(target_prob: float, draft_prob: float) -> float:
    """``P(p > u * q)`` for ``u ~ U[0, 1)``: ``min(1, p / q)``; ``1`` if ``q = 0 < p``; ``0`` if ``p = 0``."""
    if target_prob <= 0.0:
        return 0.0
    if draft_prob <= 0.0:
        return 1.0
    return min(1.0, target_prob / draft_prob)


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


def draft_probs(inputs: RequestInputs) -> F64Array:
    """``[n, V]`` the draft laws ``q_i``: ``softmax(draft / T)``, or one-hot on the drafts."""
    n, vocab_size = inputs.num_drafts, inputs.target_logits.shape[1]
    if inputs.draft_logits is not None:
        rows = [row_probs(row, inputs.temperature) for row in inputs.draft_logits]
        return np.stack(rows).reshape(n, vocab_size) if rows else np.zeros((0, vocab_size))
    probs = np.zeros((n, vocab_size))
    placed = inputs.draft_token_ids >= 0
    probs[np.nonzero(placed)[0], inputs.draft_token_ids[placed]] = 1.0
    return probs


def position_law(
    method: str, inputs: RequestInputs, target: F64Array, draft: F64Array, position: int
) -> tuple[float, F64Array]:
    """The acceptance probability of draft ``position`` and the law of ``y`` if it is rejected."""
    token = int(inputs.draft_token_ids[position])
    if method == "synthetic":
        assert inputs.synthetic_rates is not None
        accept = float(inputs.synthetic_rates[position]) if token >= 0 else 0.0
        return accept, target
    if token < 0:
        return 0.0, target
    if inputs.greedy:
        return (1.0 if target[token] == 1.0 else 0.0), target
    if method == "strict":
        return float(target[token]), without_token(target, token)
    return probabilistic_accept_prob(float(target[token]), float(draft[token])), residual_law(target, draft)


def request_law(method: str, inputs: RequestInputs) -> RequestLaw:
    """The exact law of one request's output (see the module docstring)."""
    n = inputs.num_drafts
    targets = np.stack([row_probs(row, inputs.temperature) for row in inputs.target_logits])
    drafts = draft_probs(inputs)
    accept_probs = np.zeros(n)
    token_probs = np.zeros_like(targets)
    for i in range(n):
        accept_probs[i], token_probs[i] = position_law(method, inputs, targets[i], drafts[i], i)
    token_probs[n] = targets[n]
    reach = np.concatenate([[1.0], np.cumprod(accept_probs)])  # P(m >= j)
    stop_probs = reach * np.concatenate([1.0 - accept_probs, [1.0]])
    return RequestLaw(
        accept_probs=accept_probs,
        stop_probs=stop_probs,
        token_probs=token_probs,
        target_probs=targets,
        draft_token_ids=inputs.draft_token_ids.copy(),
    )


def exact_law(batch: SpecBatch) -> list[RequestLaw]:
    """The exact float64 law of every request's output for ``batch``."""
    return [request_law(batch.method, inputs) for inputs in request_inputs(batch)]
