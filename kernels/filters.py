"""Filtered verification's kept sets in Triton: per row, the logit threshold of the processed law.

Each filter of `reference.filters` keeps the tokens at or above a value, so a row's kept set is
``{x : z_x >= t}`` for one threshold ``t`` per row (DESIGN.md, "Filtered verification"). This
module finds ``t`` without sorting the vocabulary. A row is cut into chunks of whole tiles, one
program a chunk (`default_chunks`: on a GPU, enough programs to fill it whatever the batch), and a
row is read a few times, tile by tile, never holding more than one tile:

1. the row max ``m`` and ``S = sum exp((z - m) / T)`` (`filter_stats_kernel`, chunk by chunk,
   combined in chunk order by `filter_start_kernel`);
2. min-p keeps ``(z - m) / T >= log(min_p)``: the smallest float32 logit at or above
   ``m + log(min_p) T``, that sum taken in float64 (`_min_p_key`);
3. top-k, a value pivot: the ``k``-th largest kept value is the largest order key with at least
   ``k`` kept tokens at or above it, found by a ``WAYS``-way search over the int32 keys of the
   float32 values (`_order_key`: integer order is float order): each pass (`filter_count_kernel`)
   counts the tokens at or above ``WAYS`` keys at once (a ``[BLOCK_V, WAYS]`` comparison summed over
   the tile) and narrows the interval of keys ``WAYS``-fold; `SEARCH_PASSES` passes cover every
   float32 value, so the search ends on the ``k``-th value itself (`_kth_bounds`). The first pass
   also counts the kept tokens, which tells whether top-k filters at all;
4. top-p, over the law renormalised on what min-p and top-k kept: the smallest order key whose
   kept tokens strictly above carry mass ``< top_p`` times the kept mass, by the same search over
   the same keys, each pass (`filter_mass_kernel`) summing ``exp((z - m) / T)`` above ``WAYS`` keys
   at once (`_top_p_bounds`); the first pass also sums the kept mass. Masses are fp32 sums of
   ``exp((z - m) / T)``, tile by tile within a chunk and then chunk by chunk, every key's mass summed
   in the same order, so a token whose mass above lies within a few ulps (times ``sqrt(V)``) of
   ``top_p`` is a near pivot (`reference.filters.pivot_band`);
5. ``t`` is the smallest kept logit, ``-inf`` where every token is kept (`filter_smallest_kernel`,
   `filter_finish_kernel`).

Each pass is one launch over every chunk of every row. Its programs first narrow the row's interval
by the previous pass's partial results, added in chunk order, so every program of a row finds the
same interval (and chunk 0 records it for the next); a row whose interval is one key wide is done,
and its programs leave at once. A row that filters by top-k and top-p is read at most
``2 * SEARCH_PASSES + 2`` times, 18 with 16 ways; a row without top-k or top-p, at most 2 times.
The jit code and its launcher, `filter_thresholds`, live together here; `apply_thresholds` masks
the logits with the thresholds (`apply_threshold_kernel`: one read and one write of each logit).

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
def _tile(row_ptr, tile_start, end, BLOCK_V: tl.constexpr):
    """Tokens ``tile_start + [0, BLOCK_V)`` of a row below ``end``: ``(logits as float32 with NaN as
    -inf, below end)``."""
    tokens = tile_start + tl.arange(0, BLOCK_V)
    in_vocab = tokens < end
    return clean_logit(tl.load(row_ptr + tokens, mask=in_vocab, other=NEG_INF)), in_vocab


@triton.jit
def _chunk_stats(row_ptr, begin, end, inv_temperature, BLOCK_V: tl.constexpr):
    """``(max, sum of exp((z - max) / T))`` of tokens ``[begin, end)``, the sum rescaled as the max grows."""
    chunk_max = tl.full([], NEG_INF, tl.float32)
    chunk_sum = tl.full([], 0.0, tl.float32)
    tile_start = begin
    while tile_start < end:
        x, in_vocab = _tile(row_ptr, tile_start, end, BLOCK_V)
        new_max = tl.maximum(chunk_max, tl.max(x, axis=0))
        weights = tl.where(in_vocab, tl.exp(scaled_logit(x, new_max, inv_temperature)), 0.0)
        chunk_sum = chunk_sum * rescale_factor(chunk_max, new_max, inv_temperature) + tl.sum(weights, axis=0)
        chunk_max = new_max
        tile_start += BLOCK_V
    return chunk_max, chunk_sum


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
def _counts_from(row_ptr, begin, end, cuts, BLOCK_V: tl.constexpr, WAYS: tl.constexpr):
    """``[WAYS]`` how many tokens of ``[begin, end)`` have an order key ``>= cuts[j]`` (int32 cuts)."""
    counts = tl.zeros([WAYS], tl.int32)
    tile_start = begin
    while tile_start < end:
        x, in_vocab = _tile(row_ptr, tile_start, end, BLOCK_V)
        keys = _keys(x, in_vocab)
        # A tile below the least cut (lane 0's) counts nothing at any cut.
        if tl.max(keys, axis=0) >= tl.min(cuts, axis=0):
            counts += tl.sum((keys[:, None] >= cuts[None, :]).to(tl.int32), axis=0)
        tile_start += BLOCK_V
    return counts


@triton.jit
def _masses_above(row_ptr, begin, end, cuts, row_max, inv_temperature,
                  BLOCK_V: tl.constexpr, WAYS: tl.constexpr):  # fmt: skip
    """``[WAYS]`` ``sum exp((z - max) / T)`` over the tokens of ``[begin, end)`` whose order key is
    ``> cuts[j]`` (int32 cuts).

    Each lane is a fixed sum of non-negative terms, reduced tile by tile in the same order as every
    other lane and whatever its cut is: it never decreases as the cut does, so a search on it is
    consistent (monotone, and the same cut gets the same mass in any lane of any pass)."""
    masses = tl.zeros([WAYS], tl.float32)
    tile_start = begin
    while tile_start < end:
        x, in_vocab = _tile(row_ptr, tile_start, end, BLOCK_V)
        keys = _keys(x, in_vocab)
        # A tile at or below the least cut (lane 0's) adds nothing above any cut: skipping it adds
        # zeros, which leaves every sum as it was.
        if tl.max(keys, axis=0) > tl.min(cuts, axis=0):
            weights = tl.where(in_vocab, tl.exp(scaled_logit(x, row_max, inv_temperature)), 0.0)
            above = keys[:, None] > cuts[None, :]
            masses += tl.sum(tl.where(above, weights[:, None], 0.0), axis=0)
        tile_start += BLOCK_V
    return masses


@triton.jit
def _smallest_from(row_ptr, begin, end, key, BLOCK_V: tl.constexpr):
    """``(the smallest logit whose order key is >= key, the smallest logit)`` of ``[begin, end)``
    (``+inf``: none)."""
    smallest = tl.full([], POS_INF, tl.float32)
    least = smallest
    tile_start = begin
    while tile_start < end:
        x, in_vocab = _tile(row_ptr, tile_start, end, BLOCK_V)
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


# ---------------------------------------------------------------------------------------------
# The search's state: a row's rows of the workspace, read and written by name


@triton.jit
def _chunk_span(chunk, chunk_size, vocab_size):
    """Tokens ``[begin, end)`` of a row's chunk."""
    begin = chunk * chunk_size
    return begin, tl.minimum(begin + chunk_size, vocab_size)


