"""Triton kernels of the rejection sampler: row statistics and decisions, the walk, final-row sampling.

Only ``@triton.jit`` code lives here; `kernels.rejection` validates, allocates and launches. One call
runs up to four launches:

1. `row_stats_kernel`, grid ``(B * num_splits, max_n + 1)``: one program per request, vocabulary
   split and position. It reads its split of the target row (and of the draft row when the
   probabilistic test needs ``q``) once: online max, sum of ``exp((x - max) / T)``, the argmax for
   greedy rows, the Gumbel-max candidate for strict rows. The last program to finish a row
   (an acquire-release counter per row) combines the splits and decides the row's draft
   (`_finish_row`); a rejection raises a per-request flag, and programs of later positions of
   that request that start after it leave at once, writing nothing (positions are the slowest
   grid dimension, so later positions are scheduled after earlier ones). The output never
   depends on a row after the first rejection, so skipping changes only the time, and no kernel
   reads such a row's records: the flag itself names the first rejection. Synthetic decisions
   read no logit, so each program makes them for the positions before its own and skips exactly.
   Block verification (`reference.block`) decides jointly: its rows record ``log p(d) / q(d)``
   and reject nothing here, so every row of a sampled request is read.
2. `block_keep_kernel` (block verification only), grid ``(B * num_splits, max_n)``: the weights
   ``w_i`` from the ratios, the residual mass ``S_i = sum max(w_i p_i - q_i, 0)`` of each row
   ``1 <= i < n`` that may be kept (a second read of it), the keep probabilities ``h_i`` and the
   decisions ``eta_i < h_i``.
3. `sample_kernel`, grid ``(B, num_splits)`` (``(B,)`` for strict): every program takes its
   request's first rejection ``j`` from the flag (block verification: ``m``, the largest kept
   index), or the bonus row, as the final row. The program of split 0 writes the accepted prefix,
   the padding and ``num_emitted``, and either the emitted token (greedy and strict rows) or the
   final row's record for the emit step. Where the final row is sampled, each program computes the
   block masses of its split under the residual ``(p - q)+`` (block verification's
   ``(w_m p - q)+``) or the target ``p``: one exponential per token, no noise, and no masks where
   the split lies inside the vocabulary (the canonical scheme, ``canonical-v3``,
   `reference.schemes`, draws a row within one block of 1024 tokens that the inverse CDF of the
   block masses picks).
4. `emit_kernel` (every method but strict), grid ``(B,)``: picks each final row's block with the
   row's 53-bit block uniform (the target law's masses where the residual has none), draws the
   Gumbel-max within it (each Philox call gives four uniforms, each word a run of 256 consecutive
   tokens of the block) and writes the emitted token.

A call's last launch (the emit step; strict's sampling pass; the tree walk) zeroes the workspace
records that its first launch needs zeroed (`_clear_zeroed`), so a workspace kept from call to call
needs no fill.

On a GPU of compute capability 9.0 or later, launches 2 to 4 are programmatically dependent
(`kernels.rejection.programmatic_launch`): the driver places a launch's programs while the one
before it finishes, and each program first waits for it (`rules.after_previous_launch`), which saves
the launch gaps (H200, B=64 n=4 V=128256: 4 us of 103).

Numbers follow `reference.law`: NaN logits count as ``-inf``; a row with ``+inf`` logits is uniform
over them; a row with no finite logit is uniform over the vocabulary. Everything is computed in
the log domain relative to the row max, ``e(x) = (x - max) / T``, so tiny temperatures do not
overflow and tiny probabilities do not underflow; a probability under ``2**-1075`` (which float64,
the specification's precision, rounds to zero) counts as zero.
"""

from __future__ import annotations

import triton
import triton.language as tl

from specsample.kernels.records import GEOMETRY, INFO_FLOAT, INFO_INT, ROW_FLOAT, ROW_INT, SPLIT
from specsample.kernels.rules import (
    ALL_ROWS,
    BLOCK,
    NEG_INF,
    NO_SPLIT,
    NOISE_GROUP,
    PROBABILISTIC,
    SAMPLE_NONE,
    SAMPLE_RESIDUAL,
    SAMPLE_WITHOUT_DRAFT,
    STRICT,
    SYNTHETIC,
    TREE,
    UNKNOWN_MASS,
    accept_uniform,
    accepts,
    after_previous_launch,
    block_keep_probability,
    block_keys,
    block_log_ratio,
    block_mass,
    block_next_log_weight,
    block_residual,
    block_uniform,
    clean_logit,
    draft_at,
    draft_row_offset,
    final_mode,
    geometry_field,
    gumbel_max,
    gumbel_noise,
    inverse_temperature,
    kept_logit,
    law_weights,
    log_prob,
    log_prob_at,
    logit_at,
    noise_tile,
    pick_block,
    request_span,
    rescale_factor,
    residual_weight,
    scaled_logit,
    synthetic_accepts,
    tree_child,
    weight,
)

# A row whose block masses (`_row_block_mass`, relative to the row's largest probability) sum below
# this is recomputed block by block, each relative to its own largest (`block_mass`).
FAST_MASS_FLOOR = tl.constexpr(2.0**-60)
# The largest log-sum of a final row's residual that the sampling pass's fast way takes (`_fast_row`).
FAST_LOG_SUM = tl.constexpr(600.0)


@triton.jit
def _record(work_ptr, geometry_ptr, field, dtype: tl.constexpr):
    """The workspace record ``field`` (a `GEOMETRY` field of a `records.WORKSPACE` record) as a
    pointer to ``dtype``.

    Args:
        work_ptr: the int32 workspace of the call.
        geometry_ptr: ``[GEOMETRY.SIZE]`` int64 geometry record; holds the record's offset in words.
    """
    # The offset is a multiple of 4 words: the record keeps the workspace's 16-byte alignment.
    # (Loaded here rather than through `geometry_field`: each device-function call costs the CPU
    # interpreter a re-patch of triton.language.)
    offset = tl.multiple_of(tl.load(geometry_ptr + field, eviction_policy="evict_last"), 4)
    return (work_ptr + offset).to(tl.pointer_type(dtype))


@triton.jit
def _clear_zeroed(work_ptr, geometry_ptr, request, width):
    """Zero the request's words of the workspace records that a call's first launch finds zeroed
    (`records.WORKSPACE`'s ``zeroed``: its rows' counters, its flag, and from request 0 the ticket).

    Only a call's last launch calls this, once every program has read what it needs: the launches
    before it have finished (`rules.after_previous_launch` waited for them), and no other program of
    this one reads the request's words. A workspace kept from call to call then starts every call
    zeroed, as a fresh one is (`kernels.rejection._resident_workspace`).
    """
    # Every read of the request's words by this program's warps is done before any warp clears them.
    tl.debug_barrier()
    counter_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.counter, tl.int32) + request.to(tl.int64) * width
    start = 0
    while start < width:
        columns = start + tl.arange(0, CLEAR_BLOCK)
        tl.store(counter_ptr + columns, 0, mask=columns < width)
        start += CLEAR_BLOCK
    tl.store(_record(work_ptr, geometry_ptr, GEOMETRY.stop_flag, tl.int32) + request, 0)
    if request == 0:
        tl.store(_record(work_ptr, geometry_ptr, GEOMETRY.ticket, tl.int32), 0)


# Row counters `_clear_zeroed` clears per store.
CLEAR_BLOCK = tl.constexpr(32)


@triton.jit
def _split_record(work_ptr, record: tl.constexpr, dtype: tl.constexpr):
    """Split record ``record`` (a `SPLIT` field) as a pointer to ``dtype``.

    A split record holds one entry per program of row_stats_kernel, so its length comes from the
    grid: only row_stats_kernel (and `_finish_row`, which it runs) may call this.

    Args:
        work_ptr: the int32 workspace of the call; the split records are at its start.
    """
    # Each record's length is rounded up to 4 words (16 bytes).
    length = (tl.num_programs(0).to(tl.int64) * tl.num_programs(1) + 3) // 4 * 4
    return (work_ptr + record * length).to(tl.pointer_type(dtype))


