"""The reference sampler vectorised over a batch, with the near-tie margin of every decision.

`canonical_sample` runs `reference.sampler.reference_sample`'s algorithm (float64, the canonical
Philox streams, Gumbel-max sampling) position by position over all requests at once, drawing the
Gumbel noise only for the rows it samples, so it is fast enough to feed calibration runs and the
coupled check with thousands of trials. Its tokens, counts and logprobs equal `reference_sample`'s
(`properties/test_canonical.py` holds it to that).

Alongside, it marks every position whose decision float32 arithmetic could flip: a *near tie*. The
tolerance model works in the log domain a kernel computes in (``eps = 2**-23``, times `TOL_ULPS`):
``e(x) = (x - max) / T`` carries ``|e| + 4 + log2(V)`` ulps (its rounding and the row's log-sum-exp),
a Gumbel key ``g = -log(-log u)`` carries ``|g| + 2`` ulps, ``log u`` carries ``|log u| + 1``; a
residual weight ``p - q`` is known to ``tol_p p + tol_q q``. A probability within tolerance of
``2**-1075`` (where float64 rounds to zero) may round either way, and the float64 subnormal range
below ``e**-700`` is imprecise in the reference itself; both count as near. Greedy decisions and
synthetic acceptances compare exact values and are never near.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from reference import philox
from reference.contract import SpecBatch, SpecOutput
from reference.sampler import ACCEPT_PURPOSE, SAMPLE_PURPOSE

EPS32 = 2.0**-23
TOL_ULPS = 8.0
LOG_ZERO = -1075 * math.log(2.0)
LOG_SUBNORMAL = -700.0
DEFAULT_MAX_ELEMENTS = 1 << 22

F64Array = npt.NDArray[np.float64]
I64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class CanonicalSample:
    """The reference output of a batch and where its decisions are near ties.

    Attributes:
        output: what `reference.sampler.reference_sample` returns for the batch (on the CPU).
        near: ``[B, max_n + 1]`` whether the decisions made at each emitted position (the acceptance
            test, and the sample drawn there) could flip under float32 rounding; ``False`` after the
            emitted tokens.
        num_decisions: acceptance decisions and samples made over the batch.
    """

    output: SpecOutput
    near: BoolArray
    num_decisions: int

    @property
    def near_ties(self) -> int:
        """The number of positions with a near-tie decision."""
        return int(self.near.sum())


# ---------------------------------------------------------------------------------------------
# Row laws, row by row as `reference.law` computes them


def row_probs(logits: F64Array, temperature: F64Array) -> F64Array:
    """`reference.law.row_probs` on every row of ``logits [A, V]`` with ``temperature [A]``."""
    clean = np.where(np.isnan(logits), -np.inf, logits)
    vocab_size = clean.shape[1]
    row_max = clean.max(axis=1, keepdims=True)
    greedy = temperature == 0.0
    top = np.isposinf(clean)
    has_top = top.any(axis=1)
    empty = np.isneginf(clean).all(axis=1)
    safe_t = np.where(greedy, 1.0, temperature)[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        weights = np.exp((clean - row_max) / safe_t)
        weights /= weights.sum(axis=1, keepdims=True)
    weights = np.where(has_top[:, None], top / np.maximum(top.sum(axis=1, keepdims=True), 1), weights)
    weights = np.where(empty[:, None], 1.0 / vocab_size, weights)
    onehot = np.zeros_like(clean)
    onehot[np.arange(clean.shape[0]), np.argmax(clean, axis=1)] = 1.0
    return np.asarray(np.where(greedy[:, None], onehot, weights), dtype=np.float64)


def residual_law(target: F64Array, draft: F64Array) -> F64Array:
    """`reference.law.residual_law` on every row: ``(p - q)+`` normalised, or ``p`` without mass."""
    residual = np.maximum(target - draft, 0.0)
    mass = residual.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.where(mass > 0.0, residual / mass, target), dtype=np.float64)


def gumbel_argmax(weights: F64Array, uniforms: npt.NDArray[np.float32]) -> I64Array:
    """`reference.sampler.gumbel_argmax` on every row: ``argmax(log w - log(-log u))``, ties low."""
    with np.errstate(divide="ignore"):
        scores = np.log(weights) - np.log(-np.log(uniforms.astype(np.float64)))
    return np.asarray(np.argmax(scores, axis=1), dtype=np.int64)


@dataclass(frozen=True)
class LogLaw:
    """Rows of ``log softmax(logits / T)`` that never underflow, with their float32 tolerance."""

    log_probs: F64Array
    tolerance: F64Array


def log_law(logits: F64Array, temperature: F64Array) -> LogLaw:
    """The log-domain law of every row (non-greedy temperatures) and the float32 tolerance of each entry."""
    clean = np.where(np.isnan(logits), -np.inf, logits)
    vocab_size = clean.shape[1]
    row_max = clean.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        scaled = np.where(clean == row_max, 0.0, (clean - row_max) / temperature[:, None])
    scaled = np.where(np.isposinf(row_max), np.where(np.isposinf(clean), 0.0, -np.inf), scaled)
    scaled = np.where(np.isneginf(row_max), 0.0, scaled)
    log_probs = scaled - np.log(np.exp(scaled).sum(axis=1, keepdims=True))
    finite = np.isfinite(scaled)
    tolerance = np.where(
        finite, TOL_ULPS * EPS32 * (np.abs(np.where(finite, scaled, 0.0)) + 4 + math.log2(vocab_size)), 0.0
    )
    return LogLaw(log_probs, tolerance)


def _zero_ambiguous(log_prob: F64Array, tolerance: F64Array) -> BoolArray:
    """Where float32 or float64 may round a probability to zero or not."""
    return np.asarray((log_prob >= LOG_ZERO - tolerance - 1e-9) & (log_prob <= LOG_SUBNORMAL))


def _gumbel(uniforms: npt.NDArray[np.float32]) -> tuple[F64Array, F64Array]:
    with np.errstate(divide="ignore"):
        noise = -np.log(-np.log(uniforms.astype(np.float64)))
    finite = np.isfinite(noise)
    return noise, np.where(finite, TOL_ULPS * EPS32 * (np.abs(np.where(finite, noise, 0.0)) + 2), 0.0)


def _near_argmax(winner: I64Array, low: F64Array, high: F64Array) -> BoolArray:
    """Per row, whether any other key's upper bound reaches the winner's lower bound."""
    if high.shape[1] < 2:
        return np.zeros(high.shape[0], dtype=bool)
    rows = np.arange(high.shape[0])
    others = high.copy()
    others[rows, winner] = -np.inf
    return np.asarray(low[rows, winner] <= others.max(axis=1))


def _target_intervals(law: LogLaw, noise: F64Array, noise_tol: F64Array) -> tuple[F64Array, F64Array]:
    ambiguous = _zero_ambiguous(law.log_probs, law.tolerance)
    alive = law.log_probs > LOG_ZERO + law.tolerance
    high = np.where(alive | ambiguous, law.log_probs + law.tolerance + noise + noise_tol, -np.inf)
    low = np.where(alive & ~ambiguous, law.log_probs - law.tolerance + noise - noise_tol, -np.inf)
    return low, high


# ---------------------------------------------------------------------------------------------
# The batch, read once


@dataclass(frozen=True)
class _Inputs:
    target: F64Array  # [R, V]
    draft: F64Array | None  # [D, V] or [S, K, V]
    slot: I64Array | None
    ids: I64Array  # [D], placeholders as -1
    starts: I64Array  # [B] first draft row of each request
    counts: I64Array  # [B]
    temperature: F64Array
    seed: I64Array
    step: I64Array
    rates: F64Array | None
    method: str

    def target_rows(self, requests: I64Array, position: int) -> F64Array:
        return self.target[self.starts[requests] + requests + position]

    def draft_rows(self, requests: I64Array, position: int) -> F64Array | None:
        if self.draft is None:
            return None
        if self.slot is None:
            return self.draft[self.starts[requests] + position]
        return self.draft[self.slot[requests], position]


def _read(batch: SpecBatch) -> _Inputs:
    batch.validate()
    vocab_size = batch.vocab_size
    ids = batch.draft_token_ids.detach().cpu().numpy().astype(np.int64)
    cu = batch.cu_num_drafts.detach().cpu().numpy().astype(np.int64)
    return _Inputs(
        target=batch.target_logits.detach().cpu().double().numpy(),
        draft=None if batch.draft_logits is None else batch.draft_logits.detach().cpu().double().numpy(),
        slot=None if batch.draft_slot is None else batch.draft_slot.detach().cpu().numpy().astype(np.int64),
        ids=np.where((ids >= 0) & (ids < vocab_size), ids, -1),
        starts=cu[:-1],
        counts=cu[1:] - cu[:-1],
        temperature=batch.temperature.detach().cpu().numpy().astype(np.float64),
        seed=batch.seed.detach().cpu().numpy().astype(np.int64),
        step=batch.step.detach().cpu().numpy().astype(np.int64),
        rates=None
        if batch.synthetic_rates is None or batch.method != "synthetic"
        else batch.synthetic_rates.detach().cpu().numpy().astype(np.float64),
        method=batch.method,
    )


def _offsets(step: I64Array, position: int, purpose: int, tokens: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """`reference.sampler.stream_offsets` for one position and many requests, modulo 2**64."""
    row = (step.astype(np.uint64) * np.uint64(128) + np.uint64(position)) * np.uint64(4)
    return ((row + np.uint64(purpose)) << np.uint64(22)) + np.asarray(tokens, dtype=np.uint64)


def _sample_uniforms(
    inputs: _Inputs, requests: I64Array, position: int, vocab_size: int
) -> npt.NDArray[np.float32]:
    offsets = _offsets(
        inputs.step[requests][:, None], position, SAMPLE_PURPOSE, np.arange(vocab_size)[None, :]
    )
    return philox.rand(inputs.seed[requests][:, None], offsets)


# ---------------------------------------------------------------------------------------------
# The walk


def canonical_sample(batch: SpecBatch, *, max_elements: int = DEFAULT_MAX_ELEMENTS) -> CanonicalSample:
    """`reference.sampler.reference_sample` of ``batch``, vectorised, with its near ties.

    Args:
        batch: any valid batch, on any device (it is read to the CPU once).
        max_elements: requests are walked in chunks of at most this many logits per position.

    Returns:
        The reference output and, per emitted position, whether its decision is a near tie.
    """
    inputs = _read(batch)
    num_requests, vocab_size = batch.num_requests, batch.vocab_size
    width = batch.resolved_max_num_drafts() + 1
    tokens = np.full((num_requests, width), -1, dtype=np.int64)
    logprobs = np.full((num_requests, width), np.nan, dtype=np.float32)
    emitted = np.zeros(num_requests, dtype=np.int32)
    near = np.zeros((num_requests, width), dtype=bool)
    chunk = max(1, max_elements // max(vocab_size, 1))
    decisions = 0
    for start in range(0, num_requests, chunk):
        requests = np.arange(start, min(num_requests, start + chunk))
        decisions += _walk(inputs, requests, vocab_size, tokens, logprobs, emitted, near)
    output = SpecOutput(
        token_ids=torch.from_numpy(tokens),
        num_emitted=torch.from_numpy(emitted),
        logprobs=torch.from_numpy(logprobs),
    )
    return CanonicalSample(output=output, near=near, num_decisions=decisions)


def _walk(
    inputs: _Inputs,
    requests: I64Array,
    vocab_size: int,
    tokens: I64Array,
    logprobs: npt.NDArray[np.float32],
    emitted: npt.NDArray[np.int32],
    near: BoolArray,
) -> int:
    """Walk ``requests`` position by position, writing their tokens, logprobs, counts and near ties."""
    method = inputs.method
    alive = requests.copy()
    decisions = 0
    position = 0
    while alive.size:
        a = alive
        temperature = inputs.temperature[a]
        greedy = temperature == 0.0
        is_draft = position < inputs.counts[a]
        rows = inputs.target_rows(a, position)
        probs = row_probs(rows, temperature)
        lp_probs = np.where(greedy[:, None], row_probs(rows, np.where(greedy, 1.0, temperature)), probs)
        law = log_law(rows, np.where(greedy, 1.0, temperature))
        token = np.full(a.size, -1, dtype=np.int64)
        token[is_draft] = inputs.ids[inputs.starts[a[is_draft]] + position]
        safe_token = np.maximum(token, 0)
        accept_u = philox.rand(inputs.seed[a], _offsets(inputs.step[a], position, ACCEPT_PURPOSE, 0)).astype(
            np.float64
        )
        accept = np.zeros(a.size, dtype=bool)
        position_near = np.zeros(a.size, dtype=bool)
        sampled = np.full(a.size, -1, dtype=np.int64)  # tokens already drawn at this position (strict)
        sample_near = np.zeros(a.size, dtype=bool)
        uniforms: npt.NDArray[np.float32] | None = None
        argmax = np.argmax(np.where(np.isnan(rows), -np.inf, rows), axis=1)

        if method == "synthetic":
            assert inputs.rates is not None
            rate = inputs.rates[position] if position < inputs.rates.size else 0.0
            accept = is_draft & (token >= 0) & (accept_u < rate)
            decisions += int(np.sum(is_draft))
        else:
            accept = is_draft & greedy & (token >= 0) & (token == argmax)
            strict = is_draft & ~greedy & (method == "strict")
            probabilistic = is_draft & ~greedy & (method == "probabilistic") & (token >= 0)
            decisions += int(np.sum(is_draft & (greedy | strict | probabilistic)))
            if strict.any():
                uniforms = _sample_uniforms(inputs, a, position, vocab_size)
                s = np.nonzero(strict)[0]
                sampled[s] = gumbel_argmax(probs[s], uniforms[s])
                accept[s] = sampled[s] == token[s]
                noise, noise_tol = _gumbel(uniforms[s])
                sub = LogLaw(law.log_probs[s], law.tolerance[s])
                position_near[s] = _near_argmax(sampled[s], *_target_intervals(sub, noise, noise_tol))
            if probabilistic.any():
                s = np.nonzero(probabilistic)[0]
                drafts = inputs.draft_rows(a[s], position)
                p_token = probs[s, safe_token[s]]
                log_p = law.log_probs[s, safe_token[s]]
                tol_p = law.tolerance[s, safe_token[s]]
                if drafts is None:
                    q_token = np.ones(s.size)
                    log_q, tol_q = np.zeros(s.size), np.zeros(s.size)
                else:
                    q_rows = row_probs(drafts, temperature[s])
                    q_token = q_rows[np.arange(s.size), safe_token[s]]
                    draft_law = log_law(drafts, temperature[s])
                    log_q = draft_law.log_probs[np.arange(s.size), safe_token[s]]
                    tol_q = draft_law.tolerance[np.arange(s.size), safe_token[s]]
                u = accept_u[s]
                # Strict `>`: a token with p = 0 is never accepted, even at u = 0.
                accept[s] = p_token > u * q_token
                with np.errstate(divide="ignore"):
                    log_u = np.where(u > 0, np.log(np.where(u > 0, u, 1.0)), -np.inf)
                tol_u = np.where(u > 0, TOL_ULPS * EPS32 * (1 + np.abs(np.where(u > 0, log_u, 0.0))), 0.0)
                with np.errstate(invalid="ignore"):
                    margin = np.where(
                        np.isneginf(log_p),
                        -np.inf,
                        np.where(np.isneginf(log_u + log_q), np.inf, log_p - log_u - log_q),
                    )
                position_near[s] = (
                    _zero_ambiguous(log_p, tol_p)
                    | _zero_ambiguous(log_q, tol_q)
                    | (np.isfinite(margin) & (np.abs(margin) <= tol_p + tol_q + tol_u))
                )

        # Accepted drafts are emitted as they are and the walk goes on.
        tokens[a[accept], position] = token[accept]
        with np.errstate(divide="ignore"):
            emitted_logprob = np.log(lp_probs[np.arange(a.size), safe_token]).astype(np.float32)
        logprobs[a[accept], position] = emitted_logprob[accept]
        near[a[accept], position] = position_near[accept]

        # Everything else stops here with one sampled token.
        stop = ~accept
        final = np.full(a.size, -1, dtype=np.int64)
        final[stop & greedy] = argmax[stop & greedy]
        strict_stop = stop & (sampled >= 0)
        final[strict_stop] = sampled[strict_stop]
        residual = stop & ~greedy & (method == "probabilistic") & (token >= 0)
        plain = stop & ~greedy & ~residual & (sampled < 0)
        decisions += int(np.sum(residual | plain))
        if (residual | plain).any():
            if uniforms is None:
                uniforms = _sample_uniforms(inputs, a, position, vocab_size)
            noise, noise_tol = _gumbel(uniforms)
            low, high = _target_intervals(law, noise, noise_tol)
            if plain.any():
                s = np.nonzero(plain)[0]
                final[s] = gumbel_argmax(probs[s], uniforms[s])
                sample_near[s] = _near_argmax(final[s], low[s], high[s])
            if residual.any():
                s = np.nonzero(residual)[0]
                drafts = inputs.draft_rows(a[s], position)
                final[s], sample_near[s] = _residual_sample(
                    probs[s], drafts, temperature[s], token[s], uniforms[s],
                    LogLaw(law.log_probs[s], law.tolerance[s]), noise[s], noise_tol[s], low[s], high[s],
                    rows[s],
                )  # fmt: skip
        with np.errstate(divide="ignore"):
            final_logprob = np.log(lp_probs[np.arange(a.size), np.maximum(final, 0)]).astype(np.float32)
        tokens[a[stop], position] = final[stop]
        logprobs[a[stop], position] = final_logprob[stop]
        near[a[stop], position] = position_near[stop] | sample_near[stop]
        emitted[a[stop]] = position + 1
        alive = a[accept]
        position += 1
    return decisions


def _residual_sample(
    target: F64Array,
    draft_logits: F64Array | None,
    temperature: F64Array,
    token: I64Array,
    uniforms: npt.NDArray[np.float32],
    target_law: LogLaw,
    noise: F64Array,
    noise_tol: F64Array,
    low: F64Array,
    high: F64Array,
    target_logits: F64Array,
) -> tuple[I64Array, BoolArray]:
    """The residual draw after a rejected draft, and whether it is a near tie, for each row."""
    rows = np.arange(target.shape[0])
    if draft_logits is None:
        # One-hot drafts: the residual is p without the drafted token.
        draft = np.zeros_like(target)
        draft[rows, token] = 1.0
        choice = gumbel_argmax(residual_law(target, draft), uniforms)
        low, high = low.copy(), high.copy()
        low[rows, token] = -np.inf
        high[rows, token] = -np.inf
        full_low, full_high = _target_intervals(target_law, noise, noise_tol)
        nothing_left = ~np.isfinite(high).any(axis=1)
        near = np.where(
            nothing_left, _near_argmax(choice, full_low, full_high), _near_argmax(choice, low, high)
        )
        return choice, np.asarray(near)
    draft = row_probs(draft_logits, temperature)
    choice = gumbel_argmax(residual_law(target, draft), uniforms)
    draft_law = log_law(draft_logits, temperature)
    p, q = np.exp(target_law.log_probs), np.exp(draft_law.log_probs)
    identical = np.all(
        (target_logits == draft_logits) | (np.isnan(target_logits) & np.isnan(draft_logits)), axis=1
    )
    spread = np.where(identical, 0.0, 1e-320)[:, None]
    error = target_law.tolerance * p + draft_law.tolerance * q + spread
    difference = p - q
    with np.errstate(divide="ignore", invalid="ignore"):
        res_high = np.where(
            difference + error > 0, np.log(np.maximum(difference + error, 0)) + noise + noise_tol, -np.inf
        )
        res_low = np.where(
            difference - error > 0, np.log(np.maximum(difference - error, 0)) + noise - noise_tol, -np.inf
        )
    has_mass = np.maximum(target - draft, 0.0).sum(axis=1) > 0.0
    # Without residual mass the reference falls back to p; a kernel might still see a sliver of residual.
    fallback_near = np.isfinite(res_high).any(axis=1) | _near_argmax(choice, low, high)
    near = np.where(has_mass, _near_argmax(choice, res_low, res_high), fallback_near)
    return choice, np.asarray(near)


class VectorisedSampler:
    """`canonical_sample` as a `Variant`: the reference sampler, fast enough for calibration runs."""

    name = "vectorised"
    canonical_rng = True

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample ``batch`` on the CPU with the canonical streams."""
        return canonical_sample(batch).output
