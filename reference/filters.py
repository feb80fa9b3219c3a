"""Filtered verification: the processed law ``p'`` of a row, in float64 (the specification).

Per request, optional sampling parameters ``top_k`` (``0`` or ``>= V``: off), ``top_p`` in
``(0, 1]`` (``1``: off) and ``min_p`` in ``[0, 1)`` (``0``: off). The processed law of a row with
logits ``z`` at temperature ``T``, in vLLM Model Runner V2's order:

1. temperature: ``p_T = softmax(z / T)``, as `reference.law.row_probs` reads a row (NaN as ``-inf``,
   ``+inf`` entries uniform, a row with no finite logit uniform). A greedy row (``T == 0``) is
   one-hot at its argmax and every filter keeps the argmax: greedy rows are unaffected;
2. min-p: keep ``x`` with ``p_T(x) >= min_p * max p_T``;
3. top-k: keep ``x`` if fewer than ``k`` kept tokens have a larger probability (a *value pivot*: every
   token tied with the ``k``-th largest is kept, so more than ``k`` may survive);
4. top-p, over the law renormalised on what steps 2-3 kept: keep ``x`` if the kept tokens with a
   larger probability carry mass ``< top_p`` (the token that crosses ``top_p`` is kept; ties whole);
5. ``p'``: ``p_T`` restricted to the kept set, renormalised.

Each step keeps the tokens at or above a probability, so the kept set of a row is ``{x : z_x >= t}``
for one logit threshold ``t``: filtering is masking the logits below ``t`` to ``-inf``
(`filter_logits`), after which every rule of the unfiltered methods applies unchanged. The exact law,
the walk and the reference sampler read filtered rows through `reference.law.BatchRows`, so they
follow this module from one place. Draft rows are filtered only where the batch's ``draft_filter``
says the sampler filters them; otherwise the draft logits already are the law the drafts came from.

Rounding. A token whose membership depends on rounding is a *near pivot*: its log-probability within
the sampler's declared filter tolerance of the min-p threshold or of the ``k``-th value (distinct from
it: exact ties are kept whole by every value-pivot sampler), or the mass above it within the tolerance
of ``top_p`` (`pivot_band`), at a stage whose later stages still keep it. `kept_bounds` gives the
kept set without and with them, `near_pivot` the difference; the walk decides every row twice more,
once on each, and a decision that changes is a near tie.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64Array = npt.NDArray[np.float64]
I64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# The filter parameters a batch may carry, and the batch flag for filtering draft logits.
FILTERS = ("top_k", "top_p", "min_p")
FILTER_FLAGS = (*FILTERS, "draft_filter")
# Each parameter's "off" value.
FILTER_OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
# float32's unit roundoff.
FP32_EPS = 2.0**-24


@dataclass(frozen=True)
class FilterParams:
    """Per-row sampling parameters (``[A]`` arrays), every filter off by default.

    Attributes:
        top_k: ``0`` or ``>= V`` is off.
        top_p: ``1`` is off.
        min_p: ``0`` is off.
    """

    top_k: I64Array
    top_p: F64Array
    min_p: F64Array

    @classmethod
    def off(cls, rows: int) -> FilterParams:
        """No filter on ``rows`` rows."""
        return cls(np.zeros(rows, dtype=np.int64), np.ones(rows), np.zeros(rows))

    def take(self, index: npt.ArrayLike) -> FilterParams:
        """The parameters of rows ``index``."""
        at = np.asarray(index, dtype=np.int64)
        return FilterParams(self.top_k[at], self.top_p[at], self.min_p[at])

    def active(self, vocab_size: int) -> BoolArray:
        """Which rows filter anything at all."""
        return np.asarray(
            ((self.top_k > 0) & (self.top_k < vocab_size)) | (self.top_p < 1.0) | (self.min_p > 0.0)
        )


def _probs(logits: F64Array, temperature: F64Array) -> F64Array:
    """``p_T`` of each row, as `reference.law.row_probs` reads it (imported late: law imports this)."""
    from .law import row_probs

    return row_probs(logits, temperature)


def _mass_above(probs: F64Array, kept: BoolArray) -> F64Array:
    """``[A, V]`` per token, the renormalised mass of the kept tokens with a strictly larger probability."""
    weights = np.where(kept, probs, 0.0)
    total = weights.sum(axis=-1, keepdims=True)
    law = weights / np.where(total > 0, total, 1.0)
    order = np.argsort(-law, axis=-1, kind="stable")
    ordered = np.take_along_axis(law, order, axis=-1)
    before = np.cumsum(ordered, axis=-1) - ordered  # mass of the tokens sorted before each one
    # Ties share the mass before the first of them: the mass strictly above.
    first_of_tie = np.ones(ordered.shape, dtype=bool)
    first_of_tie[..., 1:] = ordered[..., 1:] != ordered[..., :-1]
    index = np.where(first_of_tie, np.arange(ordered.shape[-1]), 0)
    index = np.maximum.accumulate(index, axis=-1)
    strictly = np.take_along_axis(before, index, axis=-1)
    above = np.empty_like(strictly)
    np.put_along_axis(above, order, strictly, axis=-1)
    return above


def _kth_largest(probs: F64Array, kept: BoolArray, k: I64Array) -> F64Array:
    """``[A]`` the ``k``-th largest kept probability of each row (``-inf`` where fewer are kept)."""
    values = -np.sort(-np.where(kept, probs, -np.inf), axis=-1)
    at = np.clip(k - 1, 0, probs.shape[-1] - 1)
    kth = np.take_along_axis(values, at[:, None], axis=-1)[:, 0]
    return np.where(k <= kept.sum(axis=-1), kth, -np.inf)


def kept_tokens(logits: F64Array, temperature: F64Array, params: FilterParams) -> BoolArray:
    """``[A, V]`` the tokens each row's filters keep (every token of a greedy or unfiltered row)."""
    logits = np.atleast_2d(np.asarray(logits, dtype=np.float64))
    temperature = np.broadcast_to(np.asarray(temperature, dtype=np.float64), logits.shape[:1])
    vocab_size = logits.shape[-1]
    kept = np.ones(logits.shape, dtype=bool)
    rows = np.nonzero(params.active(vocab_size) & (temperature > 0))[0]
    if rows.size == 0:
        return kept
    probs = _probs(logits[rows], temperature[rows])
    keep = np.ones(probs.shape, dtype=bool)
    min_p = params.min_p[rows][:, None]
    keep &= (min_p <= 0) | (probs >= min_p * probs.max(axis=-1, keepdims=True))
    k = params.top_k[rows]
    by_k = (k > 0) & (k < vocab_size)
    keep &= ~by_k[:, None] | (probs >= _kth_largest(probs, keep, k)[:, None])
    top_p = params.top_p[rows][:, None]
    keep &= (top_p >= 1.0) | (_mass_above(probs, keep) < top_p)
    kept[rows] = keep
    return kept


