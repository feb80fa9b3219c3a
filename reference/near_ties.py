"""The near-tie model: which decisions of the float64 walk a float32 kernel could take the other way.

The walk (`reference.walk`) records every decision it makes (`Decision`: an acceptance test, a
draw, block verification's keep decision, or a comparison of exact values); `judge` reads that
record in one pass and marks every emitted position whose decision float32 arithmetic could flip:
a *near tie*. The model works in the log domain a kernel computes in (``eps = 2**-23``,
times `reference.schemes.TOL_ULPS`): ``e(x) = (x - max) / T`` carries ``|e| + 4 + log2(V)`` ulps
(its rounding and the row's log-sum-exp), the Gumbel noise the scheme's tolerance, ``log u``
``|log u| + 1`` ulps; a residual weight ``p - q`` is known to ``tol_p p + tol_q q``. A probability
within tolerance of ``2**-1075`` (where float64 rounds to zero) may round either way, and the
float64 subnormal range below ``e**-700`` is imprecise in the reference itself; both count as near.
Greedy decisions and synthetic acceptances compare exact values and are never near.

A draw with a block uniform (`reference.schemes.draw`, ``canonical-v3``) is near where the
Gumbel-max within the walk's block could flip as above, or where the block itself could: a kernel's
cumulative block masses lie between the cumulative sums of the weights' bounds, widened by
`reference.schemes.BLOCK_MASS_RTOL` for the float32 sum of a block, and its threshold ``u * M``
between ``u`` times the two totals (`draw_near_bounds`).

Block verification (`reference.block`) is bounded the same way, one step further: each weight
ratio ``p(d) / q(d)`` is known to ``tol_p + tol_q`` in the log domain, so a weight ``w_i`` lies
in an interval (the clamp at 1 included: where ``w_{i-1} p / q`` may fall on either side of 1, the
interval reaches 1 and ``1 - w_i`` reaches 0); the residual mass ``S_i`` is bounded by the sum of
``max(w p - q, 0)`` at the ends of those intervals, widened by ``4 + log2(V)`` ulps for the float32
sum over the vocabulary; the keep probability ``h_i = S_i / (S_i + 1 - w_i)`` is increasing in
``S_i`` and decreasing in ``1 - w_i``, which bounds it (`block_keep_bounds`). A decision
``eta_i < h_i`` with ``eta_i`` inside those bounds is near; it may move ``m`` anywhere between the
largest index surely kept and the largest possibly kept, so every emitted position from the first
of those to ``m`` is near. Rows whose target and draft logits are identical give exactly equal
``p`` and ``q`` in any arithmetic, so their ratios and residuals carry no tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .law import MAX_TEMPERATURE, BatchRows, F64Array, I64Array, clean, one_hot, row_probs
from .schemes import BLOCK_MASS_RTOL, BLOCK_TOKENS, EPS32, TOL_ULPS, Noise, block_masses, in_blocks

LOG_ZERO = -1075 * math.log(2.0)
LOG_SUBNORMAL = -700.0

BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class LogLaw:
    """Rows of ``log softmax(logits / T)`` that never underflow, with their float32 tolerance."""

    log_probs: F64Array
    tolerance: F64Array


def log_law(logits: F64Array, temperature: F64Array) -> LogLaw:
    """The log-domain law of every row (``T = 1`` for greedy rows) and the float32 tolerance of each entry."""
    x = clean(logits)
    t = np.minimum(np.where(temperature > 0, temperature, 1.0), MAX_TEMPERATURE)[:, None]
    row_max = x.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        scaled = np.where(x == row_max, 0.0, (x - row_max) / t)
    # Skipped where no row has them: the same result, without a pass over every row.
    if np.isposinf(row_max).any():  # uniform over the +inf entries
        scaled = np.where(np.isposinf(row_max), np.where(np.isposinf(x), 0.0, -np.inf), scaled)
    if np.isneginf(row_max).any():  # no finite logit: uniform
        scaled = np.where(np.isneginf(row_max), 0.0, scaled)
    log_probs = scaled - np.log(np.exp(scaled).sum(axis=1, keepdims=True))
    finite = np.isfinite(scaled)
    bits = np.abs(np.where(finite, scaled, 0.0)) + 4 + math.log2(x.shape[1])
    return LogLaw(log_probs, np.where(finite, TOL_ULPS * EPS32 * bits, 0.0))


def zero_ambiguous(log_prob: F64Array, tolerance: F64Array) -> BoolArray:
    """Where float32 or float64 may round a probability to zero or not."""
    return np.asarray((log_prob >= LOG_ZERO - tolerance - 1e-9) & (log_prob <= LOG_SUBNORMAL))


def near_argmax(winner: I64Array, low: F64Array, high: F64Array) -> BoolArray:
    """Per row, whether any other key's upper bound reaches the winner's lower bound."""
    if high.shape[1] < 2:
        return np.zeros(high.shape[0], dtype=bool)
    rows = np.arange(high.shape[0])
    others = high.copy()
    others[rows, winner] = -np.inf
    return np.asarray(low[rows, winner] <= others.max(axis=1))


def target_weights(law: LogLaw) -> tuple[F64Array, F64Array]:
    """Bounds of the log-weights ``log p`` a float32 kernel may compute (``-inf`` where it may
    hold 0)."""
    log_p, tol = law.log_probs, law.tolerance
    ambiguous, alive = zero_ambiguous(log_p, tol), log_p > LOG_ZERO + tol
    return np.where(alive & ~ambiguous, log_p - tol, -np.inf), np.where(
        alive | ambiguous, log_p + tol, -np.inf
    )


def draw_near_bounds(choice: I64Array, log_low: F64Array, log_high: F64Array, noise: Noise) -> BoolArray:
    """Whether `reference.schemes.draw` of ``choice`` could flip when a float32 kernel holds each
    log-weight anywhere in ``[log_low, log_high]``.

    The Gumbel-max keys ``log w + g`` then lie within the bounds plus the noise's tolerance. With a
    block uniform, the block could flip too: a kernel's cumulative block masses lie between the
    sums of the bounds' weights, widened by `BLOCK_MASS_RTOL`, and its threshold ``u * M`` between
    ``u`` times the two totals; the block is near where the boundary below or above the walk's block
    may cross the threshold.
    """
    low = np.where(np.isneginf(log_low), -np.inf, log_low + noise.gumbel - noise.tolerance)
    high = np.where(np.isneginf(log_high), -np.inf, log_high + noise.gumbel + noise.tolerance)
    if noise.block_uniform is None:
        return near_argmax(choice, low, high)
    inside = in_blocks(choice // BLOCK_TOKENS, low.shape[1])
    within = near_argmax(choice, np.where(inside, low, -np.inf), np.where(inside, high, -np.inf))
    cum_low = np.cumsum(block_masses(np.exp(log_low)) * (1 - BLOCK_MASS_RTOL), axis=1)
    cum_high = np.cumsum(block_masses(np.exp(log_high)) * (1 + BLOCK_MASS_RTOL), axis=1)
    rows, block = np.arange(choice.size), choice // BLOCK_TOKENS
    below = np.where(block > 0, cum_high[rows, np.maximum(block - 1, 0)], 0.0)
    u = noise.block_uniform
    crosses = (below > u * cum_low[:, -1]) | (cum_low[rows, block] <= u * cum_high[:, -1])
    return np.asarray(within | crosses)


def draw_near(choice: I64Array, logits: F64Array, temperature: F64Array, noise: Noise) -> BoolArray:
    """Whether `reference.schemes.draw` of ``choice`` from the target laws of ``logits`` could flip
    in float32."""
    return draw_near_bounds(choice, *target_weights(log_law(logits, temperature)), noise)


def _at_drafts(logits: F64Array | None, temperature: F64Array, ids: I64Array) -> tuple[F64Array, F64Array]:
    """The log law at each row's draft and its tolerance; 0 and 0 (one-hot drafts) for ``None``."""
    if logits is None:
        return np.zeros(ids.size), np.zeros(ids.size)
    law, rows, safe = log_law(logits, temperature), np.arange(ids.size), np.maximum(ids, 0)
    return law.log_probs[rows, safe], law.tolerance[rows, safe]