@triton.jit
def _filtering(temperature, row_max):
    """Whether a row can filter at all: greedy rows, rows without a finite logit and rows with ``+inf``
    logits filter nothing."""
    return (temperature > 0.0) & (row_max > NEG_INF) & (row_max < POS_INF)


@triton.jit
def _bounds_slot(bounds_ptr, search, i, row, num_rows, PASSES: tl.constexpr):
    """The address of ``(lo, hi)`` at the start of pass ``i`` of search ``search`` (0: top-k, 1: top-p)."""
    return bounds_ptr + ((search * PASSES + i) * num_rows + row) * 2


@triton.jit
def _store_bounds(bounds_ptr, search, i, row, num_rows, lo, hi, PASSES: tl.constexpr):
    """Record ``(lo, hi)`` as the bounds at the start of pass ``i`` of search ``search``."""
    slot = _bounds_slot(bounds_ptr, search, i, row, num_rows, PASSES)
    tl.store(slot, lo)
    tl.store(slot + 1, hi)


@triton.jit
def _chunk_sums(partials_ptr, i, row, num_rows, num_chunks, WAYS: tl.constexpr):
    """``[WAYS]`` pass ``i``'s partial sums of a row added over its chunks in chunk order: the same
    value in every program that reads them."""
    lanes = tl.arange(0, WAYS)
    base = partials_ptr + ((i * num_rows + row) * num_chunks).to(tl.int64) * WAYS
    total = tl.load(base + lanes)
    chunk = 1
    while chunk < num_chunks:
        total += tl.load(base + chunk * WAYS + lanes)
        chunk += 1
    return total


