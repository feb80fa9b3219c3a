"""Filtered verification's kept sets in Triton: per row, the logit threshold of the processed law.

Each filter of `reference.filters` keeps the tokens at or above a value, so a row's kept set is
``{x : z_x >= t}`` for one threshold ``t`` per row (DESIGN.md, "Filtered verification"). This
module finds ``t`` without sorting the vocabulary: `filter_threshold_kernel` runs one program per
row and reads the row a few times, tile by tile, never holding more than one tile:

1. the row max ``m`` and ``S = sum exp((z - m) / T)`` (one pass);
2. min-p keeps ``(z - m) / T >= log(min_p)``: the smallest float32 logit at or above
   ``m + log(min_p) T``, that sum taken in float64 (`_min_p_key`);
3. top-k, a value pivot: the ``k``-th largest kept value is the largest order key with at least
   ``k`` kept tokens at or above it, found by a ``WAYS``-way search over the int32 keys of the
   float32 values (`_order_key`: integer order is float order): each pass counts the tokens at or
   above ``WAYS`` keys at once (a ``[BLOCK_V, WAYS]`` comparison summed over the tile) and narrows
   the interval of keys ``WAYS``-fold; `SEARCH_PASSES` passes cover every float32 value, so the
   search ends on the ``k``-th value itself (`_kth_key`). The first pass also counts the kept
   tokens, which tells whether top-k filters at all;
4. top-p, over the law renormalised on what min-p and top-k kept: the smallest order key whose
   kept tokens strictly above carry mass ``< top_p`` times the kept mass, by the same search over
   the same keys, each pass summing ``exp((z - m) / T)`` above ``WAYS`` keys at once
   (`_top_p_key`); the first pass also sums the kept mass. Masses are fp32 sums of
   ``exp((z - m) / T)`` over tiles, every key's mass summed in the same order, so a token whose mass
   above lies within a few ulps (times ``sqrt(V)``) of ``top_p`` is a near pivot
   (`reference.filters.pivot_band`);
5. ``t`` is the smallest kept logit, ``-inf`` where every token is kept.

A row that filters by top-k and top-p is read at most ``2 * SEARCH_PASSES + 2`` times, 18 with
16 ways (a pass whose interval is already one key wide is skipped, so narrow intervals, such as
top-p's after top-k, take fewer); a row without top-k or top-p, at most 2 times.
The jit code and its launcher, `filter_thresholds`, live together here; `apply_thresholds` masks
the logits with the thresholds.

Numbers follow `reference.filters`: NaN logits count as ``-inf``; ``-0.0`` ties with ``+0.0``;
ties at a pivot are kept whole; the row max is always kept; a probability that float64 rounds to
zero (``(z - m) / T - log S`` under ``ln 2**-1075``) ties with every other zero, so a ``k``-th value
of probability zero keeps every token min-p kept, as the specification's ``k``-th probability ``0``
does (float64 also ties distinct logits whose probabilities are subnormal; the kernel does not,
which moves less than ``2**-1022`` of mass). Rows that filter nothing get ``t = -inf``: greedy
rows (``T == 0``, one-hot at the argmax, which every filter keeps), rows with every filter off, rows
with no finite logit (uniform: every filter keeps everything) and rows with ``+inf`` logits. A
``+inf`` row's law is uniform over its ``+inf`` entries and every filter keeps those; the
specification may keep or drop its zero-probability tokens, and ``-inf`` keeps them, which leaves
the law ``p'`` unchanged.

Out-of-range parameters that `filter_thresholds` refuses when it checks values still give a
kept set that holds the row max: ``k < 0``, a NaN ``min_p`` or ``top_p`` and a NaN or negative
temperature are off; ``min_p >= 1`` and ``top_p <= 0`` keep the tokens tied with the max.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import triton
import triton.language as tl

from specsample.kernels.rules import (
    LOG_ZERO,
    MAX_TEMPERATURE,
    NEG_INF,
    clean_logit,
    inverse_temperature,
    rescale_factor,
    scaled_logit,
)
from specsample.reference.contract import LOGIT_DTYPES

# Keys a search pass tries at once: each pass narrows the interval of order keys WAYS-fold.
WAYS = 16
# Passes of a search over the order keys: the keys of float32 values span fewer than 2**32, and
# SEARCH_PASSES passes narrow 2**32 keys down to one.
SEARCH_PASSES = -(-32 // (WAYS.bit_length() - 1))
# Tile widths: the default is the vocabulary's next power of two, within these bounds; a search pass
# holds a [BLOCK_V, WAYS] tile, at most 16,384 elements by default.
MIN_BLOCK_V = 16
MAX_BLOCK_V = 16384 // WAYS
# The interpreter (CPU tensors) pays per operation rather than per element: wider default tiles.
INTERPRETER_MAX_BLOCK_V = 8192
# The largest finite float32: min-p's cut is clamped to -FLT_MAX before its conversion to float32.
FLT_MAX = tl.constexpr(3.4028234663852886e38)
POS_INF = tl.constexpr(float("inf"))
# Bits that `_order_key` flips in negative values (every bit but the sign).
MAGNITUDE_BITS = tl.constexpr(0x7FFFFFFF)
# Below every order key (the least, -inf's, is -2**31 + 2**23 - 1) and every search candidate.
NO_KEY = tl.constexpr(-(2**31))
INDEX_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _order_key(x):
    """The int32 order key of float32 values ``x`` (no NaN): ``a < b`` iff ``key(a) < key(b)``, and
    ``-0.0`` has the key of ``+0.0``."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ MAGNITUDE_BITS)


