"""The filters' rows launch plan: each program finds the thresholds of a block of rows at once.

Only ``@triton.jit`` code lives here; `kernels.filters.filter_thresholds` launches it. The split
plan (`kernels.filters`: a row shared by several programs, a sort of the few tokens near a pivot) is
what a GPU runs; this plan is what the Triton interpreter runs, which pays per operation rather than
per element: one program holds ``ROWS`` rows as ``[ROWS, BLOCK_V]`` tiles, so a batch of thousands
of rows costs about as many operations as one row (a few hundred per vocabulary tile).

Each row's threshold follows the same rules as the split plan (`kernels.rules`: `order_key`,
`min_p_key`, `filters_row`), found by bisection over the int32 order keys instead of a sort:

1. The row's max, ``sum exp((z - max) / T)`` and least logit.
2. Min-p: its key (the kept set so far).
3. Top-k: the ``k``-th largest key, the largest key ``c`` with ``k`` tokens at or above it; it cuts
   the kept set where min-p kept at least ``k`` tokens and its probability is not zero.
4. Top-p: the least key ``c`` whose kept mass above (``sum exp((z - max) / T)`` over the kept tokens
   with a key ``> c``) is below ``top_p`` times the kept mass. Every mass is the same fixed sum of
   non-negative terms, tile by tile in token order, with zeros for the tokens above no cut: it never
   grows as its cut does, so the bisection is consistent.
5. ``t``, the smallest kept logit (``-inf`` where every token is kept).

A bisection halves an interval of keys per pass over the tiles: at most 33 passes for top-k and 33
for top-p, each a few operations per tile.
"""

from __future__ import annotations

import triton
import triton.language as tl

from specsample.kernels.rules import (
    LOG_ZERO,
    NEG_INF,
    NEG_INF_KEY,
    POS_INF,
    clean_logit,
    filters_row,
    inverse_temperature,
    key_value,
    masked_key,
    min_p_key,
    order_key,
    rescale_factor,
    scaled_logit,
    weight,
)


@triton.jit
def _tile(row_ptr, live, tile_start, vocab_size, BLOCK_V: tl.constexpr):
    """Tokens ``tile_start + [0, BLOCK_V)`` of ``[ROWS]`` rows: ``(logits [ROWS, BLOCK_V] as float32 with
    NaN as -inf, order keys with `NO_KEY` outside the vocabulary, inside the vocabulary)``."""
    tokens = tile_start + tl.arange(0, BLOCK_V)
    inside = live[:, None] & (tokens < vocab_size)[None, :]
    x = clean_logit(tl.load(row_ptr[:, None] + tokens[None, :], mask=inside, other=NEG_INF))
    return x, masked_key(x, inside), inside


@triton.jit
def _count_at_least(row_ptr, live, cut, first_keys, vocab_size, ONE_TILE: tl.constexpr,
                    BLOCK_V: tl.constexpr):  # fmt: skip
    """``[ROWS]`` how many tokens of each row have an order key ``>= cut`` (``[ROWS]`` int64); where the
    vocabulary is ``ONE_TILE``, from its keys ``first_keys``, read once."""
    if ONE_TILE:
        count = tl.sum((first_keys.to(tl.int64) >= cut[:, None]).to(tl.int64), axis=1)
    else:
        count = tl.zeros(cut.shape, tl.int64)
        tile_start = 0
        while tile_start < vocab_size:
            _, keys, _ = _tile(row_ptr, live, tile_start, vocab_size, BLOCK_V)
            count += tl.sum((keys.to(tl.int64) >= cut[:, None]).to(tl.int64), axis=1)
            tile_start += BLOCK_V
    return count