@triton.jit
def _split_stats(
    row_ptr,
    row_inside,
    split,
    vocab_size,
    inv_temperature,
    threshold,
    FILTERED: tl.constexpr,
    TILES_PER_SPLIT: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One pass over one split of a greedy row: ``(max, sum of exp(e), first argmax)``.

    Lanes past the vocabulary count for nothing; a row outside its tensor reads as no finite logit.

    Args:
        row_ptr: the row's first logit, fp32/fp16/bf16, ``V`` contiguous elements.
    """
    lanes = tl.arange(0, BLOCK_V)
    first = split * (TILES_PER_SPLIT * BLOCK_V)
    row_max = tl.full([], NEG_INF, tl.float32)
    row_sum = tl.full([], 0.0, tl.float32)
    row_arg = first
    for tile in range(TILES_PER_SPLIT):
        tokens = first + tile * BLOCK_V + lanes
        in_vocab = tokens < vocab_size
        x = clean_logit(
            kept_logit(
                tl.load(row_ptr + tokens, mask=in_vocab & row_inside, other=NEG_INF), threshold, FILTERED
            )
        )
        tile_max, tile_lane = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        # Strict `>`: the first maximum wins ties, as the specification's argmax does.
        row_arg = tl.where(tile_max > row_max, first + tile * BLOCK_V + tile_lane, row_arg)
        row_max, row_sum = _online_sum(x, tile_max, in_vocab, row_max, row_sum, inv_temperature)
    return row_max, row_sum, row_arg


@triton.jit
def _online_sum(x, tile_max, in_vocab, row_max, row_sum, inv_temperature):
    """The running ``(max, sum of exp(e))`` of a row after one more tile ``x`` whose max is ``tile_max``."""
    new_max = tl.maximum(row_max, tile_max)
    weights = weight(x, in_vocab, new_max, inv_temperature)
    return new_max, row_sum * rescale_factor(row_max, new_max, inv_temperature) + tl.sum(weights, axis=0)


@triton.jit
def _split_moments(
    target_row_ptr,
    target_inside,
    draft_row_ptr,
    draft_inside,
    split,
    vocab_size,
    inv_temperature,
    target_threshold,
    draft_threshold,
    FILTERED: tl.constexpr,
    PAIR: tl.constexpr,
    TILES_PER_SPLIT: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One pass over one split of a sampled target row and, if ``PAIR``, of its draft row:
    ``(target max, target sum of exp(e), draft max, draft sum)``, the draft's ``-inf`` and 0 unless
    ``PAIR``. Lanes past the vocabulary count for nothing; a row outside its tensor reads as no
    finite logit.

    A tile of both rows is loaded before either is reduced, so a program waits on memory once per
    tile rather than twice; the arithmetic of the two rows is the same, so ``p == q`` gives
    identical numbers.
    """
    lanes = tl.arange(0, BLOCK_V)
    first = split * (TILES_PER_SPLIT * BLOCK_V)
    target_max = tl.full([], NEG_INF, tl.float32)
    target_sum = tl.full([], 0.0, tl.float32)
    draft_max = tl.full([], NEG_INF, tl.float32)
    draft_sum = tl.full([], 0.0, tl.float32)
    for tile in range(TILES_PER_SPLIT):
        tokens = first + tile * BLOCK_V + lanes
        in_vocab = tokens < vocab_size
        x = tl.load(target_row_ptr + tokens, mask=in_vocab & target_inside, other=NEG_INF)
        x = clean_logit(kept_logit(x, target_threshold, FILTERED))
        if PAIR:
            y = tl.load(draft_row_ptr + tokens, mask=in_vocab & draft_inside, other=NEG_INF)
            y = clean_logit(kept_logit(y, draft_threshold, FILTERED == ALL_ROWS))
            draft_max, draft_sum = _online_sum(
                y, tl.max(y, axis=0), in_vocab, draft_max, draft_sum, inv_temperature
            )
        target_max, target_sum = _online_sum(
            x, tl.max(x, axis=0), in_vocab, target_max, target_sum, inv_temperature
        )
    return target_max, target_sum, draft_max, draft_sum


@triton.jit
def _split_sample_stats(row_ptr, row_inside, split, vocab_size, inv_temperature, seed, step, position,
                        threshold, FILTERED: tl.constexpr, SPLIT_SIZE: tl.constexpr):  # fmt: skip
    """`_split_stats` of a sampled strict row, with the split's Gumbel-max candidate, in noise groups.

    Returns ``(max, sum, candidate logit, candidate gumbel, candidate token)``. The candidate is
    kept per lane across tiles as its raw logit and noise (so a later combine recomputes its key
    against the row max) and reduced once at the end. A split is a whole number of noise groups,
    or a single split shorter than one group.
    """
    lanes = tl.arange(0, NOISE_GROUP)
    first = split * SPLIT_SIZE
    row_max = tl.full([], NEG_INF, tl.float32)
    row_sum = tl.full([], 0.0, tl.float32)
    best_logit = tl.full([NOISE_GROUP], NEG_INF, tl.float32)
    best_gumbel = tl.full([NOISE_GROUP], NEG_INF, tl.float32)
    best_token = tl.zeros([NOISE_GROUP], tl.int32) + first
    for group in range(0, SPLIT_SIZE, NOISE_GROUP):
        tokens = first + group + lanes
        in_vocab = tokens < vocab_size
        x = tl.load(row_ptr + tokens, mask=in_vocab & row_inside, other=NEG_INF)
        x = clean_logit(kept_logit(x, threshold, FILTERED))
        new_max = tl.maximum(row_max, tl.max(x, axis=0))
        scaled = scaled_logit(x, new_max, inv_temperature)
        weights = tl.where(in_vocab, tl.exp(scaled), 0.0)
        row_sum = row_sum * rescale_factor(row_max, new_max, inv_temperature) + tl.sum(weights, axis=0)
        row_max = new_max
        gumbel = gumbel_noise(noise_tile(seed, step, position, first + group))
        keys = tl.where(in_vocab, scaled + gumbel, NEG_INF)
        # Strict `>`: tiles ascend, so a lane keeps its lowest token among equal keys.
        take = keys > scaled_logit(best_logit, new_max, inv_temperature) + best_gumbel
        best_logit = tl.where(take, x, best_logit)
        best_gumbel = tl.where(take, gumbel, best_gumbel)
        best_token = tl.where(take, tokens, best_token)
    keys = scaled_logit(best_logit, row_max, inv_temperature) + best_gumbel
    top = tl.max(keys, axis=0)
    cand_token, lane = tl.min(
        tl.where(keys == top, best_token, NO_SPLIT),
        axis=0,
        return_indices=True,
        return_indices_tie_break_left=True,
    )
    picked = lanes == lane
    cand_logit = tl.sum(tl.where(picked, best_logit, 0.0), axis=0)
    cand_gumbel = tl.sum(tl.where(picked, best_gumbel, 0.0), axis=0)
    return row_max, row_sum, cand_logit, cand_gumbel, cand_token


# Counts that change from call to call are not specialised on, so each layout compiles once.
@triton.jit
def row_stats_kernel(
    target_ptr,
    draft_ptr,
    draft_ids_ptr,
    cu_ptr,
    temperature_ptr,
    seed_ptr,
    step_ptr,
    draft_slot_ptr,
    rates_ptr,
    threshold_ptr,
    work_ptr,
    geometry_ptr,
    target_stride,
    draft_stride,
    slot_stride,
    vocab_size,
    METHOD: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    SLOTTED: tl.constexpr,
    FILTERED: tl.constexpr,
    TILES_PER_SPLIT: tl.constexpr,
    BLOCK_V: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,
    POS_BLOCK: tl.constexpr,
):
    """Per-split statistics of the target rows (and draft rows) up to each request's first rejection.

    The last program to finish a row combines its splits and decides it (`_finish_row`). A program
    whose row lies after a rejection already decided leaves at once: it writes nothing and does
    not count in, so that row is never finished. A request never needs a row after its first
    rejection, and every row up to it is read and decided, so only the time depends on what was
    skipped, never the output; `sample_kernel` takes the first rejection from the flag, not from
    the rows.

    A tree (method tree) of more than `TREE_EVERY_ROW_MAX` rows reads only the rows of its paths
    (a smaller one reads every row): each program takes its row by ticket (in the order programs
    start, rows in grid order), and a node's row waits until its parent's row is decided or known
    to lie off the path (`_tree_row_needed`); it is read only where its node is the first child
    holding the parent row's token. A program waits only on rows taken before it, whose programs
    have started, so the wait ends (under the interpreter, which runs programs one after another,
    it never starts).

    Args:
        target_ptr: ``[R, V]`` fp32/fp16/bf16 target logits, row stride ``target_stride``.
        draft_ptr: ``[D, V]`` or ``[S, K, V]`` draft logits (unused unless ``HAS_DRAFT``).
        draft_ids_ptr: ``[D]`` int64 draft token ids.
        cu_ptr: ``[B + 1]`` int32 prefix sums of the draft counts.
        temperature_ptr: ``[B]`` fp32.
        seed_ptr: ``[B]`` int64.
        step_ptr: ``[B]`` int64.
        draft_slot_ptr: ``[B]`` int32/int64 slots (unused unless ``SLOTTED``).
        rates_ptr: ``[num_rates]`` fp64 synthetic conditional acceptance rates (synthetic only);
            for a tree, ``[D]`` int32/int64 each node's parent within its request.
        threshold_ptr: where ``FILTERED``, fp32 thresholds: each target row's kept set is its logits
            at or above its threshold (`kernels.filters.filter_thresholds`; ``-inf``: every one), read
            as the masked rows would be; ``[R]``, and with ``FILTERED == ALL_ROWS`` (``draft_filter``)
            the draft rows' after them, ``[R + D]`` or ``[R + S * K]``.
        work_ptr: the call's int32 workspace. This kernel writes the split records at its start
            (``SPLIT_*``), each ``[B * (max_n + 1) * num_splits]``: target max and sum (fp32) and
            first argmax (int32); draft max and sum (fp32, probabilistic); the Gumbel-max
            candidate's logit and noise (fp32) and token (int32) (strict). Zero at launch:
            ``GEOMETRY.counter``, ``[B * (max_n + 1)]`` int32, the splits finished per row, and
            ``GEOMETRY.stop_flag``, ``[B]`` int32, ``max_n + 1 - j`` for the earliest rejected position
            ``j`` of each request decided so far. `_finish_row` writes the ``GEOMETRY.row_float`` and
            ``GEOMETRY.row_int`` records.
        geometry_ptr: ``[GEOMETRY.SIZE]`` int64: the row and id counts that bound reads, and
            the offsets of the records after the split records.
    """
    # Grid (B * num_splits, max_n + 1): program (request * num_splits + split, i) reads split
    # `split` of row i. Positions are the slowest grid dimension, so a row is scheduled after the
    # rows before it; by then the request's earlier rows are often decided, and a row after a
    # rejection is skipped. (Launching position 0 alone first skipped more rows but cost more in
    # launch tails: kernels/RESULTS.md.)
    if METHOD == TREE:
        ticket = tl.atomic_add(_record(work_ptr, geometry_ptr, GEOMETRY.ticket, tl.int32), 1, sem="relaxed")
        program = ticket % tl.num_programs(0)
        position = ticket // tl.num_programs(0)
    else:
        program = tl.program_id(0)
        position = tl.program_id(1)
    # A split is TILES_PER_SPLIT tiles (`make_plan`); the grid has a position for each row.
    num_splits = tl.cdiv(vocab_size, TILES_PER_SPLIT * BLOCK_V)
    request = program // num_splits
    split = program % num_splits
    width = tl.num_programs(1)
    max_num_drafts = width - 1
    # The geometry loads go out with the request's first loads, ahead of the logits (a load
    # cannot pass a store that may alias it).
    num_target_rows = geometry_field(geometry_ptr, GEOMETRY.num_target_rows)
    stop_flag_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.stop_flag, tl.int32)
    counter_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.counter, tl.int32)
    if METHOD == SYNTHETIC:
        num_draft_ids = geometry_field(geometry_ptr, GEOMETRY.num_draft_ids)
        num_rates = geometry_field(geometry_ptr, GEOMETRY.num_rates)
    draft_start, num_drafts = request_span(cu_ptr, request, max_num_drafts)
    # The request's scalars and its rejection flag go out with its span, ahead of every branch.
    temperature = tl.load(temperature_ptr + request)
    seed = tl.load(seed_ptr + request)
    step = tl.load(step_ptr + request)
    if METHOD != SYNTHETIC:
        stop_flag = tl.load(stop_flag_ptr + request, volatile=True)
    if position <= num_drafts:
        # Is the row still needed? Synthetic decisions read no logit, so each program makes them;
        # the others learn of a rejection from the program that decided it.
        if METHOD == SYNTHETIC:
            needed = position >= 0
            chunk = 0
            while needed & (chunk < position):
                earlier = chunk + tl.arange(0, POS_BLOCK)
                accepted = synthetic_accepts(
                    draft_ids_ptr, rates_ptr, draft_start, earlier, num_drafts, num_draft_ids,
                    num_rates, seed, step, vocab_size,
                )  # fmt: skip
                needed = tl.min(tl.where(earlier < position, accepted.to(tl.int32), 1), axis=0) > 0
                chunk += POS_BLOCK
        elif METHOD == TREE:
            # A small batch reads every row at once (a path's rows one after another cost more than
            # they save); a larger one reads only its paths' rows.
            needed = position >= 0
            if (tl.num_programs(0) // num_splits) * tl.num_programs(1) > TREE_EVERY_ROW_MAX:
                needed = _tree_row_needed(
                    draft_ids_ptr, rates_ptr, work_ptr, geometry_ptr, counter_ptr, request, position,
                    draft_start, num_drafts, width, num_splits, vocab_size, POS_BLOCK,
                )  # fmt: skip
        else:
            needed = stop_flag <= width - position
        # A row after a rejection is not needed: its program leaves at once, writing nothing and
        # not counting in, so the row is never finished, and nothing reads it.
        if needed:
            _split_program(
                target_ptr, draft_ptr, draft_ids_ptr, draft_slot_ptr, rates_ptr, threshold_ptr, work_ptr,
                geometry_ptr, counter_ptr, num_target_rows, request, split,
                position, draft_start, num_drafts, temperature, seed, step, target_stride, draft_stride,
                slot_stride, vocab_size, width, num_splits, METHOD, HAS_DRAFT, SLOTTED, FILTERED,
                TILES_PER_SPLIT, BLOCK_V, SPLIT_BLOCK,
            )  # fmt: skip


@triton.jit
def _split_program(
    target_ptr, draft_ptr, draft_ids_ptr, draft_slot_ptr, rates_ptr, threshold_ptr, work_ptr,
    geometry_ptr, counter_ptr, num_target_rows, request, split, position, draft_start, num_drafts,
    temperature, seed, step, target_stride, draft_stride, slot_stride, vocab_size, width, num_splits,
    METHOD: tl.constexpr, HAS_DRAFT: tl.constexpr, SLOTTED: tl.constexpr, FILTERED: tl.constexpr,
    TILES_PER_SPLIT: tl.constexpr, BLOCK_V: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
):  # fmt: skip
    """A needed split of row_stats_kernel: its statistics and split records; the row's last split
    finishes the row (`_finish_row`)."""
    sampled = temperature > 0.0
    inv_temperature = inverse_temperature(temperature)
    target_row = draft_start + request + position
    target_inside = target_row < num_target_rows
    target_row_ptr = target_ptr + tl.where(target_inside, target_row, 0) * target_stride
    row = request.to(tl.int64) * width + position
    out = row * num_splits + split
    target_threshold = tl.full([], NEG_INF, tl.float32)
    draft_threshold = tl.full([], NEG_INF, tl.float32)
    # A sampled filtered row whose kept statistics the filters found is not read (strict rows draw
    # their sample in this pass, so they read theirs): split 0 takes the statistics, the others
    # count for nothing.
    KEPT: tl.constexpr = FILTERED > 0 and METHOD != STRICT and METHOD != TREE
    known = tl.full([], 0, tl.int1)
    draft_known = tl.full([], 0, tl.int1)
    kept_max = tl.full([], NEG_INF, tl.float32)
    kept_sum = tl.full([], 0.0, tl.float32)
    draft_kept_max = tl.full([], NEG_INF, tl.float32)
    draft_kept_sum = tl.full([], 0.0, tl.float32)
    if FILTERED:
        target_threshold = tl.load(threshold_ptr + target_row, mask=target_inside, other=NEG_INF)
        # The thresholds buffer: the target rows' thresholds, then with draft_filter the draft
        # rows', then the rows' kept max, then their kept sum, each part N rows (their count rounded
        # up to a multiple of 4: `kernels.rejection.kept_stride`).
        num_thresholds = num_target_rows
        if FILTERED == ALL_ROWS:
            draft_rows = geometry_field(geometry_ptr, GEOMETRY.num_draft_rows)
            if SLOTTED:
                draft_rows *= geometry_field(geometry_ptr, GEOMETRY.slot_capacity)
            num_thresholds += draft_rows
        num_thresholds = (num_thresholds + 3) // 4 * 4
        if KEPT:
            kept_at = threshold_ptr + num_thresholds + target_row
            kept_sum = tl.load(kept_at + num_thresholds, mask=target_inside & sampled, other=UNKNOWN_MASS)
            kept_max = tl.load(kept_at, mask=target_inside & sampled, other=NEG_INF)
            known = kept_sum >= 0.0
    first = split * (TILES_PER_SPLIT * BLOCK_V)
    row_max = tl.full([], NEG_INF, tl.float32)
    row_sum = tl.full([], 0.0, tl.float32)
    row_arg = first
    cand_logit = tl.full([], NEG_INF, tl.float32)
    cand_gumbel = tl.full([], NEG_INF, tl.float32)
    cand_token = first
    draft_max = tl.full([], NEG_INF, tl.float32)
    draft_sum = tl.full([], 0.0, tl.float32)
    # The draft row of a sampled position is read with the target row, a tile of each loaded
    # together (`_split_moments`); its id only says afterwards whether ``q`` is needed (a
    # placeholder rejects outright), so the id's load is not on the path to the rows.
    PAIRED: tl.constexpr = (METHOD == PROBABILISTIC or METHOD == BLOCK) and HAS_DRAFT  # noqa: SIM109
    if PAIRED:
        num_draft_ids = geometry_field(geometry_ptr, GEOMETRY.num_draft_ids)
        num_draft_rows = geometry_field(geometry_ptr, GEOMETRY.num_draft_rows)
        slot_capacity = geometry_field(geometry_ptr, GEOMETRY.slot_capacity)
        is_draft, draft_id, real = draft_at(
            draft_ids_ptr, draft_start, position, num_drafts, num_draft_ids, vocab_size
        )
        draft_offset = draft_row_offset(
            request, draft_start, position, draft_slot_ptr, num_draft_rows, slot_capacity, draft_stride,
            slot_stride, SLOTTED,
        )  # fmt: skip
        if FILTERED == ALL_ROWS:
            # The draft row's index: its offset in rows (slots of K rows); its threshold follows
            # the target rows'.
            draft_index = draft_row_offset(
                request, draft_start, position, draft_slot_ptr, num_draft_rows, slot_capacity, 1,
                slot_capacity, SLOTTED,
            )  # fmt: skip
            draft_threshold = tl.load(
                threshold_ptr + num_target_rows + tl.maximum(draft_index, 0),
                mask=draft_index >= 0,
                other=NEG_INF,
            )
            if KEPT:
                draft_kept_at = threshold_ptr + num_thresholds + num_target_rows + tl.maximum(draft_index, 0)
                draft_kept_sum = tl.load(
                    draft_kept_at + num_thresholds, mask=(draft_index >= 0) & sampled, other=UNKNOWN_MASS
                )
                draft_kept_max = tl.load(draft_kept_at, mask=(draft_index >= 0) & sampled, other=NEG_INF)
                draft_known = draft_kept_sum >= 0.0
        reads_q = sampled & is_draft
        # The logits at the draft id go out with the row's first tiles: the program that finishes the
        # row then waits on the split records alone before it decides (`_finish_row`).
        target_at_draft = logit_at(target_row_ptr, target_inside & real, draft_id, vocab_size)
        draft_inside = (draft_offset >= 0) & real & sampled
        draft_at_draft = logit_at(draft_ptr + tl.maximum(draft_offset, 0), draft_inside, draft_id, vocab_size)
    else:
        reads_q = position < 0
        draft_offset = tl.full([], -1, tl.int64)
        target_at_draft = tl.full([], NEG_INF, tl.float32)
        draft_at_draft = tl.full([], NEG_INF, tl.float32)
    if METHOD == STRICT or METHOD == TREE:  # noqa: SIM109 (constexprs): every row draws its sample
        if sampled:
            row_max, row_sum, cand_logit, cand_gumbel, cand_token = _split_sample_stats(
                target_row_ptr, target_inside, split, vocab_size, inv_temperature, seed, step, position,
                target_threshold, FILTERED, TILES_PER_SPLIT * BLOCK_V,
            )  # fmt: skip
        else:
            row_max, row_sum, row_arg = _split_stats(
                target_row_ptr, target_inside, split, vocab_size, inv_temperature, target_threshold, FILTERED,
                TILES_PER_SPLIT, BLOCK_V,
            )  # fmt: skip
    elif reads_q:
        # Without KEPT, known and draft_known are constant false: only the first branch is compiled.
        draft_row_ptr = draft_ptr + tl.maximum(draft_offset, 0)
        if (known == 0) & (draft_known == 0):
            row_max, row_sum, draft_max, draft_sum = _split_moments(
                target_row_ptr, target_inside, draft_row_ptr, draft_offset >= 0, split, vocab_size,
                inv_temperature, target_threshold, draft_threshold, FILTERED, True, TILES_PER_SPLIT, BLOCK_V,
            )  # fmt: skip
        elif draft_known == 0:
            # The draft row alone, through its threshold (-inf without draft_filter: every logit
            # kept, as the paired read takes them).
            draft_max, draft_sum, _, _ = _split_moments(
                draft_row_ptr, draft_offset >= 0, draft_row_ptr, False, split, vocab_size, inv_temperature,
                draft_threshold, draft_threshold, FILTERED, False, TILES_PER_SPLIT, BLOCK_V,
            )  # fmt: skip
        elif known == 0:
            row_max, row_sum, _, _ = _split_moments(
                target_row_ptr, target_inside, target_row_ptr, False, split, vocab_size, inv_temperature,
                target_threshold, draft_threshold, FILTERED, False, TILES_PER_SPLIT, BLOCK_V,
            )  # fmt: skip
    elif sampled:
        # Only greedy rows compare drafts with the argmax; sampled rows skip it.
        if known == 0:
            row_max, row_sum, _, _ = _split_moments(
                target_row_ptr, target_inside, target_row_ptr, False, split, vocab_size, inv_temperature,
                target_threshold, draft_threshold, FILTERED, False, TILES_PER_SPLIT, BLOCK_V,
            )  # fmt: skip
    else:
        row_max, row_sum, row_arg = _split_stats(
            target_row_ptr, target_inside, split, vocab_size, inv_temperature, target_threshold, FILTERED,
            TILES_PER_SPLIT, BLOCK_V,
        )  # fmt: skip
    if KEPT:
        first_split = split == 0
        row_max = tl.where(known, tl.where(first_split, kept_max, NEG_INF), row_max)
        row_sum = tl.where(known, tl.where(first_split, kept_sum, 0.0), row_sum)
        draft_max = tl.where(draft_known, tl.where(first_split, draft_kept_max, NEG_INF), draft_max)
        draft_sum = tl.where(draft_known, tl.where(first_split, draft_kept_sum, 0.0), draft_sum)
    if METHOD == STRICT or METHOD == TREE:  # noqa: SIM109 (constexprs)
        tl.store(_split_record(work_ptr, SPLIT.cand_logit, tl.float32) + out, cand_logit)
        tl.store(_split_record(work_ptr, SPLIT.cand_gumbel, tl.float32) + out, cand_gumbel)
        tl.store(_split_record(work_ptr, SPLIT.cand_token, tl.int32) + out, cand_token)
    tl.store(_split_record(work_ptr, SPLIT.target_max, tl.float32) + out, row_max)
    tl.store(_split_record(work_ptr, SPLIT.target_sum, tl.float32) + out, row_sum)
    tl.store(_split_record(work_ptr, SPLIT.target_arg, tl.int32) + out, row_arg)
    if PAIRED:  # noqa: SIM102 (a constexpr: the branch is compiled only where drafts are read)
        # `_finish_row` reads q's records only where a real draft meets a sampled row.
        if reads_q & (draft_id >= 0) & (draft_id < vocab_size):
            tl.store(_split_record(work_ptr, SPLIT.draft_max, tl.float32) + out, draft_max)
            tl.store(_split_record(work_ptr, SPLIT.draft_sum, tl.float32) + out, draft_sum)
    # Publish the records, then count this split in; the last split of the row finishes it.
    tl.debug_barrier()
    finished = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
    if finished == num_splits - 1:
        _finish_row(
            target_row_ptr, target_inside, draft_ptr, draft_ids_ptr, draft_slot_ptr, rates_ptr, work_ptr,
            geometry_ptr, request, position, row, draft_start, num_drafts, temperature, inv_temperature, seed,
            step, draft_stride, slot_stride, vocab_size, width, num_splits, target_threshold, draft_threshold,
            (target_at_draft, draft_at_draft), METHOD, HAS_DRAFT, SLOTTED, FILTERED, SPLIT_BLOCK, PAIRED,
        )  # fmt: skip
        if METHOD == TREE:
            # The row's records are written: its children's rows may read its token.
            tl.debug_barrier()
            tl.atomic_add(counter_ptr + row, 1, sem="release", scope="gpu")


# A tree's row off the path: its split counter holds this (a decided row's holds num_splits + 1).
TREE_SKIPPED = tl.constexpr(-1)
# A tree batch of at most this many rows (B * (max_n + 1)) reads every row; a larger one only the rows
# of its paths (`_tree_row_needed`). On an H100 (V = 128256, fp32, EAGLE-2-like trees of 16, 32 and 64
# nodes, B = 1 to 16, T = 1 and 0) every row cost less in the 6 calls of up to 34 rows, and the paths
# less in 19 of the 24 of 65 rows or more (benchmarks/RESULTS.md, "Tree verification on an H100").
TREE_EVERY_ROW_MAX = tl.constexpr(64)


@triton.jit
def _tree_row_needed(draft_ids_ptr, tree_parent_ptr, work_ptr, geometry_ptr, counter_ptr, request,
                     position, draft_start, num_drafts, width, num_splits, vocab_size,
                     NODE_BLOCK: tl.constexpr):  # fmt: skip
    """Whether row ``position`` of a tree request lies on the request's path (`reference.tree`).

    The root's row (0) always does. Node ``i``'s row (``i + 1``) does when its parent's row does and
    was decided with the token of node ``i``, and no sibling before it holds that token (the walk
    takes the first). Waits for the parent's row: its split counter is ``num_splits + 1`` once
    decided, `TREE_SKIPPED` once known to lie off the path; a row found off the path stores
    `TREE_SKIPPED` in its own. A parent outside ``[-1, i)`` (unchecked input) is no parent: the row
    lies off the path.
    """
    if position == 0:
        needed = position == 0
    else:
        num_draft_ids = geometry_field(geometry_ptr, GEOMETRY.num_draft_ids)
        node = position - 1
        is_node, node_id, real = draft_at(
            draft_ids_ptr, draft_start, node, num_drafts, num_draft_ids, vocab_size
        )
        parent = tl.load(
            tree_parent_ptr + draft_start + node, mask=draft_start + node < num_draft_ids, other=-2
        ).to(tl.int64)
        needed = is_node & real & (parent >= -1) & (parent < node)
        if needed:
            parent_row = request.to(tl.int64) * width + tl.maximum(parent, -1) + 1
            state = tl.load(counter_ptr + parent_row, volatile=True)
            while (state >= 0) & (state <= num_splits):
                state = tl.load(counter_ptr + parent_row, volatile=True)
            # Acquire: the parent row's records, written before its counter's release, are seen.
            state = tl.atomic_add(counter_ptr + parent_row, 0, sem="acquire", scope="gpu")
            needed = state > num_splits
            if needed:
                row_int_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.row_int, tl.int32)
                token = tl.load(row_int_ptr + parent_row * ROW_INT.SIZE + ROW_INT.token, cache_modifier=".cg")
                needed = node_id == token
                start = 0
                while needed & (start < node):
                    earlier = start + tl.arange(0, NODE_BLOCK)
                    are_nodes, ids, holds = draft_at(
                        draft_ids_ptr, draft_start, earlier, num_drafts, num_draft_ids, vocab_size
                    )
                    parents = tl.load(
                        tree_parent_ptr + draft_start + earlier,
                        mask=(earlier < node) & (draft_start + earlier < num_draft_ids),
                        other=-2,
                    ).to(tl.int64)
                    earlier_child = are_nodes & holds & (earlier < node)
                    needed = (
                        tree_child(earlier, ids, parents, earlier_child, parent, token, node, 0, False)
                        == node
                    )
                    start += NODE_BLOCK
        if not needed:
            tl.store(counter_ptr + request.to(tl.int64) * width + position, TREE_SKIPPED)
    return needed