@triton.jit
def _key_value(key):
    """The float32 value of an int32 order key (`_order_key`'s inverse)."""
    bits = tl.where(key >= 0, key, key ^ MAGNITUDE_BITS)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _tile(row_ptr, tile_start, vocab_size, BLOCK_V: tl.constexpr):
    """Tokens ``tile_start + [0, BLOCK_V)`` of a row: ``(logits as float32 with NaN as -inf, in vocab)``."""
    tokens = tile_start + tl.arange(0, BLOCK_V)
    in_vocab = tokens < vocab_size
    return clean_logit(tl.load(row_ptr + tokens, mask=in_vocab, other=NEG_INF)), in_vocab


@triton.jit
def _row_stats(row_ptr, vocab_size, inv_temperature, BLOCK_V: tl.constexpr):
    """``(max, sum of exp((z - max) / T))`` of a row, the sum rescaled as the max grows."""
    row_max = tl.full([], NEG_INF, tl.float32)
    row_sum = tl.full([], 0.0, tl.float32)
    tile_start = 0
    while tile_start < vocab_size:
        x, in_vocab = _tile(row_ptr, tile_start, vocab_size, BLOCK_V)
        new_max = tl.maximum(row_max, tl.max(x, axis=0))
        weights = tl.where(in_vocab, tl.exp(scaled_logit(x, new_max, inv_temperature)), 0.0)
        row_sum = row_sum * rescale_factor(row_max, new_max, inv_temperature) + tl.sum(weights, axis=0)
        row_max = new_max
        tile_start += BLOCK_V
    return row_max, row_sum


@triton.jit
def _keys(x, in_vocab):
    """The order keys of a tile, `NO_KEY` (below every candidate) outside the vocabulary."""
    return tl.where(in_vocab, _order_key(x), NO_KEY)


@triton.jit
def _candidates(lo, top, WAYS: tl.constexpr):
    """``WAYS`` order keys ``lo + j ceil((top - lo) / WAYS)``, ``j < WAYS``, capped at ``top`` (int64):
    lane 0 is ``lo`` itself, and every gap between lanes, or from the last lane to ``top``, is at most
    ``ceil((top - lo) / WAYS)`` keys wide."""
    step = (top - lo + (WAYS - 1)) // WAYS
    return tl.minimum(lo + tl.arange(0, WAYS).to(tl.int64) * step, top)


