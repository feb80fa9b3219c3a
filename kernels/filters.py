"""Filtered verification's kept sets in Triton: per row, the logit threshold of the processed law.

Each filter of `reference.filters` keeps the tokens at or above a value, so a row's kept set is
``{x : z_x >= t}`` for one threshold ``t`` per row (DESIGN.md, "Filtered verification"). This
module finds ``t`` without sorting the vocabulary: it reads a row a few times, each time shared by
several programs (chunks of whole segments, `default_chunks`: on a GPU, enough programs to fill it
whatever the batch), and sorts only the few tokens near a pivot, in one program per row. The
searches compare int32 order keys of the float32 values (`order_key`: integer order is float
order), so every pivot is a token's exact value.

A row's float32 sums (its sum, top-p's masses) are made by segments of `SEGMENT_TILES` tiles, each
reduced alone, the same way whatever chunk reads it, and recorded; a row's sum adds its segments'
in their order. A chunk is a whole number of segments, as many as the batch's size calls for, so
no sum, and no kept set or kept sum, depends on the batch a row rides in.

1. ``filter_stats_kernel`` (each chunk): each segment's max, ``sum exp((z - max) / T)`` (in rows
   whose top-k is off or has fewer tiles than ``k``: `_sum_wanted`) and least logit, and the max
   of every tile of `maxima_tile` tokens (at most `MAX_TILES` of them a row).
2. ``filter_start_kernel`` (each row): the segments' statistics combined (`SEGMENT_GROUP` at a time);
   min-p's key, ``(z - max) / T >= log(min_p)`` with the cut taken in float64 (`min_p_key`); and the
   row's second pass. Top-k: a value at or below the ``k``-th largest tile maximum (`_top_k_bound`:
   two 16-way passes over the maxima, no sort) bounds the ``k``-th value from below (``k`` tiles
   hold a token at or above it), so the tokens at or above it (and min-p's key) are few
   where the logits are spread over the vocabulary; where the bound's probability may round to
   zero, the row's sum by a pass over it (top-k's test of a ``k``-th value of probability zero needs
   it, and the statistics pass does not make it in top-k rows). Top-p without top-k: two passes of
   masses above `FIRST_WAYS` values each first (3).
3. ``filter_mass_kernel`` (top-p rows, launched twice; a program takes every ``G``-th chunk of its row,
   `default_mass_programs`, so that rows of other modes cost few programs): ``sum exp((z - max) / T)`` above
   each of a pass's cuts. The first pass's lane 0 is the kept set's bound, whose mass is the kept
   mass (so top-p's target comes from the same sums as every mass compared with it), the others
   values evenly spaced between two that bound the pivot in most rows (`_first_placement`, from the
   row's sum and its tiles' maxima and masses). The second adds the first's masses over the segments
   (`_segments_sum`: every program finds the same interval: the mass above its lower end at least the
   target, above its upper end below it) and cuts that interval by values evenly spaced from
   `_top_p_floor`; where that interval holds at most the capacity (`_few_left`: each of its
   tokens weighs at least its lower end's weight), the second pass is skipped.
4. ``filter_compact_kernel`` (each chunk): top-p rows narrow their interval by the second pass's
   masses, added the same way; then the tokens of the row's interval are counted and their keys
   compacted into the chunk's own region (`_compact_chunk`: slots from the chunk's counter, a run of
   `COMPACT_RUN` tokens a thread at once, in no particular order, since the select kernel sorts
   them; no tile pays a block-wide scan); in rows that
   filter by min-p alone, each chunk's smallest logit at or above min-p's key. A tile whose maxima
   (the first pass's) lie below the interval (and min-p's key, in those rows) is not read. Where
   top-k also filters and min-p binds, the select kernel takes that logit from its candidates.
5. ``filter_select_kernel`` (each row): the chunks' candidates gathered (`_pack`); where they fit,
   they are sorted (`_sort_in_place`) and the pivots read off: the ``k``-th largest, then top-p's
   over the renormalised kept mass by a cumulative sum largest first (`_kept_of_candidates`,
   `_pivot_of_sorted`), in a tile as wide as the sort's, which follows their count.
   Where they do not, the program narrows the interval itself, ``WAYS`` cuts a pass (`_cuts`: by
   value first, then by key, each pass ``WAYS``-fold), until its tokens fit or it is one key wide;
   `exact_passes` passes find the exact pivot without any sort. ``t`` is the smallest kept logit:
   the last pivot, or, where min-p binds, the least logit at or above its key (the least of the
   chunks', or of top-k's candidates where top-k keeps all min-p keeps), and ``-inf`` where every
   token is kept. Where the sorted candidates hold every kept token above what the passes summed,
   or every token is kept (and the row's sum was made), it also writes the row's kept max and sum
   (``kept``), so that the sampler's statistics pass need not read the row.

Masses are float32 sums of ``exp((z - max) / T)``; a token whose mass above lies within a few ulps
(times ``sqrt(V)``) of ``top_p`` is a near pivot (`reference.filters.pivot_band`). A row that
filters by top-k, top-p and min-p is read twice (three or four times with top-p alone), plus the
passes of a search whose interval does not fit; a row with min-p alone, twice; an unfiltered call
launches nothing. `apply_thresholds` masks the logits with the thresholds (`apply_threshold_kernel`: one
read and one write of each logit).

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
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from specsample.kernels import launch
from specsample.kernels.filter_rows_kernels import filter_rows_kernel
from specsample.kernels.launch import programmatic_launch
from specsample.kernels.rules import (
    LOG_ZERO,
    NEG_INF,
    NEG_INF_KEY,
    NO_KEY,
    POS_INF,
    UNKNOWN_MASS,
    after_previous_launch,
    clean_logit,
    filters_row,
    inverse_temperature,
    kept_logit,
    key_value,
    masked_key,
    min_p_key,
    order_key,
    rescale_factor,
    scaled_logit,
    weight,
)
from specsample.reference.contract import LOGIT_DTYPES

# The launch plans: "split" (a row shared by several programs, what a GPU runs) and "rows" (a program
# takes a block of whole rows, `kernels.filter_rows_kernels`, what the Triton interpreter runs).
FILTER_PLANS = ("split", "rows")
# A rows-plan program holds [rows, BLOCK_V] tiles of at most this many elements, BLOCK_V at most the
# second number. The interpreter pays per operation, so its tiles are wide; a GPU runs the rows plan
# only to check it against the split plan, in tiles it compiles quickly.
ROWS_TILE_ELEMENTS = {"cpu": 2**18, "cuda": 2**10}
ROWS_MAX_BLOCK_V = {"cpu": 2**15, "cuda": 256}
# An order key above every float32's (NaN's keys aside): a bound no token reaches.
ABOVE_EVERY_KEY = tl.constexpr(2**31 - 1)
# Keys a search pass tries at once: each pass by key narrows the interval of order keys WAYS-fold.
WAYS = 16
# Tile widths: the default is the vocabulary's next power of two, within these bounds; a search pass
# holds a [BLOCK_V, WAYS] tile, at most 16,384 elements by default.
MIN_BLOCK_V = 16
MAX_BLOCK_V = 16384 // WAYS
# The interpreter (CPU tensors) pays per operation rather than per element: wider default tiles.
INTERPRETER_MAX_BLOCK_V = 8192
# Tokens a search compacts and sorts at most (a row's program holds them as one tile), by default and
# at most.
CAPACITY = 4096
MAX_CAPACITY = 16384
# The interpreter sorts slowly (about 1 s a row for 1,024 keys): it compacts at most this many.
INTERPRETER_CAPACITY = 32
# Values each of top-p's two chunked passes tries (`filter_mass_kernel`): an interval of 1/256 of the
# row's span of logits holds at most CAPACITY tokens in most rows, which are then sorted rather than
# searched (Gaussian logits, V = 128256, top-p 0.9: about 1,700). Each pass's cost grows with it.
FIRST_WAYS = 16
# Passes of BOUND_WAYS cuts that place top-k's bound among the tile maxima (`_top_k_bound`).
BOUND_PASSES = tl.constexpr(2)
BOUND_WAYS = tl.constexpr(16)
# Passes of BOUND_WAYS cuts that place top-p's first cuts' upper end (`_first_placement`): one by
# value, which places it within 1/16 of the tile maxima's span.
PLACEMENT_PASSES = tl.constexpr(1)
# A chunk's region of candidates holds at least MIN_SHARE keys (and at least its share of the
# capacity): a row whose candidates crowd into one chunk beyond it is compacted again by its own
# program. A row's program gathers the regions in [GROUP, SHARE] tiles of at most PACK_TILE keys.
MIN_SHARE = 64
# The compaction loads the maxima of up to this many tiles at once, one bit a tile (`_compact_chunk`).
COMPACT_GROUP = 32
# A thread's run of this many consecutive tokens of a compaction's tile takes its slots by one atomic
# add of their count (ptxas adds a warp's runs at once): a tile of 1,024 tokens and 4 warps pays two
# atomic round trips a warp rather than one a token of a thread's eight.
COMPACT_RUN = tl.constexpr(4)
PACK_TILE = 4096
# A row's segment records (statistics, masses) are combined this many segments at a time: a row has
# dozens of segments (42 at V = 128256 on a GPU), which a segment-by-segment loop walks at one load's
# latency each.
SEGMENT_GROUP = tl.constexpr(64)
# Tiles of a segment: a row's float32 sums are made segment by segment (`filter_stats_kernel`,
# `filter_mass_kernel`), each reduced across the program's warps once and recorded, then added in
# segment order, so no sum depends on the chunks; a chunk takes a whole number of segments, as many
# as the batch's size calls for (on an H200 at V = 128256: one at B = 1, three at B = 64). H200, n =
# 4, V = 128256 (tiles of 1,024), top-k 50, top-p 0.9, min-p 0.05, whole call, cold medians: B = 1
# 57.1 us against 53.6 with the batch's one-tile chunks, B = 4 62.1 (67.5), B = 16 99.4 (99.7), B =
# 64 236 (218 in another lease). Chunks of 1 / 2 / 3 tiles at every batch size instead: B = 1 53.1 /
# 54.8 / 56.7 us, B = 64 334 / 266 / 245.
SEGMENT_TILES = 3
# Candidates up to this many are sorted in a tile this wide, up to the second in one that wide, and
# their sums are made in that width (`_sort_in_place`). H200, the select kernel at B = 1 (n = 4, V =
# 128256, top-k 50, top-p 0.9, min-p 0.05): 15.9 us where the sums after the sort took the
# capacity's 4,096 lanes, 8.7 us in the sort's width (top-p 0.9 alone: 21.0 and 16.6).
SMALL_SORT = tl.constexpr(256)
MID_SORT = tl.constexpr(1024)
# A row's tile maxima: at most MAX_TILES of them, each over at least MIN_TILE tokens (`maxima_tile`).
# The interpreter sorts them slowly (about 2 s for 1,024): at most INTERPRETER_MAX_TILES there.
MAX_TILES = 1024
INTERPRETER_MAX_TILES = 64
MIN_TILE = 16
# Passes that find a pivot by passes alone (`exact_passes`): one by value, eight by key.
SEARCH_PASSES = 1 + -(-32 // (WAYS.bit_length() - 1))
# Elements of a search pass's [BLOCK_V, WAYS] tile in a row's program, at most, on a GPU.
SEARCH_TILE = 16384
# Elements of top-p's chunked passes' [WAYS, BLOCK_V] sums (`_chunk_masses`), at most, on a GPU. On an
# H200 (B = 64, n = 4, V = 128256, top-p 0.9) a pass took 151 us at 8192 (lines of 512 tokens) and 164
# us at 16384.
MASS_TILE = 8192
# Candidates a row's program reads at once when it narrows top-p's interval on them
# (`_narrow_candidates`).
CANDIDATE_TILE = tl.constexpr(512)
# The candidates' masses are added as integers of this many fractional bits (`_candidate_masses`):
# at most MAX_CAPACITY (2**14) weights of at most 1 each, so a sum stays below 2**62.
CANDIDATE_FRACTION_BITS = 48
CANDIDATE_UNIT = tl.constexpr(float(2**CANDIDATE_FRACTION_BITS))
# The tile width of a row's program's compaction, on a GPU.
SCAN_BLOCK = 8192
# Warps of a row's search program and of top-p's first pass.
SELECT_WARPS = 8
# The select kernel's register cap on a GPU where its rows outnumber the SMs (`select_registers`):
# ptxas gives it up to 229 registers, one program of 8 warps an SM, so B = 64's 320 rows run in three
# waves of 132; under 128, two programs share an SM, at the cost of 113 to 265 spilled accesses
# (`benchmarks.resources` records them). H200, B = 64, n = 4, V = 128256: 31.5 -> 26.4 us with top-k
# 50, top-p 0.9 and min-p 0.05; 42.0 -> 34.7 us with top-p 0.9 alone. Fewer rows than SMs gain
# nothing from it: they are not capped.
SELECT_MAX_REGISTERS = 128
INDEX_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _read(row_ptr, tokens, end):
    """The logits of a row at ``tokens`` (any shape) below ``end``: ``(float32 with NaN as -inf, below
    end)``."""
    in_vocab = tokens < end
    return clean_logit(tl.load(row_ptr + tokens, mask=in_vocab, other=NEG_INF)), in_vocab


@triton.jit
def _tile(row_ptr, tile_start, end, BLOCK_V: tl.constexpr):
    """`_read` of tokens ``tile_start + [0, BLOCK_V)``."""
    return _read(row_ptr, tile_start + tl.arange(0, BLOCK_V), end)


@triton.jit
def _line(row_ptr, tile_start, end, BLOCK_V: tl.constexpr):
    """`_tile` as a ``[1, BLOCK_V]`` line, which a ``[WAYS, BLOCK_V]`` sum takes in its own layout."""
    return _read(row_ptr, tile_start + tl.arange(0, BLOCK_V)[None, :], end)


@triton.jit
def _cuts(lo, top, floor, by_value, WAYS: tl.constexpr):
    """``[WAYS]`` order keys of a search pass in ``[lo, top]`` (int64, ascending), lane 0 ``lo`` itself.

    By key (``by_value`` false, or an end not finite): ``lo + j ceil((top - lo) / WAYS)`` capped at
    ``top``, so every gap between lanes, or from the last lane to ``top``, is at most
    ``ceil((top - lo) / WAYS)`` keys wide: ``WAYS``-fold narrowing, whatever the values. By value:
    the keys of ``WAYS`` values evenly spaced from ``max(value(lo), floor)`` to ``value(top)``, which
    place the cuts where the logits are rather than across every float32 exponent."""
    lanes = tl.arange(0, WAYS)
    step = (top - lo + (WAYS - 1)) // WAYS
    by_key = tl.minimum(lo + lanes.to(tl.int64) * step, top)
    a = tl.maximum(key_value(tl.maximum(lo, NEG_INF_KEY).to(tl.int32)), floor)
    b = key_value(top.to(tl.int32))
    use_value = by_value & (a > NEG_INF) & (b < POS_INF) & (a < b)
    f = lanes.to(tl.float32) / WAYS
    values = tl.where(use_value, a * (1.0 - f) + b * f, 0.0)
    by_values = tl.minimum(tl.maximum(order_key(values).to(tl.int64), lo), top)
    return tl.where(use_value, tl.where(lanes == 0, lo, by_values), by_key)


@triton.jit
def _counts_from(row_ptr, begin, end, cuts, BLOCK_V: tl.constexpr, WAYS: tl.constexpr):
    """``[WAYS]`` how many tokens of ``[begin, end)`` have an order key ``>= cuts[j]`` (int32 cuts)."""
    counts = tl.zeros([WAYS], tl.int32)
    tile_start = begin
    while tile_start < end:
        x, in_vocab = _tile(row_ptr, tile_start, end, BLOCK_V)
        keys = masked_key(x, in_vocab)
        # A tile below the least cut (lane 0's) counts nothing at any cut.
        if tl.max(keys, axis=0) >= tl.min(cuts, axis=0):
            counts += tl.sum((keys[:, None] >= cuts[None, :]).to(tl.int32), axis=0)
        tile_start += BLOCK_V
    return counts


@triton.jit
def _above(keys, weights, cuts):
    """``([WAYS] sum of weights, [WAYS] count)`` of a tile's keys ``> cuts[j]`` (a ``[BLOCK, WAYS]``
    comparison, each lane reduced the same way whatever its cut)."""
    above = keys[:, None] > cuts[None, :]
    return tl.sum(tl.where(above, weights[:, None], 0.0), axis=0), tl.sum(above.to(tl.int32), axis=0)


@triton.jit
def _masses_above(row_ptr, begin, end, cuts, row_max, inv_temperature, BLOCK_V: tl.constexpr,
                  WAYS: tl.constexpr):  # fmt: skip
    """``([WAYS] sum of exp((z - max) / T), [WAYS] count)`` over the tokens of ``[begin, end)`` whose
    order key is ``> cuts[j]`` (int32 cuts).

    Each lane is a fixed sum of non-negative terms, reduced tile by tile in the same order as every
    other lane and whatever its cut is: it never decreases as the cut does, so a search on it is
    consistent (monotone, and the same cut gets the same mass in any lane of any pass)."""
    masses = tl.zeros([WAYS], tl.float32)
    counts = tl.zeros([WAYS], tl.int32)
    tile_start = begin
    while tile_start < end:
        x, in_vocab = _tile(row_ptr, tile_start, end, BLOCK_V)
        keys = masked_key(x, in_vocab)
        # A tile at or below the least cut (lane 0's) adds nothing above any cut: skipping it adds
        # zeros, which leaves every sum as it was.
        if tl.max(keys, axis=0) > tl.min(cuts, axis=0):
            tile_masses, tile_counts = _above(keys, weight(x, in_vocab, row_max, inv_temperature), cuts)
            masses += tile_masses
            counts += tile_counts
        tile_start += BLOCK_V
    return masses, counts


@triton.jit
def _compact(row_ptr, out_ptr, end, lo, hi, capacity, BLOCK_V: tl.constexpr):
    """The keys of the tokens of ``[0, end)`` whose order key lies in ``[lo, hi)`` (int32 bounds) into
    ``out_ptr[0:capacity]`` in token order (those that fit), by a program that owns its row."""
    n = tl.full([], 0, tl.int32)
    tile_start = 0
    while tile_start < end:
        x, in_vocab = _tile(row_ptr, tile_start, end, BLOCK_V)
        n = _compact_tile(out_ptr, masked_key(x, in_vocab), lo, hi, n, capacity)
        tile_start += BLOCK_V


@triton.jit
def _compact_tile(out_ptr, keys, lo, hi, n, capacity):
    """A tile's keys in ``[lo, hi)`` written in token order from slot ``n`` of ``out_ptr`` (those below
    ``capacity``); returns ``n`` plus their count."""
    taken = ((keys >= lo) & (keys < hi)).to(tl.int32)
    count = tl.sum(taken, axis=0)
    # Most tiles hold no candidate: they skip the scan.
    if count > 0:
        slot = n + tl.cumsum(taken, axis=0) - 1
        tl.store(out_ptr + slot, keys, mask=(taken > 0) & (slot < capacity))
    return n + count


@triton.jit
def _sort_head(out_ptr, n, WIDTH: tl.constexpr):
    """The first ``WIDTH >= n`` slots of ``out_ptr`` sorted in place, largest first (`NO_KEY` past
    ``n``), visible to every thread of the program."""
    few = tl.arange(0, WIDTH)
    keys = tl.sort(tl.load(out_ptr + few, mask=few < n, other=NO_KEY), descending=True)
    tl.store(out_ptr + few, keys)
    tl.debug_barrier()


@triton.jit
def _sort_in_place(out_ptr, n, CAPACITY: tl.constexpr):
    """The ``n <= CAPACITY`` keys `_compact` wrote, sorted in place, largest first, in the narrowest
    tile that holds them (`SMALL_SORT`, `MID_SORT` or ``CAPACITY`` wide; `NO_KEY` past ``n`` within
    it). A sort costs its tile's width whatever ``n`` (H200: about 60 us a program for 4,096 keys)."""
    # The keys were stored by other threads of this program.
    tl.debug_barrier()
    if CAPACITY > SMALL_SORT:
        if n <= SMALL_SORT:
            _sort_head(out_ptr, n, SMALL_SORT)
        else:
            if CAPACITY > MID_SORT:
                if n <= MID_SORT:
                    _sort_head(out_ptr, n, MID_SORT)
                else:
                    _sort_head(out_ptr, n, CAPACITY)
            else:
                _sort_head(out_ptr, n, CAPACITY)
    else:
        _sort_head(out_ptr, n, CAPACITY)