@triton.jit
def _combine_splits(max_ptr, sum_ptr, records, mask, inv_temperature, num_splits, SPLIT_BLOCK: tl.constexpr):
    """The row max and ``log`` of the row sum from per-split records ``[..., SPLIT_BLOCK]``.

    ``records`` holds the record index of each row's first split, shaped ``[P, 1]``; ``mask`` the
    rows to read, ``[P, 1]``. Returns ``[P]`` maxima, ``[P]`` log-sums and the ``[P, SPLIT_BLOCK]``
    split maxima. Splits combine in a fixed order, so a row's statistics never depend on the batch.
    The records were written by other programs of the same launch: the loads bypass L1 (``.cg``).

    Args:
        max_ptr, sum_ptr: ``[rows * num_splits]`` fp32 per-split maxima and sums of `row_stats_kernel`.
    """
    splits = tl.arange(0, SPLIT_BLOCK)[None, :]
    split_mask = mask & (splits < num_splits)
    split_max = tl.load(max_ptr + records + splits, mask=split_mask, other=NEG_INF, cache_modifier=".cg")
    split_sum = tl.load(sum_ptr + records + splits, mask=split_mask, other=0.0, cache_modifier=".cg")
    row_max = tl.max(split_max, axis=1)
    row_sum = tl.sum(split_sum * rescale_factor(split_max, row_max[:, None], inv_temperature), axis=1)
    return row_max, tl.log(row_sum), split_max