@triton.jit
def _counts_from(row_ptr, vocab_size, cuts, BLOCK_V: tl.constexpr, WAYS: tl.constexpr):
    """``[WAYS]`` how many tokens of a row have an order key ``>= cuts[j]`` (int32 cuts), one pass."""
    counts = tl.zeros([WAYS], tl.int32)
    tile_start = 0
    while tile_start < vocab_size:
        x, in_vocab = _tile(row_ptr, tile_start, vocab_size, BLOCK_V)
        keys = _keys(x, in_vocab)
        counts += tl.sum((keys[:, None] >= cuts[None, :]).to(tl.int32), axis=0)
        tile_start += BLOCK_V
    return counts


@triton.jit
def _masses_above(row_ptr, vocab_size, cuts, row_max, inv_temperature,
                  BLOCK_V: tl.constexpr, WAYS: tl.constexpr):  # fmt: skip
    """``[WAYS]`` ``sum exp((z - max) / T)`` over the tokens of a row whose order key is ``> cuts[j]``
    (int32 cuts), one pass.

    Each lane is a fixed sum of non-negative terms, reduced tile by tile in the same order as every
    other lane and whatever its cut is: it never decreases as the cut does, so a search on it is
    consistent (monotone, and the same cut gets the same mass in any lane of any pass)."""
    masses = tl.zeros([WAYS], tl.float32)
    tile_start = 0
    while tile_start < vocab_size:
        x, in_vocab = _tile(row_ptr, tile_start, vocab_size, BLOCK_V)
        weights = tl.where(in_vocab, tl.exp(scaled_logit(x, row_max, inv_temperature)), 0.0)
        above = _keys(x, in_vocab)[:, None] > cuts[None, :]
        masses += tl.sum(tl.where(above, weights[:, None], 0.0), axis=0)
        tile_start += BLOCK_V
    return masses


@triton.jit
def _smallest_from(row_ptr, vocab_size, key, BLOCK_V: tl.constexpr):
    """``(the smallest logit whose order key is >= key, the smallest logit)`` of a row (``+inf``: none)."""
    smallest = tl.full([], POS_INF, tl.float32)
    least = smallest
    tile_start = 0
    while tile_start < vocab_size:
        x, in_vocab = _tile(row_ptr, tile_start, vocab_size, BLOCK_V)
        kept = in_vocab & (_order_key(x) >= key)
        smallest = tl.minimum(smallest, tl.min(tl.where(kept, x, POS_INF), axis=0))
        least = tl.minimum(least, tl.min(tl.where(in_vocab, x, POS_INF), axis=0))
        tile_start += BLOCK_V
    return smallest, least


@triton.jit
def _min_p_key(row_max, temperature, min_p):
    """The order key of the smallest float32 logit that min-p keeps, ``(z - max) / T >= log(min_p)``.

    The cut ``max + log(min_p) T`` is taken in float64 from ``log(min_p)`` in float32 and rounded up
    to a float32, so the comparison costs one float32 rounding of ``log(min_p)``: within
    `reference.filters.pivot_band` of the exact threshold."""
    log_min_p = tl.log(tl.where(min_p > 0.0, min_p, 1.0)).to(tl.float64)
    scale = tl.minimum(temperature, MAX_TEMPERATURE).to(tl.float64)
    top = row_max.to(tl.float64)
    # Within [-FLT_MAX, max]: the conversion to float32 cannot overflow, and min_p >= 1 keeps the max.
    cut = tl.minimum(tl.maximum(top + log_min_p * scale, -FLT_MAX), top)
    nearest = cut.to(tl.float32)
    key = _order_key(nearest)
    return tl.where(nearest.to(tl.float64) < cut, key + 1, key)