def acceptance_near(
    target_logits: F64Array, draft_logits: F64Array | None, temperature: F64Array, ids: I64Array, u: F64Array
) -> BoolArray:
    """Whether ``log p(d) - log u - log q(d)`` lies within float32 tolerance of 0 (or of zero mass)."""
    log_p, tol_p = _at_drafts(target_logits, temperature, ids)
    log_q, tol_q = _at_drafts(draft_logits, temperature, ids)
    with np.errstate(divide="ignore"):
        log_u = np.where(u > 0, np.log(np.where(u > 0, u, 1.0)), -np.inf)
    tol_u = np.where(u > 0, TOL_ULPS * EPS32 * (1 + np.abs(np.where(u > 0, log_u, 0.0))), 0.0)
    with np.errstate(invalid="ignore"):
        margin = np.where(
            np.isneginf(log_p), -np.inf, np.where(np.isneginf(log_u + log_q), np.inf, log_p - log_u - log_q)
        )
    return np.asarray(
        zero_ambiguous(log_p, tol_p)
        | zero_ambiguous(log_q, tol_q)
        | (np.isfinite(margin) & (np.abs(margin) <= tol_p + tol_q + tol_u))
    )


def residual_near(
    choice: I64Array,
    target_logits: F64Array,
    draft_logits: F64Array | None,
    temperature: F64Array,
    ids: I64Array,
    noise: Noise,
    weight: F64Array | None = None,
    weight_tolerance: F64Array | None = None,
) -> BoolArray:
    """Whether the residual draw after a rejected real draft could flip under float32 rounding;
    ``weight`` (block verification's ``w_m``, 1 by default) scales ``p`` in the residual
    ``max(w p - q, 0)``, and ``weight_tolerance`` (``[A]``, in the log domain), how far a kernel's
    ``log w_m`` may lie from it, widens the weighted term's tolerance."""
    rows = np.arange(ids.size)
    scale = np.ones(ids.size) if weight is None else weight
    spread = np.zeros(ids.size) if weight_tolerance is None else weight_tolerance
    target_law = log_law(target_logits, temperature)
    low, high = target_weights(target_law)
    if draft_logits is None:
        # One-hot drafts: the residual is p without the drafted token, or p when nothing is left.
        rest_low, rest_high = low.copy(), high.copy()
        rest_low[rows, ids] = rest_high[rows, ids] = -np.inf
        nothing_left = ~np.isfinite(rest_high).any(axis=1)
        rest_near = draw_near_bounds(choice, rest_low, rest_high, noise)
        return np.asarray(np.where(nothing_left, draw_near_bounds(choice, low, high, noise), rest_near))
    draft_law = log_law(draft_logits, temperature)
    p, q = scale[:, None] * np.exp(target_law.log_probs), np.exp(draft_law.log_probs)
    identical = same_rows(target_logits, draft_logits)
    error = (target_law.tolerance + spread[:, None]) * p + draft_law.tolerance * q
    error += np.where(identical, 0.0, 1e-320)[:, None]
    difference = p - q
    with np.errstate(divide="ignore", invalid="ignore"):
        res_low, res_high = (
            np.where(mass > 0, np.log(np.maximum(mass, 0)), -np.inf)
            for mass in (difference - error, difference + error)
        )
    target = scale[:, None] * row_probs(target_logits, temperature)
    has_mass = np.maximum(target - row_probs(draft_logits, temperature), 0.0).sum(axis=1) > 0.0
    # Without residual mass the walk falls back to p; a kernel might still see a sliver of residual.
    fallback_near = np.isfinite(res_high).any(axis=1) | draw_near_bounds(choice, low, high, noise)
    return np.asarray(np.where(has_mass, draw_near_bounds(choice, res_low, res_high, noise), fallback_near))