def filter_logits(logits: F64Array, temperature: F64Array, params: FilterParams) -> F64Array:
    """Each row's logits with the tokens its filters drop set to ``-inf``; ``softmax(it / T)`` is ``p'``."""
    logits = np.atleast_2d(np.asarray(logits, dtype=np.float64))
    return np.asarray(np.where(kept_tokens(logits, temperature, params), logits, -np.inf), dtype=np.float64)


def processed_probs(logits: F64Array, temperature: F64Array, params: FilterParams) -> F64Array:
    """``[A, V]`` the processed laws ``p'`` of the rows."""
    filtered = filter_logits(logits, temperature, params)
    return _probs(filtered, np.broadcast_to(np.asarray(temperature, dtype=np.float64), filtered.shape[:1]))


# ---------------------------------------------------------------------------------------------
# Near pivots


@dataclass(frozen=True)
class PivotBand:
    """How far rounding may move a filter's comparison, as the sampler's declared arithmetic says.

    Attributes:
        log_prob: absolute error of a log-probability compared with the min-p threshold, the
            ``k``-th value or the smallest value top-p keeps, in units of the row's largest ``|z / T|``
            plus one.
        mass: absolute error of the mass above a token compared with ``top_p``, per ``sqrt(V)``.
    """

    log_prob: float
    mass: float