@triton.jit
def _row_argmax(arg_ptr, records, mask, split_max, row_max, num_splits, SPLIT_BLOCK: tl.constexpr):
    """The first argmax of each row: the lowest token among the splits that hold the row max.

    Args:
        arg_ptr: ``[rows * num_splits]`` int32 per-split first argmax of `row_stats_kernel`.
    """
    splits = tl.arange(0, SPLIT_BLOCK)[None, :]
    holds_max = mask & (splits < num_splits) & (split_max == row_max[:, None])
    split_arg = tl.load(arg_ptr + records + splits, mask=holds_max, other=NO_SPLIT, cache_modifier=".cg")
    return tl.min(split_arg, axis=1)


@triton.jit
def _strict_sample(
    logit_ptr, gumbel_ptr, token_ptr, records, mask, row_max, inv_temperature, num_splits,
    SPLIT_BLOCK: tl.constexpr,
):  # fmt: skip
    """The Gumbel-max target sample of each row from its split candidates, ties to the lowest token.

    Args:
        logit_ptr, gumbel_ptr: ``[rows * num_splits]`` fp32 candidate logits and noise.
        token_ptr: ``[rows * num_splits]`` int32 candidate tokens.
    """
    splits = tl.arange(0, SPLIT_BLOCK)[None, :]
    split_mask = mask & (splits < num_splits)
    logit = tl.load(logit_ptr + records + splits, mask=split_mask, other=NEG_INF, cache_modifier=".cg")
    gumbel = tl.load(gumbel_ptr + records + splits, mask=split_mask, other=NEG_INF, cache_modifier=".cg")
    token = tl.load(token_ptr + records + splits, mask=split_mask, other=0, cache_modifier=".cg")
    keys = tl.where(split_mask, scaled_logit(logit, row_max[:, None], inv_temperature) + gumbel, NEG_INF)
    best = tl.argmax(keys, axis=1, tie_break_left=True)
    return tl.sum(tl.where(splits == best[:, None], token, 0), axis=1)


@triton.jit
def _finish_row(
    target_row_ptr, target_inside, draft_ptr, draft_ids_ptr, draft_slot_ptr, rates_ptr, work_ptr,
    geometry_ptr, request, position, row, draft_start, num_drafts, temperature, inv_temperature,
    seed, step, draft_stride, slot_stride, vocab_size, width, num_splits, target_threshold, draft_threshold,
    at_draft, METHOD: tl.constexpr, HAS_DRAFT: tl.constexpr, SLOTTED: tl.constexpr, FILTERED: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, PRELOADED: tl.constexpr,
):  # fmt: skip
    """Combine the split records of one row, decide its draft, and write the row's record.

    Run by the last program to finish the row. Every decision is made here and only here, so
    sample_kernel and the skipping programs can never disagree about it. A rejection is published
    in the workspace's ``GEOMETRY.stop_flag`` record so later rows of the request can be skipped.

    Args:
        target_row_ptr: the row's first target logit (read at the draft id and the row token).
        work_ptr: the int32 workspace: the row's split records are read, its ``GEOMETRY.row_float``
            ``[B * (max_n + 1), ROW_FLOAT.SIZE]`` fp32 and ``GEOMETRY.row_int`` ``[B * (max_n + 1),
            ROW_INT.SIZE]`` int32 records written.
        at_draft: where ``PRELOADED`` (the paired read of probabilistic and block rows), the target and
            draft logits at the draft id as `_split_program` loaded them (``-inf`` where the id is a
            placeholder, a row lies outside its tensor, or the draft's is not needed); else unread.
        The other pointers are row_stats_kernel's.
    """
    # Every geometry load at once, ahead of the chain of loads, reductions and stores below.
    row_float_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.row_float, tl.float32)
    row_int_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.row_int, tl.int32)
    stop_flag_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.stop_flag, tl.int32)
    num_draft_ids = geometry_field(geometry_ptr, GEOMETRY.num_draft_ids)
    num_draft_rows = geometry_field(geometry_ptr, GEOMETRY.num_draft_rows)
    slot_capacity = geometry_field(geometry_ptr, GEOMETRY.slot_capacity)
    num_rates = geometry_field(geometry_ptr, GEOMETRY.num_rates)
    records = tl.full([1, 1], 0, tl.int64) + row * num_splits
    every = tl.full([1, 1], 1, tl.int1)
    row_max, log_sum, split_max = _combine_splits(
        _split_record(work_ptr, SPLIT.target_max, tl.float32),
        _split_record(work_ptr, SPLIT.target_sum, tl.float32),
        records, every, inv_temperature, num_splits, SPLIT_BLOCK,
    )  # fmt: skip
    target_arg_ptr = _split_record(work_ptr, SPLIT.target_arg, tl.int32)
    token = _row_argmax(target_arg_ptr, records, every, split_max, row_max, num_splits, SPLIT_BLOCK)
    if METHOD == STRICT or METHOD == TREE:  # noqa: SIM109 (constexprs)
        every_sampled = (tl.zeros([1, 1], tl.float32) + temperature) > 0.0
        sample = _strict_sample(
            _split_record(work_ptr, SPLIT.cand_logit, tl.float32),
            _split_record(work_ptr, SPLIT.cand_gumbel, tl.float32),
            _split_record(work_ptr, SPLIT.cand_token, tl.int32),
            records, every_sampled, row_max, inv_temperature, num_splits, SPLIT_BLOCK,
        )  # fmt: skip
        token = tl.where(temperature > 0.0, sample, token)
    token = tl.sum(token, axis=0)
    row_max = tl.sum(row_max, axis=0)
    log_sum = tl.sum(log_sum, axis=0)
    sampled = temperature > 0.0
    is_draft, draft_id, real = draft_at(
        draft_ids_ptr, draft_start, position, num_drafts, num_draft_ids, vocab_size
    )
    if PRELOADED:
        target_logit = kept_logit(at_draft[0], target_threshold, FILTERED)
        log_p = log_prob(target_logit, row_max, log_sum, inv_temperature)
    else:
        log_p = log_prob_at(
            target_row_ptr, target_inside & real, draft_id, row_max, log_sum, inv_temperature, vocab_size,
            target_threshold, FILTERED,
        )  # fmt: skip
    token_log_p = log_prob_at(
        target_row_ptr, target_inside, token, row_max, log_sum, inv_temperature, vocab_size, target_threshold,
        FILTERED,
    )  # fmt: skip
    draft_max = tl.full([], NEG_INF, tl.float32)
    draft_log_sum = tl.full([], 0.0, tl.float32)
    if METHOD == SYNTHETIC:
        accept = synthetic_accepts(
            draft_ids_ptr, rates_ptr, draft_start, position, num_drafts, num_draft_ids, num_rates,
            seed, step, vocab_size,
        )  # fmt: skip
    else:
        greedy_accept = real & (draft_id == token)
        if METHOD == STRICT or METHOD == TREE:  # noqa: SIM109 (constexprs)
            # The row token of a sampled strict row is its target sample: the same comparison (a
            # tree's rows are decided by `tree_walk_kernel` from their tokens).
            sampled_accept = greedy_accept
        else:
            log_q = tl.full([], 0.0, tl.float32)
            # The compile-time test stands apart so the branch is compiled only where drafts exist.
            if HAS_DRAFT:  # noqa: SIM102
                if sampled & real:
                    draft_maxes, draft_log_sums, _ = _combine_splits(
                        _split_record(work_ptr, SPLIT.draft_max, tl.float32),
                        _split_record(work_ptr, SPLIT.draft_sum, tl.float32),
                        records, every, inv_temperature, num_splits, SPLIT_BLOCK,
                    )  # fmt: skip
                    draft_max = tl.sum(draft_maxes, axis=0)
                    draft_log_sum = tl.sum(draft_log_sums, axis=0)
                    if PRELOADED:
                        draft_logit = at_draft[1]
                    else:
                        draft_offset = draft_row_offset(
                            request, draft_start, position, draft_slot_ptr, num_draft_rows, slot_capacity,
                            draft_stride, slot_stride, SLOTTED,
                        )  # fmt: skip
                        draft_inside = draft_offset >= 0
                        draft_logit = tl.load(
                            draft_ptr + tl.maximum(draft_offset, 0) + tl.where(draft_inside, draft_id, 0),
                            mask=draft_inside,
                            other=NEG_INF,
                        )
                    draft_logit = kept_logit(draft_logit, draft_threshold, FILTERED == ALL_ROWS)
                    log_q = log_prob(draft_logit, draft_max, draft_log_sum, inv_temperature)
            if METHOD == BLOCK:
                # Decided jointly by block_keep_kernel from the ratios: no rejection here.
                log_ratio = block_log_ratio(log_p, log_q, real)
                tl.store(row_float_ptr + row * ROW_FLOAT.SIZE + ROW_FLOAT.log_ratio, log_ratio)
                sampled_accept = tl.full([], 1, tl.int1)
            else:
                sampled_accept = accepts(log_p, log_q, accept_uniform(seed, step, position), real)
        accept = tl.where(sampled, sampled_accept, greedy_accept)
    row_float = row_float_ptr + row * ROW_FLOAT.SIZE
    tl.store(row_float + ROW_FLOAT.target_max, row_max)
    tl.store(row_float + ROW_FLOAT.target_log_sum, log_sum)
    tl.store(row_float + ROW_FLOAT.draft_max, draft_max)
    tl.store(row_float + ROW_FLOAT.draft_log_sum, draft_log_sum)
    tl.store(row_float + ROW_FLOAT.draft_log_prob, log_p)
    tl.store(row_float + ROW_FLOAT.token_log_prob, token_log_p)
    if FILTERED:
        tl.store(row_float + ROW_FLOAT.target_threshold, target_threshold)
    if FILTERED == ALL_ROWS:
        tl.store(row_float + ROW_FLOAT.draft_threshold, draft_threshold)
    row_int = row_int_ptr + row * ROW_INT.SIZE
    tl.store(row_int + ROW_INT.token, token)
    # A tree's rows raise no flag: the rows a tree needs follow its nodes' parents and the tokens
    # their rows drew (`_tree_row_needed`), not its first rejection.
    if (METHOD != TREE) & is_draft & ~accept:
        tl.atomic_max(stop_flag_ptr + request, width - position)