def same_rows(target_logits: F64Array, draft_logits: F64Array) -> BoolArray:
    """Rows whose target and draft logits are identical (NaN where both are NaN): equal laws exactly."""
    same = (target_logits == draft_logits) | (np.isnan(target_logits) & np.isnan(draft_logits))
    return np.asarray(np.all(same, axis=1))


def _bounds(law: LogLaw, exact: BoolArray) -> tuple[F64Array, F64Array]:
    """Bounds ``[A, V]`` of the probabilities a float32 kernel may hold (exact rows: the value)."""
    tolerance = np.where(exact[:, None], 0.0, law.tolerance)
    ambiguous = zero_ambiguous(law.log_probs, tolerance) & ~exact[:, None]
    low = np.where(ambiguous, 0.0, np.exp(law.log_probs - tolerance))
    return low, np.exp(law.log_probs + tolerance)


def ratio_bounds(
    target_logits: F64Array, draft_logits: F64Array | None, temperature: F64Array, ids: I64Array
) -> tuple[F64Array, F64Array]:
    """Bounds of ``log p(d) - log q(d)`` a float32 kernel may compute, per row (``-inf`` for a
    placeholder or ``p(d) = 0``, ``+inf`` for ``q(d) = 0 < p(d)``, both ends open where ``p(d)`` or
    ``q(d)`` may round to zero)."""
    log_p, tol_p = _at_drafts(target_logits, temperature, ids)
    log_q, tol_q = _at_drafts(draft_logits, temperature, ids)
    ambiguous_q = zero_ambiguous(log_q, tol_q)  # never for one-hot drafts: log q = 0
    if draft_logits is not None:
        exact = same_rows(target_logits, draft_logits)
        tol_p, tol_q = np.where(exact, 0.0, tol_p), np.where(exact, 0.0, tol_q)
    ambiguous = zero_ambiguous(log_p, tol_p) | ambiguous_q
    with np.errstate(invalid="ignore"):
        ratio = np.where(np.isneginf(log_p), -np.inf, np.where(np.isneginf(log_q), np.inf, log_p - log_q))
    low = np.where(ambiguous & (ids >= 0), -np.inf, ratio - tol_p - tol_q)
    high = np.where(ambiguous & (ids >= 0), np.inf, ratio + tol_p + tol_q)
    return np.where(ids >= 0, low, -np.inf), np.where(ids >= 0, high, -np.inf)