@triton.jit
def _sorted_keys(out_ptr, n, WIDTH: tl.constexpr):
    """``[WIDTH]`` the first ``n <= WIDTH`` sorted keys at ``out_ptr`` (`_sort_in_place`), then `NO_KEY`."""
    lanes = tl.arange(0, WIDTH)
    return tl.load(out_ptr + lanes, mask=lanes < n, other=NO_KEY)


# ---------------------------------------------------------------------------------------------
# The searches' last steps, in one program that owns the row


@triton.jit
def _narrow(cuts, holds, lo, hi):
    """A search pass applied to its interval: the cuts where ``holds`` (the pass's test: at least ``k``
    tokens, or the target's mass, at or above the cut) raise ``lo``, the others lower ``hi``."""
    return tl.max(tl.where(holds, cuts, lo), axis=0), tl.min(tl.where(holds, hi, cuts), axis=0)


@triton.jit
def _narrow_top_p(cuts, masses, counts, target, lo, hi, mass_hi, at_lo, at_hi):
    """A top-p pass's results applied to ``(lo, hi]``: the mass above ``lo`` stays at least the target
    and above ``hi`` below it. Returns ``(lo, hi, mass above hi, tokens above lo, tokens above hi)``."""
    below = masses < target
    counts = counts.to(tl.int64)
    at_lo = tl.min(tl.where(below, at_lo, counts), axis=0)
    at_hi = tl.max(tl.where(below, counts, at_hi), axis=0)
    mass_hi = tl.max(tl.where(below, masses, mass_hi), axis=0)
    lo, hi = _narrow(cuts, ~below, lo, hi)
    return lo, hi, mass_hi, at_lo, at_hi


@triton.jit
def _first_narrow_top_p(cuts, masses, counts, top_p, lo, hi, WAYS: tl.constexpr):
    """Top-p's first pass applied to ``(lo, hi]``: its lane 0 is ``lo``, whose mass is the kept mass, so
    the target is ``top_p`` times it. Returns ``(lo, hi, target, mass above hi, tokens above lo, tokens
    above hi)``."""
    lanes = tl.arange(0, WAYS)
    target = top_p * tl.sum(tl.where(lanes == 0, masses, 0.0), axis=0)
    at_lo = tl.sum(tl.where(lanes == 0, counts, 0), axis=0).to(tl.int64)
    none = tl.full([], 0, tl.int64)
    lo, hi, mass_hi, at_lo, at_hi = _narrow_top_p(
        cuts, masses, counts, target, lo, hi, tl.full([], 0.0, tl.float32), at_lo, none
    )  # fmt: skip
    return lo, hi, target, mass_hi, at_lo, at_hi


@triton.jit
def _top_p_floor(row_max, least, inv_temperature):
    """The least value a top-p pass by value places a cut at: ``max - 64 T`` (a weight of ``e**-64``),
    or the row's least logit above it."""
    return tl.maximum(row_max - 64.0 / inv_temperature, least)


@triton.jit
def _first_placement(maxima_ptr, masses_ptr, num_tiles, vocab_size, top_p, kept_key, max_key, row_max,
                     row_sum, least, inv_temperature, TILES: tl.constexpr, WAYS: tl.constexpr):  # fmt: skip
    """Where top-p's first chunked pass places its cuts: ``(the key of the least value, the key of the
    value they are spaced up to)`` for `_cuts` (lane 0 stays the kept set's bound), so that lanes 1
    and ``WAYS - 1`` fall on ``[low, high]``, two values the pivot lies between in most rows. Only
    the pass's speed depends on them: every lane's mass is summed exactly, and a pivot outside
    ``[low, high]`` leaves a wider interval to the second pass.

    With ``S`` the row's sum (`filter_stats_kernel`) and ``top_p S`` the target: the tokens below the
    pivot carry ``(1 - top_p) S``, at most ``V`` times the weight of the pivot, so ``low = max + T
    log((1 - top_p) S / V)`` (at least `_top_p_floor` and min-p's bound). ``high`` bounds the mass above
    a value ``c`` by that of the tiles whose maximum is at least ``c`` (``tile_mass``): the least such
    ``c`` whose bound is below the target, to within `PLACEMENT_PASSES` passes of `BOUND_WAYS` cuts
    over the tile maxima (rows without min-p; with it the target is a share of the kept mass, and
    ``high`` is the max)."""
    kept = key_value(tl.maximum(kept_key, NEG_INF_KEY).to(tl.int32))
    floor = tl.maximum(_top_p_floor(row_max, least, inv_temperature), kept)
    target = top_p * row_sum
    low = tl.maximum(row_max + tl.log((1.0 - top_p) * row_sum / vocab_size) / inv_temperature, floor)
    high = row_max
    if kept_key == NEG_INF_KEY:
        tiles = tl.arange(0, TILES)
        valid = tiles < num_tiles
        maxima = tl.load(maxima_ptr + tiles, mask=valid, other=NEG_INF)
        keys = masked_key(maxima, valid)
        tile_mass = tl.load(masses_ptr + tiles, mask=valid, other=0.0)
        masses = tl.where(valid, tile_mass * rescale_factor(maxima, row_max, inv_temperature), 0.0)
        lo = tl.min(tl.where(valid, keys, ABOVE_EVERY_KEY), axis=0).to(tl.int64)
        _, hi = _narrow_on_tiles(keys, masses, target, lo, max_key + 1, PLACEMENT_PASSES)
        high = tl.where(hi <= max_key, key_value(tl.minimum(hi, max_key).to(tl.int32)), row_max)
    # Lane j of `_cuts` lies at a + (b - a) j / WAYS: lanes 1 and WAYS - 1 at low and high.
    span = (high - low) * WAYS / (WAYS - 2)
    placed = (low == low) & (high == high) & (low > NEG_INF) & (low < high)
    a = tl.where(placed, low - span / WAYS, floor)
    b = tl.where(placed, tl.minimum(a + span, row_max), row_max)
    return order_key(tl.where(a == a, a, NEG_INF)).to(tl.int64), tl.minimum(
        order_key(b).to(tl.int64), max_key
    )


@triton.jit
def _pass_cuts(cuts_ptr, row, second, WAYS: tl.constexpr):
    """The ``[WAYS]`` pointers of a row's recorded cuts of top-p's first chunked pass (``second`` 0) or
    its second (1), in ``cuts [R, 2, WAYS]``.

    A pass's cuts are computed in one kernel and recorded there; every later kernel that reads the
    pass's masses loads them rather than computing them again. Computed again in another kernel,
    values spaced between two floats can round to a neighbouring key (the compiler fuses a multiply
    and an add in one kernel and not in the other): a mass summed above one key is then read as the
    mass above the next, and a pivot lands one float32 ulp off (H200: a max of 93.44644 at T =
    0.001 got 93.446434)."""
    return cuts_ptr + (row * 2 + second).to(tl.int64) * WAYS + tl.arange(0, WAYS)


@triton.jit
def _top_p_first(row_ptr, vocab_size, top_p, kept_key, max_key, row_max, least, inv_temperature,
                 BLOCK_V: tl.constexpr, WAYS: tl.constexpr):  # fmt: skip
    """Top-p's first pass over the tokens at or above ``kept_key``, made by this program alone: lane 0
    is ``kept_key - 1`` (its mass is the kept mass, so the target comes from the same sums as every
    mass compared with it), the other lanes values evenly spaced from `_top_p_floor` to the max.
    Returns ``(lo, hi, target, mass above hi, tokens above lo, tokens above hi)`` for
    `_top_p_finish`."""
    lo = kept_key - 1
    cuts = _cuts(lo, max_key, _top_p_floor(row_max, least, inv_temperature), True, WAYS)
    masses, counts = _masses_above(row_ptr, 0, vocab_size, cuts.to(tl.int32), row_max, inv_temperature,
                                   BLOCK_V, WAYS)  # fmt: skip
    return _first_narrow_top_p(cuts, masses, counts, top_p, lo, max_key, WAYS)


