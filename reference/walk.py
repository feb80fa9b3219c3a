"""The walk: every exact Python sampler of the harness, vectorised over a batch, with its near ties.

`Walk` samples a batch in float64 from a random scheme's uniforms (`reference.schemes`), position
by position over all requests at once, with the rules of `reference.methods`. It is what the
coupled check compares a kernel with, what calibration runs sample from, and the host of the
planted mutants: each stage below is a method a mutant overrides. Its tokens, counts and logprobs
equal the scalar `reference.sampler.reference_sample`'s on the same scheme.

Stages, in the order a position meets them: `Walk.read` (the batch as float64 rows),
`Walk.target_law` and `Walk.draft_law`, `Walk.accept_uniforms`, `Walk.draft_probs` (``p(d)``,
``q(d)`` and which drafts are real), `Walk.decide`, `Walk.keep_walking` (the stop at the first
rejection); then, at the final row, `Walk.rejection_row` or `Walk.bonus_row`, `Walk.sample`
(Gumbel-max) or `Walk.rejection_token`, and `Walk.pack`.

Beside the output, the walk marks every emitted position whose decision float32 arithmetic could
flip: a *near tie*. The model works in the log domain a kernel computes in (``eps = 2**-23``,
times `reference.schemes.TOL_ULPS`): ``e(x) = (x - max) / T`` carries ``|e| + 4 + log2(V)`` ulps
(its rounding and the row's log-sum-exp), the Gumbel noise the scheme's tolerance, ``log u``
``|log u| + 1`` ulps; a residual weight ``p - q`` is known to ``tol_p p + tol_q q``. A probability
within tolerance of ``2**-1075`` (where float64 rounds to zero) may round either way, and the
float64 subnormal range below ``e**-700`` is imprecise in the reference itself; both count as near.
Greedy decisions and synthetic acceptances compare exact values and are never near.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from .contract import SpecBatch, SpecOutput
from .law import MAX_TEMPERATURE, greedy_token, row_probs
from .methods import METHODS, Method
from .schemes import CANONICAL, EPS32, TOL_ULPS, Noise, RandomScheme

LOG_ZERO = -1075 * math.log(2.0)
LOG_SUBNORMAL = -700.0
DEFAULT_MAX_ELEMENTS = 1 << 22

F64Array = npt.NDArray[np.float64]
I64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class BatchRows:
    """A batch read once into float64 numpy arrays, with accessors by request and position.

    Attributes:
        target: ``[R, V]`` target logits.
        draft: ``[D, V]`` or ``[S, K, V]`` draft logits, or ``None`` for one-hot drafts.
        slot: ``[B]`` draft slots (slotted drafts), else ``None``.
        ids: ``[D]`` draft ids, every id outside ``[0, V)`` read as ``-1``.
        starts, counts: ``[B]`` each request's first draft index and draft count.
        temperature: ``[B]``.
        seed, step: ``[B]`` int64.
        rates: ``[K]`` synthetic conditional rates, else ``None``.
        method: the batch's method.
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

    @classmethod
    def of(cls, batch: SpecBatch) -> BatchRows:
        """Read ``batch`` (on any device) to the CPU once."""
        batch.validate()
        ids = batch.draft_token_ids.detach().cpu().numpy().astype(np.int64)
        cu = batch.cu_num_drafts.detach().cpu().numpy().astype(np.int64)
        synthetic = batch.synthetic_rates is not None and METHODS[batch.method].takes_rates
        return cls(
            target=batch.target_logits.detach().cpu().double().numpy(),
            draft=None if batch.draft_logits is None else batch.draft_logits.detach().cpu().double().numpy(),
            slot=None
            if batch.draft_slot is None
            else batch.draft_slot.detach().cpu().numpy().astype(np.int64),
            ids=np.where((ids >= 0) & (ids < batch.vocab_size), ids, -1),
            starts=cu[:-1],
            counts=cu[1:] - cu[:-1],
            temperature=batch.temperature.detach().cpu().numpy().astype(np.float64),
            seed=batch.seed.detach().cpu().numpy().astype(np.int64),
            step=batch.step.detach().cpu().numpy().astype(np.int64),
            rates=batch.synthetic_rates.detach().cpu().numpy().astype(np.float64) if synthetic else None,  # type: ignore[union-attr]
            method=batch.method,
        )

    def target_rows(self, requests: I64Array, position: npt.ArrayLike) -> F64Array:
        """``[A, V]`` row ``position`` of each request's target rows."""
        rows: F64Array = self.target[self.starts[requests] + requests + np.asarray(position, dtype=np.int64)]
        return rows

    def draft_rows(self, requests: I64Array, position: npt.ArrayLike) -> F64Array | None:
        """``[A, V]`` draft row ``position`` of each request, read through its slot when slotted."""
        at = np.asarray(position, dtype=np.int64)
        if self.draft is None:
            return None
        if self.slot is None:
            rows: F64Array = self.draft[np.minimum(self.starts[requests] + at, self.draft.shape[0] - 1)]
            return rows
        slotted: F64Array = self.draft[self.slot[requests], np.minimum(at, self.draft.shape[1] - 1)]
        return slotted

    def draft_ids(self, requests: I64Array, position: npt.ArrayLike) -> I64Array:
        """``[A]`` the draft at ``position`` of each request, ``-1`` where it has none."""
        at = np.asarray(position, dtype=np.int64)
        if self.ids.size == 0:
            return np.full(requests.shape, -1, dtype=np.int64)
        index = np.minimum(self.starts[requests] + at, self.ids.shape[0] - 1)
        return np.where(at < self.counts[requests], self.ids[index], -1)