@triton.jit
def _kth_bounds(bounds_ptr, counts_ptr, row, i, k, num_rows, num_chunks, PASSES: tl.constexpr,
                WAYS: tl.constexpr):  # fmt: skip
    """``(lo, hi)`` of the top-k search at the start of pass ``i`` (``i == PASSES``: its result): pass
    ``i - 1``'s bounds narrowed by its counts.

    The search finds the largest order key in ``[lo, hi)`` with at least ``k`` tokens at or above
    it, given that ``hi`` has not, and ``lo`` (int64; ``hi <= lo + 1`` searches nothing). Each pass
    counts at ``WAYS`` keys of ``[lo, hi)`` at once and narrows the interval ``WAYS``-fold; once it is
    one key wide, ``lo`` is the key of the ``k``-th largest value. Lane 0 counts ``lo`` itself: where
    ``lo`` has fewer than ``k`` tokens the first pass returns ``hi == lo``, which tells the caller that
    top-k keeps everything ``lo`` keeps."""
    last = tl.maximum(i - 1, 0)
    slot = _bounds_slot(bounds_ptr, 0, last, row, num_rows, PASSES)
    lo = tl.load(slot)
    hi = tl.load(slot + 1)
    if (i > 0) & (hi - lo > 1):
        cuts = _candidates(lo, hi - 1, WAYS)
        at_least = _chunk_sums(counts_ptr, last, row, num_rows, num_chunks, WAYS) >= k
        lo = tl.max(tl.where(at_least, cuts, lo), axis=0)
        hi = tl.min(tl.where(at_least, hi, cuts), axis=0)
    return lo, hi


@triton.jit
def _top_p_bounds(bounds_ptr, masses_ptr, row, i, top_p, num_rows, num_chunks, PASSES: tl.constexpr,
                  WAYS: tl.constexpr):  # fmt: skip
    """``(lo, hi)`` of the top-p search at the start of pass ``i`` (``i == PASSES``: ``hi`` is its
    result): pass ``i - 1``'s bounds narrowed by its masses.

    The search finds the smallest order key in ``(lo, hi]`` whose tokens strictly above carry mass
    ``< target``, ``target = top_p`` times the mass above ``lo`` (the kept mass), given that
    ``lo``'s do not and ``hi``'s do (int64; ``hi <= lo + 1`` searches nothing). Each pass sums the
    masses above ``WAYS`` keys of ``[lo, hi]`` at once and narrows the interval ``WAYS``-fold. The
    first pass's lane 0 is ``lo``: its mass gives ``target``, by the same sums as every other mass
    the search compares with it."""
    last = tl.maximum(i - 1, 0)
    slot = _bounds_slot(bounds_ptr, 1, last, row, num_rows, PASSES)
    lo = tl.load(slot)
    hi = tl.load(slot + 1)
    if (i > 0) & (hi - lo > 1):
        cuts = _candidates(lo, hi, WAYS)
        lanes = tl.arange(0, WAYS)
        first = _chunk_sums(masses_ptr, 0, row, num_rows, num_chunks, WAYS)
        target = top_p * tl.max(tl.where(lanes == 0, first, 0.0), axis=0)
        below = _chunk_sums(masses_ptr, last, row, num_rows, num_chunks, WAYS) < target
        lo = tl.max(tl.where(below, lo, cuts), axis=0)
        hi = tl.min(tl.where(below, cuts, hi), axis=0)
    return lo, hi