@triton.jit
def _top_k_finish(row_ptr, cand_ptr, vocab_size, k, lo, hi, n, packed, capacity, passes,
                  BLOCK_V: tl.constexpr, SCAN: tl.constexpr, WAYS: tl.constexpr,
                  CAPACITY: tl.constexpr):  # fmt: skip
    """Top-k once the ``n`` tokens of ``[lo, hi)`` were counted, and compacted where ``packed`` (``hi``
    above the max; at least ``k`` tokens at or above ``lo`` unless ``lo`` is the kept set's
    least key): ``(the k-th largest key, whether at least k tokens are kept (else top-k keeps them
    all), how many candidates lie sorted at cand_ptr (`_sort_in_place`), whether they are every token
    at or above lo)``.

    Where the tokens are at most ``capacity``, the ``k``-th value is read off their sort. Otherwise
    ``WAYS``-way passes (`_cuts`, `_counts_from`) narrow the interval, keeping at least ``k`` tokens at
    or above ``lo`` and fewer at or above ``hi``, until it holds at most ``capacity`` tokens
    (compacted and sorted) or one key (``lo``), or ``passes`` passes are spent (``lo``: a search cut
    short, which only tests ask for)."""
    above = tl.full([], 0, tl.int64)
    filters = n >= k
    i = 0
    while filters & (n > capacity) & (hi - lo > 1) & (i < passes):
        cuts = _cuts(lo, hi - 1, NEG_INF, i == 0, WAYS)
        counts = _counts_from(row_ptr, 0, vocab_size, cuts.to(tl.int32), BLOCK_V, WAYS).to(tl.int64)
        at_least = counts >= k
        at_lo = tl.min(tl.where(at_least, counts, n + above), axis=0)
        above = tl.max(tl.where(at_least, above, counts), axis=0)
        lo, hi = _narrow(cuts, at_least, lo, hi)
        n = at_lo - above
        i += 1
    # The chunks' compaction holds the interval's tokens where they were gathered; after a pass, or
    # where they were not, compact again.
    if (n <= capacity) & (((i > 0) & (hi - lo > 1)) | ((i == 0) & (packed == 0))):
        _compact(row_ptr, cand_ptr, vocab_size, lo.to(tl.int32), hi.to(tl.int32), capacity, SCAN)
    compacted = (n <= capacity) & ((i == 0) | (hi - lo > 1))
    kth = lo
    if compacted:
        _sort_in_place(cand_ptr, n, CAPACITY)
        at = k - above - 1
        kth_key = tl.load(cand_ptr + at, mask=(at >= 0) & (at < n), other=NO_KEY).to(tl.int64)
        kth = tl.where(filters, kth_key, lo)
    whole = compacted & (above == 0)
    return kth, filters, n, whole


@triton.jit
def _candidate_masses(cand_ptr, n, cuts, row_max, inv_temperature, WAYS: tl.constexpr):
    """``([WAYS] sum of exp((z - max) / T), [WAYS] count)`` over the ``n`` candidate keys at ``cand_ptr``
    whose key is ``> cuts[j]``, `CANDIDATE_TILE` keys at a time.

    The candidates lie in the order their chunks' atomic adds gave them (`_compact_chunk`), which
    changes from run to run, so a float32 sum of them would too: each weight (at most 1) is taken as
    an integer number of ``2**-CANDIDATE_FRACTION_BITS`` (rounded down), the integers added exactly
    in int64, and each lane's total rounded to float32 once. Every lane's sum is then the same
    whatever the candidates' order, and never decreases as its cut does."""
    lanes = tl.arange(0, CANDIDATE_TILE)
    fixed = tl.zeros([WAYS], tl.int64)
    counts = tl.zeros([WAYS], tl.int32)
    start = 0
    while start < n:
        valid = start + lanes < n
        keys = tl.load(cand_ptr + start + lanes, mask=valid, other=NO_KEY)
        weights = weight(key_value(keys), valid, row_max, inv_temperature)
        units = (tl.minimum(tl.maximum(weights, 0.0), 1.0) * CANDIDATE_UNIT).to(tl.int64)
        above = keys[:, None] > cuts[None, :]
        fixed += tl.sum(tl.where(above, units[:, None], 0), axis=0)
        counts += tl.sum(above.to(tl.int32), axis=0)
        start += CANDIDATE_TILE
    return fixed.to(tl.float32) * (1.0 / CANDIDATE_UNIT), counts


@triton.jit
def _narrow_candidates(cand_ptr, n, target, lo, hi, mass_hi, row_max, inv_temperature, passes,
                       WAYS: tl.constexpr):  # fmt: skip
    """Top-p's interval ``(lo, hi]`` narrowed on its ``n`` candidates at ``cand_ptr`` (the tokens of the
    interval, unsorted) until at most `SMALL_SORT` of them are left, so that their sort is a small
    one: a pass of ``WAYS`` cuts (`_cuts`: by value, then by key) adds each cut's candidate mass
    above it to ``mass_hi``, narrows the interval as a pass over the row does (`_narrow_top_p`), and
    keeps the candidates of the new interval in place, in their order; at most ``passes`` passes.
    The candidates' sums are not the chunks' (the same terms added exactly, `_candidate_masses`, and
    rounded once): where the mass above ``lo`` they give falls below the target, the interval stays
    as it is (the pivot is then read off all ``n``, as without this). Returns ``(lo, hi, mass above
    hi, n)``."""
    lanes = tl.arange(0, CANDIDATE_TILE)
    ways = tl.arange(0, WAYS)
    narrowing = (n > SMALL_SORT) & (hi - lo > 1)
    i = 0
    while narrowing & (i < passes):
        cuts = _cuts(lo, hi, NEG_INF, i == 0, WAYS)
        masses, counts = _candidate_masses(cand_ptr, n, cuts.to(tl.int32), row_max, inv_temperature, WAYS)
        masses += mass_hi
        # Lane 0 is lo itself: every candidate lies above it.
        narrowing = tl.sum(tl.where(ways == 0, masses, 0.0), axis=0) >= target
        if narrowing:
            none = tl.full([], 0, tl.int64)
            lo, hi, mass_hi, _, _ = _narrow_top_p(cuts, masses, counts, target, lo, hi, mass_hi, none, none)
            # The candidates of the new (lo, hi], moved down in place: a key's slot is at most its own.
            kept = tl.full([], 0, tl.int32)
            start = 0
            while start < n:
                valid = start + lanes < n
                keys = tl.load(cand_ptr + start + lanes, mask=valid, other=NO_KEY)
                tl.debug_barrier()
                inside = valid & (keys.to(tl.int64) > lo) & (keys.to(tl.int64) <= hi)
                slot = kept + tl.cumsum(inside.to(tl.int32), axis=0) - 1
                tl.store(cand_ptr + slot, keys, mask=inside)
                kept += tl.sum(inside.to(tl.int32), axis=0)
                start += CANDIDATE_TILE
            tl.debug_barrier()
            n = kept.to(n.dtype)
            narrowing = (n > SMALL_SORT) & (hi - lo > 1)
        i += 1
    return lo, hi, mass_hi, n


@triton.jit
def _top_p_finish(row_ptr, cand_ptr, vocab_size, target, lo, hi, mass_hi, at_lo, at_hi, compacted, row_max,
                  inv_temperature, capacity, passes, BLOCK_V: tl.constexpr, SCAN: tl.constexpr,
                  WAYS: tl.constexpr, CAPACITY: tl.constexpr):  # fmt: skip
    """Top-p's pivot once a first pass left ``(lo, hi]`` (the mass above ``lo`` at least ``target``,
    above ``hi`` ``mass_hi < target``; ``at_lo - at_hi`` tokens in it, compacted where ``compacted`` is 1):
    ``WAYS``-way passes by key narrow it until it holds at most ``capacity`` tokens (compacted, sorted,
    and their masses added to ``mass_hi`` largest first: the pivot is the least key whose mass above
    is below the target) or one key (``hi``), or ``passes`` passes in all are spent (``hi``).

    Returns ``(pivot, kept mass)``: the mass of the tokens at or above the pivot, ``mass_hi`` plus the
    sorted candidates' from the largest down, where they were sorted; `UNKNOWN_MASS` elsewhere."""
    i = 1
    while (at_lo - at_hi > capacity) & (hi - lo > 1) & (i < passes):
        cuts = _cuts(lo, hi, NEG_INF, False, WAYS)
        masses, counts = _masses_above(row_ptr, 0, vocab_size, cuts.to(tl.int32), row_max, inv_temperature,
                                       BLOCK_V, WAYS)  # fmt: skip
        lo, hi, mass_hi, at_lo, at_hi = _narrow_top_p(
            cuts, masses, counts, target, lo, hi, mass_hi, at_lo, at_hi
        )
        compacted = compacted * 0
        i += 1
    pivot = hi
    kept_mass = tl.full([], UNKNOWN_MASS, tl.float32)
    n = at_lo - at_hi
    if (hi - lo > 1) & (n <= capacity):
        if compacted == 0:
            _compact(
                row_ptr, cand_ptr, vocab_size, (lo + 1).to(tl.int32), (hi + 1).to(tl.int32), capacity, SCAN
            )
        if CAPACITY > SMALL_SORT:
            lo, hi, mass_hi, n = _narrow_candidates(
                cand_ptr, n, target, lo, hi, mass_hi, row_max, inv_temperature, passes, WAYS
            )
            pivot = hi
        _sort_in_place(cand_ptr, n, CAPACITY)
        # The sums take the sort's tile width, which follows n alone.
        if CAPACITY > SMALL_SORT:
            if n <= SMALL_SORT:
                pivot, kept_mass = _pivot_of_sorted(
                    cand_ptr, n, target, hi, mass_hi, row_max, inv_temperature, SMALL_SORT
                )  # fmt: skip
            else:
                if CAPACITY > MID_SORT:
                    if n <= MID_SORT:
                        pivot, kept_mass = _pivot_of_sorted(
                            cand_ptr, n, target, hi, mass_hi, row_max, inv_temperature, MID_SORT
                        )  # fmt: skip
                    else:
                        pivot, kept_mass = _pivot_of_sorted(
                            cand_ptr, n, target, hi, mass_hi, row_max, inv_temperature, CAPACITY
                        )  # fmt: skip
                else:
                    pivot, kept_mass = _pivot_of_sorted(
                        cand_ptr, n, target, hi, mass_hi, row_max, inv_temperature, CAPACITY
                    )  # fmt: skip
        else:
            pivot, kept_mass = _pivot_of_sorted(
                cand_ptr, n, target, hi, mass_hi, row_max, inv_temperature, CAPACITY
            )  # fmt: skip
    return pivot, kept_mass


@triton.jit
def _pivot_of_sorted(cand_ptr, n, target, hi, mass_hi, row_max, inv_temperature, WIDTH: tl.constexpr):
    """Top-p's pivot among the ``n <= WIDTH`` keys sorted at ``cand_ptr`` (every token of its interval
    ``(lo, hi]``; ``mass_hi`` above it): the least key whose mass above, summed largest first from
    ``mass_hi``, is below ``target`` (``hi`` where none is). Returns ``(pivot, kept mass)``."""
    keys = _sorted_keys(cand_ptr, n, WIDTH)
    valid = tl.arange(0, WIDTH).to(tl.int64) < n
    weights = weight(key_value(keys), valid, row_max, inv_temperature)
    before = mass_hi + (tl.cumsum(weights, axis=0) - weights)
    pivot = tl.min(tl.where(valid & (before < target), keys.to(tl.int64), hi), axis=0)
    kept_mass = mass_hi + tl.sum(tl.where(keys.to(tl.int64) >= pivot, weights, 0.0), axis=0)
    return pivot, kept_mass


@triton.jit
def _smallest_key_from(row_ptr, vocab_size, kept_key, BLOCK_V: tl.constexpr):
    """The order key of the row's smallest logit whose key is ``>= kept_key`` (``kept_key`` itself
    where none is), by a program that reads the whole row."""
    smallest = tl.full([BLOCK_V], ABOVE_EVERY_KEY, tl.int32)
    tile_start = 0
    while tile_start < vocab_size:
        x, in_vocab = _tile(row_ptr, tile_start, vocab_size, BLOCK_V)
        keys = masked_key(x, in_vocab)
        smallest = tl.minimum(smallest, tl.where(keys.to(tl.int64) >= kept_key, keys, ABOVE_EVERY_KEY))
        tile_start += BLOCK_V
    least = tl.min(smallest, axis=0).to(tl.int64)
    return tl.where(least < ABOVE_EVERY_KEY, least, kept_key)


@triton.jit
def _row_sum(row_ptr, vocab_size, row_max, inv_temperature, BLOCK_V: tl.constexpr):
    """The row's sum of ``exp((z - max) / T)``, by a program that reads the whole row."""
    sums = tl.zeros([BLOCK_V], tl.float32)
    tile_start = 0
    while tile_start < vocab_size:
        x, in_vocab = _tile(row_ptr, tile_start, vocab_size, BLOCK_V)
        sums += weight(x, in_vocab, row_max, inv_temperature)
        tile_start += BLOCK_V
    return tl.sum(sums, axis=0)


@triton.jit
def _mass_from(cand, kept_key, row_max, inv_temperature):
    """The sum of ``exp((z - max) / T)`` over the candidate keys ``cand`` at or above ``kept_key``."""
    kept = cand.to(tl.int64) >= kept_key
    return tl.sum(weight(key_value(cand), kept, row_max, inv_temperature), axis=0)


@triton.jit
def _kept_of_candidates(cand_ptr, n, kept_key, at_pivot, top_p, max_key, row_max, inv_temperature,
                        WIDTH: tl.constexpr):  # fmt: skip
    """Where top-k's ``n <= WIDTH`` candidates sorted at ``cand_ptr`` are every token at or above
    ``kept_key`` (top-k's pivot, else min-p's key): top-p's pivot among them (``top_p < 1``), their
    kept mass, and, where nothing has pinned a pivot yet (``at_pivot`` 0: min-p binds), the least of
    them at or above min-p's key. Returns ``(kept_key, kept mass, at_pivot)``."""
    cand = _sorted_keys(cand_ptr, n, WIDTH)
    if top_p < 1.0:
        kept_key = _top_p_sorted(cand, kept_key, top_p, max_key, row_max, inv_temperature)
        at_pivot = tl.full([], 1, tl.int32)
    kept_mass = _mass_from(cand, kept_key, row_max, inv_temperature)
    if (at_pivot == 0) & (kept_key > NEG_INF_KEY):
        in_set = cand.to(tl.int64) >= kept_key
        kept_key = tl.min(tl.where(in_set, cand, ABOVE_EVERY_KEY), axis=0).to(tl.int64)
        at_pivot = tl.full([], 1, tl.int32)
    return kept_key, kept_mass, at_pivot


@triton.jit
def _top_p_sorted(cand, kept_key, top_p, max_key, row_max, inv_temperature):
    """Top-p's pivot from sorted candidates that are every kept token (key ``>= kept_key``): the least
    key whose kept mass above, summed largest first, is below ``top_p`` times their sum."""
    kept = cand.to(tl.int64) >= kept_key
    weights = weight(key_value(cand), kept, row_max, inv_temperature)
    target = top_p * tl.sum(weights, axis=0)
    before = tl.cumsum(weights, axis=0) - weights
    return tl.min(tl.where(kept & (before < target), cand.to(tl.int64), max_key), axis=0)


# ---------------------------------------------------------------------------------------------
# Kernels, launched in this order by `filter_thresholds`. Grid (R, C): a program per chunk of a row;
# grid (R,): a program per row. A row's state lies in `row_stats` (float32: max, sum, least logit,
# top-p's target and the masses above its intervals) and `row_state` (int64, the `STATE_*` fields).
# Counts that change from call to call are not specialised on; the row stride and the vocabulary
# are (a multiple of 16 lets the passes load 16 bytes a thread at once).