@triton.jit
def _mass_above(row_ptr, live, cut, row_max, inv_temperature, first_keys, first_weights, vocab_size,
                ONE_TILE: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """``[ROWS]`` the sum of ``exp((z - max) / T)`` over each row's tokens whose order key is ``> cut``:
    the same terms in the same order whatever the cut, zeros for the tokens not above it; where the
    vocabulary is ``ONE_TILE``, from its keys and weights, read once."""
    if ONE_TILE:
        mass = tl.sum(tl.where(first_keys.to(tl.int64) > cut[:, None], first_weights, 0.0), axis=1)
    else:
        mass = tl.zeros(row_max.shape, tl.float32)
        tile_start = 0
        while tile_start < vocab_size:
            x, keys, inside = _tile(row_ptr, live, tile_start, vocab_size, BLOCK_V)
            weights = weight(x, inside, row_max[:, None], inv_temperature[:, None])
            mass += tl.sum(tl.where(keys.to(tl.int64) > cut[:, None], weights, 0.0), axis=1)
            tile_start += BLOCK_V
    return mass


@triton.jit(do_not_specialize=["num_rows", "logits_stride", "vocab_size"])
def filter_rows_kernel(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, threshold_ptr, num_rows,
                       logits_stride, vocab_size, HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr,
                       HAS_MIN_P: tl.constexpr, ROWS: tl.constexpr, BLOCK_V: tl.constexpr,
                       ONE_TILE: tl.constexpr):  # fmt: skip
    """Grid ``(cdiv(R, ROWS),)``: the thresholds of rows ``program * ROWS + [0, ROWS)``, each the smallest
    logit its filters keep (``-inf`` where they keep every token), into ``threshold [R]`` fp32.

    Args:
        logits_ptr: ``[R, V]`` fp32/fp16/bf16 logits, row stride ``logits_stride``.
        temperature_ptr: ``[R]`` fp32; a row that is not ``> 0`` filters nothing.
        top_k_ptr, top_p_ptr, min_p_ptr: ``[R]`` int32/int64, fp32, fp32 (each read only if its
            ``HAS_*``).
        ONE_TILE: whether ``V <= BLOCK_V``: the searches then read the row's one tile once.
    """
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = row < num_rows
    row_ptr = logits_ptr + tl.where(live, row, 0).to(tl.int64) * logits_stride
    temperature = tl.load(temperature_ptr + row, mask=live, other=0.0)
    inv_temperature = inverse_temperature(temperature)
    # 1. The row's max, sum and least logit.
    row_max = tl.full([ROWS], NEG_INF, tl.float32)
    row_sum = tl.zeros([ROWS], tl.float32)
    least = tl.full([ROWS], POS_INF, tl.float32)
    tile_start = 0
    while tile_start < vocab_size:
        x, _, inside = _tile(row_ptr, live, tile_start, vocab_size, BLOCK_V)
        new_max = tl.maximum(row_max, tl.max(x, axis=1))
        weights = weight(x, inside, new_max[:, None], inv_temperature[:, None])
        row_sum = row_sum * rescale_factor(row_max, new_max, inv_temperature) + tl.sum(weights, axis=1)
        row_max = new_max
        least = tl.minimum(least, tl.min(tl.where(inside, x, POS_INF), axis=1))
        tile_start += BLOCK_V
    first_x, first_keys, first_inside = _tile(row_ptr, live, 0, vocab_size, BLOCK_V)
    first_weights = weight(first_x, first_inside, row_max[:, None], inv_temperature[:, None])
    filtering = live & filters_row(temperature, row_max)
    max_key = order_key(row_max).to(tl.int64)
    # The least key of the kept set so far: every token until a filter cuts.
    kept_key = tl.full([ROWS], NEG_INF_KEY, tl.int64)
    # 2. Min-p.
    if HAS_MIN_P:
        min_p = tl.load(min_p_ptr + row, mask=live, other=0.0)
        by_min_p = filtering & (min_p > 0.0)
        kept_key = tl.where(by_min_p, tl.minimum(min_p_key(row_max, temperature, min_p), max_key), kept_key)
    # 3. Top-k: bisect for the largest key with at least k tokens at or above it. The row's least key
    # has every token at or above it; the key past the max has none.
    if HAS_TOP_K:
        k = tl.load(top_k_ptr + row, mask=live, other=0).to(tl.int64)
        by_k = filtering & (k > 0) & (k < vocab_size)
        hi = max_key + 1
        lo = tl.where(by_k, order_key(least).to(tl.int64), max_key)
        while tl.max(hi - lo, axis=0) > 1:
            mid = lo + (hi - lo) // 2
            enough = _count_at_least(row_ptr, live, mid, first_keys, vocab_size, ONE_TILE, BLOCK_V) >= k
            lo = tl.where(enough, mid, lo)
            hi = tl.where(enough, hi, mid)
        # A k-th value of probability zero ties with every zero (the specification's float64): top-k
        # then keeps every token min-p kept, as it does where min-p kept fewer than k.
        kth_log_p = scaled_logit(key_value(lo.to(tl.int32)), row_max, inv_temperature) - tl.log(row_sum)
        by_k = by_k & (lo >= kept_key) & (kth_log_p >= LOG_ZERO)
        kept_key = tl.where(by_k, lo, kept_key)
    # 4. Top-p over the kept mass: bisect for the least key whose kept mass above is below the target.
    # The mass above the key below the kept set is the kept mass itself (at least the target); above
    # the max key it is 0 (below it, the max's weight being 1).
    if HAS_TOP_P:
        top_p = tl.load(top_p_ptr + row, mask=live, other=1.0)
        by_p = filtering & (top_p < 1.0)
        lo = kept_key - 1
        hi = tl.where(by_p, max_key, lo + 1)
        target = top_p * _mass_above(
            row_ptr, live, lo, row_max, inv_temperature, first_keys, first_weights, vocab_size, ONE_TILE,
            BLOCK_V,
        )  # fmt: skip
        while tl.max(hi - lo, axis=0) > 1:
            mid = lo + (hi - lo) // 2
            mass = _mass_above(
                row_ptr, live, mid, row_max, inv_temperature, first_keys, first_weights, vocab_size, ONE_TILE,
                BLOCK_V,
            )  # fmt: skip
            below = mass < target
            hi = tl.where(below, mid, hi)
            lo = tl.where(below, lo, mid)
        kept_key = tl.where(by_p, hi, kept_key)
    # 5. The smallest kept logit; the max is always kept, and a threshold at the least logit keeps all.
    smallest = tl.full([ROWS], POS_INF, tl.float32)
    tile_start = 0
    while tile_start < vocab_size:
        x, keys, _ = _tile(row_ptr, live, tile_start, vocab_size, BLOCK_V)
        kept = keys.to(tl.int64) >= kept_key[:, None]
        smallest = tl.minimum(smallest, tl.min(tl.where(kept, x, POS_INF), axis=1))
        tile_start += BLOCK_V
    cuts = filtering & (kept_key > NEG_INF_KEY) & (smallest > least)
    tl.store(threshold_ptr + row, tl.where(cuts, tl.minimum(smallest, row_max), NEG_INF), mask=live)