@dataclass(frozen=True)
class WalkResult:
    """The walk's output for a batch and where its decisions are near ties.

    Attributes:
        output: tokens, counts and logprobs, on the CPU.
        near: ``[B, max_n + 1]`` whether a decision made at each emitted position (the acceptance
            test, and the sample drawn there) could flip under float32 rounding.
        num_decisions: acceptance decisions and samples made over the batch.
    """

    output: SpecOutput
    near: BoolArray
    num_decisions: int

    @property
    def near_ties(self) -> int:
        """The number of positions with a near-tie decision."""
        return int(self.near.sum())


@dataclass
class _Chunk:
    """The state of a walk over some requests: what each one emitted so far, and its near ties."""

    requests: I64Array
    tokens: I64Array
    logprobs: npt.NDArray[np.float32]
    accepted: I64Array
    walking: BoolArray
    sampled: I64Array  # [A, W] the row samples drawn to decide (strict), -1 elsewhere
    accept_u: F64Array  # [A, W] the acceptance uniforms of the positions decided
    near: BoolArray
    decisions: int = 0


class Walk:
    """Sampling in float64 from a scheme's uniforms, with overridable stages (see the module docstring).

    Args:
        scheme: where the uniforms come from.
        max_elements: requests are walked in chunks of at most this many logits per position.
    """

    def __init__(self, scheme: RandomScheme = CANONICAL, max_elements: int = DEFAULT_MAX_ELEMENTS) -> None:
        self.scheme = scheme
        self.max_elements = max_elements

    def run(self, batch: SpecBatch) -> WalkResult:
        """Sample ``batch``; return the output and its near ties."""
        rows = self.read(batch)
        method = self.method(rows.method)
        num_requests, vocab_size = batch.num_requests, batch.vocab_size
        width = batch.resolved_max_num_drafts() + 1
        tokens = np.full((num_requests, width), -1, dtype=np.int64)
        logprobs = np.full((num_requests, width), np.nan, dtype=np.float32)
        emitted = np.zeros(num_requests, dtype=np.int64)
        near = np.zeros((num_requests, width), dtype=bool)
        size = max(1, self.max_elements // max(vocab_size, 1))
        decisions = 0
        for start in range(0, num_requests, size):
            requests = np.arange(start, min(num_requests, start + size))
            chunk = _Chunk(
                requests=requests,
                tokens=tokens[requests],
                logprobs=logprobs[requests],
                accepted=np.zeros(requests.size, dtype=np.int64),
                walking=np.ones(requests.size, dtype=bool),
                sampled=np.full((requests.size, width), -1, dtype=np.int64),
                accept_u=np.zeros((requests.size, width)),
                near=near[requests],
            )
            self._decide_drafts(rows, method, chunk)
            self._emit(rows, method, chunk)
            tokens[requests], logprobs[requests], near[requests] = chunk.tokens, chunk.logprobs, chunk.near
            emitted[requests] = chunk.accepted + 1
            decisions += chunk.decisions
        output = self.pack(rows, tokens, emitted, logprobs)
        return WalkResult(output=output, near=near, num_decisions=decisions)

    # -- stages ---------------------------------------------------------------------------------

    def read(self, batch: SpecBatch) -> BatchRows:
        """The batch as float64 rows."""
        return BatchRows.of(batch)

    def method(self, name: str) -> Method:
        """The rules of the batch's method."""
        return METHODS[name]

    def target_law(self, logits: F64Array, temperature: F64Array) -> F64Array:
        """``[A, V]`` target laws ``p = softmax(logits / T)``; greedy rows one-hot."""
        return row_probs(logits, temperature)

    def draft_law(self, logits: F64Array | None, temperature: F64Array, ids: I64Array) -> F64Array | None:
        """``[A, V]`` draft laws ``q = softmax(draft / T)``, or ``None`` for one-hot drafts."""
        return None if logits is None else row_probs(logits, temperature)

    def accept_uniforms(self, seed: I64Array, step: I64Array, position: int) -> F64Array:
        """``[A]`` the acceptance uniforms of ``position``."""
        return self.scheme.accept_uniforms(seed, step, np.full(seed.shape, position))

    def synthetic_rate(self, rates: F64Array | None, position: int) -> float:
        """The conditional acceptance rate of ``position`` (0 past the given rates)."""
        return float(rates[position]) if rates is not None and position < rates.size else 0.0

    def draft_probs(
        self, p: F64Array, q: F64Array | None, ids: I64Array
    ) -> tuple[F64Array, F64Array, BoolArray]:
        """``(p(d), q(d), real)``: the laws at each draft, and which drafts are real ids (not ``-1``)."""
        rows, safe = np.arange(ids.size), np.maximum(ids, 0)
        q_draft = np.ones(ids.size) if q is None else q[rows, safe]
        return p[rows, safe], q_draft, ids >= 0

    def decide(
        self, method: Method, p_draft: F64Array, q_draft: F64Array, u: F64Array, rate: float
    ) -> BoolArray:
        """Whether each real draft at a sampled row is accepted."""
        return method.decide(p_draft, q_draft, u, np.full(u.shape, rate))

    def keep_walking(self, accept: BoolArray) -> BoolArray:
        """Which requests decide their next draft: those that accepted this one."""
        return accept

    def sample(self, weights: F64Array, noise: Noise) -> I64Array:
        """Gumbel-max: ``argmax(log w + g)`` per row, ties to the lowest index."""
        with np.errstate(divide="ignore"):
            return np.asarray(np.argmax(np.log(weights) + noise.gumbel, axis=1), dtype=np.int64)

    def rejection_token(
        self, method: Method, p: F64Array, q: F64Array, ids: I64Array, noise: Noise, u: F64Array
    ) -> I64Array:
        """The token emitted after a real draft is rejected at a sampled row: a draw from the method's law."""
        return self.sample(method.rejection_law(p, q, ids), noise)

    def rejection_row(self, accepted: I64Array) -> I64Array:
        """The row whose laws the rejection draw uses: the rejected position."""
        return accepted

    def bonus_row(self, counts: I64Array) -> I64Array:
        """The row of the bonus draw: ``n``."""
        return counts

    def pack(
        self, rows: BatchRows, tokens: I64Array, emitted: I64Array, logprobs: npt.NDArray[np.float32]
    ) -> SpecOutput:
        """The output: ``emitted`` tokens per request, ``-1`` (and NaN) after them."""
        return SpecOutput(
            token_ids=torch.from_numpy(tokens),
            num_emitted=torch.from_numpy(emitted.astype(np.int32)),
            logprobs=torch.from_numpy(logprobs),
        )

    # -- the walk -----------------------------------------------------------------------------

    def _noise(self, rows: BatchRows, requests: I64Array, position: npt.ArrayLike, vocab_size: int) -> Noise:
        return self.scheme.gumbel_noise(rows.seed[requests], rows.step[requests], position, vocab_size)

    def _decide_drafts(self, rows: BatchRows, method: Method, chunk: _Chunk) -> None:
        """Decide each request's drafts in order until it stops walking."""
        counts = rows.counts[chunk.requests]
        vocab_size = rows.target.shape[1]
        for position in range(int(counts.max(initial=0))):
            local = np.nonzero(chunk.walking & (position < counts))[0]
            if local.size == 0:
                break
            a = chunk.requests[local]
            temperature = rows.temperature[a]
            greedy = temperature == 0.0
            logits = rows.target_rows(a, position)
            p = self.target_law(logits, temperature)
            ids = rows.draft_ids(a, position)
            draft_logits = rows.draft_rows(a, position)
            q = self.draft_law(draft_logits, temperature, ids)
            u = self.accept_uniforms(rows.seed[a], rows.step[a], position)
            chunk.accept_u[local, position] = u
            p_draft, q_draft, real = self.draft_probs(p, q, ids)
            by_argmax = greedy & method.greedy_accepts_argmax
            accept = by_argmax & real & (ids == greedy_token(logits))
            near = np.zeros(local.size, dtype=bool)
            if method.decides_by_sampling:
                s = np.nonzero(~by_argmax)[0]
                noise = self._noise(rows, a[s], position, vocab_size)
                chunk.sampled[local[s], position] = self.sample(p[s], noise)
                accept[s] = real[s] & (chunk.sampled[local[s], position] == ids[s])
                near[s] = _near_argmax(
                    chunk.sampled[local[s], position],
                    *_target_intervals(log_law(logits[s], temperature[s]), noise),
                )
                chunk.decisions += local.size
            else:
                s = np.nonzero(~by_argmax & (real | (not method.greedy_accepts_argmax)))[0]
                rate = self.synthetic_rate(rows.rates, position)
                accept[s] = real[s] & self.decide(method, p_draft[s], q_draft[s], u[s], rate)
                if not method.exact_decision:
                    d = draft_logits[s] if draft_logits is not None else None
                    near[s] = _acceptance_near(logits[s], d, temperature[s], ids[s], u[s])
                    chunk.decisions += int(np.sum(by_argmax)) + s.size
                else:
                    chunk.decisions += local.size
            chunk.tokens[local[accept], position] = ids[accept]
            chunk.logprobs[local[accept], position] = _logprobs(
                logits[accept], temperature[accept], ids[accept]
            )
            chunk.near[local, position] = near
            chunk.accepted[local] += accept
            chunk.walking[local] = self.keep_walking(accept)

    def _emit(self, rows: BatchRows, method: Method, chunk: _Chunk) -> None:
        """Draw the token emitted after each request's accepted drafts, at row ``m``."""
        requests, m = chunk.requests, chunk.accepted
        counts = rows.counts[requests]
        vocab_size = rows.target.shape[1]
        temperature = rows.temperature[requests]
        greedy = temperature == 0.0
        logits = rows.target_rows(requests, m)
        ids = rows.draft_ids(requests, m)
        bonus = m >= counts
        final = greedy_token(logits)
        near = np.zeros(requests.size, dtype=bool)
        drawn = ~greedy
        by_sample = drawn & ~bonus & method.decides_by_sampling
        final[by_sample] = chunk.sampled[np.nonzero(by_sample)[0], m[by_sample]]
        rejected = drawn & ~bonus & (ids >= 0) & (not method.decides_by_sampling)
        plain = drawn & ~by_sample & ~rejected
        chunk.decisions += int(np.sum(plain | rejected))
        if plain.any():
            s = np.nonzero(plain)[0]
            row = np.where(bonus[s], self.bonus_row(counts[s]), m[s])
            noise = self._noise(rows, requests[s], row, vocab_size)
            row_logits = rows.target_rows(requests[s], row)
            final[s] = self.sample(self.target_law(row_logits, temperature[s]), noise)
            near[s] = _near_argmax(final[s], *_target_intervals(log_law(row_logits, temperature[s]), noise))
        if rejected.any():
            s = np.nonzero(rejected)[0]
            row = self.rejection_row(m[s])
            noise = self._noise(rows, requests[s], m[s], vocab_size)
            p = self.target_law(rows.target_rows(requests[s], row), temperature[s])
            draft_logits = rows.draft_rows(requests[s], row)
            q = self.draft_law(draft_logits, temperature[s], ids[s])
            q_full = (
                q if q is not None else np.asarray(np.arange(vocab_size) == ids[s, None], dtype=np.float64)
            )
            final[s] = self.rejection_token(method, p, q_full, ids[s], noise, chunk.accept_u[s, m[s]])
            if method.uses_draft_law:
                near[s] = _residual_near(
                    final[s], rows.target_rows(requests[s], row), draft_logits, temperature[s], ids[s], noise
                )
            else:
                near[s] = _near_argmax(
                    final[s], *_target_intervals(log_law(logits[s], temperature[s]), noise)
                )
        index = np.arange(requests.size)
        chunk.tokens[index, m] = final
        chunk.logprobs[index, m] = _logprobs(logits, temperature, final)
        chunk.near[index, m] |= near


# ---------------------------------------------------------------------------------------------
# The near-tie model


@dataclass(frozen=True)
class LogLaw:
    """Rows of ``log softmax(logits / T)`` that never underflow, with their float32 tolerance."""

    log_probs: F64Array
    tolerance: F64Array


def log_law(logits: F64Array, temperature: F64Array) -> LogLaw:
    """The log-domain law of every row (``T = 1`` for greedy rows) and the float32 tolerance of each entry."""
    clean = np.where(np.isnan(logits), -np.inf, logits)
    t = np.minimum(np.where(temperature > 0, temperature, 1.0), MAX_TEMPERATURE)[:, None]
    row_max = clean.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        scaled = np.where(clean == row_max, 0.0, (clean - row_max) / t)
    scaled = np.where(np.isposinf(row_max), np.where(np.isposinf(clean), 0.0, -np.inf), scaled)
    scaled = np.where(np.isneginf(row_max), 0.0, scaled)
    log_probs = scaled - np.log(np.exp(scaled).sum(axis=1, keepdims=True))
    finite = np.isfinite(scaled)
    bits = np.abs(np.where(finite, scaled, 0.0)) + 4 + math.log2(clean.shape[1])
    return LogLaw(log_probs, np.where(finite, TOL_ULPS * EPS32 * bits, 0.0))


def _logprobs(logits: F64Array, temperature: F64Array, tokens: I64Array) -> npt.NDArray[np.float32]:
    """``log softmax(logits / T)`` at each row's token, float32; ``T = 1`` for greedy rows."""
    law = row_probs(logits, np.where(temperature > 0, temperature, 1.0))
    with np.errstate(divide="ignore"):
        return np.log(law[np.arange(tokens.size), np.maximum(tokens, 0)]).astype(np.float32)


def _zero_ambiguous(log_prob: F64Array, tolerance: F64Array) -> BoolArray:
    """Where float32 or float64 may round a probability to zero or not."""
    return np.asarray((log_prob >= LOG_ZERO - tolerance - 1e-9) & (log_prob <= LOG_SUBNORMAL))


def _near_argmax(winner: I64Array, low: F64Array, high: F64Array) -> BoolArray:
    """Per row, whether any other key's upper bound reaches the winner's lower bound."""
    if high.shape[1] < 2:
        return np.zeros(high.shape[0], dtype=bool)
    rows = np.arange(high.shape[0])
    others = high.copy()
    others[rows, winner] = -np.inf
    return np.asarray(low[rows, winner] <= others.max(axis=1))


def _target_intervals(law: LogLaw, noise: Noise) -> tuple[F64Array, F64Array]:
    """Bounds of the Gumbel-max keys ``log p + g`` a float32 kernel may compute."""
    ambiguous = _zero_ambiguous(law.log_probs, law.tolerance)
    alive = law.log_probs > LOG_ZERO + law.tolerance
    high = np.where(
        alive | ambiguous, law.log_probs + law.tolerance + noise.gumbel + noise.tolerance, -np.inf
    )
    low = np.where(
        alive & ~ambiguous, law.log_probs - law.tolerance + noise.gumbel - noise.tolerance, -np.inf
    )
    return low, high


def _acceptance_near(
    target_logits: F64Array, draft_logits: F64Array | None, temperature: F64Array, ids: I64Array, u: F64Array
) -> BoolArray:
    """Whether ``log p(d) - log u - log q(d)`` lies within float32 tolerance of 0 (or of zero mass)."""
    rows, safe = np.arange(ids.size), np.maximum(ids, 0)
    law = log_law(target_logits, temperature)
    log_p, tol_p = law.log_probs[rows, safe], law.tolerance[rows, safe]
    if draft_logits is None:
        log_q, tol_q = np.zeros(ids.size), np.zeros(ids.size)
    else:
        draft_law = log_law(draft_logits, temperature)
        log_q, tol_q = draft_law.log_probs[rows, safe], draft_law.tolerance[rows, safe]
    with np.errstate(divide="ignore"):
        log_u = np.where(u > 0, np.log(np.where(u > 0, u, 1.0)), -np.inf)
    tol_u = np.where(u > 0, TOL_ULPS * EPS32 * (1 + np.abs(np.where(u > 0, log_u, 0.0))), 0.0)
    with np.errstate(invalid="ignore"):
        margin = np.where(
            np.isneginf(log_p), -np.inf, np.where(np.isneginf(log_u + log_q), np.inf, log_p - log_u - log_q)
        )
    return np.asarray(
        _zero_ambiguous(log_p, tol_p)
        | _zero_ambiguous(log_q, tol_q)
        | (np.isfinite(margin) & (np.abs(margin) <= tol_p + tol_q + tol_u))
    )


def _residual_near(
    choice: I64Array,
    target_logits: F64Array,
    draft_logits: F64Array | None,
    temperature: F64Array,
    ids: I64Array,
    noise: Noise,
) -> BoolArray:
    """Whether the residual draw after a rejected real draft could flip under float32 rounding."""
    rows = np.arange(ids.size)
    target_law = log_law(target_logits, temperature)
    low, high = _target_intervals(target_law, noise)
    if draft_logits is None:
        # One-hot drafts: the residual is p without the drafted token.
        low, high = low.copy(), high.copy()
        low[rows, ids] = high[rows, ids] = -np.inf
        full_low, full_high = _target_intervals(target_law, noise)
        nothing_left = ~np.isfinite(high).any(axis=1)
        return np.asarray(
            np.where(nothing_left, _near_argmax(choice, full_low, full_high), _near_argmax(choice, low, high))
        )
    draft_law = log_law(draft_logits, temperature)
    p, q = np.exp(target_law.log_probs), np.exp(draft_law.log_probs)
    identical = np.all(
        (target_logits == draft_logits) | (np.isnan(target_logits) & np.isnan(draft_logits)), axis=1
    )
    error = target_law.tolerance * p + draft_law.tolerance * q + np.where(identical, 0.0, 1e-320)[:, None]
    difference = p - q
    with np.errstate(divide="ignore", invalid="ignore"):
        res_high = np.where(
            difference + error > 0,
            np.log(np.maximum(difference + error, 0)) + noise.gumbel + noise.tolerance,
            -np.inf,
        )
        res_low = np.where(
            difference - error > 0,
            np.log(np.maximum(difference - error, 0)) + noise.gumbel - noise.tolerance,
            -np.inf,
        )
    target = row_probs(target_logits, temperature)
    has_mass = np.maximum(target - row_probs(draft_logits, temperature), 0.0).sum(axis=1) > 0.0
    # Without residual mass the walk falls back to p; a kernel might still see a sliver of residual.
    fallback_near = np.isfinite(res_high).any(axis=1) | _near_argmax(choice, low, high)
    return np.asarray(np.where(has_mass, _near_argmax(choice, res_low, res_high), fallback_near))


class WalkSampler(Walk):
    """The walk as a `Variant`: the float64 sampler of a scheme, fast enough for calibration runs.

    The planted mutants of `fuzz.mutants` are subclasses that override one stage.
    """

    name = "walk"

    def __init__(self, scheme: RandomScheme = CANONICAL) -> None:
        super().__init__(scheme)
        self.streams = scheme
        if scheme is not CANONICAL:
            self.name = f"walk-{scheme.name}"

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample ``batch`` on the CPU with the scheme's uniforms."""
        return self.run(batch).output


def walk(
    batch: SpecBatch, scheme: RandomScheme = CANONICAL, max_elements: int = DEFAULT_MAX_ELEMENTS
) -> WalkResult:
    """`Walk` on ``batch``: the output and its near ties."""
    return Walk(scheme, max_elements).run(batch)