# A row's mode: what its chunks' second pass does for it.
MODE_NONE = tl.constexpr(0)  # nothing filters: t = -inf
MODE_TOP_K = tl.constexpr(1)  # compact the tokens at or above top-k's bound
MODE_TOP_P = tl.constexpr(2)  # top-p without top-k: a pass of masses, then compact its interval
MODE_MIN_P = tl.constexpr(3)  # min-p alone: the smallest logit it keeps
STATE_MODE = tl.constexpr(0)
STATE_KEPT = tl.constexpr(1)  # min-p's key (the kept set so far), NEG_INF_KEY where none
STATE_LO = tl.constexpr(2)
STATE_HI = tl.constexpr(3)
STATE_TOP_P_LO = tl.constexpr(4)  # top-p's interval after its first pass
STATE_TOP_P_HI = tl.constexpr(5)
STATE_FINAL_LO = tl.constexpr(6)  # top-p's interval after its second pass
STATE_FINAL_HI = tl.constexpr(7)
STATE_SKIP = tl.constexpr(8)  # 1 where the first pass left few enough tokens that no second is made
STATE_FIELDS = tl.constexpr(9)
STATS_TARGET = tl.constexpr(3)  # top-p's target: top_p times the kept mass
STATS_MASS_HI = tl.constexpr(4)  # the mass above top-p's interval after its first pass
STATS_FINAL_MASS_HI = tl.constexpr(5)  # after its second
STATS_FIELDS = tl.constexpr(6)


@triton.jit(do_not_specialize=["num_tiles", "num_segments"])
def filter_stats_kernel(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, segment_stats_ptr, tile_max_ptr,
                        tile_mass_ptr, chunk_count_ptr, logits_stride, vocab_size, num_tiles, num_segments,
                        BLOCK_V: tl.constexpr, TILE: tl.constexpr, SEGMENT_TILES: tl.constexpr,
                        SEGMENTS: tl.constexpr, MASSES: tl.constexpr, HAS_TOP_K: tl.constexpr,
                        PDL: tl.constexpr):  # fmt: skip
    """Grid (R, C): each segment's ``(max, sum of exp((z - max) / T), least logit)`` per line slot into
    ``segment_stats [R, S, 3, BLOCK_V / TILE]``; the max of every ``TILE`` tokens into ``tile_max [R,
    num_tiles]`` and, with ``MASSES`` (calls that filter by top-p) in rows whose top-p is on and top-k
    off, their ``sum of exp((z - tile max) / T)`` into ``tile_mass [R, num_tiles]`` (which place
    top-p's first cuts, `_first_placement`); the chunk's compaction counter (``chunk_count [R, C]``,
    `_compact_chunk`'s) set to 0. A chunk is ``SEGMENTS`` segments of ``SEGMENT_TILES`` tiles of
    ``BLOCK_V`` tokens (loops of known length), each tile loaded as ``[BLOCK_V / TILE, TILE]`` lines.

    Each line's max and mass (its terms taken from its own max: one exponential a token) are reduced
    within the line only, and added into one running ``(max, sum, least)`` per line slot, the sum
    rescaled as that slot's max grows; each segment's slots are recorded as they are, and
    `filter_start_kernel` reduces them, so nothing here reduces across the program's warps (H200, B =
    64, n = 4, V = 128256, fp32, three filters: 61.3 us against 73.0 for one running sum over the
    whole tile a step; 80.8 where each segment's slots were reduced here). A segment's slots are made
    the same way whatever chunk reads it, so the row's sum (`filter_start_kernel` adds them in
    segment order) does not depend on how many chunks the batch's size cuts the row into.

    The sums are made only in rows that want them (`_sum_wanted`: not where top-k filters and the row
    has at least ``k`` tiles); the others take each tile's maxima and least logits alone, no
    exponential. A thread keeps the least of its own logits of a segment, reduced once at the
    segment's end, and a tile's logits are loaded while the tile before it is reduced. H200, B =
    64, n = 4, V = 128256, fp32, top-k 50, top-p 0.9, min-p 0.05: 62.7 us before these three, 63.7
    with the tile ahead alone, 52.5 with all three (B = 1: 5.3, 4.2, 3.9); top-p 0.9 alone, whose
    rows make their sums: 64.9, 64.4, 66.5 (benchmarks/RESULTS.md, "The filters' statistics pass
    without sums in top-k rows")."""
    after_previous_launch(PDL)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
    maxima_ptr = tile_max_ptr + row.to(tl.int64) * num_tiles
    masses_ptr = tile_mass_ptr + row.to(tl.int64) * num_tiles
    inv_temperature = inverse_temperature(tl.load(temperature_ptr + row))
    # Rows whose top-k filters need no sum (`_sum_wanted`); top-p alone also wants the tiles' masses.
    sums_wanted = _sum_wanted(top_k_ptr, row, vocab_size, num_tiles, HAS_TOP_K)
    masses_wanted = MASSES
    if MASSES:
        masses_wanted = tl.load(top_p_ptr + row) < 1.0
        if HAS_TOP_K:
            k = tl.load(top_k_ptr + row)
            masses_wanted = masses_wanted & ((k <= 0) | (k >= vocab_size))
    LINES: tl.constexpr = BLOCK_V // TILE
    lines = tl.arange(0, LINES)
    lanes = tl.arange(0, TILE)
    tl.store(chunk_count_ptr + row * tl.num_programs(1) + chunk, 0)
    # The chunk's tiles one after another, each tile's logits loaded while the tile before it is
    # reduced (the loads of a tile wait on no barrier of the reductions before them).
    TILES: tl.constexpr = SEGMENTS * SEGMENT_TILES
    first_tile = chunk * TILES
    offsets = lines[:, None] * TILE + lanes[None, :]
    tokens = first_tile * BLOCK_V + offsets
    ahead = tl.load(row_ptr + tokens, mask=tokens < vocab_size, other=NEG_INF)
    slot_max = tl.full([LINES], NEG_INF, tl.float32)
    slot_sum = tl.full([LINES], 0.0, tl.float32)
    # Each thread keeps the least of its own logits of a segment, reduced at the segment's end.
    slot_least = tl.full([LINES, TILE], POS_INF, tl.float32)
    for i in range(TILES):
        t = i % SEGMENT_TILES
        segment = chunk * SEGMENTS + i // SEGMENT_TILES
        tile_start = (first_tile + i) * BLOCK_V
        in_vocab = tile_start + offsets < vocab_size
        x = clean_logit(ahead)
        following = tile_start + BLOCK_V + offsets
        ahead = tl.load(row_ptr + following, mask=(following < vocab_size) & (i + 1 < TILES), other=NEG_INF)
        if t == 0:
            slot_max = tl.full([LINES], NEG_INF, tl.float32)
            slot_sum = tl.full([LINES], 0.0, tl.float32)
            slot_least = tl.full([LINES, TILE], POS_INF, tl.float32)
        if segment < num_segments:
            maxima = tl.max(x, axis=1)
            tiles = tile_start // TILE + lines
            tl.store(maxima_ptr + tiles, maxima, mask=tiles < num_tiles)
            new_max = tl.maximum(slot_max, maxima)
            if sums_wanted:
                masses = tl.sum(weight(x, in_vocab, maxima[:, None], inv_temperature), axis=1)
                if masses_wanted:
                    tl.store(masses_ptr + tiles, masses, mask=tiles < num_tiles)
                rescaled = slot_sum * rescale_factor(slot_max, new_max, inv_temperature)
                slot_sum = rescaled + masses * rescale_factor(maxima, new_max, inv_temperature)
            slot_max = new_max
            slot_least = tl.minimum(slot_least, tl.where(in_vocab, x, POS_INF))
            if t == SEGMENT_TILES - 1:
                out = segment_stats_ptr + (row * num_segments + segment).to(tl.int64) * (3 * LINES) + lines
                tl.store(out, slot_max)
                tl.store(out + LINES, slot_sum)
                tl.store(out + 2 * LINES, tl.min(slot_least, axis=1))


@triton.jit
def _sum_wanted(top_k_ptr, row, vocab_size, num_tiles, HAS_TOP_K: tl.constexpr):
    """Whether a row's sum is made by `filter_stats_kernel`: not where its top-k filters (``0 < k <
    V``) and the row has at least ``k`` tiles, so that the ``k``-th value has a lower bound
    (`_top_k_bound`). Such a row's kept sum comes from its sorted candidates, and its test of a
    ``k``-th value of probability zero needs the sum only where that bound lies within ``log V``
    of zero's probability (`filter_start_kernel` then makes it, `_row_sum`); it skips an
    exponential a token."""
    wanted = True
    if HAS_TOP_K:
        k = tl.load(top_k_ptr + row)
        wanted = (k <= 0) | (k >= vocab_size) | (k > num_tiles)
    return wanted


@triton.jit
def _top_k_bound(maxima_ptr, num_tiles, k, max_key, TILES: tl.constexpr):
    """A key at or below the ``k``-th largest of the row's ``num_tiles`` tile maxima (``TILES >=
    num_tiles`` a power of two), so that ``k`` tiles hold a token at or above it and the ``k``-th value
    is at least it; `NEG_INF_KEY` where there are fewer than ``k`` tiles.

    `BOUND_PASSES` passes of `BOUND_WAYS` cuts, by value then by key (`_cuts`), narrow ``[lo, hi)``
    (at least ``k`` maxima at or above ``lo``, fewer at or above ``hi``) from the least maximum and the
    max; the bound is ``lo``, a little below the ``k``-th maximum (a sort found it exactly, at the
    cost of sorting every maximum)."""
    tiles = tl.arange(0, TILES)
    valid = tiles < num_tiles
    keys = masked_key(tl.load(maxima_ptr + tiles, mask=valid, other=NEG_INF), valid)
    lo = tl.min(tl.where(valid, keys, ABOVE_EVERY_KEY), axis=0).to(tl.int64)
    lo, _ = _narrow_on_tiles(keys, valid.to(tl.float32), k.to(tl.float32), lo, max_key + 1, BOUND_PASSES)
    return tl.where(k <= num_tiles, lo, NEG_INF_KEY)


@triton.jit
def _narrow_on_tiles(keys, weights, need, lo, hi, PASSES: tl.constexpr):
    """``[lo, hi)`` narrowed over a row's tile maxima (``keys``, each with a weight: ``1`` counts them)
    by ``PASSES`` passes of `BOUND_WAYS` cuts, by value then by key (`_cuts`), so that the maxima at or
    above ``lo`` weigh at least ``need`` and those at or above ``hi`` less."""
    for i in tl.static_range(PASSES):
        cuts = _cuts(lo, hi - 1, NEG_INF, i == 0, BOUND_WAYS)
        at_or_above = keys[None, :] >= cuts[:, None].to(tl.int32)
        above = tl.sum(tl.where(at_or_above, weights[None, :], 0.0), axis=1)
        lo, hi = _narrow(cuts, above >= need, lo, hi)
    return lo, hi