@triton.jit
def _block_log_weight(row_float_ptr, out_row, position):
    """``log w_position`` of block verification: ``log w_{i+1} = min(0, log w_i + log(p(d_i) / q(d_i)))``
    from ``log w_0 = 0``, over the ``ROW_FLOAT.log_ratio`` records of rows ``0 .. position - 1``; once
    ``-inf``, it stays ``-inf``."""
    log_weight = tl.full([], 0.0, tl.float32)
    earlier = 0
    while earlier < position:
        log_ratio = tl.load(row_float_ptr + (out_row + earlier) * ROW_FLOAT.SIZE + ROW_FLOAT.log_ratio)
        log_weight = block_next_log_weight(log_weight, log_ratio)
        earlier += 1
    return log_weight


@triton.jit
def _split_block_mass(
    target_row_ptr, target_inside, draft_row_ptr, draft_inside, split, vocab_size, inv_temperature,
    target_max, target_log_sum, draft_max, draft_log_sum, log_weight, draft_id, target_threshold,
    draft_threshold, HAS_DRAFT: tl.constexpr, FILTERED: tl.constexpr, TILES_PER_SPLIT: tl.constexpr,
    BLOCK_V: tl.constexpr,
):  # fmt: skip
    """One split's share of block verification's residual mass ``S = sum_x max(w p(x) - q(x), 0)``
    (`rules.block_residual`)."""
    lanes = tl.arange(0, BLOCK_V)
    first = split * (TILES_PER_SPLIT * BLOCK_V)
    real = (draft_id >= 0) & (draft_id < vocab_size)
    total = tl.zeros([BLOCK_V], tl.float32)
    for tile in range(TILES_PER_SPLIT):
        tokens = first + tile * BLOCK_V + lanes
        in_vocab = tokens < vocab_size
        x = tl.load(target_row_ptr + tokens, mask=in_vocab & target_inside, other=NEG_INF)
        x = kept_logit(x, target_threshold, FILTERED)
        y = x
        if HAS_DRAFT:
            y = tl.load(draft_row_ptr + tokens, mask=in_vocab & draft_inside & real, other=NEG_INF)
            y = kept_logit(y, draft_threshold, FILTERED == ALL_ROWS)
        total += block_residual(
            x, y, tokens, vocab_size, target_max, target_log_sum, log_weight, draft_max, draft_log_sum,
            draft_id, inv_temperature, HAS_DRAFT,
        )  # fmt: skip
    return tl.sum(total, axis=0)


# Counts that change from call to call are not specialised on, so each layout compiles once.
@triton.jit(do_not_specialize=["max_num_drafts", "num_splits"])
def block_keep_kernel(
    target_ptr,
    draft_ptr,
    draft_ids_ptr,
    cu_ptr,
    temperature_ptr,
    seed_ptr,
    step_ptr,
    draft_slot_ptr,
    work_ptr,
    geometry_ptr,
    mass_ptr,
    target_stride,
    draft_stride,
    slot_stride,
    vocab_size,
    max_num_drafts,
    num_splits,
    HAS_DRAFT: tl.constexpr,
    SLOTTED: tl.constexpr,
    FILTERED: tl.constexpr,
    TILES_PER_SPLIT: tl.constexpr,
    BLOCK_V: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """Block verification's keep decisions of the sampled requests: ``eta_i < h_i`` for ``1 <= i <= n``.

    Row ``i < n``: each program sums its split's share of the residual mass ``S_i`` at the row's
    weight ``w_i`` (`_split_block_mass`); the last one to finish the row combines the shares in a
    fixed order, takes ``h_i = S_i / (S_i + 1 - w_i)`` (1 where both are 0) and compares it with
    ``eta_i``, the acceptance uniform of position ``i - 1``. Row ``n``: ``h_n = w_n``, decided by
    its first split's program. ``h_i <= w_i``, so a row with ``eta_i >= w_i`` (every row of weight 0
    among them) is rejected by its first split's program without reading the row.

    Args:
        The pointers are row_stats_kernel's, after it has run: this kernel reads the row records
        (``GEOMETRY.row_float``: statistics, ``ROW_FLOAT.log_ratio``), writes ``ROW_FLOAT.log_weight`` of rows
        ``1 .. n``, raises each sampled request's flag (``GEOMETRY.stop_flag``) to its largest kept
        index ``m`` (it stays 0 where none is kept), and counts splits on from the ``num_splits``
        that row_stats_kernel left in each row's ``GEOMETRY.counter``.
        mass_ptr: ``[B * (max_n + 1) * num_splits]`` fp32 workspace: the split shares of ``S_i``.
    """
    # Grid (B * num_splits, max_n): program (request * num_splits + split, i - 1) handles split
    # `split` of row i; greedy requests (decided by their argmax chain) exit at once.
    program = tl.program_id(0)
    request = program // num_splits
    split = program % num_splits
    position = tl.program_id(1) + 1
    width = max_num_drafts + 1
    draft_start, num_drafts = request_span(cu_ptr, request, max_num_drafts)
    temperature = tl.load(temperature_ptr + request)
    after_previous_launch(PDL)
    if (position <= num_drafts) & (temperature > 0.0):
        row_float_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.row_float, tl.float32)
        out_row = request.to(tl.int64) * width
        row = out_row + position
        log_weight = _block_log_weight(row_float_ptr, out_row, position)
        seed = tl.load(seed_ptr + request)
        step = tl.load(step_ptr + request)
        eta = accept_uniform(seed, step, position - 1)
        # h_n = w_n. Below n, h_i <= w_i (as S_i <= w_i): eta_i >= w_i rejects index i without S_i,
        # and every program of the row skips its read alike.
        keep = tl.exp(log_weight)
        decide = split == 0
        if (position < num_drafts) & (eta < keep):
            counter_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.counter, tl.int32)
            num_target_rows = geometry_field(geometry_ptr, GEOMETRY.num_target_rows)
            num_draft_ids = geometry_field(geometry_ptr, GEOMETRY.num_draft_ids)
            num_draft_rows = geometry_field(geometry_ptr, GEOMETRY.num_draft_rows)
            slot_capacity = geometry_field(geometry_ptr, GEOMETRY.slot_capacity)
            row_float = row_float_ptr + row * ROW_FLOAT.SIZE
            draft_id = tl.load(
                draft_ids_ptr + draft_start + position,
                mask=draft_start + position < num_draft_ids,
                other=-1,
            )
            target_row = draft_start + request + position
            target_inside = target_row < num_target_rows
            target_row_ptr = target_ptr + tl.where(target_inside, target_row, 0) * target_stride
            draft_offset = draft_row_offset(
                request, draft_start, position, draft_slot_ptr, num_draft_rows, slot_capacity, draft_stride,
                slot_stride, SLOTTED,
            )  # fmt: skip
            target_threshold = tl.full([], NEG_INF, tl.float32)
            draft_threshold = tl.full([], NEG_INF, tl.float32)
            if FILTERED:
                target_threshold = tl.load(row_float + ROW_FLOAT.target_threshold)
            if FILTERED == ALL_ROWS:
                draft_threshold = tl.load(row_float + ROW_FLOAT.draft_threshold)
            mass = _split_block_mass(
                target_row_ptr, target_inside, draft_ptr + tl.maximum(draft_offset, 0), draft_offset >= 0,
                split, vocab_size, inverse_temperature(temperature),
                tl.load(row_float + ROW_FLOAT.target_max), tl.load(row_float + ROW_FLOAT.target_log_sum),
                tl.load(row_float + ROW_FLOAT.draft_max), tl.load(row_float + ROW_FLOAT.draft_log_sum),
                log_weight, draft_id, target_threshold, draft_threshold, HAS_DRAFT, FILTERED, TILES_PER_SPLIT,
                BLOCK_V,
            )  # fmt: skip
            tl.store(mass_ptr + row * num_splits + split, mass)
            # Publish the share, then count this split in; the last split of the row decides it.
            tl.debug_barrier()
            finished = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
            decide = finished == 2 * num_splits - 1
            splits = tl.arange(0, SPLIT_BLOCK)
            shares = tl.load(
                mass_ptr + row * num_splits + splits, mask=decide & (splits < num_splits), other=0.0,
                cache_modifier=".cg",
            )  # fmt: skip
            keep = block_keep_probability(tl.sum(shares, axis=0), keep)
        if decide:
            tl.store(row_float_ptr + row * ROW_FLOAT.SIZE + ROW_FLOAT.log_weight, log_weight)
            if eta < keep:
                # m, the largest kept index, is the request's flag (row_stats_kernel left it 0).
                tl.atomic_max(
                    _record(work_ptr, geometry_ptr, GEOMETRY.stop_flag, tl.int32) + request, position
                )


@triton.jit
def _row_block_mass(log_p, fraction, has_mass, top, axis: tl.constexpr):
    """`block_mass` with the row's bound ``top >= log p`` for a scale, with no reduction before the
    exponential: ``(top or -inf where the block has no mass, sum)``. Weights more than ``2**-126``
    below ``exp(top)`` underflow; `_emit_token` recomputes a row whose masses sum below
    ``FAST_MASS_FLOOR`` with `block_mass`, so what underflows is at most ``V 2**-126 / 2**-60`` of
    the row's mass."""
    weight = tl.where(has_mass, tl.exp(log_p - top) * fraction, 0.0)
    scale = tl.where(tl.max(has_mass.to(tl.int32), axis=axis) > 0, top, NEG_INF)
    return scale, tl.sum(weight, axis=axis)


@triton.jit
def _fast_weights(x, y, target_max, residual_log_sum, draft_max, draft_log_sum, inv_temperature, tokens,
                  draft_token, RESIDUAL: tl.constexpr):  # fmt: skip
    """The weights `_row_block_mass` sums, for a tile that `sample_kernel` may take the fast way
    (`_fast_row`): every token inside the vocabulary and the rows, both maxima finite. The weight of
    a token is ``exp(e_p) (1 - q / (w p))`` where ``w p > q``, else 0 (``exp(e_p)`` where it is not
    the excluded ``draft_token`` outside ``RESIDUAL``), with ``e_p = (x - max) / T``, relative to
    ``exp(top)``: the same sum with fewer instructions, no masks and no second reduction. A
    probability under ``2**-1075`` weighs 0 as in `law_weights`, since the fast row's log-sum puts
    ``e_p`` far into float32's underflow there, and so does ``q`` under ``2**-1075``."""
    if RESIDUAL:
        # A NaN target logit fails the comparison: p = 0 weighs 0, with no need to clean it first.
        e_p = (x.to(tl.float32) - target_max) * inv_temperature
        log_p = e_p - residual_log_sum
        log_q = (clean_logit(y) - draft_max) * inv_temperature - draft_log_sum
        weight = residual_weight(tl.exp(e_p), log_p, log_q)
    else:
        weight = tl.where(tokens != draft_token, tl.exp((clean_logit(x) - target_max) * inv_temperature), 0.0)
    return weight