# ---------------------------------------------------------------------------------------------
# Kernels, launched in this order by `filter_thresholds`. Grid (R, C): a program per chunk of a
# row; grid (R,): a program per row. The chunks' partial results go through the workspace, and
# each reduction over them adds them in chunk order, so the search is the same in every program.
# Counts that change from call to call are not specialised on.


@triton.jit(do_not_specialize=["logits_stride", "vocab_size", "chunk_size"])
def filter_stats_kernel(logits_ptr, temperature_ptr, chunk_stats_ptr, logits_stride, vocab_size,
                        chunk_size, BLOCK_V: tl.constexpr):  # fmt: skip
    """Grid (R, C): each chunk's ``(max, sum of exp((z - max) / T))`` into ``chunk_stats [R, C, 2]``."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
    begin, end = _chunk_span(chunk, chunk_size, vocab_size)
    inv_temperature = inverse_temperature(tl.load(temperature_ptr + row))
    chunk_max, chunk_sum = _chunk_stats(row_ptr, begin, end, inv_temperature, BLOCK_V)
    out = chunk_stats_ptr + (row * tl.num_programs(1) + chunk).to(tl.int64) * 2
    tl.store(out, chunk_max)
    tl.store(out + 1, chunk_sum)


@triton.jit(do_not_specialize=["vocab_size", "num_chunks"])
def filter_start_kernel(temperature_ptr, top_k_ptr, min_p_ptr, chunk_stats_ptr, row_stats_ptr, row_keys_ptr,
                        bounds_ptr, vocab_size, num_chunks, HAS_TOP_K: tl.constexpr,
                        HAS_MIN_P: tl.constexpr, PASSES: tl.constexpr):  # fmt: skip
    """Grid (R,): the row's max and sum (its chunks' in chunk order) into ``row_stats``; min-p's key
    and whether a filter applies into ``row_keys``; the top-k search's first bounds."""
    row = tl.program_id(0)
    num_rows = tl.num_programs(0)
    temperature = tl.load(temperature_ptr + row)
    inv_temperature = inverse_temperature(temperature)
    row_max = tl.full([], NEG_INF, tl.float32)
    row_sum = tl.full([], 0.0, tl.float32)
    stats = chunk_stats_ptr + (row * num_chunks).to(tl.int64) * 2
    chunk = 0
    while chunk < num_chunks:
        chunk_max = tl.load(stats + chunk * 2)
        new_max = tl.maximum(row_max, chunk_max)
        chunk_sum = tl.load(stats + chunk * 2 + 1) * rescale_factor(chunk_max, new_max, inv_temperature)
        row_sum = row_sum * rescale_factor(row_max, new_max, inv_temperature) + chunk_sum
        row_max = new_max
        chunk += 1
    tl.store(row_stats_ptr + row * 2, row_max)
    tl.store(row_stats_ptr + row * 2 + 1, row_sum)

    filtering = _filtering(temperature, row_max)
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
        _store_bounds(
            bounds_ptr, 0, 0, row, num_rows, kept_key, tl.where(by_k, max_key + 1, kept_key + 1), PASSES
        )
    tl.store(row_keys_ptr + row * 2, kept_key)
    tl.store(row_keys_ptr + row * 2 + 1, by_any.to(tl.int64))