@triton.jit(do_not_specialize=["vocab_size", "num_segments", "num_tiles"])
def filter_start_kernel(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, segment_stats_ptr,
                        tile_max_ptr, tile_mass_ptr, row_stats_ptr, row_state_ptr, cuts_ptr, logits_stride,
                        vocab_size, num_segments, num_tiles, HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr,
                        HAS_MIN_P: tl.constexpr, TILES: tl.constexpr, LINES: tl.constexpr, WAYS: tl.constexpr,
                        BLOCK_V: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """Grid (R,): the row's max, sum and least logit (its segments' ``LINES`` line slots each,
    `SEGMENT_GROUP` segments at a time, in segment order), min-p's key, the row's mode and its second
    pass's interval: for top-k, ``[max(min-p's key, bound), max]``, the bound at or below the
    ``k``-th largest tile maximum (`_top_k_bound`: ``k`` tiles hold a token at or above it, so the
    ``k``-th value is at least it); for top-p alone, the first pass's ``(min-p's key - 1, max]`` and
    its cuts (placed by `_first_placement`, recorded in ``cuts [R, 2, WAYS]``: `_pass_cuts`)."""
    after_previous_launch(PDL)
    row = tl.program_id(0)
    temperature = tl.load(temperature_ptr + row)
    inv_temperature = inverse_temperature(temperature)
    row_max = tl.full([], NEG_INF, tl.float32)
    row_sum = tl.full([], 0.0, tl.float32)
    least = tl.full([], POS_INF, tl.float32)
    stats = segment_stats_ptr + (row * num_segments).to(tl.int64) * (3 * LINES)
    segments = tl.arange(0, SEGMENT_GROUP)
    slots = tl.arange(0, LINES)
    c = 0
    while c < num_segments:
        inside = (c + segments < num_segments)[:, None]
        at = stats + (c + segments)[:, None] * (3 * LINES) + slots[None, :]
        slot_max = tl.load(at, mask=inside, other=NEG_INF)
        new_max = tl.maximum(row_max, tl.max(tl.max(slot_max, axis=1), axis=0))
        slot_sum = tl.load(at + LINES, mask=inside, other=0.0) * rescale_factor(
            slot_max, new_max, inv_temperature
        )
        group_sum = tl.sum(tl.sum(slot_sum, axis=1), axis=0)
        row_sum = row_sum * rescale_factor(row_max, new_max, inv_temperature) + group_sum
        row_max = new_max
        slot_least = tl.load(at + 2 * LINES, mask=inside, other=POS_INF)
        least = tl.minimum(least, tl.min(tl.min(slot_least, axis=1), axis=0))
        c += SEGMENT_GROUP
    out = row_stats_ptr + row * STATS_FIELDS
    tl.store(out, row_max)
    # Rows without a sum (`_sum_wanted`) store UNKNOWN_MASS, unless their top-k test needs it (below).
    summed = _sum_wanted(top_k_ptr, row, vocab_size, num_tiles, HAS_TOP_K)
    row_sum = tl.where(summed, row_sum, UNKNOWN_MASS)
    tl.store(out + 2, least)

    filtering = filters_row(temperature, row_max)
    max_key = order_key(row_max).to(tl.int64)
    kept_key = tl.full([], NEG_INF_KEY, tl.int64)
    mode = tl.full([], MODE_NONE, tl.int64)
    lo = kept_key
    hi = max_key + 1
    if HAS_MIN_P:
        min_p = tl.load(min_p_ptr + row)
        by_min_p = filtering & (min_p > 0.0)
        kept_key = tl.where(by_min_p, tl.minimum(min_p_key(row_max, temperature, min_p), max_key), kept_key)
        mode = tl.where(by_min_p, MODE_MIN_P, mode)
        lo = kept_key
    if HAS_TOP_P:
        top_p = tl.load(top_p_ptr + row)
        by_p = filtering & (top_p < 1.0)
        mode = tl.where(by_p, MODE_TOP_P, mode)
        lo = tl.where(by_p, kept_key - 1, lo)
        hi = tl.where(by_p, max_key, hi)
    if HAS_TOP_K:
        k = tl.load(top_k_ptr + row).to(tl.int64)
        if filtering & (k > 0) & (k < vocab_size):
            bound = _top_k_bound(tile_max_ptr + row.to(tl.int64) * num_tiles, num_tiles, k, max_key, TILES)
            # The k-th value is at least the bound, and the sum S in [1, V]: the select kernel's test
            # of a k-th value of probability zero needs S only where the bound's log probability may
            # lie below zero's, log V above it.
            bound_log = scaled_logit(key_value(bound.to(tl.int32)), row_max, inv_temperature)
            if (not summed) & (bound_log < LOG_ZERO + tl.log(tl.full([], vocab_size, tl.float32))):
                row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
                row_sum = _row_sum(row_ptr, vocab_size, row_max, inv_temperature, BLOCK_V)
            mode = tl.full([], MODE_TOP_K, tl.int64)
            lo = tl.maximum(kept_key, bound)
            hi = max_key + 1
    tl.store(out + 1, row_sum)
    state = row_state_ptr + row * STATE_FIELDS
    if HAS_TOP_P:  # noqa: SIM102 (a constexpr condition, then a runtime one)
        if mode == MODE_TOP_P:
            first_floor, first_top = _first_placement(
                tile_max_ptr + row.to(tl.int64) * num_tiles, tile_mass_ptr + row.to(tl.int64) * num_tiles,
                num_tiles, vocab_size, tl.load(top_p_ptr + row), kept_key, max_key, row_max, row_sum, least,
                inv_temperature, TILES, WAYS,
            )  # fmt: skip
            cuts = _cuts(lo, first_top, key_value(first_floor.to(tl.int32)), True, WAYS)
            tl.store(_pass_cuts(cuts_ptr, row, 0, WAYS), cuts)
    tl.store(state + STATE_MODE, mode)
    tl.store(state + STATE_KEPT, kept_key)
    tl.store(state + STATE_LO, lo)
    tl.store(state + STATE_HI, hi)


@triton.jit
def _segment_masses(row_ptr, segment, vocab_size, cuts, row_max, inv_temperature, BLOCK_V: tl.constexpr,
                    WAYS: tl.constexpr, LINES: tl.constexpr):  # fmt: skip
    """``[WAYS]`` sum of ``exp((z - max) / T)`` over the segment's tokens (``LINES`` lines of ``BLOCK_V``)
    whose order key is ``> cuts[j]`` (int32 cuts).

    Every (lane, cut) pair keeps its own sum across the lines, reduced once at the end: each cut's
    mass is a fixed sum of non-negative terms in the same order whatever the cut, so it never
    decreases as the cut does, and the same cut gets the same mass in any lane of any pass. A term
    is its weight times 0 or 1, the comparison made on values: ``z > value(cut)`` is ``key(z) >
    cut`` for every logit (NaN reads as ``-inf``), and a cut below ``-inf``'s key compares as
    ``-inf``, which leaves out only ``-inf`` logits, of weight 0. The sums lie ``[WAYS, BLOCK_V]``,
    so a thread holds every cut of its tokens (one compare and one fused multiply-add a pair)."""
    values = key_value(tl.maximum(cuts, NEG_INF_KEY))
    acc = tl.zeros([WAYS, BLOCK_V], tl.float32)
    for t in range(LINES):
        x, in_vocab = _line(row_ptr, (segment * LINES + t) * BLOCK_V, vocab_size, BLOCK_V)
        weights = weight(x, in_vocab, row_max, inv_temperature)
        acc += weights * (x > values[:, None]).to(tl.float32)
    return tl.sum(acc, axis=1)


@triton.jit
def _segments_sum(masses_ptr, row, num_segments, WAYS: tl.constexpr):
    """``[WAYS]`` a row's segment masses added up, `SEGMENT_GROUP` segments at a time (each group summed
    as a tile, the groups in segment order): the same sums in every program, whatever chunks made
    them, and each cut's as the others' (an addition of larger terms never gives a smaller sum, so
    the sums keep the cuts' order)."""
    segments = tl.arange(0, SEGMENT_GROUP)
    ways = tl.arange(0, WAYS)
    base = masses_ptr + (row * num_segments).to(tl.int64) * WAYS
    masses = tl.zeros([WAYS], tl.float32)
    c = 0
    while c < num_segments:
        inside = c + segments < num_segments
        part = tl.load(base + (c + segments)[:, None] * WAYS + ways[None, :], mask=inside[:, None], other=0.0)
        masses += tl.sum(part, axis=0)
        c += SEGMENT_GROUP
    return masses


@triton.jit
def _few_left(masses, target, mass_hi, lo, row_max, inv_temperature, capacity):
    """Whether a top-p pass's interval ``(lo, hi]`` (the mass above ``lo`` at least ``target``, above
    ``hi`` ``mass_hi``, both among the pass's ``masses``) holds at most ``capacity`` tokens: each of
    them weighs at least ``lo``'s weight, so their count is at most their mass over it."""
    mass_lo = tl.min(tl.where(masses >= target, masses, POS_INF), axis=0)
    least = tl.exp(
        scaled_logit(key_value(tl.maximum(lo, NEG_INF_KEY).to(tl.int32)), row_max, inv_temperature)
    )
    most = (mass_lo - mass_hi) / least
    # (A margin for the float32 sums; NaN and inf say no.)
    return most * 1.001 + 1.0 <= capacity


@triton.jit(do_not_specialize=["num_segments", "num_chunks", "capacity"])
def filter_mass_kernel(logits_ptr, temperature_ptr, top_p_ptr, row_stats_ptr, row_state_ptr, cuts_ptr,
                       first_ptr, masses_ptr, logits_stride, vocab_size, num_segments, num_chunks, capacity,
                       SECOND: tl.constexpr, WAYS: tl.constexpr, BLOCK_V: tl.constexpr, LINES: tl.constexpr,
                       SEGMENTS: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """Grid (R, G), rows of mode top-p: program ``(r, g)`` takes chunks ``g, g + G, ...`` of the
    ``num_chunks`` of row ``r``: the masses above a top-p pass's ``WAYS`` cuts of each of a chunk's
    ``SEGMENTS`` segments (``LINES`` lines of ``BLOCK_V`` tokens each) into ``masses [R, S,
    WAYS]``. The first pass (``SECOND`` false) cuts ``(min-p's key - 1, max]`` where the start kernel
    recorded (`_pass_cuts`): lane 0 its lower end, whose mass is the kept mass, the others values
    placed by `_first_placement`. The second adds the first's masses (``first_ptr``) over the segments
    (`_segments_sum`), which narrow the interval (program ``g = 0`` records it, top-p's target, the mass above
    it and the second pass's cuts), and cuts the narrowed interval by values evenly spaced from
    `_top_p_floor` to its upper end; unless the narrowed interval holds at most ``capacity`` tokens
    (`_few_left`), which the compaction then gathers (``STATE_SKIP``), and its programs return at
    once."""
    after_previous_launch(PDL)
    row = tl.program_id(0)
    state = row_state_ptr + row * STATE_FIELDS
    if tl.load(state + STATE_MODE) == MODE_TOP_P:
        row_max = tl.load(row_stats_ptr + row * STATS_FIELDS)
        least = tl.load(row_stats_ptr + row * STATS_FIELDS + 2)
        inv_temperature = inverse_temperature(tl.load(temperature_ptr + row))
        floor = _top_p_floor(row_max, least, inv_temperature)
        lo = tl.load(state + STATE_LO)
        hi = tl.load(state + STATE_HI)
        skip = False
        cuts = tl.load(_pass_cuts(cuts_ptr, row, 0, WAYS))
        if SECOND:
            first = _segments_sum(first_ptr, row, num_segments, WAYS)
            # (The counts go unused: the compaction counts the tokens of the narrowed interval.)
            lo, hi, target, mass_hi, _, _ = _first_narrow_top_p(
                cuts, first, tl.zeros([WAYS], tl.int32), tl.load(top_p_ptr + row), lo, hi, WAYS
            )
            skip = _few_left(first, target, mass_hi, lo, row_max, inv_temperature, capacity)
            if tl.program_id(1) == 0:
                tl.store(state + STATE_TOP_P_LO, lo)
                tl.store(state + STATE_TOP_P_HI, hi)
                tl.store(state + STATE_SKIP, skip.to(tl.int64))
                tl.store(row_stats_ptr + row * STATS_FIELDS + STATS_TARGET, target)
                tl.store(row_stats_ptr + row * STATS_FIELDS + STATS_MASS_HI, mass_hi)
            # Every program computes the same cuts (the same code on the same values).
            cuts = _cuts(lo, hi, floor, True, WAYS)
            if tl.program_id(1) == 0:
                tl.store(_pass_cuts(cuts_ptr, row, 1, WAYS), cuts)
        if not skip:
            row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
            # The program's chunks: every ``tl.num_programs(1)``-th of the row's.
            chunk = tl.program_id(1)
            while chunk < num_chunks:
                for s in range(SEGMENTS):
                    segment = chunk * SEGMENTS + s
                    if segment < num_segments:
                        masses = _segment_masses(
                            row_ptr, segment, vocab_size, cuts.to(tl.int32), row_max, inv_temperature,
                            BLOCK_V, WAYS, LINES,
                        )  # fmt: skip
                        out = (row * num_segments + segment).to(tl.int64) * WAYS + tl.arange(0, WAYS)
                        tl.store(masses_ptr + out, masses)
                chunk += tl.num_programs(1)


@triton.jit
def _compact_chunk(row_ptr, maxima_ptr, out_ptr, count_ptr, chunk, vocab_size, num_tiles, lo, hi, kept_key,
                   SHARE: tl.constexpr, BLOCK_V: tl.constexpr, TILES: tl.constexpr, TILE: tl.constexpr,
                   GROUP: tl.constexpr, RUN: tl.constexpr):  # fmt: skip
    """`_compact` of a chunk (``TILES`` tiles of ``BLOCK_V``) that shares its row: the keys of its
    tokens whose order key lies in ``[lo, hi)`` (int32 bounds; none where ``lo >= hi``) into the
    chunk's own region ``out_ptr[0:SHARE]`` (those that fit), each at the slot it takes from the
    chunk's counter (``count_ptr``, 0 before the call, their count after it); returns the chunk's
    smallest logit whose key is ``>= kept_key`` (``+inf``: none).

    A thread's run of ``RUN`` consecutive tokens takes its slots by one atomic add of its count (the
    compiler adds a warp's at once), each token the slot after those of the run before it, so no
    tile pays a block-wide scan; the slots' order is the threads', not the tokens', and the select
    kernel sorts the keys. A token an add (a thread's eight of a 1,024-token tile, eight round trips
    a warp one after another) took 96.7 us on an H200 with top-p 0.9 alone at B = 64, n = 4, V =
    128256, runs of four 64.8 us, of two 74.6.
    The row's maxima (``maxima_ptr``: one a ``TILE`` tokens, `filter_stats_kernel`'s) say which tiles
    can hold such a token: a tile whose maxima are all below ``lo`` (or the interval is empty) and
    below ``kept_key`` is not read, which leaves the count and the smallest logit as they were. The
    maxima of ``GROUP`` tiles (at most 32) are loaded at once, before any of their logits, and
    become one bit a tile: a tile's read waits on no load of the maxima (H200, B = 64, n = 4, V =
    128256, top-k 50, top-p 0.9, min-p 0.05: 29.1 us against 36.1 where each tile loaded its own
    maxima; top-p 0.9 alone 96.8 against 107.0)."""
    smallest = tl.full([BLOCK_V // RUN, RUN], POS_INF, tl.float32)
    runs = tl.arange(0, BLOCK_V // RUN)[:, None] * RUN + tl.arange(0, RUN)[None, :]
    lines = tl.arange(0, BLOCK_V // TILE)
    ways = tl.arange(0, GROUP)
    least_key = tl.minimum(tl.where(lo < hi, lo, ABOVE_EVERY_KEY), kept_key)
    for g in range(0, TILES, GROUP):
        first = chunk * TILES + g
        tiles = (first + ways)[:, None] * (BLOCK_V // TILE) + lines[None, :]
        inside = ((g + ways) < TILES)[:, None] & (tiles < num_tiles)
        maxima = tl.load(maxima_ptr + tiles, mask=inside, other=NEG_INF)
        reach = tl.max(order_key(maxima), axis=1) >= least_key
        bits = tl.sum(tl.where(reach, tl.full([GROUP], 1, tl.int64) << ways.to(tl.int64), 0), axis=0)
        for u in range(GROUP):
            if ((bits >> u) & 1) != 0:
                x, in_vocab = _read(row_ptr, (first + u) * BLOCK_V + runs, vocab_size)
                keys = masked_key(x, in_vocab)
                smallest = tl.minimum(smallest, tl.where(keys >= kept_key, x, POS_INF))
                taken = ((keys >= lo) & (keys < hi)).to(tl.int32)
                count = tl.sum(taken, axis=1)
                base = tl.atomic_add(
                    count_ptr + tl.zeros([BLOCK_V // RUN], tl.int32), count, mask=count > 0, sem="relaxed"
                )
                slot = base[:, None] + tl.cumsum(taken, axis=1) - taken
                tl.store(out_ptr + slot, keys, mask=(taken != 0) & (slot < SHARE))
    return tl.min(tl.min(smallest, axis=1), axis=0)


@triton.jit
def _pack(regions_ptr, counts_ptr, out_ptr, num_chunks, capacity, SHARE: tl.constexpr, GROUP: tl.constexpr):
    """A row's candidates gathered from its chunks' regions (``[num_chunks, SHARE]``, ``counts_ptr
    [num_chunks]`` each chunk's count) into ``out_ptr``, in chunk order, ``GROUP`` chunks at a time.
    Returns ``(n, packed)``: the row's count, and whether its candidates were gathered (every
    chunk's fit its region and ``n <= capacity``; else the row's program compacts them itself)."""
    groups = tl.arange(0, GROUP)
    lanes = tl.arange(0, SHARE)
    n = tl.full([], 0, tl.int64)
    most = tl.full([], 0, tl.int32)
    c = 0
    while c < num_chunks:
        counts = tl.load(counts_ptr + c + groups, mask=c + groups < num_chunks, other=0)
        n += tl.sum(counts, axis=0).to(tl.int64)
        most = tl.maximum(most, tl.max(counts, axis=0))
        c += GROUP
    packed = (n <= capacity) & (most <= SHARE)
    if packed:
        base = tl.full([], 0, tl.int32)
        c = 0
        while c < num_chunks:
            chunks = c + groups
            counts = tl.load(counts_ptr + chunks, mask=chunks < num_chunks, other=0)
            starts = base + tl.cumsum(counts, axis=0) - counts
            valid = lanes[None, :] < counts[:, None]
            keys = tl.load(regions_ptr + chunks[:, None] * SHARE + lanes[None, :], mask=valid)
            tl.store(out_ptr + starts[:, None] + lanes[None, :], keys, mask=valid)
            base += tl.sum(counts, axis=0)
            c += GROUP
    return n, packed.to(tl.int32)


@triton.jit(do_not_specialize=["num_segments"])
def filter_compact_kernel(logits_ptr, tile_max_ptr, row_stats_ptr, row_state_ptr, cuts_ptr, masses_ptr,
                          regions_ptr, chunk_count_ptr, chunk_min_ptr, logits_stride, vocab_size,
                          num_segments, num_tiles, WAYS: tl.constexpr, BLOCK_V: tl.constexpr,
                          TILES: tl.constexpr, SHARE: tl.constexpr, TILE: tl.constexpr,
                          TILE_GROUP: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """Grid (R, C): each chunk's share of its row's last pass. Top-k rows: the tokens of ``[lo, hi)``
    counted (into ``chunk_count [R, C]``) and compacted into the chunk's region (``regions [R, C,
    SHARE]``; `_pack` gathers them). Top-p rows: the second pass's masses added over the segments
    (`_segments_sum`: the same sums in every program), which, at the cuts the pass recorded
    (`_pass_cuts`), narrow its interval ``(lo, hi]`` (chunk 0
    records it; a row whose first pass left few tokens keeps that pass's, ``STATE_SKIP``), then its
    tokens counted and compacted. Rows that filter by min-p alone: the chunk's smallest logit at or
    above min-p's key into ``chunk_min [R, C]``. Where top-k or top-p filters too, the select kernel
    finds that logit among its sorted candidates or does not need it, so a tile is read only where
    its maxima reach the interval (H200, B = 64, n = 4, V = 128256, top-k 50, top-p 0.9, min-p 0.05:
    35.2 us against 42.0 where min-p's key, below the interval, also chose the tiles)."""
    after_previous_launch(PDL)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    num_chunks = tl.num_programs(1)
    state = row_state_ptr + row * STATE_FIELDS
    mode = tl.load(state + STATE_MODE)
    if mode != MODE_NONE:
        row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
        lo = tl.load(state + STATE_LO)
        hi = tl.load(state + STATE_HI)
        compacting = mode == MODE_TOP_K
        if mode == MODE_TOP_P:
            stats = row_stats_ptr + row * STATS_FIELDS
            lo = tl.load(state + STATE_TOP_P_LO)
            hi = tl.load(state + STATE_TOP_P_HI)
            mass_hi = tl.load(stats + STATS_MASS_HI)
            if tl.load(state + STATE_SKIP) == 0:
                # The counts go unused: the compaction counts the interval's tokens.
                none = tl.full([], 0, tl.int64)
                cuts = tl.load(_pass_cuts(cuts_ptr, row, 1, WAYS))
                lo, hi, mass_hi, _, _ = _narrow_top_p(
                    cuts, _segments_sum(masses_ptr, row, num_segments, WAYS), tl.zeros([WAYS], tl.int32),
                    tl.load(stats + STATS_TARGET), lo, hi, mass_hi, none, none,
                )  # fmt: skip
            if chunk == 0:
                tl.store(state + STATE_FINAL_LO, lo)
                tl.store(state + STATE_FINAL_HI, hi)
                tl.store(stats + STATS_FINAL_MASS_HI, mass_hi)
            compacting = hi - lo > 1
            # (lo, hi] as [lo + 1, hi + 1)
            lo += 1
            hi += 1
        # One pass over the chunk: the interval's tokens (none where the row compacts nothing) and, in
        # min-p rows, the smallest logit at or above min-p's key.
        lo = tl.where(compacting, lo, 0)
        hi = tl.where(compacting, hi, 0)
        kept_key = tl.where(mode == MODE_MIN_P, tl.load(state + STATE_KEPT), ABOVE_EVERY_KEY)
        smallest = _compact_chunk(
            row_ptr, tile_max_ptr + row.to(tl.int64) * num_tiles,
            regions_ptr + (row * num_chunks + chunk).to(tl.int64) * SHARE,
            chunk_count_ptr + row * num_chunks + chunk, chunk, vocab_size, num_tiles, lo.to(tl.int32),
            hi.to(tl.int32), kept_key.to(tl.int32), SHARE, BLOCK_V, TILES, TILE, TILE_GROUP, COMPACT_RUN,
        )  # fmt: skip
        tl.store(chunk_min_ptr + row * num_chunks + chunk, smallest)


@triton.jit(do_not_specialize=["kept_stride", "num_chunks", "capacity", "passes"])
def filter_select_kernel(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, row_stats_ptr, row_state_ptr,
                         candidates_ptr, regions_ptr, chunk_count_ptr, chunk_min_ptr, threshold_ptr, kept_ptr,
                         kept_stride, logits_stride, vocab_size, num_chunks, capacity, passes,
                         HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr, WAYS: tl.constexpr,
                         BLOCK_V: tl.constexpr, SCAN: tl.constexpr, CAPACITY: tl.constexpr,
                         SHARE: tl.constexpr, GROUP: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """Grid (R,): the row's threshold ``t``: top-k's ``k``-th value (`_top_k_finish`), then top-p's
    pivot (`_top_p_sorted` on top-k's candidates where they are every kept token, else
    `_top_p_finish`), then the smallest kept logit: its filters keep exactly the tokens with
    ``z >= t``.

    And the row's kept statistics, ``kept [2, R]`` (row stride ``kept_stride``): the row max (always
    kept) and the sum of ``exp((z - max) / T)`` over the kept tokens, so that the sampler need not
    read the row for them (`rejection_kernels.row_stats_kernel`). The sum is known where the
    candidates sorted here hold every kept token above what the passes summed (top-k's, and top-p's
    after its search) or every token is kept (the row's sum, where the statistics pass made it or
    top-k's test of a ``k``-th value of probability zero needed it); elsewhere (min-p alone, a search
    by passes alone, rows that filter nothing: greedy ones, those without a finite logit) it is
    `UNKNOWN_MASS`. The passes' sums are made by segments, whatever chunks read them, so a known sum
    does not depend on the batch a row rides in. The candidates' sum adds the same terms in another
    order than a pass over the row would: the two differ by float32 rounding, which moves decisions
    only at near ties."""
    after_previous_launch(PDL)
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
    cand_ptr = candidates_ptr + row.to(tl.int64) * CAPACITY
    stats = row_stats_ptr + row * STATS_FIELDS
    state = row_state_ptr + row * STATE_FIELDS
    row_max = tl.load(stats)
    row_sum = tl.load(stats + 1)
    least = tl.load(stats + 2)
    temperature = tl.load(temperature_ptr + row)
    inv_temperature = inverse_temperature(temperature)
    kept_mass = tl.full([], UNKNOWN_MASS, tl.float32)
    max_key = order_key(row_max).to(tl.int64)
    mode = tl.load(state + STATE_MODE)
    kept_key = tl.load(state + STATE_KEPT)
    lo = tl.load(state + STATE_LO)
    hi = tl.load(state + STATE_HI)
    # The tokens of the chunks' interval, counted and compacted by the chunks, gathered here.
    n = tl.full([], 0, tl.int64)
    packed = tl.full([], 0, tl.int32)
    if (mode == MODE_TOP_K) | (mode == MODE_TOP_P):
        n, packed = _pack(
            regions_ptr + row.to(tl.int64) * num_chunks * SHARE, chunk_count_ptr + row * num_chunks, cand_ptr,
            num_chunks, capacity, SHARE, GROUP,
        )  # fmt: skip
    # kept_key is a token's key (a k-th value or top-p's pivot), or min-p's key.
    at_pivot = tl.full([], 0, tl.int32)
    # Top-p's search still to make: 0 none, 1 by this program alone, 2 from the passes' interval.
    search = tl.full([], 0, tl.int32)
    if HAS_TOP_K:  # noqa: SIM102 (a constexpr condition, then a runtime one)
        if mode == MODE_TOP_K:
            k = tl.load(top_k_ptr + row).to(tl.int64)
            kth, filters, n, whole = _top_k_finish(
                row_ptr, cand_ptr, vocab_size, k, lo, hi, n, packed, capacity, passes, BLOCK_V, SCAN, WAYS,
                CAPACITY,
            )  # fmt: skip
            # A row without its sum (UNKNOWN_MASS, `_sum_wanted`) has a k-th value whose log
            # probability lies log V above zero's or more: S in [1, V] leaves the test as it is.
            kth_scaled = scaled_logit(key_value(kth.to(tl.int32)), row_max, inv_temperature)
            kth_log_p = kth_scaled - tl.log(tl.maximum(row_sum, 1.0))
            # A k-th value of probability zero ties with every zero: top-k then keeps everything kept.
            by_k = filters & (kth_log_p >= LOG_ZERO)
            kept_key = tl.where(by_k, kth, kept_key)
            at_pivot = by_k.to(tl.int32)
            top_p = tl.full([], 1.0, tl.float32)
            if HAS_TOP_P:
                top_p = tl.load(top_p_ptr + row)
            if whole & (lo <= kept_key):
                # Every kept token is a candidate: top-p's pivot, the kept mass and min-p's least kept
                # logit are read off them, in the sort's tile width, which follows n alone.
                if CAPACITY > SMALL_SORT:
                    if n <= SMALL_SORT:
                        kept_key, kept_mass, at_pivot = _kept_of_candidates(
                            cand_ptr, n, kept_key, at_pivot, top_p, max_key, row_max, inv_temperature,
                            SMALL_SORT,
                        )  # fmt: skip
                    else:
                        if CAPACITY > MID_SORT:
                            if n <= MID_SORT:
                                kept_key, kept_mass, at_pivot = _kept_of_candidates(
                                    cand_ptr, n, kept_key, at_pivot, top_p, max_key, row_max,
                                    inv_temperature, MID_SORT,
                                )  # fmt: skip
                            else:
                                kept_key, kept_mass, at_pivot = _kept_of_candidates(
                                    cand_ptr, n, kept_key, at_pivot, top_p, max_key, row_max,
                                    inv_temperature, CAPACITY,
                                )  # fmt: skip
                        else:
                            kept_key, kept_mass, at_pivot = _kept_of_candidates(
                                cand_ptr, n, kept_key, at_pivot, top_p, max_key, row_max, inv_temperature,
                                CAPACITY,
                            )  # fmt: skip
                else:
                    kept_key, kept_mass, at_pivot = _kept_of_candidates(
                        cand_ptr, n, kept_key, at_pivot, top_p, max_key, row_max, inv_temperature, CAPACITY
                    )  # fmt: skip
            else:
                if top_p < 1.0:
                    # Top-k's candidates are not every kept token: top-p searches.
                    search = tl.full([], 1, tl.int32)
                else:
                    if (at_pivot == 0) & (kept_key > NEG_INF_KEY):
                        # Min-p binds (top-k keeps every token min-p keeps): t is the smallest of
                        # them, by a pass here.
                        kept_key = _smallest_key_from(row_ptr, vocab_size, kept_key, BLOCK_V)
                        at_pivot = tl.full([], 1, tl.int32)
    if HAS_TOP_P:
        if mode == MODE_TOP_P:
            lo = tl.load(state + STATE_FINAL_LO)
            hi = tl.load(state + STATE_FINAL_HI)
            # Too many to sort: the search starts again in this program (with a pass that counts).
            search = tl.where((hi - lo > 1) & (n > capacity), 1, 2)
        if search > 0:
            top_p = tl.load(top_p_ptr + row)
            target = tl.load(stats + STATS_TARGET)
            mass_hi = tl.load(stats + STATS_FINAL_MASS_HI)
            at_lo = n
            at_hi = tl.full([], 0, tl.int64)
            compacted = (hi - lo > 1).to(tl.int32) * packed
            if search == 1:
                lo, hi, target, mass_hi, at_lo, at_hi = _top_p_first(
                    row_ptr,
                    vocab_size,
                    top_p,
                    kept_key,
                    max_key,
                    row_max,
                    least,
                    inv_temperature,
                    BLOCK_V,
                    WAYS,
                )
                compacted = tl.full([], 0, tl.int32)
            kept_key, kept_mass = _top_p_finish(
                row_ptr, cand_ptr, vocab_size, target, lo, hi, mass_hi, at_lo, at_hi, compacted, row_max,
                inv_temperature, capacity, passes, BLOCK_V, SCAN, WAYS, CAPACITY,
            )  # fmt: skip
            at_pivot = tl.full([], 1, tl.int32)
    threshold = tl.full([], NEG_INF, tl.float32)
    if (mode != MODE_NONE) & (kept_key > NEG_INF_KEY):
        smallest = key_value(kept_key.to(tl.int32))
        if mode == MODE_MIN_P:
            # Min-p's key: the smallest logit at or above it, the least of the chunks' (kept_key is
            # still the key they compared with).
            chunks = tl.arange(0, BLOCK_V)
            smallest = tl.full([], POS_INF, tl.float32)
            c = 0
            while c < num_chunks:
                part = tl.load(chunk_min_ptr + row * num_chunks + c + chunks, mask=c + chunks < num_chunks,
                               other=POS_INF)  # fmt: skip
                smallest = tl.minimum(smallest, tl.min(part, axis=0))
                c += BLOCK_V
        # The max is always kept; a threshold at the row's least logit keeps every token.
        threshold = tl.where(smallest > least, tl.minimum(smallest, row_max), NEG_INF)
    tl.store(threshold_ptr + row, threshold)
    # Every token kept: the row's own sum.
    kept_mass = tl.where(threshold == NEG_INF, row_sum, kept_mass)
    tl.store(kept_ptr + row, row_max)
    kept_mass = tl.where(filters_row(temperature, row_max), kept_mass, UNKNOWN_MASS)
    tl.store(kept_ptr + kept_stride + row, kept_mass)


# Rows of parameters `row_params_kernel` gathers a program.
PARAMS_BLOCK = 256


@triton.jit(do_not_specialize=["num_rows", "num_requests", "steps"])
def row_params_kernel(cu_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row_temperature_ptr,
                      row_top_k_ptr, row_top_p_ptr, row_min_p_ptr, num_rows, num_requests, steps,
                      EXTRA: tl.constexpr, HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr,
                      HAS_MIN_P: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """Grid (cdiv(R, BLOCK),): each row's request's temperature and sampling parameters, gathered into
    ``[R]`` vectors. Request ``b`` owns rows ``[cu[b] + EXTRA b, cu[b + 1] + EXTRA (b + 1))``
    (``EXTRA`` 1: its target rows, ``n_b + 1``; 0: its draft rows), so a row's request is the last
    whose first row is at or before it, found by ``steps`` halvings of ``[0, num_requests)``."""
    after_previous_launch(PDL)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = rows < num_rows
    lo = tl.zeros([BLOCK], tl.int32)
    hi = tl.zeros([BLOCK], tl.int32) + num_requests
    i = 0
    while i < steps:
        mid = (lo + hi) // 2
        first = tl.load(cu_ptr + mid, mask=inside, other=0) + EXTRA * mid
        at_or_before = first <= rows
        lo = tl.where(at_or_before, mid, lo)
        hi = tl.where(at_or_before, hi, mid)
        i += 1
    tl.store(row_temperature_ptr + rows, tl.load(temperature_ptr + lo, mask=inside), mask=inside)
    if HAS_TOP_K:
        tl.store(row_top_k_ptr + rows, tl.load(top_k_ptr + lo, mask=inside), mask=inside)
    if HAS_TOP_P:
        tl.store(row_top_p_ptr + rows, tl.load(top_p_ptr + lo, mask=inside), mask=inside)
    if HAS_MIN_P:
        tl.store(row_min_p_ptr + rows, tl.load(min_p_ptr + lo, mask=inside), mask=inside)


@triton.jit(do_not_specialize=["num_rows", "logits_stride", "out_stride", "vocab_size"])
def apply_threshold_kernel(logits_ptr, threshold_ptr, out_ptr, num_rows, logits_stride, out_stride,
                           vocab_size, ROWS: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Grid (cdiv(R, ROWS), cdiv(V, BLOCK_V)): ``out = logits`` where ``float32(logits) >= t`` of the row,
    else ``-inf`` (NaN included), in the logits' dtype, a ``[ROWS, BLOCK_V]`` tile a program."""
    row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    tokens = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    inside = (row < num_rows)[:, None] & (tokens < vocab_size)[None, :]
    x = tl.load(logits_ptr + row[:, None] * logits_stride + tokens[None, :], mask=inside, other=0.0)
    threshold = tl.load(threshold_ptr + row, mask=row < num_rows, other=NEG_INF)
    # The split plan's loads apply the same rule (`kept_logit`). Exact: a kept value goes back to the
    # dtype it came from.
    masked = kept_logit(x, threshold[:, None], True)
    out = out_ptr + row[:, None] * out_stride + tokens[None, :]
    tl.store(out, masked.to(out_ptr.dtype.element_ty), mask=inside)


# ---------------------------------------------------------------------------------------------
# Launch


def _fail(argument: str, problem: str) -> ValueError:
    return ValueError(f"{argument} {problem}")


def _check_vector(
    name: str, value: object, dtypes: tuple[torch.dtype, ...], device: torch.device, rows: int
) -> torch.Tensor:
    """``value``, checked: a dense ``[rows]`` tensor of ``dtypes`` on ``device``."""
    value = _check_dense(name, value, device)
    if value.dtype not in dtypes:
        expected = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise _fail(name, f"has dtype {value.dtype}; expected one of {expected}")
    if tuple(value.shape) != (rows,):
        raise _fail(name, f"has shape {tuple(value.shape)}; expected [R] = [{rows}]")
    return value


def _check_dense(name: str, value: object, device: torch.device) -> torch.Tensor:
    """``value``, checked: a dense tensor on ``device``."""
    if not isinstance(value, torch.Tensor):
        kind = "is None" if value is None else f"has type {type(value).__qualname__}"
        raise _fail(name, f"{kind}; expected a torch.Tensor")
    if value.layout != torch.strided or value.is_nested:
        raise _fail(name, f"has layout {value.layout}; expected a dense (strided) tensor")
    if value.device != device:
        raise _fail(name, f"is on device {value.device}; expected {device} (the device of logits)")
    return value


def _check_kept(kept: object, device: torch.device, rows: int) -> None:
    """``kept``, checked: a dense ``[2, R]`` fp32 tensor on ``device``, its rows contiguous."""
    kept = _check_dense("kept", kept, device)
    if kept.dtype != torch.float32:
        raise _fail("kept", f"has dtype {kept.dtype}; expected float32")
    if tuple(kept.shape) != (2, rows):
        raise _fail("kept", f"has shape {tuple(kept.shape)}; expected [2, R] = [2, {rows}]")
    if rows > 1 and kept.stride(1) != 1:
        raise _fail("kept", f"has stride {kept.stride()}; its rows must be contiguous (last stride 1)")


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


def exact_passes(ways: int) -> int:
    """Passes of ``ways`` keys that find a pivot without a sort: one by value, then enough by key to
    narrow the ``2**32`` order keys to one (each narrows ``ways``-fold)."""
    return 1 + -(-32 // (ways.bit_length() - 1))


def maxima_tile(vocab_size: int, block_v: int, max_tiles: int = MAX_TILES) -> int:
    """The width of a row's maxima tiles: the least power of two >= `MIN_TILE` that cuts the vocabulary
    into at most ``max_tiles`` tiles, at most ``block_v``."""
    return min(block_v, max(MIN_TILE, int(triton.next_power_of_2(-(-vocab_size // max_tiles)))))


# Programs the first pass aims for on a GPU, per SM: enough chunks that a few batches' rows fill it.
# Cold medians of a filtered call (H100, B = 64, n = 4, V = 128256, fp32; top-k 50, top-p 0.9, min-p
# 0.05 / top-p 0.9 alone) at 4, 8, 16, 32: 775, 688, 670, 641 / 2320, 2222, 2169, 2136 us; B = 1 is
# unchanged (109 / 188 us). Its passes are bound by loads in flight, not by the programs' count.
PROGRAMS_PER_SM = 32


def default_chunks(rows: int, segments: int, device: torch.device) -> int:
    """Chunks a row is cut into for its passes: on a GPU, enough that it has `PROGRAMS_PER_SM`
    programs per SM (`default_chunks_for`); under the interpreter (CPU tensors), one."""
    if device.type != "cuda":
        return 1
    return default_chunks_for(rows, segments, torch.cuda.get_device_properties(device).multi_processor_count)


def default_chunks_for(rows: int, segments: int, sms: int, per_sm: int = PROGRAMS_PER_SM) -> int:
    """Parts enough that ``rows`` rows have ``per_sm`` programs on each of ``sms`` SMs, at most
    ``segments`` (a chunk per segment, or a program per chunk)."""
    return max(1, min(segments, -(-per_sm * sms // rows)))


# Top-p's passes aim for this many programs an SM on a GPU: a program takes every G-th chunk of its
# row (`default_mass_programs`), so rows of other modes pay for few programs that return at once, and
# the second pass adds the first's masses once a program. H200, n = 4, V = 128256, the two launches
# (PyTorch profiler, L2 flushed) at 3 / 6 / 9 / 12 an SM: top-p 0.9 alone at B = 64 137.7 / 133.7 /
# 127.1 / 130.5 us, 153.5 with one program a chunk; at B = 16 45.7 / 41.5 / 41.1 / 42.9; top-k 50,
# top-p 0.9, min-p 0.05 at B = 64 3.2 / 3.8 / 4.4 / 5.0, 10.4 with one program a chunk.
MASS_PROGRAMS_PER_SM = 9


def default_mass_programs(rows: int, chunks: int, device: torch.device) -> int:
    """The programs of each row in top-p's passes: one a chunk (``chunks``), or on a GPU as few as
    still give `MASS_PROGRAMS_PER_SM` programs an SM."""
    if device.type != "cuda":
        return chunks
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return default_chunks_for(rows, chunks, sms, MASS_PROGRAMS_PER_SM)


def segments_of(vocab_size: int, block_v: int) -> int:
    """The segments of a row of ``vocab_size`` in tiles of ``block_v``: `SEGMENT_TILES` tiles each."""
    return -(-vocab_size // (block_v * SEGMENT_TILES))


def select_registers(rows: int, sms: int) -> dict[str, int]:
    """The select kernel's register cap for ``rows`` rows on a GPU of ``sms`` SMs, as launch options:
    `SELECT_MAX_REGISTERS` where its programs (one a row) outnumber the SMs, else none."""
    return {"maxnreg": SELECT_MAX_REGISTERS} if rows > sms else {}


def default_block_v(vocab_size: int) -> int:
    """The tile width for a vocabulary: its next power of two, within `MIN_BLOCK_V` and `MAX_BLOCK_V`."""
    return max(MIN_BLOCK_V, min(MAX_BLOCK_V, int(triton.next_power_of_2(vocab_size))))


def _launch_block_v(vocab_size: int, device: torch.device) -> int:
    """The default tile width of a launch: `default_block_v` on a GPU; under the interpreter (CPU
    tensors), up to `INTERPRETER_MAX_BLOCK_V`, which numpy handles in far fewer, cheaper steps."""
    if device.type == "cpu":
        return max(MIN_BLOCK_V, min(INTERPRETER_MAX_BLOCK_V, int(triton.next_power_of_2(vocab_size))))
    return default_block_v(vocab_size)


@dataclass(frozen=True)
class FilterPlan:
    """The launches of one call structure (`filter_thresholds`' split plan, or `row_parameters`), made
    once and cached with their compiled kernels (`kernels.launch.run_cached`), and the call's
    workspace: each buffer's ``(name, byte offset, dtype, shape)`` in ``nbytes`` bytes."""

    launches: tuple[launch.Launch, ...]
    layout: tuple[tuple[str, int, torch.dtype, tuple[int, ...]], ...] = ()
    nbytes: int = 0

    def views(self, work: torch.Tensor) -> dict[str, torch.Tensor]:
        """The workspace buffers as typed views of ``work`` (``nbytes`` of uint8), by name."""
        return {
            name: work[offset : offset + _size(dtype, shape)].view(dtype).view(shape)
            for name, offset, dtype, shape in self.layout
        }

    def addresses(self, base: int) -> dict[str, int]:
        """The workspace buffers' device addresses from the workspace's, by name."""
        return {name: base + offset for name, offset, _, _ in self.layout}


def _size(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return int(np.prod(shape)) * dtype.itemsize


# Workspace buffers start at multiples of this many bytes (Triton specialises 16-byte alignment).
BUFFER_ALIGN = 128


def _layout(
    buffers: dict[str, tuple[torch.dtype, tuple[int, ...]]],
) -> tuple[tuple[tuple[str, int, torch.dtype, tuple[int, ...]], ...], int]:
    """``buffers`` (name: dtype and shape) placed one after another, each at a multiple of
    `BUFFER_ALIGN` bytes: their ``(name, offset, dtype, shape)`` and the bytes in all."""
    layout, offset = [], 0
    for name, (dtype, shape) in buffers.items():
        layout.append((name, offset, dtype, shape))
        offset += -(-_size(dtype, shape) // BUFFER_ALIGN) * BUFFER_ALIGN
    return tuple(layout), offset


# The filters' plans by call structure, with their compiled kernels.
_plans = launch.PlanCache(64)


def _device_key(device: torch.device) -> tuple[str, int | None]:
    return (device.type, launch.current_device() if device.type == "cuda" else None)


PARAMS_BUFFERS = frozenset({
    "cu_ptr", "temperature_ptr", "top_k_ptr", "top_p_ptr", "min_p_ptr", "row_temperature_ptr",
    "row_top_k_ptr", "row_top_p_ptr", "row_min_p_ptr",
})  # fmt: skip


def row_parameters(
    cu_num_drafts: torch.Tensor,
    num_rows: int,
    extra: int,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    *,
    kernel: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Each of ``num_rows`` rows' temperature, ``top_k``, ``top_p`` and ``min_p`` (``None`` where the
    request's is), without a host synchronisation: request ``b`` owns rows ``[cu[b] + extra b, cu[b +
    1] + extra (b + 1))`` (``extra`` 1: the target rows, ``n_b + 1`` a request; 0: the draft rows).
    The tensors are a validated batch's.

    With ``kernel`` (default: on a GPU), one launch (`row_params_kernel`), planned once per structure
    and launched directly after (`kernels.launch.run_cached`): a dozen PyTorch launches fewer. Else
    PyTorch's ``repeat_interleave`` and indexing, which the interpreter's launch (12 ms) would slow."""
    device, num_requests = temperature.device, temperature.shape[0]
    params = (top_k, top_p, min_p)
    if not (device.type == "cuda" if kernel is None else kernel):
        counts = (cu_num_drafts[1:] - cu_num_drafts[:-1]).to(torch.int64) + extra
        requests = torch.arange(num_requests, device=device)
        owner = torch.repeat_interleave(requests, counts, output_size=num_rows)
        return temperature[owner], *(None if p is None else p[owner] for p in params)  # type: ignore[return-value]
    row_temperature = torch.empty(num_rows, dtype=torch.float32, device=device)
    gathered = [None if p is None else torch.empty(num_rows, dtype=p.dtype, device=device) for p in params]
    if num_rows == 0:
        return row_temperature, *gathered  # type: ignore[return-value]
    # Parameters the launch does not read get the temperature's pointer.
    tensors = dict(
        zip(("cu_ptr", "temperature_ptr", "top_k_ptr", "top_p_ptr", "min_p_ptr"),
            (cu_num_drafts, temperature, *(temperature if p is None else p for p in params)), strict=True),
        **dict(zip(("row_temperature_ptr", "row_top_k_ptr", "row_top_p_ptr", "row_min_p_ptr"),
                   (row_temperature, *(row_temperature if g is None else g for g in gathered)), strict=True)),
    )  # fmt: skip
    has = tuple(p is not None for p in params)
    key = (
        "params", _device_key(device), num_rows, num_requests, extra, has, cu_num_drafts.dtype,
        *(None if p is None else p.dtype for p in params), launch.aligned(*tensors.values()),
    )  # fmt: skip

    def make() -> FilterPlan:
        pdl = programmatic_launch(device)
        values = dict(
            num_rows=num_rows, num_requests=num_requests, steps=max(num_requests, 1).bit_length(),
            EXTRA=extra, HAS_TOP_K=has[0], HAS_TOP_P=has[1], HAS_MIN_P=has[2], BLOCK=PARAMS_BLOCK, PDL=pdl,
        )  # fmt: skip
        grid = (-(-num_rows // PARAMS_BLOCK), 1, 1)
        options = launch.pdl_options(pdl)
        return FilterPlan((launch.Launch.of(row_params_kernel, grid, values=values, options=options,
                                            buffers=PARAMS_BUFFERS),))  # fmt: skip

    def buffers(plan: FilterPlan, direct: bool) -> dict[str, object]:
        return {name: t.data_ptr() for name, t in tensors.items()} if direct else dict(tensors)

    launch.run_cached(_plans, key, make, buffers, device)
    return row_temperature, *gathered  # type: ignore[return-value]


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
    capacity: int | None = None,
    search_passes: int | None = None,
    search_ways: int | None = None,
    plan: str | None = None,
    out: torch.Tensor | None = None,
    kept: torch.Tensor | None = None,
    mass_programs: int | None = None,
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
        chunks: how many programs share each of a row's passes, each reading a chunk of whole
            segments (`SEGMENT_TILES` tiles; default `default_chunks`); the thresholds and kept sums
            do not depend on it (every float32 sum is made by segments).
        capacity: the most tokens a search sorts (default `CAPACITY`, `INTERPRETER_CAPACITY` on the
            CPU; ``0``: it never sorts, and searches by passes alone).
        search_passes, search_ways: the most passes a search makes before it sorts (default
            `SEARCH_PASSES`), and the keys a pass tries, a power of two >= 2 (default `WAYS`;
            `exact_passes` of them find the exact pivots without a sort; fewer stop short, which only
            tests ask for).
        plan: ``"split"`` (a row shared by several programs; ``chunks``, ``capacity``, the search's
            passes and ways and ``mass_programs`` shape it) or ``"rows"`` (a program takes a block of
            whole rows, `kernels.filter_rows_kernels`, in tiles ``block_v`` wide); default: ``"rows"`` for CPU
            tensors (the interpreter), else ``"split"``. Both keep the same sets up to near pivots (the
            order of float32 sums).
        out: where given, the ``[R]`` fp32 tensor (on the device of ``logits``, contiguous) that
            receives the thresholds.
        kept: where given, a ``[2, R]`` fp32 tensor (rows contiguous) that receives each row's kept
            statistics (the split plan's, `filter_select_kernel`): its max, and the sum of
            ``exp((z - max) / T)`` over its kept tokens where the search found it, else
            `UNKNOWN_MASS`. The rows plan, and a call without parameters, write `UNKNOWN_MASS` sums
            and no max.
        mass_programs: how many programs share each row's top-p passes, each taking every
            ``mass_programs``-th of its chunks (default `default_mass_programs`; at most the chunks);
            the thresholds and kept sums do not depend on it.

    Returns:
        ``[R]`` fp32 thresholds on the device of ``logits`` (``out`` where given).

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
    bad_width = not isinstance(block_v, int) or block_v < MIN_BLOCK_V or block_v & (block_v - 1)
    if block_v is not None and bad_width:
        raise _fail("block_v", f"is {block_v!r}; expected a power of two >= {MIN_BLOCK_V}")
    if plan is None:
        plan = "rows" if device.type == "cpu" else "split"
    elif plan not in FILTER_PLANS:
        raise _fail("plan", f"is {plan!r}; expected one of {', '.join(FILTER_PLANS)}")
    if plan == "rows":
        split_only = {"chunks": chunks, "capacity": capacity, "search_passes": search_passes,
                      "search_ways": search_ways, "mass_programs": mass_programs}  # fmt: skip
        for name, value in split_only.items():
            if value is not None:
                raise _fail(name, f"is {value!r}; it shapes the split plan, and the plan is 'rows'")
    if search_ways is None:
        search_ways = WAYS
    if not isinstance(search_ways, int) or search_ways < 2 or search_ways & (search_ways - 1):
        raise _fail("search_ways", f"is {search_ways!r}; expected a power of two >= 2")
    if search_passes is None:
        search_passes = SEARCH_PASSES
    if not isinstance(search_passes, int) or search_passes < 1:
        raise _fail("search_passes", f"is {search_passes!r}; expected an int >= 1")
    if capacity is None:
        capacity = INTERPRETER_CAPACITY if device.type == "cpu" else CAPACITY
    if not isinstance(capacity, int) or not 0 <= capacity <= MAX_CAPACITY:
        raise _fail("capacity", f"is {capacity!r}; expected an int in [0, {MAX_CAPACITY}]")
    if out is not None:
        _check_vector("out", out, (torch.float32,), device, rows)
        if rows > 1 and out.stride(0) != 1:
            raise _fail("out", f"has stride {out.stride()}; expected a contiguous [R] tensor")
    if kept is not None:
        _check_kept(kept, device, rows)
    if check_values or (check_values is None and device.type == "cpu"):
        _check_values(temperature, top_k, top_p, min_p)

    thresholds = torch.empty(rows, dtype=torch.float32, device=device) if out is None else out
    if rows == 0:
        return thresholds
    unfiltered = top_k is None and top_p is None and min_p is None
    if kept is not None and (unfiltered or plan == "rows"):
        kept[1].fill_(UNKNOWN_MASS.value)
    if unfiltered:
        return thresholds.fill_(float("-inf"))
    if plan == "rows":
        return _rows_thresholds(logits, temperature, top_k, top_p, min_p, thresholds, block_v)
    for name, value in (("chunks", chunks), ("mass_programs", mass_programs)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise _fail(name, f"is {value!r}; expected an int >= 1")
    has = (top_k is not None, top_p is not None, min_p is not None)
    # Parameters a launch does not read get the temperature's pointer.
    inputs = {
        "logits_ptr": logits, "temperature_ptr": temperature,
        "top_k_ptr": top_k if top_k is not None else temperature,
        "top_p_ptr": top_p if top_p is not None else temperature,
        "min_p_ptr": min_p if min_p is not None else temperature, "threshold_ptr": thresholds,
    }  # fmt: skip
    if kept is not None:
        inputs["kept_ptr"] = kept
    # Without ``kept``, the kept statistics go to the workspace (`_split_plan`), rows apart.
    kept_stride = rows if kept is None else kept.stride(0)
    key = (
        "split", _device_key(device), rows, vocab_size, logits.dtype, logits.stride(0), has,
        None if top_k is None else top_k.dtype, block_v, chunks, capacity, search_passes, search_ways,
        kept is not None, kept_stride, mass_programs, launch.aligned(*inputs.values()),
    )  # fmt: skip

    def make() -> FilterPlan:
        return _split_plan(rows, vocab_size, logits.stride(0), device, has, block_v, chunks, capacity,
                           search_passes, search_ways, kept is not None, kept_stride,
                           mass_programs)  # fmt: skip

    # The call's workspace, held until its launches are enqueued (a free after that is ordered after
    # them on the stream).
    work: list[torch.Tensor] = []

    def buffers(plan: FilterPlan, direct: bool) -> dict[str, object]:
        work.append(torch.empty(plan.nbytes, dtype=torch.uint8, device=device))
        if direct:
            addresses = {name: tensor.data_ptr() for name, tensor in inputs.items()}
            return {**addresses, **plan.addresses(work[0].data_ptr())}
        return {**inputs, **plan.views(work[0])}

    # The interpreter computes both branches of a tl.where in numpy: -inf - -inf is expected there.
    quiet = np.errstate(all="ignore") if device.type == "cpu" else contextlib.nullcontext()
    with quiet:
        launch.run_cached(_plans, key, make, buffers, device)
    return thresholds


# The split plan's kernel parameters that take a call's buffers: its inputs, its output and its
# workspace (the two top-p passes' masses by the names `_split_plan` gives them).
SPLIT_BUFFERS = frozenset({
    "logits_ptr", "temperature_ptr", "top_k_ptr", "top_p_ptr", "min_p_ptr", "threshold_ptr",
    "segment_stats_ptr", "tile_max_ptr", "tile_mass_ptr", "chunk_count_ptr", "row_stats_ptr", "row_state_ptr",
    "cuts_ptr", "first_ptr", "masses_ptr", "regions_ptr", "chunk_min_ptr", "candidates_ptr", "kept_ptr",
})  # fmt: skip


def _split_plan(
    rows: int,
    vocab_size: int,
    stride: int,
    device: torch.device,
    has: tuple[bool, bool, bool],
    block_v: int | None,
    chunks: int | None,
    capacity: int,
    search_passes: int,
    search_ways: int,
    kept_given: bool,
    kept_stride: int,
    mass_programs: int | None,
) -> FilterPlan:
    """`filter_thresholds`' split plan for a call structure: its launches, in order, and its workspace
    (which holds the kept statistics where the call gives no tensor for them: ``kept_given`` false)."""
    has_top_k, has_top_p, has_min_p = has
    if block_v is None:
        block_v = _launch_block_v(vocab_size, device)
    num_segments = segments_of(vocab_size, block_v)
    if chunks is None:
        chunks = default_chunks(rows, num_segments, device)
    segments_per_chunk = -(-num_segments // min(chunks, num_segments))
    num_chunks = -(-num_segments // segments_per_chunk)
    chunk_tiles = segments_per_chunk * SEGMENT_TILES
    tile = maxima_tile(vocab_size, block_v, INTERPRETER_MAX_TILES if device.type == "cpu" else MAX_TILES)
    num_tiles = -(-vocab_size // tile)
    # Top-p's first pass, shared by a row's chunks, tries at least FIRST_WAYS values.
    first_ways = max(search_ways, FIRST_WAYS)
    masses_shape = (rows, num_segments, first_ways) if has_top_p else (0,)
    # Top-p's passes hold a [ways, BLOCK_V] sum a program: at most MASS_TILE elements on a GPU.
    mass_block = block_v if device.type == "cpu" else min(block_v, max(MIN_BLOCK_V, MASS_TILE // first_ways))
    block_capacity = max(MIN_BLOCK_V, int(triton.next_power_of_2(max(capacity, 1))))
    searches = has_top_k or has_top_p
    # Each chunk compacts into a region of its own (`_compact_chunk`), which the row's program gathers.
    share = min(block_capacity, max(MIN_SHARE, int(triton.next_power_of_2(-(-block_capacity // num_chunks)))))
    group = max(1, min(int(triton.next_power_of_2(num_chunks)), PACK_TILE // share))
    layout, nbytes = _layout({
        "segment_stats_ptr": (torch.float32, (rows, num_segments, 3, block_v // tile)),
        "tile_max_ptr": (torch.float32, (rows, num_tiles)),
        "tile_mass_ptr": (torch.float32, (rows, num_tiles)),
        "row_stats_ptr": (torch.float32, (rows, STATS_FIELDS.value)),
        "row_state_ptr": (torch.int64, (rows, STATE_FIELDS.value)),
        "chunk_min_ptr": (torch.float32, (rows, num_chunks)),
        "masses_first": (torch.float32, masses_shape),
        "masses_second": (torch.float32, masses_shape),
        "cuts_ptr": (torch.int64, (rows, 2, first_ways) if has_top_p else (0,)),
        "candidates_ptr": (torch.int32, (rows if searches else 0, block_capacity)),
        "regions_ptr": (torch.int32, (rows if searches else 0, num_chunks * share)),
        "chunk_count_ptr": (torch.int32, (rows, num_chunks)),
        **({} if kept_given else {"kept_ptr": (torch.float32, (2, rows))}),
    })  # fmt: skip
    # A pass of masses or counts holds a [BLOCK_V, ways] tile: at most SEARCH_TILE elements on a GPU.
    search_block = (
        block_v if device.type == "cpu" else min(block_v, max(MIN_BLOCK_V, SEARCH_TILE // search_ways))
    )
    # A row's program's compaction holds a [SCAN_BLOCK] tile.
    scan_block = (
        block_v
        if device.type == "cpu"
        else max(block_v, min(SCAN_BLOCK, int(triton.next_power_of_2(vocab_size))))
    )
    grid, per_row = (rows, num_chunks, 1), (rows, 1, 1)
    pdl = programmatic_launch(device)
    dependent = launch.pdl_options(pdl)
    wide = dict(num_warps=SELECT_WARPS, **dependent)
    select_options: dict[str, object] = dict(wide)
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        select_options.update(select_registers(rows, sms))
    common = dict(vocab_size=vocab_size, PDL=pdl)

    def of(kernel: object, grid: tuple[int, int, int], options: dict[str, object],
           sources: dict[str, str] | None = None, **values: object) -> launch.Launch:  # fmt: skip
        return launch.Launch.of(kernel, grid, values={**common, **values}, options=options,
                                buffers=SPLIT_BUFFERS, sources=sources)  # fmt: skip

    launches = [
        of(filter_stats_kernel, grid, dependent, logits_stride=stride, num_tiles=num_tiles,
           num_segments=num_segments, BLOCK_V=block_v, TILE=tile, SEGMENT_TILES=SEGMENT_TILES,
           SEGMENTS=segments_per_chunk, MASSES=has_top_p, HAS_TOP_K=has_top_k),
        of(filter_start_kernel, per_row, dependent, logits_stride=stride, num_segments=num_segments,
           num_tiles=num_tiles, HAS_TOP_K=has_top_k, HAS_TOP_P=has_top_p, HAS_MIN_P=has_min_p,
           TILES=int(triton.next_power_of_2(num_tiles)), LINES=block_v // tile, WAYS=first_ways,
           BLOCK_V=block_v),
    ]  # fmt: skip
    if has_top_p:
        if mass_programs is None:
            mass_programs = default_mass_programs(rows, num_chunks, device)
        mass_grid = (rows, min(mass_programs, num_chunks), 1)
        for second in (False, True):
            masses = "masses_second" if second else "masses_first"
            launches.append(
                of(filter_mass_kernel, mass_grid, wide, {"first_ptr": "masses_first", "masses_ptr": masses},
                   logits_stride=stride, num_segments=num_segments, num_chunks=num_chunks, capacity=capacity,
                   SECOND=second,
                   WAYS=first_ways, BLOCK_V=mass_block, LINES=SEGMENT_TILES * block_v // mass_block,
                   SEGMENTS=segments_per_chunk)
            )  # fmt: skip
    launches += [
        of(filter_compact_kernel, grid, dependent, {"masses_ptr": "masses_second"}, logits_stride=stride,
           num_segments=num_segments, num_tiles=num_tiles, WAYS=first_ways, BLOCK_V=block_v,
           TILES=chunk_tiles, SHARE=share, TILE=tile,
           TILE_GROUP=min(COMPACT_GROUP, int(triton.next_power_of_2(chunk_tiles)))),
        of(filter_select_kernel, per_row, select_options, logits_stride=stride, kept_stride=kept_stride,
           num_chunks=num_chunks, capacity=capacity, passes=search_passes, HAS_TOP_K=has_top_k,
           HAS_TOP_P=has_top_p, WAYS=search_ways, BLOCK_V=search_block, SCAN=scan_block,
           CAPACITY=block_capacity, SHARE=share, GROUP=group),
    ]  # fmt: skip
    return FilterPlan(tuple(launches), layout, nbytes)


def _rows_thresholds(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    thresholds: torch.Tensor,
    block_v: int | None,
) -> torch.Tensor:
    """`filter_thresholds` by the rows plan: one program per block of rows (`filter_rows_kernel`)."""
    rows, vocab_size = logits.shape
    kind = "cpu" if logits.device.type == "cpu" else "cuda"
    if block_v is None:
        block_v = max(MIN_BLOCK_V, min(ROWS_MAX_BLOCK_V[kind], int(triton.next_power_of_2(vocab_size))))
    per_program = max(1, min(ROWS_TILE_ELEMENTS[kind] // block_v, int(triton.next_power_of_2(rows))))
    # Parameters a launch does not read get the temperature's pointer.
    quiet = np.errstate(all="ignore") if logits.device.type == "cpu" else contextlib.nullcontext()
    with quiet:
        filter_rows_kernel[(-(-rows // per_program),)](
            logits, temperature, temperature if top_k is None else top_k,
            temperature if top_p is None else top_p, temperature if min_p is None else min_p, thresholds,
            rows, logits.stride(0), vocab_size, HAS_TOP_K=top_k is not None, HAS_TOP_P=top_p is not None,
            HAS_MIN_P=min_p is not None, ROWS=per_program, BLOCK_V=block_v, ONE_TILE=vocab_size <= block_v,
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
    # A program a row on a GPU; under the interpreter, as many rows as a rows-plan tile holds.
    per_row = 1
    if logits.device.type == "cpu":
        per_row = max(1, min(ROWS_TILE_ELEMENTS["cpu"] // block_v, int(triton.next_power_of_2(rows))))
    apply_threshold_kernel[(-(-rows // per_row), -(-vocab_size // block_v))](
        logits, thresholds.to(device=logits.device, dtype=torch.float32).contiguous(), out, rows,
        logits.stride(0), out.stride(0), vocab_size, ROWS=per_row, BLOCK_V=block_v,
    )  # fmt: skip
    return out