def pivot_band(ulps: float) -> PivotBand:
    """The band of a sampler whose filters round within ``ulps`` float32 ulps per operation: a
    log-probability within ``ulps`` ulps of the row's scale, a float32 cumulative sum of ``V``
    probabilities within ``ulps * sqrt(V)`` ulps of 1 (a random walk of rounding errors)."""
    return PivotBand(log_prob=ulps * FP32_EPS, mass=ulps * FP32_EPS)


def kept_bounds(
    logits: F64Array, temperature: F64Array, params: FilterParams, band: PivotBand
) -> tuple[BoolArray, BoolArray]:
    """``([A, V], [A, V])`` the tokens every sampler within ``band`` keeps, and those some such sampler
    may keep: the kept set without, and with, its near pivots.

    Stage by stage on the exact chain's pivots, a token is near a pivot when its log-probability lies
    within the band of the min-p threshold, or of the ``k``-th kept value or the smallest value top-p
    keeps while differing from it (exact ties are kept whole; a sampler comparing rounded values may
    tie the others with it), or when the kept mass above it lies within the band of ``top_p``; it then
    goes either way at that stage, and the later stages still apply to it. The row's largest
    token is always kept. Only rows that filter and sample have near pivots.
    """
    logits = np.atleast_2d(np.asarray(logits, dtype=np.float64))
    temperature = np.broadcast_to(np.asarray(temperature, dtype=np.float64), logits.shape[:1])
    exact = kept_tokens(logits, temperature, params)
    lower, upper = exact.copy(), exact.copy()
    vocab_size = logits.shape[-1]
    rows = np.nonzero(params.active(vocab_size) & (temperature > 0))[0]
    if rows.size == 0:
        return lower, upper
    t = temperature[rows][:, None]
    probs = _probs(logits[rows], temperature[rows])
    finite = np.isfinite(logits[rows])
    scale = np.where(finite, np.abs(logits[rows]), 0.0).max(axis=-1, keepdims=True) / t
    log_band = band.log_prob * (1.0 + scale)
    with np.errstate(divide="ignore"):
        log_probs = np.log(probs)
    keep = np.ones(probs.shape, dtype=bool)  # the exact chain before each stage
    low, high = keep.copy(), keep.copy()

    def stage(kept: BoolArray, near: BoolArray) -> None:
        nonlocal keep, low, high
        low &= kept & ~near
        high &= kept | near
        keep &= kept

    min_p = params.min_p[rows][:, None]
    by_min_p = min_p > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        threshold = np.log(np.where(by_min_p, min_p, 1.0)) + log_probs.max(axis=-1, keepdims=True)
        stage(
            ~by_min_p | (probs >= min_p * probs.max(axis=-1, keepdims=True)),
            by_min_p & (np.abs(log_probs - threshold) <= log_band),
        )
    k = params.top_k[rows]
    by_k = ((k > 0) & (k < vocab_size))[:, None]
    kth = _kth_largest(probs, keep, k)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_kth = np.log(np.maximum(kth, 0.0))
        stage(
            ~by_k | (probs >= kth),
            by_k & (probs != kth) & (np.abs(log_probs - log_kth) <= log_band) & (probs > 0),
        )
    top_p = params.top_p[rows][:, None]
    above = _mass_above(probs, keep)
    mass_band = band.mass * np.sqrt(vocab_size)
    by_p = top_p < 1.0
    kept_p = ~by_p | (above < top_p)
    # top-p keeps a value prefix too: the smallest value it keeps is compared with, like the k-th.
    pivot = np.where(keep & kept_p, probs, np.inf).min(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        near_value = (probs != pivot) & (np.abs(log_probs - np.log(pivot)) <= log_band) & (probs > 0)
    stage(kept_p, by_p & ((np.abs(above - top_p) <= mass_band) | near_value))
    largest = probs >= probs.max(axis=-1, keepdims=True)  # every filter keeps the largest
    lower[rows], upper[rows] = low | largest, high | largest
    return lower, upper


def near_pivot(logits: F64Array, temperature: F64Array, params: FilterParams, band: PivotBand) -> BoolArray:
    """``[A, V]`` the tokens whose membership of the kept set rounding within ``band`` could flip: those
    some sampler within the band keeps and another drops (`kept_bounds`)."""
    lower, upper = kept_bounds(logits, temperature, params, band)
    return upper & ~lower


def pivot_slack(logits: F64Array, temperature: F64Array, params: FilterParams, band: PivotBand) -> F64Array:
    """``[A]`` how far the log-normaliser of ``p'`` may move with the near pivots: ``log`` of the mass
    of the kept set with every near pivot over its mass without them (0 where a row has none)."""
    logits = np.atleast_2d(np.asarray(logits, dtype=np.float64))
    temperature = np.broadcast_to(np.asarray(temperature, dtype=np.float64), logits.shape[:1])
    low, high = kept_bounds(logits, temperature, params, band)
    if not (high & ~low).any():
        return np.zeros(logits.shape[0])
    probs = _probs(logits, np.where(temperature > 0, temperature, 1.0))
    upper = np.where(high, probs, 0.0).sum(axis=-1)
    lower = np.where(low, probs, 0.0).sum(axis=-1)
    with np.errstate(divide="ignore"):
        return np.asarray(np.where(lower > 0, np.log(upper) - np.log(np.where(lower > 0, lower, 1.0)), 0.0))


def explain_token(logits: F64Array, temperature: float, params: FilterParams, token: int) -> str:
    """Why ``token`` lies outside the kept set of one row, in words: which filter drops it, how far
    from that filter's cut-off (in float32 ulps of the compared quantity) and the mass it carries
    under ``p_T``; empty when the token is kept (or out of range, or the row is greedy)."""
    row = np.asarray(logits, dtype=np.float64)[None, :]
    t = np.full(1, temperature)
    if not 0 <= token < row.shape[1] or temperature <= 0 or kept_tokens(row, t, params)[0, token]:
        return ""
    probs = _probs(row, t)[0]
    mass = f"p_T = {probs[token]:.3g}"
    keep = np.ones(probs.shape, dtype=bool)
    min_p = float(params.min_p[0])
    if min_p > 0:
        threshold = min_p * probs.max()
        if probs[token] < threshold:
            ulps = (threshold - probs[token]) / (np.spacing(np.float32(threshold)) or FP32_EPS)
            return (
                f"token {token} lies outside the kept set: min-p {min_p:.6g} drops it, {ulps:.3g} float32 "
                f"ulps below the threshold {threshold:.9g} ({mass})"
            )
        keep &= probs >= threshold
    k = int(params.top_k[0])
    if 0 < k < probs.size:
        kth = float(_kth_largest(probs[None], keep[None], np.array([k]))[0])
        if probs[token] < kth:
            ulps = (kth - probs[token]) / (np.spacing(np.float32(kth)) or FP32_EPS)
            rank = int((probs[keep] > probs[token]).sum()) + 1
            return (
                f"token {token} lies outside the kept set: top-k {k} drops it (rank {rank}), "
                f"{ulps:.3g} float32 ulps below the k-th value {kth:.9g} ({mass})"
            )
        keep &= probs >= kth
    top_p = float(params.top_p[0])
    above = float(_mass_above(probs[None], keep[None])[0, token])
    ulps = (above - top_p) / np.spacing(np.float32(top_p))
    return (
        f"token {token} lies outside the kept set: top-p {top_p:.9g} drops it, the kept mass above it is "
        f"{above:.9g} ({ulps:.3g} float32 ulps past top-p; {mass})"
    )