@triton.jit
def _kth_key(row_ptr, vocab_size, lo, hi, k, PASSES: tl.constexpr, BLOCK_V: tl.constexpr,
             WAYS: tl.constexpr):  # fmt: skip
    """The largest order key in ``[lo, hi)`` with at least ``k`` tokens at or above it, given that
    ``hi`` has not, and ``lo`` (int64 bounds; ``hi <= lo + 1`` searches nothing).

    Each pass counts at ``WAYS`` keys of ``[lo, hi)`` at once and narrows the interval ``WAYS``-fold;
    once it is one key wide, ``lo`` is the key of the ``k``-th largest value. Lane 0 counts ``lo``
    itself: where ``lo`` has fewer than ``k`` tokens the first pass returns ``hi == lo``, which tells
    the caller that top-k keeps everything ``lo`` keeps. Returns ``(lo, hi)``."""
    for _ in range(PASSES):
        if hi - lo > 1:
            cuts = _candidates(lo, hi - 1, WAYS)
            at_least = _counts_from(row_ptr, vocab_size, cuts.to(tl.int32), BLOCK_V, WAYS) >= k
            lo = tl.max(tl.where(at_least, cuts, lo), axis=0)
            hi = tl.min(tl.where(at_least, hi, cuts), axis=0)
    return lo, hi


@triton.jit
def _top_p_key(row_ptr, vocab_size, lo, hi, top_p, row_max, inv_temperature, PASSES: tl.constexpr,
               BLOCK_V: tl.constexpr, WAYS: tl.constexpr):  # fmt: skip
    """The smallest order key in ``(lo, hi]`` whose tokens strictly above carry mass ``< target``,
    ``target = top_p`` times the mass above ``lo`` (the kept mass), given that ``lo``'s do not and
    ``hi``'s do (int64 bounds; ``hi <= lo + 1`` searches nothing).

    Each pass sums the masses above ``WAYS`` keys of ``[lo, hi]`` at once and narrows the interval
    ``WAYS``-fold. The first pass's lane 0 is ``lo``: its mass gives ``target`` in the same pass, by
    the same sums as every other mass the search compares with it."""
    target = tl.full([], 0.0, tl.float32)
    lanes = tl.arange(0, WAYS)
    for i in range(PASSES):
        if hi - lo > 1:
            cuts = _candidates(lo, hi, WAYS)
            masses = _masses_above(
                row_ptr, vocab_size, cuts.to(tl.int32), row_max, inv_temperature, BLOCK_V, WAYS
            )
            kept_mass = tl.max(tl.where(lanes == 0, masses, 0.0), axis=0)
            target = tl.where(i == 0, top_p * kept_mass, target)
            below = masses < target
            lo = tl.max(tl.where(below, lo, cuts), axis=0)
            hi = tl.min(tl.where(below, cuts, hi), axis=0)
    return hi