@triton.jit
def _fast_row(in_vocab, target_inside, draft_inside, residual, target_max, draft_max, residual_log_sum):
    """Whether `sample_kernel` may read a split the fast way (`_fast_weights`): every token of it
    inside the vocabulary (``in_vocab``), the rows inside their tensors, both maxima finite (a row
    of ``+inf`` logits or without a finite one takes `law_weights`), and the residual's log-sum at
    most ``FAST_LOG_SUM`` (a weight ``w`` of block verification above ``exp(-600)``), so that
    ``w p < 2**-1075`` puts ``e_p`` below float32's smallest exponential."""
    finite = (target_max > NEG_INF) & (target_max < float("inf"))
    draft_finite = (draft_max > NEG_INF) & (draft_max < float("inf"))
    fits = in_vocab & target_inside & (residual_log_sum <= FAST_LOG_SUM)
    return fits & finite & ((draft_inside & draft_finite) | (residual == 0))


@triton.jit
def _fast_block_masses(target_row_ptr, draft_row_ptr, first, records, block_scale_ptr, block_sum_ptr, top,
                       target_max, residual_log_sum, draft_max, draft_log_sum, inv_temperature, draft_token,
                       target_threshold, draft_threshold, SPAN: tl.constexpr, RESIDUAL: tl.constexpr,
                       FILTERED: tl.constexpr):  # fmt: skip
    """`sample_kernel`'s fast way (`_fast_row`) over the ``SPAN`` tokens from ``first``, a block of
    ``NOISE_GROUP`` at a time: each block's mass recorded as ``(top, sum)`` of its `_fast_weights`,
    or ``(-inf, 0)`` where the sum is 0 (`_emit_token` then tells a row without mass from one whose
    weights all underflowed by computing it again). Draft logits are read only if ``RESIDUAL``.

    A split shorter than a block (the only split of a vocabulary of ``SPAN < NOISE_GROUP`` tokens)
    is one block of ``SPAN`` lanes: reading ``NOISE_GROUP`` there ran past the row (into the rows
    after it, or past the tensor), whose logits then gave the block a mass its own tokens lack."""
    if SPAN < NOISE_GROUP:
        _fast_block_mass(
            target_row_ptr, draft_row_ptr, first, 0, records, block_scale_ptr, block_sum_ptr, top,
            target_max, residual_log_sum, draft_max, draft_log_sum, inv_temperature, draft_token,
            target_threshold, draft_threshold, SPAN, RESIDUAL, FILTERED,
        )  # fmt: skip
    else:
        for group in range(0, SPAN, NOISE_GROUP):
            _fast_block_mass(
                target_row_ptr, draft_row_ptr, first, group, records, block_scale_ptr, block_sum_ptr, top,
                target_max, residual_log_sum, draft_max, draft_log_sum, inv_temperature, draft_token,
                target_threshold, draft_threshold, NOISE_GROUP, RESIDUAL, FILTERED,
            )  # fmt: skip