@triton.jit(do_not_specialize=["logits_stride", "vocab_size", "chunk_size", "num_chunks", "i"])
def filter_count_kernel(logits_ptr, top_k_ptr, bounds_ptr, counts_ptr, logits_stride, vocab_size, chunk_size,
                        num_chunks, i, PASSES: tl.constexpr, WAYS: tl.constexpr,
                        BLOCK_V: tl.constexpr):  # fmt: skip
    """Grid (R, C): pass ``i`` of the top-k search (`_kth_bounds`): its bounds into the workspace (by
    chunk 0), each chunk's counts at the pass's ``WAYS`` keys into ``counts [PASSES, R, C, WAYS]``."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    num_rows = tl.num_programs(0)
    k = tl.load(top_k_ptr + row).to(tl.int64)
    lo, hi = _kth_bounds(bounds_ptr, counts_ptr, row, i, k, num_rows, num_chunks, PASSES, WAYS)
    if (chunk == 0) & (i > 0):
        _store_bounds(bounds_ptr, 0, i, row, num_rows, lo, hi, PASSES)
    if hi - lo > 1:
        begin, end = _chunk_span(chunk, chunk_size, vocab_size)
        cuts = _candidates(lo, hi - 1, WAYS).to(tl.int32)
        counts = _counts_from(logits_ptr + row.to(tl.int64) * logits_stride, begin, end, cuts, BLOCK_V, WAYS)
        out = counts_ptr + ((i * num_rows + row) * num_chunks + chunk).to(tl.int64) * WAYS
        tl.store(out + tl.arange(0, WAYS), counts)


@triton.jit(do_not_specialize=["vocab_size", "num_chunks"])
def filter_between_kernel(temperature_ptr, top_k_ptr, top_p_ptr, row_stats_ptr, row_keys_ptr, bounds_ptr,
                          counts_ptr, vocab_size, num_chunks, HAS_TOP_K: tl.constexpr,
                          HAS_TOP_P: tl.constexpr, PASSES: tl.constexpr, WAYS: tl.constexpr):  # fmt: skip
    """Grid (R,): top-k's result (the ``k``-th value's key, where it filters) into ``row_keys``; the
    top-p search's first bounds."""
    row = tl.program_id(0)
    num_rows = tl.num_programs(0)
    temperature = tl.load(temperature_ptr + row)
    inv_temperature = inverse_temperature(temperature)
    row_max = tl.load(row_stats_ptr + row * 2)
    row_sum = tl.load(row_stats_ptr + row * 2 + 1)
    kept_key = tl.load(row_keys_ptr + row * 2)
    by_any = tl.load(row_keys_ptr + row * 2 + 1) != 0
    filtering = _filtering(temperature, row_max)
    max_key = _order_key(row_max).to(tl.int64)
    if HAS_TOP_K:
        k = tl.load(top_k_ptr + row).to(tl.int64)
        by_k = filtering & (k > 0) & (k < vocab_size)
        kth_key, hi = _kth_bounds(bounds_ptr, counts_ptr, row, PASSES, k, num_rows, num_chunks, PASSES, WAYS)
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
        _store_bounds(
            bounds_ptr, 1, 0, row, num_rows, kept_key - 1, tl.where(by_p, max_key, kept_key), PASSES
        )
        by_any = by_any | by_p
    tl.store(row_keys_ptr + row * 2, kept_key)
    tl.store(row_keys_ptr + row * 2 + 1, by_any.to(tl.int64))