# Counts that change from call to call are not specialised on.
@triton.jit(do_not_specialize=["logits_stride", "vocab_size"])
def filter_threshold_kernel(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, threshold_ptr,
                            logits_stride, vocab_size, HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr,
                            HAS_MIN_P: tl.constexpr, PASSES: tl.constexpr, WAYS: tl.constexpr,
                            BLOCK_V: tl.constexpr):  # fmt: skip
    """Each row's threshold ``t``: its filters keep exactly the tokens with ``z >= t``.

    Args:
        logits_ptr: ``[R, V]`` fp32/fp16/bf16 logits, rows ``logits_stride`` apart, contiguous within.
        temperature_ptr: ``[R]`` fp32 (``0``: greedy).
        top_k_ptr, top_p_ptr, min_p_ptr: ``[R]`` each (int32/int64, fp32, fp32), read only where
            ``HAS_TOP_K``, ``HAS_TOP_P``, ``HAS_MIN_P`` (otherwise the filter is off for every row).
        threshold_ptr: ``[R]`` fp32 output.
        PASSES: passes of each search (`SEARCH_PASSES` finds the exact pivot; fewer stop short).
        WAYS: keys each search pass tries at once, a power of two >= 2 (`WAYS`); a pass compares a
            ``[BLOCK_V, WAYS]`` tile.
    """
    # Grid (R,): one program per row.
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
    temperature = tl.load(temperature_ptr + row)
    inv_temperature = inverse_temperature(temperature)
    row_max, row_sum = _row_stats(row_ptr, vocab_size, inv_temperature, BLOCK_V)
    # Greedy rows, rows without a finite logit and rows with +inf logits filter nothing.
    filtering = (temperature > 0.0) & (row_max > NEG_INF) & (row_max < POS_INF)
    max_key = _order_key(row_max).to(tl.int64)
    # The kept set so far: the tokens whose order key is >= kept_key.
    kept_key = _order_key(tl.full([], NEG_INF, tl.float32)).to(tl.int64)
    by_any = tl.full([], False, tl.int1)

    if HAS_MIN_P:
        min_p = tl.load(min_p_ptr + row)
        by_min_p = filtering & (min_p > 0.0)
        kept_key = tl.where(by_min_p, tl.minimum(_min_p_key(row_max, temperature, min_p), max_key), kept_key)
        by_any = by_any | by_min_p

    if HAS_TOP_K:
        top_k = tl.load(top_k_ptr + row).to(tl.int64)
        by_k = filtering & (top_k > 0) & (top_k < vocab_size)
        # Invariant: fewer than k kept tokens at or above hi; at least k at or above lo, which the
        # first pass checks (lane 0 counts lo) where the kept tokens may be fewer than k.
        hi = tl.where(by_k, max_key + 1, kept_key + 1)
        kth_key, hi = _kth_key(row_ptr, vocab_size, kept_key, hi, top_k, PASSES, BLOCK_V, WAYS)
        by_k = by_k & (hi > kth_key)
        kth_log_p = scaled_logit(_key_value(kth_key.to(tl.int32)), row_max, inv_temperature) - tl.log(row_sum)
        # A k-th value of probability zero ties with every zero: top-k then keeps everything kept.
        kept_key = tl.where(by_k & (kth_log_p >= LOG_ZERO), kth_key, kept_key)
        by_any = by_any | by_k

    if HAS_TOP_P:
        top_p = tl.load(top_p_ptr + row)
        by_p = filtering & (top_p < 1.0)
        # lo = kept_key - 1: the mass above it is the kept mass. The max's own weight is 1, so
        # target > 0 whenever top_p > 0, and the mass above the max, 0, is below it.
        hi = tl.where(by_p, max_key, kept_key)
        kept_key = _top_p_key(
            row_ptr, vocab_size, kept_key - 1, hi, top_p, row_max, inv_temperature, PASSES, BLOCK_V, WAYS
        )
        by_any = by_any | by_p

    threshold = tl.full([], NEG_INF, tl.float32)
    if by_any:
        smallest, least = _smallest_from(row_ptr, vocab_size, kept_key.to(tl.int32), BLOCK_V)
        # The max is always kept; a threshold at the row's least logit keeps every token.
        threshold = tl.where(smallest > least, tl.minimum(smallest, row_max), NEG_INF)
    tl.store(threshold_ptr + row, threshold)


# ---------------------------------------------------------------------------------------------
# Launch


def _fail(argument: str, problem: str) -> ValueError:
    return ValueError(f"{argument} {problem}")


