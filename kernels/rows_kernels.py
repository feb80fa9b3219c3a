"""The rows plan: one launch whose programs each take whole requests, every row of them at once.

Only ``@triton.jit`` code lives here; `kernels.rejection` chooses the plan and launches. The split
plan (`rejection_kernels`, up to four launches of one program per request, position and vocabulary
split) is what a GPU runs. The Triton interpreter runs a program's every operation through numpy at a fixed
cost of some microseconds that a small tile hardly adds to, so its time grows with the number of
programs times the operations each runs; the split plan costs it 50 to 80 ms a request. Here one
program takes ``REQUESTS`` requests and holds their rows as ``[REQUESTS, POSITIONS, BLOCK_V]``
tiles, so the operations are paid once per program instead of once per request, position and split.

It computes what the split plan computes, with the same helpers and in the same order: row
statistics in the log domain relative to the row max, the acceptance and keep decisions from
``tl.rand`` at the canonical offsets, the walk to the first rejection (block verification: to the
largest kept index), and the final row's draw under the canonical scheme (`reference.schemes`,
``canonical-v3``: the block its uniform picks by the block masses, then the Gumbel-max within it).
Where the split plan combines per-split partial results, this plan works through a row tile by
tile, so its sums (and strict sampling's keys, taken against the row's final max, and the block
masses, each block's tiles merged as they come) may differ in the last bits: the outputs agree with
the split plan's except at near ties, the same allowance both plans have against the float64 walk.
Per-request values are ``[REQUESTS, 1]`` columns and per-row values ``[REQUESTS, POSITIONS]``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from specsample.kernels.records import GEOMETRY
from specsample.kernels.rules import (
    BLOCK,
    NEG_INF,
    NO_SPLIT,
    NOISE_GROUP,
    NOISE_RUN,
    PROBABILISTIC,
    SAMPLE_NONE,
    SAMPLE_PURPOSE,
    SAMPLE_RESIDUAL,
    SAMPLE_WITHOUT_DRAFT,
    STRICT,
    SYNTHETIC,
    TREE,
    accept_uniform,
    accepts,
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
    law_weights,
    log_prob,
    log_prob_at,
    philox,
    pick_block,
    request_span,
    rescale_factor,
    scaled_logit,
    synthetic_accepts,
    to_uniform,
    tree_child,
    weight,
)


@triton.jit
def _noise_rows(seed, step, position, tile_start, BLOCK_V: tl.constexpr):
    """The sampling uniforms of tokens ``tile_start + [0, BLOCK_V)`` of ``[N, 1]`` rows, ``[N, BLOCK_V]``.

    Token ``t`` is word ``t % 1024 // 256`` of Philox call ``t // 1024 * 256 + t % 256``
    (``canonical-v3``, as `rules.noise_group` lays out a noise group). A tile of a
    whole noise group takes the four words of 256 calls; a smaller tile (a vocabulary under 1024
    tokens, one tile) picks each token's word from its own call.
    """
    if BLOCK_V >= NOISE_GROUP:
        calls = tile_start // 4 + tl.arange(0, NOISE_RUN)[None, :]
        w0, w1, w2, w3 = philox(seed, step, position, SAMPLE_PURPOSE, calls)
        # [row, lane, a, b] with run a + 2 b; the permute puts the run before the lane.
        joined = tl.join(tl.join(to_uniform(w0), to_uniform(w1)), tl.join(to_uniform(w2), to_uniform(w3)))
        return tl.reshape(tl.permute(joined, (0, 3, 2, 1)), (joined.shape[0], NOISE_GROUP))
    else:
        tokens = tile_start + tl.arange(0, BLOCK_V)[None, :]
        calls = tokens // NOISE_GROUP * NOISE_RUN + tokens % NOISE_RUN
        word = tokens % NOISE_GROUP // NOISE_RUN
        w0, w1, w2, w3 = philox(seed, step, position, SAMPLE_PURPOSE, calls)
        return to_uniform(tl.where(word == 0, w0, tl.where(word == 1, w1, tl.where(word == 2, w2, w3))))


@triton.jit
def _final_laws(target_ptr, draft_ptr, target_offset, target_inside, draft_offset, tokens, vocab_size, laws,
                inv_temperature, excluded):  # fmt: skip
    """A tile of each request's final row under both of `rules.law_weights`'s laws, the
    residual ``(p - q)+`` and the target ``p`` without ``excluded``: ``(residual, target)``, each
    ``(log p, fraction, has mass)``; each request then takes its own. ``laws`` is ``(target max,
    target log-sum, the residual's log-sum, draft max, draft log-sum)``."""
    target_max, target_log_sum, residual_log_sum, draft_max, draft_log_sum = laws
    in_vocab = tokens < vocab_size
    x = tl.load(target_ptr + target_offset + tokens, mask=in_vocab & target_inside, other=NEG_INF)
    y = tl.load(
        draft_ptr + tl.maximum(draft_offset, 0) + tokens, mask=in_vocab & (draft_offset >= 0), other=NEG_INF
    )
    residual = law_weights(
        x, y, target_max, residual_log_sum, draft_max, draft_log_sum, inv_temperature, tokens, vocab_size,
        excluded, True,
    )  # fmt: skip
    target = law_weights(
        x, y, target_max, target_log_sum, draft_max, draft_log_sum, inv_temperature, tokens, vocab_size,
        excluded, False,
    )  # fmt: skip
    return residual, target


@triton.jit
def _no_mass(REQUESTS: tl.constexpr):
    """``[REQUESTS, 1]`` block masses ``(scale, sum)`` of nothing yet: ``(-inf, 0)``."""
    return tl.full([REQUESTS, 1], NEG_INF, tl.float32), tl.zeros([REQUESTS, 1], tl.float32)


@triton.jit
def _merge_mass(mass, tile):
    """A block's mass ``(scale, sum)`` (`rules.block_mass`) with a tile's added."""
    scale = tl.maximum(mass[0], tile[0])
    shift = tl.where(scale > NEG_INF, scale, 0.0)
    old = tl.where(mass[0] > NEG_INF, mass[1] * tl.exp(mass[0] - shift), 0.0)
    new = tl.where(tile[0] > NEG_INF, tile[1] * tl.exp(tile[0] - shift), 0.0)
    return scale, old + new


@triton.jit
def _at(values, chosen, empty):
    """Per request, the entry of ``values`` ``[R, P]`` where ``chosen`` ``[R, P]`` holds (once a row)."""
    return tl.max(tl.where(chosen, values, empty), axis=1, keep_dims=True)


@triton.jit
def _rows_stats(row_ptr, inside, vocab_size, inv_temperature, BLOCK_V: tl.constexpr):
    """``(max, sum of exp(e), first argmax)`` of every row: ``row_ptr`` ``[R, P]`` the rows' first
    logits, ``inside`` ``[R, P]`` the rows to read (the others read as no finite logit)."""
    lanes = tl.arange(0, BLOCK_V)[None, None, :]
    row_max = tl.full(inside.shape, NEG_INF, tl.float32)
    row_sum = tl.zeros(inside.shape, tl.float32)
    row_arg = tl.zeros(inside.shape, tl.int32)
    scale = inv_temperature[:, :, None]
    tile_start = 0
    while tile_start < vocab_size:
        tokens = tile_start + lanes
        in_vocab = tokens < vocab_size
        x = clean_logit(
            tl.load(row_ptr[:, :, None] + tokens, mask=in_vocab & inside[:, :, None], other=NEG_INF)
        )
        tile_max, tile_lane = tl.max(x, axis=2, return_indices=True, return_indices_tie_break_left=True)
        # Strict `>`: the first maximum wins ties, as the specification's argmax does.
        row_arg = tl.where(tile_max > row_max, tile_start + tile_lane, row_arg)
        new_max = tl.maximum(row_max, tile_max)
        weights = weight(x, in_vocab, new_max[:, :, None], scale)
        row_sum = row_sum * rescale_factor(row_max, new_max, inv_temperature) + tl.sum(weights, axis=2)
        row_max = new_max
        tile_start += BLOCK_V
    return row_max, row_sum, row_arg


@triton.jit
def _rows_strict_sample(row_ptr, inside, vocab_size, inv_temperature, row_max, seed, step, position,
                        REQUESTS: tl.constexpr, POSITIONS: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """The target sample of every row by Gumbel-max, ``e(x) - log(-log u)``, ties to the lowest token.
    ``position`` ``[1, P]`` numbers the rows of a request."""
    lanes = tl.arange(0, BLOCK_V)[None, None, :]
    best_key = tl.full([REQUESTS, POSITIONS], NEG_INF, tl.float32)
    best_token = tl.zeros([REQUESTS, POSITIONS], tl.int32)
    # The rows flattened to [R * P, 1] for the noise, which is put back to [R, P, BLOCK_V].
    flat_seed = tl.reshape(tl.broadcast_to(seed, (REQUESTS, POSITIONS)), (REQUESTS * POSITIONS, 1))
    flat_step = tl.reshape(tl.broadcast_to(step, (REQUESTS, POSITIONS)), (REQUESTS * POSITIONS, 1))
    flat_position = tl.reshape(tl.broadcast_to(position, (REQUESTS, POSITIONS)), (REQUESTS * POSITIONS, 1))
    tile_start = 0
    while tile_start < vocab_size:
        tokens = tile_start + lanes
        in_vocab = tokens < vocab_size
        x = clean_logit(
            tl.load(row_ptr[:, :, None] + tokens, mask=in_vocab & inside[:, :, None], other=NEG_INF)
        )
        noise = _noise_rows(flat_seed, flat_step, flat_position, tile_start, BLOCK_V)
        gumbel = gumbel_noise(tl.reshape(noise, (REQUESTS, POSITIONS, BLOCK_V)))
        scaled = scaled_logit(x, row_max[:, :, None], inv_temperature[:, :, None])
        keys = tl.where(in_vocab, scaled + gumbel, NEG_INF)
        tile_key = tl.max(keys, axis=2)
        tile_token = tl.min(tl.where(keys == tile_key[:, :, None], tokens, NO_SPLIT), axis=2)
        best_token = tl.where(tile_key > best_key, tile_token, best_token)
        best_key = tl.maximum(best_key, tile_key)
        tile_start += BLOCK_V
    return best_token


@triton.jit
def _rows_block_mass(target_row_ptr, target_inside, draft_row_ptr, draft_inside, vocab_size, inv_temperature,
                     target_max, target_log_sum, draft_max, draft_log_sum, log_weight, draft_id,
                     HAS_DRAFT: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Block verification's residual mass ``S = sum_x max(w p(x) - q(x), 0)`` of every row
    (`rules.block_residual`), tile by tile."""
    lanes = tl.arange(0, BLOCK_V)[None, None, :]
    real = (draft_id >= 0) & (draft_id < vocab_size)
    total = tl.zeros(target_max.shape, tl.float32)
    tile_start = 0
    while tile_start < vocab_size:
        tokens = tile_start + lanes
        in_vocab = tokens < vocab_size
        x = tl.load(
            target_row_ptr[:, :, None] + tokens, mask=in_vocab & target_inside[:, :, None], other=NEG_INF
        )
        y = x
        if HAS_DRAFT:
            y = tl.load(
                draft_row_ptr[:, :, None] + tokens,
                mask=in_vocab & (draft_inside & real)[:, :, None],
                other=NEG_INF,
            )
        residual = block_residual(
            x, y, tokens, vocab_size, target_max[:, :, None], target_log_sum[:, :, None],
            log_weight[:, :, None], draft_max[:, :, None], draft_log_sum[:, :, None], draft_id[:, :, None],
            inv_temperature[:, :, None], HAS_DRAFT,
        )  # fmt: skip
        total += tl.sum(residual, axis=2)
        tile_start += BLOCK_V
    return total


@triton.jit
def _rows_laws(target_ptr, draft_ptr, draft_slot_ptr, request, draft_start, position, draft_id, real, sampled,
               target_inside, target_offset, num_draft_rows, slot_capacity, draft_stride, slot_stride,
               vocab_size, inv_temperature, seed, step, METHOD: tl.constexpr, HAS_DRAFT: tl.constexpr,
               SLOTTED: tl.constexpr, REQUESTS: tl.constexpr, POSITIONS: tl.constexpr,
               BLOCK_V: tl.constexpr):  # fmt: skip
    """The statistics of every row ``[R, P]``: the target law's ``(max, log-sum)``, the row token (the
    argmax of a greedy row, the target sample of a sampled strict one) and its ``log p``, the draft's
    ``log p``, and where ``q`` is needed (a real draft of a sampled row, probabilistic and block
    verification with draft logits) the draft law's ``(max, log-sum)``, the draft's ``log q`` and
    the draft row's offset (-1 where not read). Returns ``(target max, target log-sum, token,
    token log p, log p, log q, draft max, draft log-sum, draft offset)``."""
    target_row_ptr = target_ptr + target_offset
    target_max, target_sum, token = _rows_stats(
        target_row_ptr, target_inside, vocab_size, inv_temperature, BLOCK_V
    )
    target_log_sum = tl.log(target_sum)
    if METHOD == STRICT or METHOD == TREE:  # noqa: SIM109 (constexprs): every row draws its sample
        sample = _rows_strict_sample(
            target_row_ptr, target_inside & sampled, vocab_size, inv_temperature, target_max, seed, step,
            position, REQUESTS, POSITIONS, BLOCK_V,
        )  # fmt: skip
        token = tl.where(sampled, sample, token)
    log_p = log_prob_at(
        target_row_ptr,
        target_inside & real,
        draft_id,
        target_max,
        target_log_sum,
        inv_temperature,
        vocab_size,
    )
    token_log_p = log_prob_at(
        target_row_ptr, target_inside, token, target_max, target_log_sum, inv_temperature, vocab_size
    )
    log_q = tl.zeros(log_p.shape, tl.float32)
    draft_max = tl.full(log_p.shape, NEG_INF, tl.float32)
    draft_log_sum = tl.zeros(log_p.shape, tl.float32)
    draft_offset = tl.full(log_p.shape, -1, tl.int64)
    if (METHOD == PROBABILISTIC or METHOD == BLOCK) and HAS_DRAFT:  # noqa: SIM109 (constexprs)
        # q is needed where a real draft meets a sampled row, as in the split plan.
        draft_offset = draft_row_offset(
            request, draft_start, position, draft_slot_ptr, num_draft_rows, slot_capacity, draft_stride,
            slot_stride, SLOTTED,
        )  # fmt: skip
        needs_q = sampled & real
        draft_inside = draft_offset >= 0
        draft_max, draft_sum, _ = _rows_stats(
            draft_ptr + tl.maximum(draft_offset, 0), needs_q & draft_inside, vocab_size, inv_temperature,
            BLOCK_V,
        )  # fmt: skip
        draft_log_sum = tl.log(draft_sum)
        draft_logit = tl.load(
            draft_ptr + tl.maximum(draft_offset, 0) + tl.where(real & draft_inside, draft_id, 0),
            mask=needs_q & draft_inside,
            other=NEG_INF,
        )
        log_q = log_prob(draft_logit, draft_max, draft_log_sum, inv_temperature)
        draft_max = tl.where(needs_q, draft_max, NEG_INF)
        draft_log_sum = tl.where(needs_q, draft_log_sum, 0.0)
    return (
        target_max,
        target_log_sum,
        token,
        token_log_p,
        log_p,
        log_q,
        draft_max,
        draft_log_sum,
        draft_offset,
    )


@triton.jit
def _rows_block_keep(target_ptr, draft_ptr, position, is_row, is_draft, draft_id, real, sampled,
                     target_inside, target_offset, draft_offset, max_num_drafts, vocab_size, inv_temperature,
                     seed, step,
                     target_max, target_log_sum, draft_max, draft_log_sum, log_p, log_q,
                     HAS_DRAFT: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Block verification's decisions of every row ``[R, P]`` of a sampled request: ``(the row is
    before m, the largest kept index; log w of each row)``. Index ``i`` (``1 <= i <= n``) is kept
    iff ``eta_i < h_i``, ``eta_i`` the acceptance uniform of position ``i - 1``; ``h_n = w_n``, and
    below ``n`` ``h_i <= w_i``, so ``eta_i >= w_i`` rejects without the residual mass."""
    log_ratio = block_log_ratio(log_p, log_q, real)
    log_weight = tl.zeros(log_p.shape, tl.float32)
    running = tl.zeros(sampled.shape, tl.float32)
    earlier = 0
    while earlier < max_num_drafts:
        running = block_next_log_weight(running, _at(log_ratio, position == earlier, NEG_INF))
        log_weight = tl.where(position == earlier + 1, running, log_weight)
        earlier += 1
    eta = accept_uniform(seed, step, position - 1)
    weight = tl.exp(log_weight)
    needs_mass = sampled & (position >= 1) & is_draft & (eta < weight)
    mass = _rows_block_mass(
        target_ptr + target_offset, target_inside & needs_mass, draft_ptr + tl.maximum(draft_offset, 0),
        draft_offset >= 0, vocab_size, inv_temperature, target_max, target_log_sum, draft_max, draft_log_sum,
        log_weight, draft_id, HAS_DRAFT, BLOCK_V,
    )  # fmt: skip
    keep = tl.where(needs_mass, block_keep_probability(mass, weight), weight)
    kept = tl.max(tl.where((position >= 1) & is_row & (eta < keep), position, 0), axis=1, keep_dims=True)
    return position < kept, log_weight


@triton.jit
def _rows_block_masses(target_ptr, draft_ptr, final_offset, final_inside, final_draft_offset, residual,
                       excluded, final_laws, vocab_size, inv_temperature, REQUESTS: tl.constexpr,
                       BLOCK_V: tl.constexpr, NUM_BLOCKS: tl.constexpr):  # fmt: skip
    """The ``[R, NUM_BLOCKS]`` block masses ``(scale, sum)`` (`rules.block_mass`) of each request's
    final law, the residual ``(p - q)+`` or the target ``p`` (without a rejected one-hot draft),
    and of the fallback ``p``, for a law without mass: ``(law scale, law sum, fallback scale,
    fallback sum)``. A block of ``NOISE_GROUP`` tokens spans whole tiles, merged as they come."""
    lanes = tl.arange(0, BLOCK_V)[None, :]
    blocks = tl.arange(0, NUM_BLOCKS)[None, :]
    law_scale = tl.full([REQUESTS, NUM_BLOCKS], NEG_INF, tl.float32)
    law_total = tl.zeros([REQUESTS, NUM_BLOCKS], tl.float32)
    fallback_scale = tl.full([REQUESTS, NUM_BLOCKS], NEG_INF, tl.float32)
    fallback_total = tl.zeros([REQUESTS, NUM_BLOCKS], tl.float32)
    block_law = _no_mass(REQUESTS)
    block_fallback = _no_mass(REQUESTS)
    tile_start = 0
    while tile_start < vocab_size:
        residual_law, target_law = _final_laws(
            target_ptr, draft_ptr, final_offset, final_inside, final_draft_offset, tile_start + lanes,
            vocab_size, final_laws, inv_temperature, excluded,
        )  # fmt: skip
        tile_mass = block_mass(
            tl.where(residual, residual_law[0], target_law[0]),
            tl.where(residual, residual_law[1], target_law[1]),
            tl.where(residual, residual_law[2], target_law[2]), 1, True,
        )  # fmt: skip
        block_law = _merge_mass(block_law, tile_mass)
        block_fallback = _merge_mass(
            block_fallback, block_mass(target_law[0], target_law[1], target_law[0] > NEG_INF, 1, True)
        )
        tile_start += BLOCK_V
        if (tile_start % NOISE_GROUP == 0) | (tile_start >= vocab_size):
            here = blocks == (tile_start - 1) // NOISE_GROUP
            law_scale = tl.where(here, block_law[0], law_scale)
            law_total = tl.where(here, block_law[1], law_total)
            fallback_scale = tl.where(here, block_fallback[0], fallback_scale)
            fallback_total = tl.where(here, block_fallback[1], fallback_total)
            block_law = _no_mass(REQUESTS)
            block_fallback = _no_mass(REQUESTS)
    return law_scale, law_total, fallback_scale, fallback_total


@triton.jit
def _rows_final_draw(target_ptr, draft_ptr, final_offset, final_inside, final_draft_offset, residual,
                     excluded, final_laws, vocab_size, inv_temperature, seed, step, stop,
                     REQUESTS: tl.constexpr, BLOCK_V: tl.constexpr, NUM_BLOCKS: tl.constexpr):  # fmt: skip
    """Each request's token drawn from its final row under the canonical scheme: the block its
    uniform picks by the block masses (the target law's where the residual has none), then the
    Gumbel-max within it, ``[R, 1]``."""
    law_scale, law_total, fallback_scale, fallback_total = _rows_block_masses(
        target_ptr, draft_ptr, final_offset, final_inside, final_draft_offset, residual, excluded, final_laws,
        vocab_size, inv_temperature, REQUESTS, BLOCK_V, NUM_BLOCKS,
    )  # fmt: skip
    # A law without mass falls back to the target law, as the specification says.
    fallback = tl.max(law_scale, axis=1, keep_dims=True) == NEG_INF
    scale = tl.where(fallback, fallback_scale, law_scale)
    total = tl.where(fallback, fallback_total, law_total)
    block = pick_block(scale, total, block_uniform(seed, step, stop), NUM_BLOCKS)
    residual = residual & ~fallback
    excluded = tl.where(fallback, -1, excluded)
    lanes = tl.arange(0, BLOCK_V)[None, :]
    best_key = tl.full([REQUESTS, BLOCK_V], NEG_INF, tl.float32)
    best_token = tl.zeros([REQUESTS, BLOCK_V], tl.int32)
    # The tiles of the picked block (only those inside a vocabulary shorter than a block).
    part = 0
    while part < tl.minimum(vocab_size, NOISE_GROUP):
        tokens = block * NOISE_GROUP + part + lanes
        residual_law, target_law = _final_laws(
            target_ptr, draft_ptr, final_offset, final_inside, final_draft_offset, tokens, vocab_size,
            final_laws, inv_temperature, excluded,
        )  # fmt: skip
        noise = _noise_rows(seed, step, stop, block * NOISE_GROUP + part, BLOCK_V)
        keys = tl.where(
            residual,
            block_keys(residual_law[0], residual_law[1], residual_law[2], noise, True),
            block_keys(target_law[0], target_law[1], target_law[2], noise, False),
        )
        # Strict `>`: parts ascend, so a lane keeps its lowest token among equal keys.
        take = keys > best_key
        best_key = tl.where(take, keys, best_key)
        best_token = tl.where(take, tokens, best_token)
        part += BLOCK_V
    # A row without any mass (every logit rounds to probability 0) emits its block's first token.
    return gumbel_max(best_key, best_token, block * NOISE_GROUP, 1, True)


@triton.jit
def _rows_final_row(target_ptr, draft_ptr, at_stop, stop, real, draft_id, sampled, target_inside,
                    target_offset, draft_offset, token, token_log_p, target_max, target_log_sum, draft_max,
                    draft_log_sum, log_weight, vocab_size, inv_temperature, seed, step, METHOD: tl.constexpr,
                    HAS_DRAFT: tl.constexpr, REQUESTS: tl.constexpr, BLOCK_V: tl.constexpr,
                    NUM_BLOCKS: tl.constexpr):  # fmt: skip
    """Each request's emitted token at its final row ``stop`` (``at_stop`` marks it among the rows)
    and its ``log p``, ``[R, 1]`` each: the row token where it is known (greedy and strict rows),
    else the scheme's draw from the residual or the target law."""
    final_token = _at(token, at_stop, -1)
    final_log_p = _at(token_log_p, at_stop, NEG_INF)
    if METHOD != STRICT:
        mode = final_mode(_at(real.to(tl.int32), at_stop, 0) > 0, sampled, METHOD, HAS_DRAFT)
        residual = mode == SAMPLE_RESIDUAL
        excluded = tl.where(mode == SAMPLE_WITHOUT_DRAFT, _at(draft_id, at_stop, -1), -1)
        final_inside = (_at(target_inside.to(tl.int32), at_stop, 0) > 0) & (mode != SAMPLE_NONE)
        final_offset = _at(target_offset, at_stop, 0)
        final_max = _at(target_max, at_stop, NEG_INF)
        final_log_sum = _at(target_log_sum, at_stop, NEG_INF)
        # The residual's p is weighted (block verification's w_m, else 1): log(w p) = e - (log_sum - log w).
        residual_log_sum = final_log_sum - tl.where(residual, _at(log_weight, at_stop, NEG_INF), 0.0)
        final_laws = (
            final_max, final_log_sum, residual_log_sum, _at(draft_max, at_stop, NEG_INF),
            _at(draft_log_sum, at_stop, NEG_INF),
        )  # fmt: skip
        final_draft_offset = tl.where(residual, _at(draft_offset, at_stop, -1), -1)
        sampled_token = _rows_final_draw(
            target_ptr, draft_ptr, final_offset, final_inside, final_draft_offset, residual, excluded,
            final_laws, vocab_size, inv_temperature, seed, step, stop, REQUESTS, BLOCK_V, NUM_BLOCKS,
        )  # fmt: skip
        sampled_log_p = log_prob_at(
            target_ptr + final_offset, final_inside, sampled_token, final_max, final_log_sum, inv_temperature,
            vocab_size,
        )  # fmt: skip
        final_token = tl.where(mode == SAMPLE_NONE, final_token, sampled_token)
        final_log_p = tl.where(mode == SAMPLE_NONE, final_log_p, sampled_log_p)
    return final_token, final_log_p


# Counts that change from call to call are not specialised on.
@triton.jit
def _rows_tree_walk(tree_parent_ptr, draft_start, position, is_draft, draft_id, real, token, token_log_p,
                    num_draft_ids, num_drafts, live, request, max_num_drafts, token_ids_ptr, logprobs_ptr,
                    num_emitted_ptr, accepted_nodes_ptr, POSITIONS: tl.constexpr):  # fmt: skip
    """Tree verification (`reference.tree`) of every request from its rows' tokens ``token`` ``[R, P]``
    (the Gumbel-max sample of a sampled row, the argmax of a greedy one): from the root, the first
    child of the current node (node ``i`` at position ``i``, its row ``i + 1``) whose draft is the
    row's token is accepted, until a token no child holds is emitted. Writes every output."""
    parents = tl.load(
        tree_parent_ptr + draft_start + position,
        mask=is_draft & (draft_start + position < num_draft_ids),
        other=-2,
    ).to(tl.int64)
    row = tl.zeros(num_drafts.shape, tl.int64)
    walking = live & (row == 0)
    emitted = tl.zeros(num_drafts.shape, tl.int64)
    tokens = tl.full(token.shape, -1, tl.int64)
    log_probs = tl.full(token_log_p.shape, float("nan"), tl.float32)
    nodes = tl.full(token.shape, -1, tl.int64)
    while tl.max(walking.to(tl.int32)) > 0:
        here = position == row
        drawn = _at(token, here, -1).to(tl.int64)
        level = position == emitted
        tokens = tl.where(walking & level, drawn, tokens)
        log_probs = tl.where(walking & level, _at(token_log_p, here, NEG_INF), log_probs)
        child = tree_child(position, draft_id, parents, real, row - 1, drawn, POSITIONS, 1, True)
        accept = walking & (child < POSITIONS) & (emitted < num_drafts)
        nodes = tl.where(accept & level, child, nodes)
        emitted += walking.to(tl.int64)
        row = tl.where(accept, child + 1, row)
        walking = accept
    width = max_num_drafts + 1
    out = request * width + position
    tl.store(token_ids_ptr + out, tokens, mask=live & (position < width))
    tl.store(logprobs_ptr + out, log_probs, mask=live & (position < width))
    tl.store(accepted_nodes_ptr + request * max_num_drafts + position, nodes.to(tl.int32),
             mask=live & (position < max_num_drafts))  # fmt: skip
    tl.store(num_emitted_ptr + request, emitted.to(tl.int32), mask=live)


@triton.jit
def rows_kernel(target_ptr, draft_ptr, draft_ids_ptr, cu_ptr, temperature_ptr, seed_ptr, step_ptr,
                draft_slot_ptr, rates_ptr, geometry_ptr, token_ids_ptr, logprobs_ptr, num_emitted_ptr,
                accepted_nodes_ptr, target_stride, draft_stride, slot_stride, METHOD: tl.constexpr,
                HAS_DRAFT: tl.constexpr, SLOTTED: tl.constexpr, REQUESTS: tl.constexpr,
                POSITIONS: tl.constexpr, BLOCK_V: tl.constexpr, NUM_BLOCKS: tl.constexpr):  # fmt: skip
    """Every output of ``REQUESTS`` requests: their rows' statistics and decisions, the walk, the final row.

    Args:
        The inputs, geometry record and outputs are the split plan's (`rejection_kernels`; a tree's
        parents travel as ``rates_ptr``); this plan has no workspace; its geometry record holds the
        request count ``B``, ``max_n`` and ``V`` as well.
        ``POSITIONS >= max_num_drafts + 1``.
    """
    # Grid (cdiv(B, REQUESTS),). Lanes past the batch repeat its last request and store nothing.
    num_requests = geometry_field(geometry_ptr, GEOMETRY.num_requests)
    max_num_drafts = geometry_field(geometry_ptr, GEOMETRY.max_num_drafts)
    vocab_size = geometry_field(geometry_ptr, GEOMETRY.vocab_size)
    first = tl.program_id(0) * REQUESTS + tl.arange(0, REQUESTS)[:, None]
    live = first < num_requests
    request = tl.minimum(first, num_requests - 1).to(tl.int64)
    num_target_rows = geometry_field(geometry_ptr, GEOMETRY.num_target_rows)
    num_draft_ids = geometry_field(geometry_ptr, GEOMETRY.num_draft_ids)
    draft_start, num_drafts = request_span(cu_ptr, request, max_num_drafts)
    temperature = tl.load(temperature_ptr + request)
    sampled = temperature > 0.0
    inv_temperature = inverse_temperature(temperature)
    seed = tl.load(seed_ptr + request)
    step = tl.load(step_ptr + request)

    # Every row of the requests: [R, P].
    position = tl.arange(0, POSITIONS)[None, :]
    is_row = position <= num_drafts
    is_draft, draft_id, real = draft_at(
        draft_ids_ptr, draft_start, position, num_drafts, num_draft_ids, vocab_size
    )
    target_row = draft_start + request + position
    target_inside = is_row & (target_row < num_target_rows)
    target_offset = tl.where(target_inside, target_row, 0) * target_stride
    laws = _rows_laws(
        target_ptr, draft_ptr, draft_slot_ptr, request, draft_start, position, draft_id, real, sampled,
        target_inside, target_offset, geometry_field(geometry_ptr, GEOMETRY.num_draft_rows),
        geometry_field(geometry_ptr, GEOMETRY.slot_capacity), draft_stride, slot_stride, vocab_size,
        inv_temperature, seed, step, METHOD, HAS_DRAFT, SLOTTED, REQUESTS, POSITIONS, BLOCK_V,
    )  # fmt: skip
    target_max, target_log_sum, token, token_log_p, log_p, log_q, draft_max, draft_log_sum, draft_offset = (
        laws
    )
    if METHOD == TREE:
        _rows_tree_walk(
            rates_ptr, draft_start, position, is_draft, draft_id, real, token, token_log_p,
            num_draft_ids, num_drafts, live, request, max_num_drafts, token_ids_ptr, logprobs_ptr,
            num_emitted_ptr, accepted_nodes_ptr, POSITIONS,
        )  # fmt: skip
    else:
        _rows_chain(
            target_ptr, draft_ptr, draft_ids_ptr, rates_ptr, geometry_ptr, token_ids_ptr, logprobs_ptr,
            num_emitted_ptr, request, live, draft_start, num_drafts, max_num_drafts, num_draft_ids,
            position, is_row, is_draft, draft_id, real, sampled, target_inside, target_offset, token,
            token_log_p, log_p, log_q, target_max, target_log_sum, draft_max, draft_log_sum, draft_offset,
            vocab_size, inv_temperature, seed, step, METHOD, HAS_DRAFT, REQUESTS, BLOCK_V, NUM_BLOCKS,
        )  # fmt: skip


@triton.jit
def _rows_chain(target_ptr, draft_ptr, draft_ids_ptr, rates_ptr, geometry_ptr, token_ids_ptr, logprobs_ptr,
                num_emitted_ptr, request, live, draft_start, num_drafts, max_num_drafts, num_draft_ids,
                position, is_row, is_draft, draft_id, real, sampled, target_inside, target_offset, token,
                token_log_p, log_p, log_q, target_max, target_log_sum, draft_max, draft_log_sum, draft_offset,
                vocab_size, inv_temperature, seed, step, METHOD: tl.constexpr, HAS_DRAFT: tl.constexpr,
                REQUESTS: tl.constexpr, BLOCK_V: tl.constexpr, NUM_BLOCKS: tl.constexpr):  # fmt: skip
    """The chain methods' decisions of every row, the walk to the first rejection (block verification:
    to the largest kept index), and the final row's token: every output."""
    # The row decisions.
    greedy_accept = real & (draft_id == token)
    log_weight = tl.zeros(log_p.shape, tl.float32)
    if METHOD == SYNTHETIC:
        accept = synthetic_accepts(
            draft_ids_ptr, rates_ptr, draft_start, position, num_drafts, num_draft_ids,
            geometry_field(geometry_ptr, GEOMETRY.num_rates), seed, step, vocab_size,
        )  # fmt: skip
    elif METHOD == STRICT:
        # The row token of a sampled strict row is its target sample: the same comparison.
        accept = greedy_accept
    elif METHOD == PROBABILISTIC:
        accept = tl.where(
            sampled, accepts(log_p, log_q, accept_uniform(seed, step, position), real), greedy_accept
        )
    else:
        kept, log_weight = _rows_block_keep(
            target_ptr, draft_ptr, position, is_row, is_draft, draft_id, real, sampled, target_inside,
            target_offset, draft_offset, max_num_drafts, vocab_size, inv_temperature, seed, step, target_max,
            target_log_sum, draft_max, draft_log_sum, log_p, log_q, HAS_DRAFT, BLOCK_V,
        )  # fmt: skip
        accept = tl.where(sampled, kept, greedy_accept)

    # The walk: the first rejection, or the bonus row.
    stop = tl.min(tl.where(is_draft & ~accept, position, num_drafts), axis=1, keep_dims=True)
    width = max_num_drafts + 1
    out = request * width + position
    written = live & (position < width) & (position != stop)
    emitted = position < stop
    tl.store(token_ids_ptr + out, tl.where(emitted, draft_id, -1), mask=written)
    tl.store(logprobs_ptr + out, tl.where(emitted, log_p, float("nan")), mask=written)
    tl.store(num_emitted_ptr + request, (stop + 1).to(tl.int32), mask=live)

    # The final row, at the stop.
    final_token, final_log_p = _rows_final_row(
        target_ptr, draft_ptr, position == stop, stop, real, draft_id, sampled, target_inside, target_offset,
        draft_offset, token, token_log_p, target_max, target_log_sum, draft_max, draft_log_sum, log_weight,
        vocab_size, inv_temperature, seed, step, METHOD, HAS_DRAFT, REQUESTS, BLOCK_V, NUM_BLOCKS,
    )  # fmt: skip
    out = request * width + stop
    tl.store(token_ids_ptr + out, final_token.to(tl.int64), mask=live)
    tl.store(logprobs_ptr + out, final_log_p, mask=live)