@triton.jit(do_not_specialize=["logits_stride", "vocab_size", "chunk_size", "num_chunks", "i"])
def filter_mass_kernel(logits_ptr, temperature_ptr, top_p_ptr, row_stats_ptr, bounds_ptr, masses_ptr,
                       logits_stride, vocab_size, chunk_size, num_chunks, i, PASSES: tl.constexpr,
                       WAYS: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Grid (R, C): pass ``i`` of the top-p search (`_top_p_bounds`): its bounds into the workspace
    (by chunk 0), each chunk's masses above the pass's ``WAYS`` keys into ``masses [PASSES, R, C,
    WAYS]``."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    num_rows = tl.num_programs(0)
    top_p = tl.load(top_p_ptr + row)
    lo, hi = _top_p_bounds(bounds_ptr, masses_ptr, row, i, top_p, num_rows, num_chunks, PASSES, WAYS)
    if (chunk == 0) & (i > 0):
        _store_bounds(bounds_ptr, 1, i, row, num_rows, lo, hi, PASSES)
    if hi - lo > 1:
        begin, end = _chunk_span(chunk, chunk_size, vocab_size)
        inv_temperature = inverse_temperature(tl.load(temperature_ptr + row))
        row_max = tl.load(row_stats_ptr + row * 2)
        cuts = _candidates(lo, hi, WAYS).to(tl.int32)
        masses = _masses_above(
            logits_ptr + row.to(tl.int64) * logits_stride, begin, end, cuts, row_max, inv_temperature,
            BLOCK_V, WAYS,
        )  # fmt: skip
        out = masses_ptr + ((i * num_rows + row) * num_chunks + chunk).to(tl.int64) * WAYS
        tl.store(out + tl.arange(0, WAYS), masses)


@triton.jit(do_not_specialize=["logits_stride", "vocab_size", "chunk_size", "num_chunks"])
def filter_smallest_kernel(logits_ptr, top_p_ptr, row_keys_ptr, bounds_ptr, masses_ptr, chunk_stats_ptr,
                           logits_stride, vocab_size, chunk_size, num_chunks, HAS_TOP_P: tl.constexpr,
                           PASSES: tl.constexpr, WAYS: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Grid (R, C): the kept set's key (top-p's result, where the row has a top-p) and, where a filter
    applies, each chunk's ``(smallest kept logit, smallest logit)`` into ``chunk_stats [R, C, 2]``."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    num_rows = tl.num_programs(0)
    kept_key = tl.load(row_keys_ptr + row * 2)
    if HAS_TOP_P:
        top_p = tl.load(top_p_ptr + row)
        _, kept_key = _top_p_bounds(
            bounds_ptr, masses_ptr, row, PASSES, top_p, num_rows, num_chunks, PASSES, WAYS
        )
    if tl.load(row_keys_ptr + row * 2 + 1) != 0:
        begin, end = _chunk_span(chunk, chunk_size, vocab_size)
        smallest, least = _smallest_from(
            logits_ptr + row.to(tl.int64) * logits_stride, begin, end, kept_key.to(tl.int32), BLOCK_V
        )
        out = chunk_stats_ptr + (row * num_chunks + chunk).to(tl.int64) * 2
        tl.store(out, smallest)
        tl.store(out + 1, least)


@triton.jit(do_not_specialize=["num_chunks"])
def filter_finish_kernel(row_stats_ptr, row_keys_ptr, chunk_stats_ptr, threshold_ptr, num_chunks):
    """Grid (R,): each row's threshold ``t``: its filters keep exactly the tokens with ``z >= t``."""
    row = tl.program_id(0)
    threshold = tl.full([], NEG_INF, tl.float32)
    if tl.load(row_keys_ptr + row * 2 + 1) != 0:
        smallest = tl.full([], POS_INF, tl.float32)
        least = smallest
        stats = chunk_stats_ptr + (row * num_chunks).to(tl.int64) * 2
        chunk = 0
        while chunk < num_chunks:
            smallest = tl.minimum(smallest, tl.load(stats + chunk * 2))
            least = tl.minimum(least, tl.load(stats + chunk * 2 + 1))
            chunk += 1
        # The max is always kept; a threshold at the row's least logit keeps every token.
        threshold = tl.where(
            smallest > least, tl.minimum(smallest, tl.load(row_stats_ptr + row * 2)), NEG_INF
        )
    tl.store(threshold_ptr + row, threshold)


@triton.jit(do_not_specialize=["logits_stride", "out_stride", "vocab_size"])
def apply_threshold_kernel(logits_ptr, threshold_ptr, out_ptr, logits_stride, out_stride, vocab_size,
                           BLOCK_V: tl.constexpr):  # fmt: skip
    """Grid (R, cdiv(V, BLOCK_V)): ``out = logits`` where ``float32(logits) >= t`` of the row, else
    ``-inf`` (NaN included), in the logits' dtype."""
    row = tl.program_id(0).to(tl.int64)
    tokens = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    in_vocab = tokens < vocab_size
    x = tl.load(logits_ptr + row * logits_stride + tokens, mask=in_vocab, other=0.0).to(tl.float32)
    # Exact: a kept value goes back to the dtype it came from.
    masked = tl.where(x >= tl.load(threshold_ptr + row), x, NEG_INF)
    tl.store(out_ptr + row * out_stride + tokens, masked.to(out_ptr.dtype.element_ty), mask=in_vocab)


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


def filter_warps(block_v: int, ways: int = WAYS) -> int:
    """Warps of a search program: 8 where a pass's ``[block_v, ways]`` tile has 8,192 elements or more."""
    return 8 if block_v * ways >= 8192 else 4


# Programs a search pass aims for on a GPU, per SM: enough chunks that a few batches' rows fill it.
PROGRAMS_PER_SM = 4


def default_chunks(rows: int, tiles: int, device: torch.device) -> int:
    """Chunks a row is cut into: on a GPU, enough that the passes have `PROGRAMS_PER_SM` programs per
    SM (at most one chunk per tile); under the interpreter (CPU tensors), one."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(tiles, -(-PROGRAMS_PER_SM * sms // rows)))


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
    chunks: int | None = None,
    search_passes: int = SEARCH_PASSES,
    search_ways: int = WAYS,
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
        chunks: how many programs share a row, each reading a chunk of whole tiles (default
            `default_chunks`); the thresholds do not depend on it but through the order of the
            masses' fp32 sums (near pivots only).
        search_passes, search_ways: the searches' passes and the keys a pass tries, a power of two
            >= 2 (`SEARCH_PASSES` of `WAYS` find the exact pivots; fewer passes stop short, which
            only tests ask for).

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
    if not isinstance(search_ways, int) or search_ways < 2 or search_ways & (search_ways - 1):
        raise _fail("search_ways", f"is {search_ways!r}; expected a power of two >= 2")
    if not isinstance(search_passes, int) or search_passes < 1:
        raise _fail("search_passes", f"is {search_passes!r}; expected an int >= 1")
    if check_values or (check_values is None and device.type == "cpu"):
        _check_values(temperature, top_k, top_p, min_p)

    thresholds = torch.empty(rows, dtype=torch.float32, device=device)
    if rows == 0:
        return thresholds
    tiles = -(-vocab_size // block_v)
    if chunks is None:
        chunks = default_chunks(rows, tiles, device)
    elif not isinstance(chunks, int) or chunks < 1:
        raise _fail("chunks", f"is {chunks!r}; expected an int >= 1")
    tiles_per_chunk = -(-tiles // min(chunks, tiles))
    chunk_size = tiles_per_chunk * block_v
    num_chunks = -(-tiles // tiles_per_chunk)
    has_top_k, has_top_p, has_min_p = top_k is not None, top_p is not None, min_p is not None
    # Parameters a launch does not read get the temperature's pointer.
    k_ptr = top_k if top_k is not None else temperature
    p_ptr = top_p if top_p is not None else temperature
    min_p_ptr = min_p if min_p is not None else temperature
    chunk_stats = torch.empty(rows, num_chunks, 2, dtype=torch.float32, device=device)
    row_stats = torch.empty(rows, 2, dtype=torch.float32, device=device)
    row_keys = torch.empty(rows, 2, dtype=torch.int64, device=device)
    bounds = torch.empty(2, search_passes, rows, 2, dtype=torch.int64, device=device)
    counts = torch.empty(
        search_passes if has_top_k else 0, rows, num_chunks, search_ways, dtype=torch.int32, device=device
    )
    masses = torch.empty(
        search_passes if has_top_p else 0, rows, num_chunks, search_ways, dtype=torch.float32, device=device
    )
    grid, per_row = (rows, num_chunks), (rows,)
    stride = logits.stride(0)
    warps = filter_warps(block_v, search_ways)
    # The interpreter computes both branches of a tl.where in numpy: -inf - -inf is expected there.
    quiet = np.errstate(all="ignore") if device.type == "cpu" else contextlib.nullcontext()
    with quiet:
        filter_stats_kernel[grid](
            logits, temperature, chunk_stats, stride, vocab_size, chunk_size, BLOCK_V=block_v
        )
        filter_start_kernel[per_row](
            temperature, k_ptr, min_p_ptr, chunk_stats, row_stats, row_keys, bounds, vocab_size, num_chunks,
            HAS_TOP_K=has_top_k, HAS_MIN_P=has_min_p, PASSES=search_passes,
        )  # fmt: skip
        if has_top_k:
            for i in range(search_passes):
                filter_count_kernel[grid](
                    logits, k_ptr, bounds, counts, stride, vocab_size, chunk_size, num_chunks, i,
                    PASSES=search_passes,
                    WAYS=search_ways, BLOCK_V=block_v, num_warps=warps,
                )  # fmt: skip
        if has_top_k or has_top_p:
            filter_between_kernel[per_row](
                temperature, k_ptr, p_ptr, row_stats, row_keys, bounds, counts, vocab_size, num_chunks,
                HAS_TOP_K=has_top_k, HAS_TOP_P=has_top_p, PASSES=search_passes, WAYS=search_ways,
            )  # fmt: skip
        if has_top_p:
            for i in range(search_passes):
                filter_mass_kernel[grid](
                    logits, temperature, p_ptr, row_stats, bounds, masses, stride, vocab_size, chunk_size,
                    num_chunks, i,
                    PASSES=search_passes, WAYS=search_ways, BLOCK_V=block_v, num_warps=warps,
                )  # fmt: skip
        filter_smallest_kernel[grid](
            logits, p_ptr, row_keys, bounds, masses, chunk_stats, stride, vocab_size, chunk_size, num_chunks,
            HAS_TOP_P=has_top_p, PASSES=search_passes, WAYS=search_ways, BLOCK_V=block_v,
        )  # fmt: skip
        filter_finish_kernel[per_row](row_stats, row_keys, chunk_stats, thresholds, num_chunks)
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
    if logits.dtype not in LOGIT_DTYPES:
        expected = ", ".join(str(d).removeprefix("torch.") for d in LOGIT_DTYPES)
        raise _fail("logits", f"has dtype {logits.dtype}; expected one of {expected}")
    rows, vocab_size = logits.shape
    if vocab_size > 1 and logits.stride(1) != 1:
        raise _fail("logits", f"has stride {logits.stride()}; rows must be contiguous (last stride 1)")
    out = torch.empty((rows, vocab_size), dtype=logits.dtype, device=logits.device)
    if rows == 0 or vocab_size == 0:
        return out
    block_v = _launch_block_v(vocab_size, logits.device)
    apply_threshold_kernel[(rows, -(-vocab_size // block_v))](
        logits, thresholds.to(device=logits.device, dtype=torch.float32).contiguous(), out, logits.stride(0),
        out.stride(0), vocab_size, BLOCK_V=block_v,
    )  # fmt: skip
    return out