def _check_vector(
    name: str, value: object, dtypes: tuple[torch.dtype, ...], device: torch.device, rows: int
) -> torch.Tensor:
    """``value``, checked: a dense ``[rows]`` tensor of ``dtypes`` on ``device``."""
    if not isinstance(value, torch.Tensor):
        kind = "is None" if value is None else f"has type {type(value).__qualname__}"
        raise _fail(name, f"{kind}; expected a torch.Tensor")
    if value.layout != torch.strided or value.is_nested:
        raise _fail(name, f"has layout {value.layout}; expected a dense (strided) tensor")
    if value.device != device:
        raise _fail(name, f"is on device {value.device}; expected {device} (the device of logits)")
    if value.dtype not in dtypes:
        expected = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise _fail(name, f"has dtype {value.dtype}; expected one of {expected}")
    if tuple(value.shape) != (rows,):
        raise _fail(name, f"has shape {tuple(value.shape)}; expected [R] = [{rows}]")
    return value


def _check_entries(name: str, values: torch.Tensor, ok: torch.Tensor, expected: str) -> None:
    """Raise the ``ValueError`` naming the first entry of ``values`` where ``ok`` is false."""
    if not bool(ok.all()):
        i = int(torch.nonzero(~ok)[0, 0])
        raise ValueError(f"{name}[{i}] is {values[i].item()}; expected {expected}")


def _check_values(
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
) -> None:
    """The parameters' ranges, as `reference.contract.SpecBatch.validate` states them."""
    t = temperature.detach().cpu()
    _check_entries("temperature", t, torch.isfinite(t) & (t >= 0), "a finite value >= 0")
    if top_k is not None:
        k = top_k.detach().cpu()
        _check_entries("top_k", k, k >= 0, "k >= 0 (0 or >= V: off)")
    if top_p is not None:
        p = top_p.detach().cpu()
        _check_entries("top_p", p, (p > 0) & (p <= 1), "a value in (0, 1] (1: off)")
    if min_p is not None:
        q = min_p.detach().cpu()
        _check_entries("min_p", q, (q >= 0) & (q < 1), "a value in [0, 1) (0: off)")


def filter_warps(block_v: int) -> int:
    """Warps of a program: 8 where a search pass's ``[block_v, WAYS]`` tile has 8,192 elements or more."""
    return 8 if block_v * WAYS >= 8192 else 4


def default_block_v(vocab_size: int) -> int:
    """The tile width for a vocabulary: its next power of two, within `MIN_BLOCK_V` and `MAX_BLOCK_V`."""
    return max(MIN_BLOCK_V, min(MAX_BLOCK_V, int(triton.next_power_of_2(vocab_size))))


def _launch_block_v(vocab_size: int, device: torch.device) -> int:
    """The default tile width of a launch: `default_block_v` on a GPU; under the interpreter (CPU
    tensors), up to `INTERPRETER_MAX_BLOCK_V`, which numpy handles in far fewer, cheaper steps."""
    if device.type == "cpu":
        return max(MIN_BLOCK_V, min(INTERPRETER_MAX_BLOCK_V, int(triton.next_power_of_2(vocab_size))))
    return default_block_v(vocab_size)