@triton.jit
def _fast_block_mass(target_row_ptr, draft_row_ptr, first, group, records, block_scale_ptr, block_sum_ptr,
                     top, target_max, residual_log_sum, draft_max, draft_log_sum, inv_temperature,
                     draft_token, target_threshold, draft_threshold, WIDTH: tl.constexpr,
                     RESIDUAL: tl.constexpr, FILTERED: tl.constexpr):  # fmt: skip
    """One block of `_fast_block_masses`: the ``WIDTH`` tokens from ``first + group``, every one inside
    the row, recorded at the block ``group // NOISE_GROUP`` of ``records``."""
    tokens = first + group + tl.arange(0, WIDTH)
    x = kept_logit(tl.load(target_row_ptr + tokens), target_threshold, FILTERED)
    y = kept_logit(tl.load(draft_row_ptr + tokens), draft_threshold, FILTERED == ALL_ROWS) if RESIDUAL else x
    weights = _fast_weights(
        x, y, target_max, residual_log_sum, draft_max, draft_log_sum, inv_temperature, tokens,
        draft_token, RESIDUAL,
    )  # fmt: skip
    total = tl.sum(weights, axis=0)
    tl.store(block_scale_ptr + records + group // NOISE_GROUP, tl.where(total > 0.0, top, NEG_INF))
    tl.store(block_sum_ptr + records + group // NOISE_GROUP, total)


@triton.jit
def _row_offset(offset, ROW_ALIGN: tl.constexpr):
    """A row offset of a final row (-1 for a row outside its tensor, which reads
    nothing) as the row's first element, a multiple of ``ROW_ALIGN`` elements: the plan found every
    row stride a multiple of it, and saying so lets the compiler load the row in vectors."""
    # Rounding down to a multiple changes nothing and tells the compiler (a hint does not survive).
    return tl.maximum(offset, 0) // ROW_ALIGN * ROW_ALIGN


@triton.jit
def _final_row(info_int, info_float, mode, FILTERED: tl.constexpr):
    """What `sample_kernel` recorded of a request's final row: ``(target offset, draft offset, the
    excluded draft token, residual or not, (target max, target log-sum, the residual's log-sum,
    draft max, draft log-sum), (target threshold, draft threshold))``; the draft fields only in
    residual mode, the thresholds ``-inf`` unless ``FILTERED``."""
    residual = mode == SAMPLE_RESIDUAL
    target_log_sum = tl.load(info_float + INFO_FLOAT.target_log_sum)
    # The residual's p is weighted (block verification's w_m, else 1): log(w p) = e - (log_sum - log w).
    residual_log_sum = target_log_sum - tl.where(residual, tl.load(info_float + INFO_FLOAT.log_weight), 0.0)
    laws = (
        tl.load(info_float + INFO_FLOAT.target_max),
        target_log_sum,
        residual_log_sum,
        tl.load(info_float + INFO_FLOAT.draft_max, mask=residual, other=NEG_INF),
        tl.load(info_float + INFO_FLOAT.draft_log_sum, mask=residual, other=0.0),
    )
    target_offset = tl.load(info_int + INFO_INT.target_offset)
    draft_offset = tl.load(info_int + INFO_INT.draft_offset, mask=residual, other=-1)
    target_threshold = tl.full([], NEG_INF, tl.float32)
    draft_threshold = tl.full([], NEG_INF, tl.float32)
    if FILTERED:
        target_threshold = tl.load(info_float + INFO_FLOAT.target_threshold)
    if FILTERED == ALL_ROWS:
        draft_threshold = tl.load(info_float + INFO_FLOAT.draft_threshold)
    thresholds = (target_threshold, draft_threshold)
    return target_offset, draft_offset, tl.load(info_int + INFO_INT.draft_token), residual, laws, thresholds


@triton.jit
def _final_block(target_row_ptr, draft_row_ptr, target_inside, draft_inside, block, vocab_size, draft_token,
                 target_max, law_log_sum, draft_max, draft_log_sum, inv_temperature, residual, thresholds,
                 FILTERED: tl.constexpr):  # fmt: skip
    """Block ``block`` of a final row under its law: ``(tokens, target logits, log p, fraction, has mass)``
    (`law_weights`), the emit step's read of one block."""
    tokens = block * NOISE_GROUP + tl.arange(0, NOISE_GROUP)
    in_vocab = tokens < vocab_size
    x = tl.load(target_row_ptr + tokens, mask=in_vocab & target_inside, other=NEG_INF)
    y = tl.load(draft_row_ptr + tokens, mask=in_vocab & residual & draft_inside, other=NEG_INF)
    x = kept_logit(x, thresholds[0], FILTERED)
    y = kept_logit(y, thresholds[1], FILTERED)
    log_p, fraction, has_mass = law_weights(
        x, y, target_max, law_log_sum, draft_max, draft_log_sum, inv_temperature, tokens, vocab_size,
        draft_token, residual,
    )  # fmt: skip
    return tokens, x, log_p, fraction, has_mass


@triton.jit
def _row_block_masses(target_row_ptr, draft_row_ptr, target_inside, draft_inside, scale, total, num_blocks,
                      vocab_size, draft_token, target_max, law_log_sum, draft_max, draft_log_sum,
                      inv_temperature, residual, thresholds, NUM_BLOCKS: tl.constexpr,
                      FILTERED: tl.constexpr):  # fmt: skip
    """A final row's ``[1, NUM_BLOCKS]`` block masses ``(scale, sum)`` (`block_mass`), read block by
    block in one program, each relative to its own largest weight: `_emit_token`'s slow way."""
    blocks = tl.arange(0, NUM_BLOCKS)[None, :]
    block = 0
    while block < num_blocks:
        _, _, log_p, fraction, has_mass = _final_block(
            target_row_ptr, draft_row_ptr, target_inside, draft_inside, block, vocab_size, draft_token,
            target_max, law_log_sum, draft_max, draft_log_sum, inv_temperature, residual, thresholds,
            FILTERED,
        )  # fmt: skip
        block_scale, block_total = block_mass(log_p, fraction, has_mass, 0, False)
        scale = tl.where(blocks == block, block_scale, scale)
        total = tl.where(blocks == block, block_total, total)
        block += 1
    return scale, total


@triton.jit
def _emit_token(target_row_ptr, draft_row_ptr, target_inside, draft_inside, block_scale_ptr, block_sum_ptr,
                request, num_blocks, vocab_size, mode, draft_token, target_max, target_log_sum,
                residual_log_sum, draft_max, draft_log_sum, inv_temperature, seed, step, position, out,
                token_ids_ptr, logprobs_ptr, thresholds, NUM_BLOCKS: tl.constexpr,
                FILTERED: tl.constexpr):  # fmt: skip
    """Draw a final row's token from its block masses, and write it and its logprob at ``out``.

    The block is the one whose cumulative mass first exceeds ``u`` times the row's (``u`` the row's
    53-bit block uniform, `block_uniform`; the masses summed in float64); the token is the
    Gumbel-max of that block alone, under the canonical noise (`noise_tile`). A row's masses whose
    sum `sample_kernel` found below ``FAST_MASS_FLOOR`` (a residual of tiny probabilities only, or
    none) are computed again here, block by block, each relative to its own largest weight; a row
    whose residual then has no mass (p <= q everywhere, up to rounding) is drawn from p, the
    specification's fallback, with p's block masses computed the same way. Both are rare enough to
    run slowly.
    """
    residual = mode == SAMPLE_RESIDUAL
    blocks = tl.arange(0, NUM_BLOCKS)[None, :]
    records = request.to(tl.int64) * num_blocks + blocks
    scale = tl.load(block_scale_ptr + records, mask=blocks < num_blocks, other=NEG_INF, cache_modifier=".cg")
    total = tl.load(block_sum_ptr + records, mask=blocks < num_blocks, other=0.0, cache_modifier=".cg")
    law_log_sum = residual_log_sum
    if tl.sum(tl.sum(tl.where(scale > NEG_INF, total, 0.0), axis=1), axis=0) < FAST_MASS_FLOOR:
        scale, total = _row_block_masses(
            target_row_ptr, draft_row_ptr, target_inside, draft_inside, scale, total, num_blocks,
            vocab_size, draft_token, target_max, law_log_sum, draft_max, draft_log_sum, inv_temperature,
            residual, thresholds, NUM_BLOCKS, FILTERED,
        )  # fmt: skip
        if tl.max(tl.max(scale, axis=1), axis=0) == NEG_INF:
            # The residual has no mass: the target law, as the specification says.
            residual = mode < 0
            draft_token = tl.full([], -1, tl.int64)
            law_log_sum = target_log_sum
            scale, total = _row_block_masses(
                target_row_ptr, draft_row_ptr, target_inside, draft_inside, scale, total, num_blocks,
                vocab_size, draft_token, target_max, law_log_sum, draft_max, draft_log_sum,
                inv_temperature, residual, thresholds, NUM_BLOCKS, FILTERED,
            )  # fmt: skip
    u = block_uniform(seed, step, position)
    block = tl.sum(tl.reshape(pick_block(scale, total, u, NUM_BLOCKS), (1,)), axis=0)
    tokens, x, log_p, fraction, has_mass = _final_block(
        target_row_ptr, draft_row_ptr, target_inside, draft_inside, block, vocab_size, draft_token,
        target_max, law_log_sum, draft_max, draft_log_sum, inv_temperature, residual, thresholds, FILTERED,
    )  # fmt: skip
    noise = noise_tile(seed, step, position, block * NOISE_GROUP)
    keys = block_keys(log_p, fraction, has_mass, noise, residual)
    # A block with mass has a finite key; a row without any (only where every logit rounds to
    # probability 0) emits the block's first token.
    token = gumbel_max(keys, tokens, block * NOISE_GROUP, 0, False)
    # log p of the token from the tile in hand, rather than a second read of the row.
    logit = tl.max(tl.where(tokens == token, clean_logit(x), NEG_INF), axis=0)
    tl.store(token_ids_ptr + out, token.to(tl.int64))
    tl.store(logprobs_ptr + out, log_prob(logit, target_max, target_log_sum, inv_temperature))


@triton.jit
def _write_decided(draft_ids_ptr, row_float_ptr, row_int_ptr, token_ids_ptr, logprobs_ptr, num_emitted_ptr,
                   request, out_row, draft_start, num_draft_ids, stop, width, known,
                   POS_BLOCK: tl.constexpr):  # fmt: skip
    """Every output of a request that needs no sampling: the accepted drafts before ``stop`` with
    their logprobs, the padding after it, ``num_emitted``, and where the final token is ``known``
    (greedy and strict rows) that token and its logprob from the row's record."""
    lanes = tl.arange(0, POS_BLOCK)
    chunk = 0
    while chunk < stop:
        position = chunk + lanes
        keep = position < stop
        draft_id = tl.load(
            draft_ids_ptr + draft_start + position,
            mask=keep & (draft_start + position < num_draft_ids),
            other=-1,
        )
        log_p = tl.load(
            row_float_ptr + (out_row + position) * ROW_FLOAT.SIZE + ROW_FLOAT.draft_log_prob, mask=keep
        )
        tl.store(token_ids_ptr + out_row + position, draft_id, mask=keep)
        tl.store(logprobs_ptr + out_row + position, log_p, mask=keep)
        chunk += POS_BLOCK
    pad = 0
    while pad < width:
        position = pad + lanes
        after = (position > stop) & (position < width)
        tl.store(token_ids_ptr + out_row + position, -1, mask=after)
        tl.store(logprobs_ptr + out_row + position, float("nan"), mask=after)
        pad += POS_BLOCK
    tl.store(num_emitted_ptr + request, (stop + 1).to(tl.int32))
    if known:
        token = tl.load(row_int_ptr + (out_row + stop) * ROW_INT.SIZE + ROW_INT.token)
        log_p = tl.load(row_float_ptr + (out_row + stop) * ROW_FLOAT.SIZE + ROW_FLOAT.token_log_prob)
        tl.store(token_ids_ptr + out_row + stop, token.to(tl.int64))
        tl.store(logprobs_ptr + out_row + stop, log_p)


@triton.jit
def _final_row_laws(row_float, residual, weighted, METHOD: tl.constexpr, HAS_DRAFT: tl.constexpr):
    """A sampled final row's laws from its record (`ROW_FLOAT`): ``(target max, target log-sum,
    draft max, draft log-sum, log w)``, the draft's only in ``residual`` mode, ``log w`` (block
    verification's ``w_m`` of the residual ``max(w_m p - q, 0)`` after a stop at ``m < n``) only
    where ``weighted``, else 0 (``w_0 = 1``)."""
    target_max = tl.load(row_float + ROW_FLOAT.target_max)
    target_log_sum = tl.load(row_float + ROW_FLOAT.target_log_sum)
    log_weight = tl.full([], 0.0, tl.float32)
    draft_max = tl.full([], NEG_INF, tl.float32)
    draft_log_sum = tl.full([], 0.0, tl.float32)
    if METHOD == BLOCK:  # noqa: SIM102
        if weighted:
            log_weight = tl.load(row_float + ROW_FLOAT.log_weight)
    if (METHOD == PROBABILISTIC or METHOD == BLOCK) and HAS_DRAFT:  # noqa: SIM102, SIM109
        if residual:
            draft_max = tl.load(row_float + ROW_FLOAT.draft_max)
            draft_log_sum = tl.load(row_float + ROW_FLOAT.draft_log_sum)
    return target_max, target_log_sum, draft_max, draft_log_sum, log_weight


@triton.jit
def sample_kernel(target_ptr, draft_ptr, draft_ids_ptr, cu_ptr, temperature_ptr, draft_slot_ptr, work_ptr,
                  geometry_ptr, token_ids_ptr, logprobs_ptr, num_emitted_ptr, target_stride, draft_stride,
                  slot_stride, vocab_size, METHOD: tl.constexpr, HAS_DRAFT: tl.constexpr,
                  SLOTTED: tl.constexpr, POS_BLOCK: tl.constexpr, TILES_PER_SPLIT: tl.constexpr,
                  BLOCK_V: tl.constexpr, ROW_ALIGN: tl.constexpr, PDL: tl.constexpr,
                  FILTERED: tl.constexpr):  # fmt: skip
    """Each request's final row from the row records, its outputs that need no sampling, and the
    block masses of one split of a sampled final row.

    Every program finds its request's final row: the first rejection ``j`` from the request's flag
    (``max_n + 1 - j``; block verification: ``m``, the largest kept index), or the bonus row. The
    program of split 0 writes the accepted prefix, the padding and ``num_emitted``, and either the
    emitted token (greedy and strict rows) or the final row's record for `emit_kernel`. Where the
    final row is sampled, each program computes the block masses of its split under the residual
    ``(p - q)+`` (block verification's ``(w_m p - q)+``) or the target ``p``, a block of
    ``NOISE_GROUP`` tokens at a time (`reference.schemes`, ``canonical-v3``: a row is drawn within
    one block, picked by the inverse CDF of the block masses); a block's mass costs one
    exponential per token besides the residual's own. `emit_kernel` picks the block and draws the
    token. A split whose tokens all lie inside the vocabulary, of a row with finite maxima, is read
    the fast way (`_fast_row`, `_fast_weights`: no masks, one reduction a block, about 30
    instructions a token against 70; H200, B=64 n=4 V=128256: 19 us against 25); the vocabulary's
    last split and odd rows the general way (`law_weights`, `_row_block_mass`).

    Args:
        target_ptr: ``[R, V]`` fp32/fp16/bf16 target logits.
        draft_ptr: ``[D, V]`` or ``[S, K, V]`` draft logits (read only in residual mode).
        draft_ids_ptr: ``[D]`` int64 draft token ids.
        cu_ptr: ``[B + 1]`` int32 prefix sums of the draft counts.
        temperature_ptr: ``[B]`` fp32.
        draft_slot_ptr: ``[B]`` int32/int64 (unused unless ``SLOTTED``).
        work_ptr: the call's int32 workspace: reads the request's flag (``stop_flag``) and the row
            records (`ROW_FLOAT`, `ROW_INT`); writes the final row's (`INFO_INT`, `INFO_FLOAT`) and its
            block masses (``block_scale``, ``block_sum``: ``exp(scale) * sum``, `block_mass`).
        geometry_ptr: ``[GEOMETRY.SIZE]`` int64 geometry record: the counts that bound reads, ``max_n``
            and the records' offsets.
        token_ids_ptr: ``[B, max_n + 1]`` int64 output.
        logprobs_ptr: ``[B, max_n + 1]`` fp32 output.
        num_emitted_ptr: ``[B]`` int32 output.
    """
    # Grid (B, num_splits): one program per request and vocabulary split. Rows after the first
    # rejection may never have been finished (row_stats_kernel skips them): none is read.
    request = tl.program_id(0)
    split = tl.program_id(1)
    # The geometry and the batch's loads go out while the previous launch finishes.
    max_num_drafts = geometry_field(geometry_ptr, GEOMETRY.max_num_drafts)
    num_target_rows = geometry_field(geometry_ptr, GEOMETRY.num_target_rows)
    num_draft_ids = geometry_field(geometry_ptr, GEOMETRY.num_draft_ids)
    num_draft_rows = geometry_field(geometry_ptr, GEOMETRY.num_draft_rows)
    slot_capacity = geometry_field(geometry_ptr, GEOMETRY.slot_capacity)
    stop_flag_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.stop_flag, tl.int32)
    row_float_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.row_float, tl.float32)
    row_int_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.row_int, tl.int32)
    info_int = _record(work_ptr, geometry_ptr, GEOMETRY.info_int, tl.int64) + request * INFO_INT.SIZE
    info_float = _record(work_ptr, geometry_ptr, GEOMETRY.info_float, tl.float32) + request * INFO_FLOAT.SIZE
    draft_start, num_drafts = request_span(cu_ptr, request, max_num_drafts)
    temperature = tl.load(temperature_ptr + request)
    after_previous_launch(PDL)
    stop_flag = tl.load(stop_flag_ptr + request)
    sampled = temperature > 0.0
    width = max_num_drafts + 1
    out_row = request.to(tl.int64) * width

    # The first rejection j, from the request's flag (max_n + 1 - j, 0 where every row before the
    # bonus row was accepted): every row up to it was read and decided, so the flag holds the
    # first one, however many later rows were skipped.
    stop = tl.where(stop_flag > 0, tl.minimum(width - stop_flag, num_drafts), num_drafts)
    if METHOD == BLOCK:
        # A sampled request keeps m drafts, m the largest index block_keep_kernel kept (its rows
        # are never skipped: only greedy rows reject in row_stats_kernel).
        stop = tl.where(sampled, tl.minimum(stop_flag, num_drafts), stop)
    # The final row: the first rejection, or the bonus row when every draft was accepted.
    is_draft, draft_id, real = draft_at(
        draft_ids_ptr, draft_start, stop, num_drafts, num_draft_ids, vocab_size
    )
    mode = final_mode(real, sampled, METHOD, HAS_DRAFT)
    if split == 0:
        _write_decided(
            draft_ids_ptr, row_float_ptr, row_int_ptr, token_ids_ptr, logprobs_ptr, num_emitted_ptr, request,
            out_row, draft_start, num_draft_ids, stop, width, mode == SAMPLE_NONE, POS_BLOCK,
        )  # fmt: skip
        tl.store(info_int + INFO_INT.mode, mode)
    if mode != SAMPLE_NONE:
        residual = mode == SAMPLE_RESIDUAL
        target_row = draft_start + request + stop
        target_offset = tl.where(target_row < num_target_rows, target_row * target_stride, -1)
        draft_offset = tl.full([], -1, tl.int64)
        # The compile-time test stands apart so the branch is compiled only where drafts exist.
        if (METHOD == PROBABILISTIC or METHOD == BLOCK) and HAS_DRAFT:  # noqa: SIM102, SIM109
            if residual:
                draft_offset = draft_row_offset(
                    request, draft_start, stop, draft_slot_ptr, num_draft_rows, slot_capacity,
                    draft_stride, slot_stride, SLOTTED,
                )  # fmt: skip
        # Only a rejected one-hot draft is excluded from the sample.
        draft_token = tl.where(mode == SAMPLE_WITHOUT_DRAFT, draft_id, -1)
        target_max, target_log_sum, draft_max, draft_log_sum, log_weight = _final_row_laws(
            row_float_ptr + (out_row + stop) * ROW_FLOAT.SIZE, residual, (stop > 0) & is_draft, METHOD,
            HAS_DRAFT,
        )  # fmt: skip
        target_threshold = tl.full([], NEG_INF, tl.float32)
        draft_threshold = tl.full([], NEG_INF, tl.float32)
        if FILTERED:
            target_threshold = tl.load(
                row_float_ptr + (out_row + stop) * ROW_FLOAT.SIZE + ROW_FLOAT.target_threshold
            )
        if FILTERED == ALL_ROWS:
            draft_threshold = tl.load(
                row_float_ptr + (out_row + stop) * ROW_FLOAT.SIZE + ROW_FLOAT.draft_threshold
            )
        if split == 0:
            tl.store(info_int + INFO_INT.position, stop)
            tl.store(info_int + INFO_INT.target_offset, target_offset)
            tl.store(info_int + INFO_INT.draft_offset, draft_offset)
            tl.store(info_int + INFO_INT.draft_token, draft_token)
            tl.store(info_float + INFO_FLOAT.target_max, target_max)
            tl.store(info_float + INFO_FLOAT.target_log_sum, target_log_sum)
            tl.store(info_float + INFO_FLOAT.draft_max, draft_max)
            tl.store(info_float + INFO_FLOAT.draft_log_sum, draft_log_sum)
            tl.store(info_float + INFO_FLOAT.log_weight, log_weight)
            if FILTERED:
                tl.store(info_float + INFO_FLOAT.target_threshold, target_threshold)
            if FILTERED == ALL_ROWS:
                tl.store(info_float + INFO_FLOAT.draft_threshold, draft_threshold)
        # The residual's p is weighted (block verification's w_m, else 1): log(w p) = e - (log_sum - log w).
        residual_log_sum = target_log_sum - tl.where(residual, log_weight, 0.0)
        target_row_ptr = target_ptr + _row_offset(target_offset, ROW_ALIGN)
        draft_row_ptr = draft_ptr + _row_offset(draft_offset, ROW_ALIGN)
        _split_block_masses(
            target_row_ptr, draft_row_ptr, target_offset >= 0, residual & (draft_offset >= 0), work_ptr,
            geometry_ptr, request, split, vocab_size, draft_token, residual, target_max, residual_log_sum,
            draft_max, draft_log_sum, inverse_temperature(temperature), target_threshold, draft_threshold,
            FILTERED, TILES_PER_SPLIT, BLOCK_V,
        )  # fmt: skip
    if METHOD == STRICT:
        # Strict's sampling pass is its last launch, one program per request.
        _clear_zeroed(work_ptr, geometry_ptr, request, width)