def block_keep_bounds(
    weight: F64Array,
    target_logits: F64Array,
    draft_logits: F64Array | None,
    temperature: F64Array,
    ids: I64Array,
) -> F64Array:
    """``[2, A]`` bounds of the keep probability ``h_i`` a float32 kernel may compute at a row
    ``1 <= i < n``, from ``weight [2, A]`` (the bounds of ``w_i``) and the row's laws."""
    vocab_size = target_logits.shape[1]
    if draft_logits is None:
        exact = np.ones(ids.size, dtype=bool)
        q_low = q_high = one_hot(ids, vocab_size)
    else:
        exact = same_rows(target_logits, draft_logits)
        q_low, q_high = _bounds(log_law(draft_logits, temperature), exact)
        q_low, q_high = np.where(ids[:, None] >= 0, q_low, 0.0), np.where(ids[:, None] >= 0, q_high, 0.0)
    p_low, p_high = _bounds(log_law(target_logits, temperature), exact & (draft_logits is not None))
    summed = TOL_ULPS * EPS32 * (4 + math.log2(vocab_size))
    mass_low = np.maximum(weight[0][:, None] * p_low - q_high, 0.0).sum(axis=1) * (1 - summed)
    mass_high = np.maximum(weight[1][:, None] * p_high - q_low, 0.0).sum(axis=1) * (1 + summed)
    rest_low, rest_high = 1.0 - weight[1], 1.0 - weight[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        low = np.where(mass_low + rest_high > 0, mass_low / (mass_low + rest_high), 1.0)
        high = np.where(mass_high + rest_low > 0, mass_high / (mass_high + rest_low), 1.0)
    return np.stack([low, high])


def clamped_sum(log_weight: F64Array, log_ratio: F64Array) -> F64Array:
    """``log min(1, w r)`` elementwise from ``log w`` and ``log r``; a weight of 0 stays 0."""
    with np.errstate(invalid="ignore"):
        total = np.minimum(0.0, log_weight + log_ratio)
    return np.where(np.isneginf(log_weight) | np.isneginf(log_ratio), -np.inf, total)


def block_bounds(rows: BatchRows, requests: I64Array, width: int) -> tuple[F64Array, F64Array]:
    """``[2, B, W]`` bounds of the log-weights ``log w_i`` and of the keep probabilities ``h_i`` a
    float32 kernel may compute, at each index ``0 <= i <= n`` of ``requests`` (0 elsewhere).

    ``w_0 = 1``, each ratio ``p(d) / q(d)`` known to `ratio_bounds`; ``h_i`` from `block_keep_bounds`
    for ``1 <= i < n``, and ``h_n = w_n``.
    """
    counts = rows.counts[requests]
    log_weight = np.zeros((2, rows.counts.size, width))
    keep = np.zeros((2, rows.counts.size, width))
    for position in range(int(counts.max(initial=0))):
        a = requests[position < counts]
        temperature = rows.temperature[a]
        logits, draft_logits, ids = (
            rows.target_rows(a, position),
            rows.draft_rows(a, position),
            rows.draft_ids(a, position),
        )
        bounds = log_weight[:, a, position]
        if position:
            keep[:, a, position] = block_keep_bounds(np.exp(bounds), logits, draft_logits, temperature, ids)
        log_ratio = np.stack(ratio_bounds(logits, draft_logits, temperature, ids))
        log_weight[:, a, position + 1] = clamped_sum(bounds, log_ratio)
    keep[:, requests, counts] = np.exp(log_weight[:, requests, counts])
    return log_weight, keep


# ---------------------------------------------------------------------------------------------
# The walk's record, and the pass that judges it


@dataclass(frozen=True)
class ExactDecision:
    """Decisions at ``position`` of ``requests`` that compare exact values (a greedy row's argmax
    test, a synthetic acceptance): no rounding flips them."""

    requests: I64Array
    position: int


@dataclass(frozen=True)
class AcceptanceTest:
    """The tests ``p(d) > u q(d)`` at ``position`` of ``requests``, of drafts ``ids`` with uniforms ``u``."""

    requests: I64Array
    position: int
    ids: I64Array
    u: F64Array


@dataclass(frozen=True)
class Draw:
    """The tokens ``choice`` drawn with ``noise`` at target row ``row`` of ``requests``, emitted at
    ``position``.

    Drawn from the target law, or, for the drafts ``residual_of``, from the residual
    ``max(w p - q, 0)`` of each draft (``w`` block verification's ``weight``, 1 by default; a
    placeholder's is ``p``).
    """

    requests: I64Array
    position: int | I64Array
    row: int | I64Array
    choice: I64Array
    noise: Noise
    residual_of: I64Array | None = None
    weight: F64Array | None = None


@dataclass(frozen=True)
class Keep:
    """Block verification's decisions ``eta_i < h_i`` at index ``index`` of ``requests``: their
    uniforms ``eta`` and which ones kept it."""

    requests: I64Array
    index: int
    eta: F64Array
    kept: BoolArray


Decision = ExactDecision | AcceptanceTest | Draw | Keep


@dataclass(frozen=True)
class Judgement:
    """What the model makes of a record: ``near [B, W]``, whether a decision at each emitted
    position could flip under float32 rounding, and ``num_decisions``, the decisions recorded."""

    near: BoolArray
    num_decisions: int


def judge(rows: BatchRows, record: Sequence[Decision], width: int) -> Judgement:
    """One pass over the walk's ``record`` of ``rows``: which emitted positions (``width`` per
    request) hold a near tie.

    An acceptance test or a draw that could flip makes its own position near; block verification's
    keep decisions make the span from the largest index surely kept to ``m`` near.
    """
    near = np.zeros((rows.counts.size, width), dtype=bool)
    keeps = [d for d in record if isinstance(d, Keep)]
    verified = np.unique(np.concatenate([k.requests for k in keeps])) if keeps else np.zeros(0, np.int64)
    log_weight, keep = block_bounds(rows, verified, width)
    # Block verification: the largest index surely kept, possibly kept, and kept (m), per request.
    surely, possibly, accepted = np.zeros((3, rows.counts.size), dtype=np.int64)
    for decision in record:
        if isinstance(decision, AcceptanceTest):
            a, at = decision.requests, decision.position
            near[a, at] |= acceptance_near(
                rows.target_rows(a, at), rows.draft_rows(a, at), rows.temperature[a], decision.ids, decision.u
            )
        elif isinstance(decision, Draw):
            near[decision.requests, decision.position] |= _draw_near(rows, decision, log_weight)
        elif isinstance(decision, Keep):
            a, i, eta = decision.requests, decision.index, decision.eta
            exact = rows.temperature[a] == 0.0
            sure = decision.kept & (exact | (eta < keep[0, a, i]))
            maybe = decision.kept | (~exact & (eta < keep[1, a, i]))
            # A request's keep decisions come in increasing index: each of these ends at the largest.
            surely[a[sure]], possibly[a[maybe]], accepted[a[decision.kept]] = i, i, i
    column = np.arange(width)[None, :]
    span = (column >= surely[:, None]) & (column <= accepted[:, None])
    near |= (surely < possibly)[:, None] & span
    return Judgement(near, sum(d.requests.size for d in record))


def _draw_near(rows: BatchRows, draw: Draw, log_weight: F64Array) -> BoolArray:
    """Whether each of ``draw``'s tokens could flip (``log_weight``: `block_bounds`, for a weighted
    residual's tolerance)."""
    a, row, choice, noise = draw.requests, draw.row, draw.choice, draw.noise
    logits, temperature = rows.target_rows(a, row), rows.temperature[a]
    if draw.residual_of is None:
        return draw_near(choice, logits, temperature, noise)
    ids, spread = draw.residual_of, None
    if draw.weight is not None:
        # How far a kernel's log w may lie from the walk's w.
        with np.errstate(divide="ignore", invalid="ignore"):
            spread = np.abs(log_weight[:, a, row] - np.log(draw.weight)).max(axis=0)
        spread = np.where(draw.weight > 0, spread, 0.0)
    safe = np.maximum(ids, 0)
    near = residual_near(
        choice, logits, rows.draft_rows(a, row), temperature, safe, noise, draw.weight, spread
    )
    if (ids < 0).any():
        near = np.where(ids >= 0, near, draw_near(choice, logits, temperature, noise))
    return np.asarray(near)