def filter_thresholds(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
    *,
    check_values: bool | None = None,
    block_v: int | None = None,
) -> torch.Tensor:
    """Each row's threshold ``t``: the row's filters keep exactly ``{x : z_x >= t}`` (NaN as ``-inf``).

    ``t`` is the smallest kept logit as float32, or ``-inf`` where every token is kept (greedy rows,
    rows that filter nothing, rows without a finite logit or with ``+inf`` logits). `apply_thresholds`
    masks the rest to ``-inf``; ``softmax(masked / T)`` is then the processed law ``p'``.

    Args:
        logits: ``[R, V]`` fp32, fp16 or bf16, rows contiguous (any row stride).
        temperature: ``[R]`` fp32, ``0`` for a greedy row.
        top_k: ``[R]`` int32/int64 (``0`` or ``>= V``: off), or ``None``: off for every row.
        top_p: ``[R]`` fp32 in ``(0, 1]`` (``1``: off), or ``None``.
        min_p: ``[R]`` fp32 in ``[0, 1)`` (``0``: off), or ``None``.
        check_values: check the parameters' values (a device synchronisation on a GPU); default: where
            the tensors are on the CPU.
        block_v: the tile width, a power of two >= 16 (default `default_block_v`; wider on the CPU,
            where the interpreter runs the kernel).

    Returns:
        ``[R]`` fp32 thresholds on the device of ``logits``.

    Raises:
        ValueError: naming the argument and the value, for a wrong type, shape, dtype, device, row
            layout, tile width or (when values are checked) parameter value.
    """
    if not isinstance(logits, torch.Tensor):
        raise _fail("logits", f"has type {type(logits).__qualname__}; expected a torch.Tensor")
    if logits.dim() != 2:
        raise _fail("logits", f"has shape {tuple(logits.shape)}; expected [R, V]")
    if logits.dtype not in LOGIT_DTYPES:
        expected = ", ".join(str(d).removeprefix("torch.") for d in LOGIT_DTYPES)
        raise _fail("logits", f"has dtype {logits.dtype}; expected one of {expected}")
    rows, vocab_size = logits.shape
    if vocab_size < 1:
        raise _fail("logits", f"has vocab size {vocab_size}; expected V >= 1")
    if vocab_size > 1 and logits.stride(1) != 1:
        raise _fail("logits", f"has stride {logits.stride()}; rows must be contiguous (last stride 1)")
    device = logits.device
    _check_vector("temperature", temperature, (torch.float32,), device, rows)
    if top_k is not None:
        _check_vector("top_k", top_k, INDEX_DTYPES, device, rows)
    if top_p is not None:
        _check_vector("top_p", top_p, (torch.float32,), device, rows)
    if min_p is not None:
        _check_vector("min_p", min_p, (torch.float32,), device, rows)
    if block_v is None:
        block_v = _launch_block_v(vocab_size, device)
    elif not isinstance(block_v, int) or block_v < MIN_BLOCK_V or block_v & (block_v - 1):
        raise _fail("block_v", f"is {block_v!r}; expected a power of two >= {MIN_BLOCK_V}")
    if check_values or (check_values is None and device.type == "cpu"):
        _check_values(temperature, top_k, top_p, min_p)

    thresholds = torch.empty(rows, dtype=torch.float32, device=device)
    if rows == 0:
        return thresholds
    # The interpreter computes both branches of a tl.where in numpy: -inf - -inf is expected there.
    quiet = np.errstate(all="ignore") if device.type == "cpu" else contextlib.nullcontext()
    with quiet:
        filter_threshold_kernel[(rows,)](
            logits, temperature, temperature if top_k is None else top_k,
            temperature if top_p is None else top_p, temperature if min_p is None else min_p, thresholds,
            logits.stride(0), vocab_size, HAS_TOP_K=top_k is not None, HAS_TOP_P=top_p is not None,
            HAS_MIN_P=min_p is not None, PASSES=SEARCH_PASSES, WAYS=WAYS, BLOCK_V=block_v,
            num_warps=filter_warps(block_v),
        )  # fmt: skip
    return thresholds


def apply_thresholds(logits: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """A copy of ``logits`` ``[R, V]`` with every entry below its row's threshold (and every NaN) set to
    ``-inf``: the filtered logits, ``softmax(them / T)`` the processed law ``p'``."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__qualname__
        raise _fail("logits", f"is {shape}; expected an [R, V] torch.Tensor")
    if not isinstance(thresholds, torch.Tensor) or tuple(thresholds.shape) != (logits.shape[0],):
        shape = (
            tuple(thresholds.shape) if isinstance(thresholds, torch.Tensor) else type(thresholds).__qualname__
        )
        raise _fail("thresholds", f"is {shape}; expected [R] = [{logits.shape[0]}]")
    keep = logits.float() >= thresholds.to(device=logits.device, dtype=torch.float32)[:, None]
    return logits.masked_fill(~keep, float("-inf"))