@triton.jit
def _split_block_masses(target_row_ptr, draft_row_ptr, target_inside, draft_inside, work_ptr, geometry_ptr,
                        request, split, vocab_size, draft_token, residual, target_max, residual_log_sum,
                        draft_max, draft_log_sum, inv_temperature, target_threshold, draft_threshold,
                        FILTERED: tl.constexpr, TILES_PER_SPLIT: tl.constexpr,
                        BLOCK_V: tl.constexpr):  # fmt: skip
    """`sample_kernel`'s block masses of split ``split`` of a sampled final row, recorded as
    ``(scale, sum)``: the fast way where `_fast_row` allows it, else `law_weights` and
    `_row_block_mass` a block at a time."""
    block_scale_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.block_scale, tl.float32)
    block_sum_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.block_sum, tl.float32)
    num_blocks = tl.cdiv(vocab_size, NOISE_GROUP)
    lanes = tl.arange(0, NOISE_GROUP)
    first = split * (TILES_PER_SPLIT * BLOCK_V)
    records = request.to(tl.int64) * num_blocks + first // NOISE_GROUP
    # log p <= -log_sum: every weight relative to the row's largest possible one.
    top = -residual_log_sum
    fast = _fast_row(
        first + TILES_PER_SPLIT * BLOCK_V <= vocab_size, target_inside, draft_inside, residual,
        target_max, draft_max, residual_log_sum,
    )  # fmt: skip
    # A split is a whole number of blocks, or a single split shorter than a block.
    if fast & residual:
        _fast_block_masses(
            target_row_ptr, draft_row_ptr, first, records, block_scale_ptr, block_sum_ptr, top,
            target_max, residual_log_sum, draft_max, draft_log_sum, inv_temperature, draft_token,
            target_threshold, draft_threshold, TILES_PER_SPLIT * BLOCK_V, True, FILTERED,
        )  # fmt: skip
    elif fast:
        _fast_block_masses(
            target_row_ptr, draft_row_ptr, first, records, block_scale_ptr, block_sum_ptr, top,
            target_max, residual_log_sum, draft_max, draft_log_sum, inv_temperature, draft_token,
            target_threshold, draft_threshold, TILES_PER_SPLIT * BLOCK_V, False, FILTERED,
        )  # fmt: skip
    else:
        for group in range(0, TILES_PER_SPLIT * BLOCK_V, NOISE_GROUP):
            tokens = first + group + lanes
            in_vocab = tokens < vocab_size
            x = tl.load(target_row_ptr + tokens, mask=in_vocab & target_inside, other=NEG_INF)
            y = tl.load(draft_row_ptr + tokens, mask=in_vocab & draft_inside, other=NEG_INF)
            x = kept_logit(x, target_threshold, FILTERED)
            y = kept_logit(y, draft_threshold, FILTERED == ALL_ROWS)
            log_p, fraction, has_mass = law_weights(
                x, y, target_max, residual_log_sum, draft_max, draft_log_sum, inv_temperature, tokens,
                vocab_size, draft_token, residual,
            )  # fmt: skip
            scale, total = _row_block_mass(log_p, fraction, has_mass, top, 0)
            inside = (first + group) // NOISE_GROUP < num_blocks
            tl.store(block_scale_ptr + records + group // NOISE_GROUP, scale, mask=inside)
            tl.store(block_sum_ptr + records + group // NOISE_GROUP, total, mask=inside)


@triton.jit(do_not_specialize=["max_num_drafts", "num_blocks"])
def emit_kernel(
    target_ptr,
    draft_ptr,
    temperature_ptr,
    seed_ptr,
    step_ptr,
    info_int_ptr,
    info_float_ptr,
    block_scale_ptr,
    block_sum_ptr,
    work_ptr,
    geometry_ptr,
    token_ids_ptr,
    logprobs_ptr,
    vocab_size,
    max_num_drafts,
    num_blocks,
    NUM_BLOCKS: tl.constexpr,
    ROW_ALIGN: tl.constexpr,
    PDL: tl.constexpr,
    FILTERED: tl.constexpr,
):
    """Draw each final row's token from its block masses (`_emit_token`) and write it and its logprob.

    Args:
        target_ptr: ``[R, V]`` fp32/fp16/bf16 target logits.
        draft_ptr: ``[D, V]`` or ``[S, K, V]`` draft logits (read only in residual mode).
        temperature_ptr: ``[B]`` fp32.
        seed_ptr, step_ptr: ``[B]`` int64.
        info_int_ptr: ``[B, 5]`` int64 and info_float_ptr: ``[B, 5]`` fp32: the final row's records
            (`sample_kernel`).
        block_scale_ptr, block_sum_ptr: the ``[B * num_blocks]`` block masses of `sample_kernel`.
        work_ptr, geometry_ptr: the call's workspace and geometry record: as the call's last launch,
            this kernel zeroes the request's counters and flag for the next call (`_clear_zeroed`).
        token_ids_ptr: ``[B, max_n + 1]`` int64 output.
        logprobs_ptr: ``[B, max_n + 1]`` fp32 output.
    """
    # Grid (B,): one program per request.
    request = tl.program_id(0)
    temperature = tl.load(temperature_ptr + request)
    seed = tl.load(seed_ptr + request)
    step = tl.load(step_ptr + request)
    after_previous_launch(PDL)
    info_int = info_int_ptr + request.to(tl.int64) * INFO_INT.SIZE
    mode = tl.load(info_int + INFO_INT.mode)
    if mode != SAMPLE_NONE:
        target_offset, draft_offset, draft_token, residual, laws, thresholds = _final_row(
            info_int, info_float_ptr + request.to(tl.int64) * INFO_FLOAT.SIZE, mode, FILTERED
        )
        target_max, target_log_sum, residual_log_sum, draft_max, draft_log_sum = laws
        position = tl.load(info_int + INFO_INT.position)
        target_row_ptr = target_ptr + _row_offset(target_offset, ROW_ALIGN)
        _emit_token(
            target_row_ptr, draft_ptr + _row_offset(draft_offset, ROW_ALIGN),
            target_offset >= 0, residual & (draft_offset >= 0), block_scale_ptr, block_sum_ptr, request,
            num_blocks, vocab_size, mode, draft_token, target_max, target_log_sum, residual_log_sum,
            draft_max, draft_log_sum, inverse_temperature(temperature), seed, step, position,
            request.to(tl.int64) * (max_num_drafts + 1) + position, token_ids_ptr, logprobs_ptr, thresholds,
            NUM_BLOCKS, FILTERED,
        )  # fmt: skip
    _clear_zeroed(work_ptr, geometry_ptr, request, max_num_drafts + 1)


@triton.jit(do_not_specialize=["max_num_drafts"])
def tree_walk_kernel(draft_ids_ptr, cu_ptr, rates_ptr, work_ptr, geometry_ptr, token_ids_ptr,
                     logprobs_ptr, num_emitted_ptr, accepted_nodes_ptr, vocab_size, max_num_drafts,
                     NODES: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """Tree verification (`reference.tree`): each request's walk from the root over its rows' tokens.

    `row_stats_kernel` drew every row's token (`ROW_INT.token`: the Gumbel-max sample of a sampled
    row, the argmax of a greedy one) and its target log-probability (`ROW_FLOAT.token_log_prob`).
    From the root, the walk takes the token of the current node's row; the first child (in node
    order) whose draft id is that token is accepted and the walk goes on from its row; a token no
    child holds is emitted. A placeholder, or an id outside ``[0, V)``, matches nothing.

    Args:
        draft_ids_ptr: ``[D]`` int64 draft token ids (each node's token).
        cu_ptr: ``[B + 1]`` int32 prefix sums of the node counts.
        rates_ptr: ``[D]`` int32/int64 each node's parent within its request (``-1``: the root): a
            tree takes no synthetic rates, so its parents travel in their place.
        work_ptr, geometry_ptr: the call's workspace and geometry record (the row records).
        token_ids_ptr: ``[B, max_n + 1]`` int64 output; logprobs_ptr: ``[B, max_n + 1]`` fp32 output;
            num_emitted_ptr: ``[B]`` int32 output; accepted_nodes_ptr: ``[B, max_n]`` int32 output.
        NODES: a power of two ``>= max_n + 1``: a request's nodes held as one vector.
    """
    # Grid (B,): one program per request.
    request = tl.program_id(0)
    num_draft_ids = geometry_field(geometry_ptr, GEOMETRY.num_draft_ids)
    row_float_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.row_float, tl.float32)
    row_int_ptr = _record(work_ptr, geometry_ptr, GEOMETRY.row_int, tl.int32)
    draft_start, num_drafts = request_span(cu_ptr, request, max_num_drafts)
    nodes = tl.arange(0, NODES)
    is_node, node_ids, real = draft_at(
        draft_ids_ptr, draft_start, nodes, num_drafts, num_draft_ids, vocab_size
    )
    inside = is_node & (draft_start + nodes < num_draft_ids)
    parents = tl.load(rates_ptr + draft_start + nodes, mask=inside, other=-2).to(tl.int64)
    after_previous_launch(PDL)
    width = max_num_drafts + 1
    out_row = request.to(tl.int64) * width
    nodes_row = request.to(tl.int64) * max_num_drafts
    row = tl.full([], 0, tl.int64)
    level = tl.full([], 0, tl.int64)
    walking = tl.full([], 1, tl.int1)
    while walking:
        record = out_row + row
        token = tl.load(row_int_ptr + record * ROW_INT.SIZE + ROW_INT.token).to(tl.int64)
        log_p = tl.load(row_float_ptr + record * ROW_FLOAT.SIZE + ROW_FLOAT.token_log_prob)
        tl.store(token_ids_ptr + out_row + level, token)
        tl.store(logprobs_ptr + out_row + level, log_p)
        # The first child of the row's node (parents before their children) holding the token.
        child = tree_child(nodes, node_ids, parents, real, row - 1, token, NODES, 0, False)
        walking = (child < NODES) & (level < num_drafts)
        if walking:
            tl.store(accepted_nodes_ptr + nodes_row + level, child.to(tl.int32))
            row = child.to(tl.int64) + 1
        level += 1
    tl.store(num_emitted_ptr + request, level.to(tl.int32))
    # The padding: -1 (and NaN) after the emitted tokens and the accepted nodes.
    start = 0
    while start < width:
        column = start + nodes
        after = (column >= level) & (column < width)
        tl.store(token_ids_ptr + out_row + column, -1, mask=after)
        tl.store(logprobs_ptr + out_row + column, float("nan"), mask=after)
        tl.store(
            accepted_nodes_ptr + nodes_row + column,
            -1,
            mask=(column >= level - 1) & (column < max_num_drafts),
        )
        start += NODES
    _clear_zeroed(work_ptr, geometry_ptr, request, width)
