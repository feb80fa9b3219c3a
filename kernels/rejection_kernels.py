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

On a GPU of compute capability 9.0 or later, launches 2 to 4 are programmatically dependent
(`kernels.rejection.programmatic_launch`): the driver places a launch's programs while the one
before it finishes, and each program first waits for it (`_after_previous_launch`), which saves
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
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

PROBABILISTIC = tl.constexpr(0)
STRICT = tl.constexpr(1)
SYNTHETIC = tl.constexpr(2)
BLOCK = tl.constexpr(3)

# What the final row of a request needs: sample_kernel finds it and records it for emit_kernel.
SAMPLE_NONE = tl.constexpr(0)  # the token is already known (greedy argmax, strict sample)
SAMPLE_TARGET = tl.constexpr(1)  # y ~ p: bonus row, placeholder draft, synthetic rejection
SAMPLE_WITHOUT_DRAFT = tl.constexpr(2)  # one-hot draft rejected: y ~ p restricted to x != d
SAMPLE_RESIDUAL = tl.constexpr(3)  # y ~ (p - q)+

ACCEPT_PURPOSE = tl.constexpr(0)
SAMPLE_PURPOSE = tl.constexpr(1)
BLOCK_PURPOSE = tl.constexpr(2)
# The canonical scheme reads each word of a Philox call as a run of NOISE_RUN tokens, four runs a
# group; a group is also the block the final row's inverse CDF picks.
NOISE_RUN = tl.constexpr(256)
NOISE_GROUP = tl.constexpr(1024)

# A row whose block masses (`_row_block_mass`, relative to the row's largest probability) sum below
# this is recomputed block by block, each relative to its own largest (`_block_mass`).
FAST_MASS_FLOOR = tl.constexpr(2.0**-60)
# The largest log-sum of a final row's residual that the sampling pass's fast way takes (`_fast_row`).
FAST_LOG_SUM = tl.constexpr(600.0)
# ln(2**-1075): float64 rounds a probability below this to zero.
LOG_ZERO = tl.constexpr(-745.1332191019412)
# Temperatures above this act as this: the law is uniform to within 1e-30 either way, and the
# reciprocal stays a normal float32.
MAX_TEMPERATURE = tl.constexpr(1e30)
NEG_INF = tl.constexpr(float("-inf"))
NO_SPLIT = tl.constexpr(2**30)
# Field indices of the per-request final-row records.
INFO_MODE = tl.constexpr(0)
INFO_POSITION = tl.constexpr(1)
INFO_TARGET_OFFSET = tl.constexpr(2)
INFO_DRAFT_OFFSET = tl.constexpr(3)
INFO_DRAFT_TOKEN = tl.constexpr(4)
INFO_INTS = tl.constexpr(5)
INFO_TARGET_MAX = tl.constexpr(0)
INFO_TARGET_LOG_SUM = tl.constexpr(1)
INFO_DRAFT_MAX = tl.constexpr(2)
INFO_DRAFT_LOG_SUM = tl.constexpr(3)
INFO_LOG_WEIGHT = tl.constexpr(4)  # log w of the final row's residual max(w p - q, 0): 0 but for block
INFO_FLOATS = tl.constexpr(5)
# Field indices of the per-row records `_finish_row` writes for sample_kernel.
ROW_TARGET_MAX = tl.constexpr(0)
ROW_TARGET_LOG_SUM = tl.constexpr(1)
ROW_DRAFT_MAX = tl.constexpr(2)
ROW_DRAFT_LOG_SUM = tl.constexpr(3)
ROW_DRAFT_LOG_PROB = tl.constexpr(4)  # log p(d_i), the logprob of an accepted draft
ROW_TOKEN_LOG_PROB = tl.constexpr(5)  # log p of ROW_TOKEN
ROW_LOG_RATIO = tl.constexpr(6)  # block: log p(d) - log q(d) (-inf where p(d) = 0, +inf where q(d) = 0)
ROW_LOG_WEIGHT = tl.constexpr(7)  # block: log w_i of the row (rows 1 to n, sampled requests)
ROW_FLOATS = tl.constexpr(8)
ROW_TOKEN = tl.constexpr(0)  # the argmax of a greedy row, the target sample of a strict one
ROW_INTS = tl.constexpr(1)
# The workspace of a call (int32 words) starts with the split records of row_stats_kernel,
# ``[B * (max_n + 1) * num_splits]`` each, indexed like its programs: it finds them from its own
# grid (`_split_record`), with no load on its path. Every record starts 16-byte aligned.
SPLIT_TARGET_MAX = tl.constexpr(0)  # fp32
SPLIT_TARGET_SUM = tl.constexpr(1)  # fp32
SPLIT_TARGET_ARG = tl.constexpr(2)  # int32, first argmax
SPLIT_DRAFT_MAX = tl.constexpr(3)  # fp32, probabilistic
SPLIT_DRAFT_SUM = tl.constexpr(4)  # fp32, probabilistic
SPLIT_CAND_LOGIT = tl.constexpr(5)  # fp32, strict
SPLIT_CAND_GUMBEL = tl.constexpr(6)  # fp32, strict
SPLIT_CAND_TOKEN = tl.constexpr(7)  # int32, strict
SPLIT_RECORDS = tl.constexpr(8)
# Field indices of the geometry record, ``[GEOMETRY_FIELDS]`` int64, one per plan: first the counts
# that only bound reads (they change from call to call, so no kernel is specialised on them), then
# the offsets of the records after the split records that kernels find through it, in 4-byte words
# (row_stats_kernel and sample_kernel have no parameter to spare). Every offset is a multiple of 4,
# so every record is 16-byte aligned like the workspace itself.
GEO_NUM_TARGET_ROWS = tl.constexpr(0)
GEO_NUM_DRAFT_IDS = tl.constexpr(1)
GEO_NUM_DRAFT_ROWS = tl.constexpr(2)  # D, or S for slotted drafts
GEO_SLOT_CAPACITY = tl.constexpr(3)  # K of slotted drafts
GEO_NUM_RATES = tl.constexpr(4)
WORK_COUNTER = tl.constexpr(5)  # int32 [B * (max_n + 1)], zero at launch
# int32 [B], zero at launch: max_n + 1 - j for a request's first rejection j (row_stats_kernel), but
# for a sampled block-verification request m, its largest kept index (block_keep_kernel).
WORK_STOP_FLAG = tl.constexpr(6)
WORK_ROW_FLOAT = tl.constexpr(7)  # fp32 [B * (max_n + 1), ROW_FLOATS]
WORK_ROW_INT = tl.constexpr(8)  # int32 [B * (max_n + 1), ROW_INTS]
GEO_NUM_REQUESTS = tl.constexpr(9)  # B, read by the rows plan (`rows_kernels`) only
GEO_MAX_NUM_DRAFTS = tl.constexpr(10)  # max_n, read by the rows plan only
WORK_INFO_INT = tl.constexpr(11)  # int64 [B, INFO_INTS]
WORK_INFO_FLOAT = tl.constexpr(12)  # fp32 [B, INFO_FLOATS]
WORK_BLOCK_SCALE = tl.constexpr(13)  # fp32 [B * num_blocks]
WORK_BLOCK_SUM = tl.constexpr(14)  # fp32 [B * num_blocks]
GEOMETRY_FIELDS = tl.constexpr(15)


@triton.jit
def _clean(x):
    """A float32 logit with NaN read as ``-inf``."""
    x = x.to(tl.float32)
    return tl.where(x == x, x, NEG_INF)


@triton.jit
def _scaled(x, row_max, inv_temperature):
    """``e(x) = (x - max) / T``, exactly 0 where ``x`` equals the max (so all-``inf`` rows work)."""
    return tl.where(x == row_max, 0.0, (x - row_max) * inv_temperature)


@triton.jit
def _rescale(old_max, new_max, inv_temperature):
    """The factor that moves a sum of ``exp(e)`` from ``old_max`` to ``new_max >= old_max``."""
    return tl.where(old_max == new_max, 1.0, tl.exp((old_max - new_max) * inv_temperature))


@triton.jit
def _inv_temperature(temperature):
    """``1 / T`` for a sampled request; 1 for a greedy one (its logprobs use ``T = 1``)."""
    sampled = temperature > 0.0
    safe = tl.where(sampled, tl.minimum(temperature, MAX_TEMPERATURE), 1.0)
    return 1.0 / safe


@triton.jit
def _after_previous_launch(PDL: tl.constexpr):
    """Where a call's launches after the first are programmatically dependent (``PDL``, sm_90 and
    later): wait until the previous launch has finished and its writes are visible, then let the
    next launch place its programs, which wait here in turn. Called before any write and any read
    of what a launch writes; the batch's own tensors, which no launch writes, may be read first,
    while the previous launch finishes."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _request_span(cu_ptr, request, max_num_drafts):
    """The first draft index and the draft count of a request, clamped so no value reads out of bounds.

    Args:
        cu_ptr: ``[B + 1]`` int32 prefix sums of the draft counts.
    """
    start = tl.maximum(tl.load(cu_ptr + request).to(tl.int64), 0)
    end = tl.load(cu_ptr + request + 1).to(tl.int64)
    num_drafts = tl.minimum(tl.maximum(end - start, 0), max_num_drafts)
    return start, num_drafts


@triton.jit
def _geometry(geometry_ptr, field):
    """Field ``field`` (a ``GEO_*`` or ``WORK_*`` index) of the geometry record, int64.

    Args:
        geometry_ptr: ``[GEOMETRY_FIELDS]`` int64 geometry record.
    """
    # Every program reads the record, and the logit stream would push it out of L1: keep it there
    # (without the hint row_stats_kernel ran about 4% slower at B = 256 on an H100).
    return tl.load(geometry_ptr + field, eviction_policy="evict_last")


@triton.jit
def _record(work_ptr, geometry_ptr, field, dtype: tl.constexpr):
    """The workspace record ``field`` (a ``WORK_*`` index) as a pointer to ``dtype``.

    Args:
        work_ptr: the int32 workspace of the call.
        geometry_ptr: ``[GEOMETRY_FIELDS]`` int64 geometry record; holds the record's offset in words.
    """
    # The offset is a multiple of 4 words: the record keeps the workspace's 16-byte alignment.
    # (Loaded here rather than through `_geometry`: each device-function call costs the CPU
    # interpreter a re-patch of triton.language.)
    offset = tl.multiple_of(tl.load(geometry_ptr + field, eviction_policy="evict_last"), 4)
    return (work_ptr + offset).to(tl.pointer_type(dtype))


@triton.jit
def _split_record(work_ptr, record: tl.constexpr, dtype: tl.constexpr):
    """Split record ``record`` (a ``SPLIT_*`` index) as a pointer to ``dtype``.

    A split record holds one entry per program of row_stats_kernel, so its length comes from the
    grid: only row_stats_kernel (and `_finish_row`, which it runs) may call this.

    Args:
        work_ptr: the int32 workspace of the call; the split records are at its start.
    """
    # Each record's length is rounded up to 4 words (16 bytes).
    length = (tl.num_programs(0).to(tl.int64) * tl.num_programs(1) + 3) // 4 * 4
    return (work_ptr + record * length).to(tl.pointer_type(dtype))


@triton.jit
def _offsets(step, position, purpose, token):
    """The canonical Philox offsets ``(((step * 128 + i) * 4 + purpose) << 22) + token``, mod 2**64."""
    return (((step * 128 + position) * 4 + purpose) << 22) + token


@triton.jit
def _philox(seed, step, position, purpose, calls):
    """The four words of Philox4x32-10 at ``_offsets(step, position, purpose, calls)``, ``calls < 2**22``.

    Key ``seed``, counter ``(offset low, offset high, 0, 0)``, as `tl.randint4x`. The offset of a
    call is the row's base, whose low 22 bits are zero, plus the call, so the high counter word is
    the row's own, one scalar: the first two rounds then multiply a single vector word, not two.
    Each multiplication is one 32 x 32 -> 64-bit product giving both halves.
    """
    base = _offsets(step, position, purpose, 0)
    c0 = base.to(tl.uint32) + calls.to(tl.uint32)
    c1 = (base >> 32).to(tl.uint32)
    c2 = tl.full([], 0, tl.uint32)
    c3 = tl.full([], 0, tl.uint32)
    key = seed.to(tl.uint64)
    k0 = (key & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((key >> 32) & 0xFFFFFFFF).to(tl.uint32)
    for _ in tl.static_range(10):
        product_a = c0.to(tl.uint64) * 0xD2511F53
        product_b = c2.to(tl.uint64) * 0xCD9E8D57
        c0 = (product_b >> 32).to(tl.uint32) ^ c1 ^ k0
        c2 = (product_a >> 32).to(tl.uint32) ^ c3 ^ k1
        c1 = product_b.to(tl.uint32)
        c3 = product_a.to(tl.uint32)
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def _to_uniform(word):
    """A Philox word mapped to ``[0, 1)`` as `tl.rand` maps it."""
    word = word.to(tl.int32, bitcast=True)
    word = tl.where(word < 0, -word - 1, word)
    return word * 4.6566127342e-10


@triton.jit
def _noise_group(seed, step, position, group_start):
    """The uniforms of tokens ``group_start + [0, NOISE_GROUP)`` of one row's sampling stream.

    Returns four ``[NOISE_RUN]`` runs, run ``j`` the tokens ``group_start + j * NOISE_RUN + lane``:
    word ``j`` of the Philox call ``group_start / 4 + lane`` (``canonical-v3``,
    `reference.schemes`). ``group_start`` is a multiple of ``NOISE_GROUP``.
    """
    calls = group_start // 4 + tl.arange(0, NOISE_RUN)
    w0, w1, w2, w3 = _philox(seed, step, position, SAMPLE_PURPOSE, calls)
    return _to_uniform(w0), _to_uniform(w1), _to_uniform(w2), _to_uniform(w3)


@triton.jit
def _noise_tile(seed, step, position, group_start):
    """The ``[NOISE_GROUP]`` uniforms of tokens ``group_start + [0, NOISE_GROUP)``, in token order."""
    u0, u1, u2, u3 = _noise_group(seed, step, position, group_start)
    # [run, lane] flattened: join gives [lane, a, b] with run a + 2 b; permute puts the run first.
    joined = tl.join(tl.join(u0, u1), tl.join(u2, u3))
    return tl.reshape(tl.permute(joined, (2, 1, 0)), (NOISE_GROUP,))


@triton.jit
def _draft_row_offset(
    request,
    draft_start,
    position,
    draft_slot_ptr,
    num_draft_rows,
    slot_capacity,
    draft_stride,
    slot_stride,
    SLOTTED: tl.constexpr,
):
    """The element offset of a draft row, or -1 where the row lies outside the draft tensor.

    Flat drafts: row ``draft_start + position`` of ``[D, V]``. Slotted drafts: row ``position`` of
    slot ``draft_slot[request]`` of ``[S, K, V]``; a slot outside ``[0, S)`` or a position at or past
    ``K`` reads nothing.

    Args:
        draft_slot_ptr: ``[B]`` int32/int64 slots (read only if ``SLOTTED``).
    """
    if SLOTTED:
        slot = tl.load(draft_slot_ptr + request).to(tl.int64)
        inside = (slot >= 0) & (slot < num_draft_rows) & (position < slot_capacity)
        offset = slot * slot_stride + position * draft_stride
    else:
        row = draft_start + position
        inside = row < num_draft_rows
        offset = row * draft_stride
    return tl.where(inside, offset, -1)


@triton.jit
def _split_stats(
    row_ptr,
    row_inside,
    split,
    vocab_size,
    inv_temperature,
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
        x = _clean(tl.load(row_ptr + tokens, mask=in_vocab & row_inside, other=NEG_INF))
        tile_max, tile_lane = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        # Strict `>`: the first maximum wins ties, as the specification's argmax does.
        row_arg = tl.where(tile_max > row_max, first + tile * BLOCK_V + tile_lane, row_arg)
        row_max, row_sum = _online_sum(x, tile_max, in_vocab, row_max, row_sum, inv_temperature)
    return row_max, row_sum, row_arg


@triton.jit
def _online_sum(x, tile_max, in_vocab, row_max, row_sum, inv_temperature):
    """The running ``(max, sum of exp(e))`` of a row after one more tile ``x`` whose max is ``tile_max``."""
    new_max = tl.maximum(row_max, tile_max)
    weights = tl.where(in_vocab, tl.exp(_scaled(x, new_max, inv_temperature)), 0.0)
    return new_max, row_sum * _rescale(row_max, new_max, inv_temperature) + tl.sum(weights, axis=0)


@triton.jit
def _split_moments(
    target_row_ptr,
    target_inside,
    draft_row_ptr,
    draft_inside,
    split,
    vocab_size,
    inv_temperature,
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
        x = _clean(tl.load(target_row_ptr + tokens, mask=in_vocab & target_inside, other=NEG_INF))
        if PAIR:
            y = _clean(tl.load(draft_row_ptr + tokens, mask=in_vocab & draft_inside, other=NEG_INF))
            draft_max, draft_sum = _online_sum(
                y, tl.max(y, axis=0), in_vocab, draft_max, draft_sum, inv_temperature
            )
        target_max, target_sum = _online_sum(
            x, tl.max(x, axis=0), in_vocab, target_max, target_sum, inv_temperature
        )
    return target_max, target_sum, draft_max, draft_sum


@triton.jit
def _split_sample_stats(row_ptr, row_inside, split, vocab_size, inv_temperature, seed, step, position,
                        SPLIT_SIZE: tl.constexpr):  # fmt: skip
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
        x = _clean(tl.load(row_ptr + tokens, mask=in_vocab & row_inside, other=NEG_INF))
        new_max = tl.maximum(row_max, tl.max(x, axis=0))
        scaled = _scaled(x, new_max, inv_temperature)
        weights = tl.where(in_vocab, tl.exp(scaled), 0.0)
        row_sum = row_sum * _rescale(row_max, new_max, inv_temperature) + tl.sum(weights, axis=0)
        row_max = new_max
        gumbel = -tl.log(-tl.log(_noise_tile(seed, step, position, first + group)))
        keys = tl.where(in_vocab, scaled + gumbel, NEG_INF)
        # Strict `>`: tiles ascend, so a lane keeps its lowest token among equal keys.
        take = keys > _scaled(best_logit, new_max, inv_temperature) + best_gumbel
        best_logit = tl.where(take, x, best_logit)
        best_gumbel = tl.where(take, gumbel, best_gumbel)
        best_token = tl.where(take, tokens, best_token)
    keys = _scaled(best_logit, row_max, inv_temperature) + best_gumbel
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


@triton.jit
def _draft_at(draft_ids_ptr, draft_start, position, num_drafts, num_draft_ids, vocab_size):
    """The draft at ``position`` of a request (a scalar or a vector of positions): ``(is_draft,
    draft_id, real)``, the id -1 past the request's drafts or the id tensor, and ``real`` where it
    names a token of the vocabulary (anything else is a placeholder).

    Args:
        draft_ids_ptr: ``[D]`` int64 draft token ids.
    """
    is_draft = position < num_drafts
    draft_id = tl.load(
        draft_ids_ptr + draft_start + position,
        mask=is_draft & (draft_start + position < num_draft_ids),
        other=-1,
    )
    real = is_draft & (draft_id >= 0) & (draft_id < vocab_size)
    return is_draft, draft_id, real


@triton.jit
def _synthetic_accept(
    draft_ids_ptr, rates_ptr, draft_start, position, num_drafts, num_draft_ids, num_rates, seed, step,
    vocab_size,
):  # fmt: skip
    """Whether synthetic sampling accepts the draft at ``position`` (a scalar or a vector of them).

    A real draft is accepted iff ``u < c_i``. It needs no logit, so every program can evaluate it
    for the positions before its own. Every operation is exact (integer Philox, the conversion of
    `tl.rand`, a float64 comparison), so every caller gets the same answer bit for bit.

    Args:
        draft_ids_ptr: ``[D]`` int64 draft token ids.
        rates_ptr: ``[num_rates]`` fp64 conditional acceptance rates.
    """
    is_draft, _, real = _draft_at(draft_ids_ptr, draft_start, position, num_drafts, num_draft_ids, vocab_size)
    rate = tl.load(rates_ptr + position, mask=is_draft & (position < num_rates), other=0.0)
    u = tl.rand(seed, _offsets(step, position.to(tl.int64), ACCEPT_PURPOSE, 0))
    return real & (u.to(tl.float64) < rate)


# Counts that change from call to call are not specialised on, so each layout compiles once.
@triton.jit(do_not_specialize=["max_num_drafts", "num_splits"])
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
    work_ptr,
    geometry_ptr,
    target_stride,
    draft_stride,
    slot_stride,
    vocab_size,
    max_num_drafts,
    num_splits,
    METHOD: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    SLOTTED: tl.constexpr,
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

    Args:
        target_ptr: ``[R, V]`` fp32/fp16/bf16 target logits, row stride ``target_stride``.
        draft_ptr: ``[D, V]`` or ``[S, K, V]`` draft logits (unused unless ``HAS_DRAFT``).
        draft_ids_ptr: ``[D]`` int64 draft token ids.
        cu_ptr: ``[B + 1]`` int32 prefix sums of the draft counts.
        temperature_ptr: ``[B]`` fp32.
        seed_ptr: ``[B]`` int64.
        step_ptr: ``[B]`` int64.
        draft_slot_ptr: ``[B]`` int32/int64 slots (unused unless ``SLOTTED``).
        rates_ptr: ``[num_rates]`` fp64 synthetic conditional acceptance rates (synthetic only).
        work_ptr: the call's int32 workspace. This kernel writes the split records at its start
            (``SPLIT_*``), each ``[B * (max_n + 1) * num_splits]``: target max and sum (fp32) and
            first argmax (int32); draft max and sum (fp32, probabilistic); the Gumbel-max
            candidate's logit and noise (fp32) and token (int32) (strict). Zero at launch:
            ``WORK_COUNTER``, ``[B * (max_n + 1)]`` int32, the splits finished per row, and
            ``WORK_STOP_FLAG``, ``[B]`` int32, ``max_n + 1 - j`` for the earliest rejected position
            ``j`` of each request decided so far. `_finish_row` writes the ``WORK_ROW_FLOAT`` and
            ``WORK_ROW_INT`` records.
        geometry_ptr: ``[GEOMETRY_FIELDS]`` int64: the row and id counts that bound reads, and
            the offsets of the records after the split records.
    """
    # Grid (B * num_splits, max_n + 1): program (request * num_splits + split, i) reads split
    # `split` of row i. Positions are the slowest grid dimension, so a row is scheduled after the
    # rows before it; by then the request's earlier rows are often decided, and a row after a
    # rejection is skipped. (Launching position 0 alone first skipped more rows but cost more in
    # launch tails: kernels/RESULTS.md.)
    program = tl.program_id(0)
    request = program // num_splits
    split = program % num_splits
    position = tl.program_id(1)
    width = max_num_drafts + 1
    # The geometry loads go out with the request's first loads, ahead of the logits (a load
    # cannot pass a store that may alias it).
    num_target_rows = _geometry(geometry_ptr, GEO_NUM_TARGET_ROWS)
    stop_flag_ptr = _record(work_ptr, geometry_ptr, WORK_STOP_FLAG, tl.int32)
    counter_ptr = _record(work_ptr, geometry_ptr, WORK_COUNTER, tl.int32)
    if METHOD == SYNTHETIC:
        num_draft_ids = _geometry(geometry_ptr, GEO_NUM_DRAFT_IDS)
        num_rates = _geometry(geometry_ptr, GEO_NUM_RATES)
    draft_start, num_drafts = _request_span(cu_ptr, request, max_num_drafts)
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
                accepted = _synthetic_accept(
                    draft_ids_ptr, rates_ptr, draft_start, earlier, num_drafts, num_draft_ids,
                    num_rates, seed, step, vocab_size,
                )  # fmt: skip
                needed = tl.min(tl.where(earlier < position, accepted.to(tl.int32), 1), axis=0) > 0
                chunk += POS_BLOCK
        else:
            needed = stop_flag <= width - position
        # A row after a rejection is not needed: its program leaves at once, writing nothing and
        # not counting in, so the row is never finished, and nothing reads it.
        if needed:
            _split_program(
                target_ptr, draft_ptr, draft_ids_ptr, draft_slot_ptr, rates_ptr, work_ptr, geometry_ptr,
                counter_ptr, num_target_rows, request, split, position, draft_start, num_drafts, temperature,
                seed, step, target_stride, draft_stride, slot_stride, vocab_size, width, num_splits, METHOD,
                HAS_DRAFT, SLOTTED, TILES_PER_SPLIT, BLOCK_V, SPLIT_BLOCK,
            )  # fmt: skip


@triton.jit
def _split_program(
    target_ptr, draft_ptr, draft_ids_ptr, draft_slot_ptr, rates_ptr, work_ptr, geometry_ptr, counter_ptr,
    num_target_rows, request, split, position, draft_start, num_drafts, temperature, seed, step,
    target_stride, draft_stride, slot_stride, vocab_size, width, num_splits,
    METHOD: tl.constexpr, HAS_DRAFT: tl.constexpr, SLOTTED: tl.constexpr, TILES_PER_SPLIT: tl.constexpr,
    BLOCK_V: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
):  # fmt: skip
    """A needed split of row_stats_kernel: its statistics and split records; the row's last split
    finishes the row (`_finish_row`)."""
    sampled = temperature > 0.0
    inv_temperature = _inv_temperature(temperature)
    target_row = draft_start + request + position
    target_inside = target_row < num_target_rows
    target_row_ptr = target_ptr + tl.where(target_inside, target_row, 0) * target_stride
    row = request.to(tl.int64) * width + position
    out = row * num_splits + split
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
        num_draft_ids = _geometry(geometry_ptr, GEO_NUM_DRAFT_IDS)
        num_draft_rows = _geometry(geometry_ptr, GEO_NUM_DRAFT_ROWS)
        slot_capacity = _geometry(geometry_ptr, GEO_SLOT_CAPACITY)
        is_draft = position < num_drafts
        draft_id = tl.load(
            draft_ids_ptr + draft_start + position,
            mask=is_draft & (draft_start + position < num_draft_ids),
            other=-1,
        )
        draft_offset = _draft_row_offset(
            request, draft_start, position, draft_slot_ptr, num_draft_rows, slot_capacity, draft_stride,
            slot_stride, SLOTTED,
        )  # fmt: skip
        reads_q = sampled & is_draft
    else:
        reads_q = position < 0
        draft_offset = tl.full([], -1, tl.int64)
    if METHOD == STRICT:
        if sampled:
            row_max, row_sum, cand_logit, cand_gumbel, cand_token = _split_sample_stats(
                target_row_ptr, target_inside, split, vocab_size, inv_temperature, seed, step, position,
                TILES_PER_SPLIT * BLOCK_V,
            )  # fmt: skip
        else:
            row_max, row_sum, row_arg = _split_stats(
                target_row_ptr, target_inside, split, vocab_size, inv_temperature, TILES_PER_SPLIT, BLOCK_V
            )
    elif reads_q:
        row_max, row_sum, draft_max, draft_sum = _split_moments(
            target_row_ptr, target_inside, draft_ptr + tl.maximum(draft_offset, 0), draft_offset >= 0, split,
            vocab_size, inv_temperature, True, TILES_PER_SPLIT, BLOCK_V,
        )  # fmt: skip
    elif sampled:
        # Only greedy rows compare drafts with the argmax; sampled rows skip it.
        row_max, row_sum, _, _ = _split_moments(
            target_row_ptr, target_inside, target_row_ptr, False, split, vocab_size, inv_temperature, False,
            TILES_PER_SPLIT, BLOCK_V,
        )  # fmt: skip
    else:
        row_max, row_sum, row_arg = _split_stats(
            target_row_ptr, target_inside, split, vocab_size, inv_temperature, TILES_PER_SPLIT, BLOCK_V
        )
    if METHOD == STRICT:
        tl.store(_split_record(work_ptr, SPLIT_CAND_LOGIT, tl.float32) + out, cand_logit)
        tl.store(_split_record(work_ptr, SPLIT_CAND_GUMBEL, tl.float32) + out, cand_gumbel)
        tl.store(_split_record(work_ptr, SPLIT_CAND_TOKEN, tl.int32) + out, cand_token)
    tl.store(_split_record(work_ptr, SPLIT_TARGET_MAX, tl.float32) + out, row_max)
    tl.store(_split_record(work_ptr, SPLIT_TARGET_SUM, tl.float32) + out, row_sum)
    tl.store(_split_record(work_ptr, SPLIT_TARGET_ARG, tl.int32) + out, row_arg)
    if PAIRED:  # noqa: SIM102 (a constexpr: the branch is compiled only where drafts are read)
        # `_finish_row` reads q's records only where a real draft meets a sampled row.
        if reads_q & (draft_id >= 0) & (draft_id < vocab_size):
            tl.store(_split_record(work_ptr, SPLIT_DRAFT_MAX, tl.float32) + out, draft_max)
            tl.store(_split_record(work_ptr, SPLIT_DRAFT_SUM, tl.float32) + out, draft_sum)
    # Publish the records, then count this split in; the last split of the row finishes it.
    tl.debug_barrier()
    finished = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
    if finished == num_splits - 1:
        _finish_row(
            target_row_ptr, target_inside, draft_ptr, draft_ids_ptr, draft_slot_ptr, rates_ptr, work_ptr,
            geometry_ptr, request, position, row, draft_start, num_drafts, temperature, inv_temperature, seed,
            step, draft_stride, slot_stride, vocab_size, width, num_splits, METHOD, HAS_DRAFT, SLOTTED,
            SPLIT_BLOCK,
        )  # fmt: skip


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
    row_sum = tl.sum(split_sum * _rescale(split_max, row_max[:, None], inv_temperature), axis=1)
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
    keys = tl.where(split_mask, _scaled(logit, row_max[:, None], inv_temperature) + gumbel, NEG_INF)
    best = tl.argmax(keys, axis=1, tie_break_left=True)
    return tl.sum(tl.where(splits == best[:, None], token, 0), axis=1)


@triton.jit
def _log_prob(target_row_ptr, target_inside, token, row_max, log_sum, inv_temperature, vocab_size):
    """``log p(token)`` under the target law; ``-inf`` below float64's smallest probability.

    Args:
        target_row_ptr: the row's first logit, fp32/fp16/bf16 (read at ``token`` if inside).
    """
    inside = target_inside & (token >= 0) & (token < vocab_size)
    logit = tl.load(target_row_ptr + tl.where(inside, token, 0), mask=inside, other=NEG_INF)
    return _logit_log_prob(logit, row_max, log_sum, inv_temperature)


@triton.jit
def _logit_log_prob(logit, row_max, log_sum, inv_temperature):
    """``log p`` of a logit under the target law; ``-inf`` below float64's smallest probability."""
    log_prob = _scaled(_clean(logit), row_max, inv_temperature) - log_sum
    return tl.where(log_prob < LOG_ZERO, NEG_INF, log_prob)


@triton.jit
def _finish_row(
    target_row_ptr, target_inside, draft_ptr, draft_ids_ptr, draft_slot_ptr, rates_ptr, work_ptr,
    geometry_ptr, request, position, row, draft_start, num_drafts, temperature, inv_temperature,
    seed, step, draft_stride, slot_stride, vocab_size, width, num_splits,
    METHOD: tl.constexpr, HAS_DRAFT: tl.constexpr, SLOTTED: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
):  # fmt: skip
    """Combine the split records of one row, decide its draft, and write the row's record.

    Run by the last program to finish the row. Every decision is made here and only here, so
    sample_kernel and the skipping programs can never disagree about it. A rejection is published
    in the workspace's ``WORK_STOP_FLAG`` record so later rows of the request can be skipped.

    Args:
        target_row_ptr: the row's first target logit (read at the draft id and the row token).
        work_ptr: the int32 workspace: the row's split records are read, its ``WORK_ROW_FLOAT``
            ``[B * (max_n + 1), ROW_FLOATS]`` fp32 and ``WORK_ROW_INT`` ``[B * (max_n + 1),
            ROW_INTS]`` int32 records written.
        The other pointers are row_stats_kernel's.
    """
    # Every geometry load at once, ahead of the chain of loads, reductions and stores below.
    row_float_ptr = _record(work_ptr, geometry_ptr, WORK_ROW_FLOAT, tl.float32)
    row_int_ptr = _record(work_ptr, geometry_ptr, WORK_ROW_INT, tl.int32)
    stop_flag_ptr = _record(work_ptr, geometry_ptr, WORK_STOP_FLAG, tl.int32)
    num_draft_ids = _geometry(geometry_ptr, GEO_NUM_DRAFT_IDS)
    num_draft_rows = _geometry(geometry_ptr, GEO_NUM_DRAFT_ROWS)
    slot_capacity = _geometry(geometry_ptr, GEO_SLOT_CAPACITY)
    num_rates = _geometry(geometry_ptr, GEO_NUM_RATES)
    records = tl.full([1, 1], 0, tl.int64) + row * num_splits
    every = tl.full([1, 1], 1, tl.int1)
    row_max, log_sum, split_max = _combine_splits(
        _split_record(work_ptr, SPLIT_TARGET_MAX, tl.float32),
        _split_record(work_ptr, SPLIT_TARGET_SUM, tl.float32),
        records, every, inv_temperature, num_splits, SPLIT_BLOCK,
    )  # fmt: skip
    target_arg_ptr = _split_record(work_ptr, SPLIT_TARGET_ARG, tl.int32)
    token = _row_argmax(target_arg_ptr, records, every, split_max, row_max, num_splits, SPLIT_BLOCK)
    if METHOD == STRICT:
        every_sampled = (tl.zeros([1, 1], tl.float32) + temperature) > 0.0
        sample = _strict_sample(
            _split_record(work_ptr, SPLIT_CAND_LOGIT, tl.float32),
            _split_record(work_ptr, SPLIT_CAND_GUMBEL, tl.float32),
            _split_record(work_ptr, SPLIT_CAND_TOKEN, tl.int32),
            records, every_sampled, row_max, inv_temperature, num_splits, SPLIT_BLOCK,
        )  # fmt: skip
        token = tl.where(temperature > 0.0, sample, token)
    token = tl.sum(token, axis=0)
    row_max = tl.sum(row_max, axis=0)
    log_sum = tl.sum(log_sum, axis=0)
    sampled = temperature > 0.0
    is_draft, draft_id, real = _draft_at(
        draft_ids_ptr, draft_start, position, num_drafts, num_draft_ids, vocab_size
    )
    log_p = _log_prob(
        target_row_ptr, target_inside & real, draft_id, row_max, log_sum, inv_temperature, vocab_size
    )
    token_log_p = _log_prob(
        target_row_ptr, target_inside, token, row_max, log_sum, inv_temperature, vocab_size
    )
    draft_max = tl.full([], NEG_INF, tl.float32)
    draft_log_sum = tl.full([], 0.0, tl.float32)
    if METHOD == SYNTHETIC:
        accept = _synthetic_accept(
            draft_ids_ptr, rates_ptr, draft_start, position, num_drafts, num_draft_ids, num_rates,
            seed, step, vocab_size,
        )  # fmt: skip
    else:
        greedy_accept = real & (draft_id == token)
        if METHOD == STRICT:
            # The row token of a sampled strict row is its target sample: the same comparison.
            sampled_accept = greedy_accept
        else:
            log_q = tl.full([], 0.0, tl.float32)
            # The compile-time test stands apart so the branch is compiled only where drafts exist.
            if HAS_DRAFT:  # noqa: SIM102
                if sampled & real:
                    draft_maxes, draft_log_sums, _ = _combine_splits(
                        _split_record(work_ptr, SPLIT_DRAFT_MAX, tl.float32),
                        _split_record(work_ptr, SPLIT_DRAFT_SUM, tl.float32),
                        records, every, inv_temperature, num_splits, SPLIT_BLOCK,
                    )  # fmt: skip
                    draft_max = tl.sum(draft_maxes, axis=0)
                    draft_log_sum = tl.sum(draft_log_sums, axis=0)
                    draft_offset = _draft_row_offset(
                        request, draft_start, position, draft_slot_ptr, num_draft_rows, slot_capacity,
                        draft_stride, slot_stride, SLOTTED,
                    )  # fmt: skip
                    draft_inside = draft_offset >= 0
                    draft_logit = _clean(
                        tl.load(
                            draft_ptr + tl.maximum(draft_offset, 0) + tl.where(draft_inside, draft_id, 0),
                            mask=draft_inside,
                            other=NEG_INF,
                        )
                    )
                    log_q = _scaled(draft_logit, draft_max, inv_temperature) - draft_log_sum
                    log_q = tl.where(log_q < LOG_ZERO, NEG_INF, log_q)
            if METHOD == BLOCK:
                # Decided jointly by block_keep_kernel from the ratios: no rejection here.
                log_ratio = tl.where(
                    log_p > NEG_INF, tl.where(log_q > NEG_INF, log_p - log_q, float("inf")), NEG_INF
                )
                tl.store(row_float_ptr + row * ROW_FLOATS + ROW_LOG_RATIO, tl.where(real, log_ratio, NEG_INF))
                sampled_accept = tl.full([], 1, tl.int1)
            else:
                u = tl.rand(seed, _offsets(step, position.to(tl.int64), ACCEPT_PURPOSE, 0))
                # p(d) > u q(d) in the log domain. Strict `>`: a draft with p = 0 is never accepted,
                # even at u = 0; a draft with q = 0 < p always is.
                sampled_accept = real & (log_p > NEG_INF) & (log_p > tl.log(u) + log_q)
        accept = tl.where(sampled, sampled_accept, greedy_accept)
    row_float = row_float_ptr + row * ROW_FLOATS
    tl.store(row_float + ROW_TARGET_MAX, row_max)
    tl.store(row_float + ROW_TARGET_LOG_SUM, log_sum)
    tl.store(row_float + ROW_DRAFT_MAX, draft_max)
    tl.store(row_float + ROW_DRAFT_LOG_SUM, draft_log_sum)
    tl.store(row_float + ROW_DRAFT_LOG_PROB, log_p)
    tl.store(row_float + ROW_TOKEN_LOG_PROB, token_log_p)
    row_int = row_int_ptr + row * ROW_INTS
    tl.store(row_int + ROW_TOKEN, token)
    if is_draft & ~accept:
        tl.atomic_max(stop_flag_ptr + request, width - position)


@triton.jit
def _block_log_weight(row_float_ptr, out_row, position):
    """``log w_position`` of block verification: ``log w_{i+1} = min(0, log w_i + log(p(d_i) / q(d_i)))``
    from ``log w_0 = 0``, over the ``ROW_LOG_RATIO`` records of rows ``0 .. position - 1``; once
    ``-inf``, it stays ``-inf``."""
    log_weight = tl.full([], 0.0, tl.float32)
    earlier = 0
    while earlier < position:
        log_ratio = tl.load(row_float_ptr + (out_row + earlier) * ROW_FLOATS + ROW_LOG_RATIO)
        log_weight = tl.where(log_weight > NEG_INF, tl.minimum(log_weight + log_ratio, 0.0), NEG_INF)
        earlier += 1
    return log_weight


@triton.jit
def _split_block_mass(
    target_row_ptr, target_inside, draft_row_ptr, draft_inside, split, vocab_size, inv_temperature,
    target_max, target_log_sum, draft_max, draft_log_sum, log_weight, draft_id,
    HAS_DRAFT: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """One split's share of block verification's residual mass ``S = sum_x max(w p(x) - q(x), 0)``.

    ``q`` is the draft law (``HAS_DRAFT``) or ``onehot(d)``, and no mass at a placeholder
    (``draft_id`` outside the vocabulary); ``w p`` is ``exp(e(x) - log_sum + log w)``.
    """
    lanes = tl.arange(0, BLOCK_V)
    first = split * (TILES_PER_SPLIT * BLOCK_V)
    real = (draft_id >= 0) & (draft_id < vocab_size)
    total = tl.zeros([BLOCK_V], tl.float32)
    for tile in range(TILES_PER_SPLIT):
        tokens = first + tile * BLOCK_V + lanes
        in_vocab = tokens < vocab_size
        x = _clean(tl.load(target_row_ptr + tokens, mask=in_vocab & target_inside, other=NEG_INF))
        weighted = tl.exp(_scaled(x, target_max, inv_temperature) - target_log_sum + log_weight)
        if HAS_DRAFT:
            y = _clean(tl.load(draft_row_ptr + tokens, mask=in_vocab & draft_inside & real, other=NEG_INF))
            q = tl.where(real, tl.exp(_scaled(y, draft_max, inv_temperature) - draft_log_sum), 0.0)
        else:
            q = tl.where(tokens == draft_id, 1.0, 0.0)
        total += tl.where(in_vocab, tl.maximum(weighted - q, 0.0), 0.0)
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
        (``WORK_ROW_FLOAT``: statistics, ``ROW_LOG_RATIO``), writes ``ROW_LOG_WEIGHT`` of rows
        ``1 .. n``, raises each sampled request's flag (``WORK_STOP_FLAG``) to its largest kept
        index ``m`` (it stays 0 where none is kept), and counts splits on from the ``num_splits``
        that row_stats_kernel left in each row's ``WORK_COUNTER``.
        mass_ptr: ``[B * (max_n + 1) * num_splits]`` fp32 workspace: the split shares of ``S_i``.
    """
    # Grid (B * num_splits, max_n): program (request * num_splits + split, i - 1) handles split
    # `split` of row i; greedy requests (decided by their argmax chain) exit at once.
    program = tl.program_id(0)
    request = program // num_splits
    split = program % num_splits
    position = tl.program_id(1) + 1
    width = max_num_drafts + 1
    draft_start, num_drafts = _request_span(cu_ptr, request, max_num_drafts)
    temperature = tl.load(temperature_ptr + request)
    _after_previous_launch(PDL)
    if (position <= num_drafts) & (temperature > 0.0):
        row_float_ptr = _record(work_ptr, geometry_ptr, WORK_ROW_FLOAT, tl.float32)
        out_row = request.to(tl.int64) * width
        row = out_row + position
        log_weight = _block_log_weight(row_float_ptr, out_row, position)
        seed = tl.load(seed_ptr + request)
        step = tl.load(step_ptr + request)
        eta = tl.rand(seed, _offsets(step, (position - 1).to(tl.int64), ACCEPT_PURPOSE, 0))
        # h_n = w_n. Below n, h_i <= w_i (as S_i <= w_i): eta_i >= w_i rejects index i without S_i,
        # and every program of the row skips its read alike.
        keep = tl.exp(log_weight)
        decide = split == 0
        if (position < num_drafts) & (eta < keep):
            counter_ptr = _record(work_ptr, geometry_ptr, WORK_COUNTER, tl.int32)
            num_target_rows = _geometry(geometry_ptr, GEO_NUM_TARGET_ROWS)
            num_draft_ids = _geometry(geometry_ptr, GEO_NUM_DRAFT_IDS)
            num_draft_rows = _geometry(geometry_ptr, GEO_NUM_DRAFT_ROWS)
            slot_capacity = _geometry(geometry_ptr, GEO_SLOT_CAPACITY)
            row_float = row_float_ptr + row * ROW_FLOATS
            draft_id = tl.load(
                draft_ids_ptr + draft_start + position,
                mask=draft_start + position < num_draft_ids,
                other=-1,
            )
            target_row = draft_start + request + position
            target_inside = target_row < num_target_rows
            target_row_ptr = target_ptr + tl.where(target_inside, target_row, 0) * target_stride
            draft_offset = _draft_row_offset(
                request, draft_start, position, draft_slot_ptr, num_draft_rows, slot_capacity, draft_stride,
                slot_stride, SLOTTED,
            )  # fmt: skip
            mass = _split_block_mass(
                target_row_ptr, target_inside, draft_ptr + tl.maximum(draft_offset, 0), draft_offset >= 0,
                split, vocab_size, _inv_temperature(temperature), tl.load(row_float + ROW_TARGET_MAX),
                tl.load(row_float + ROW_TARGET_LOG_SUM), tl.load(row_float + ROW_DRAFT_MAX),
                tl.load(row_float + ROW_DRAFT_LOG_SUM), log_weight, draft_id, HAS_DRAFT, TILES_PER_SPLIT,
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
            mass = tl.sum(shares, axis=0)
            total = mass + (1.0 - keep)
            keep = tl.where(total > 0.0, mass / total, 1.0)
        if decide:
            tl.store(row_float_ptr + row * ROW_FLOATS + ROW_LOG_WEIGHT, log_weight)
            if eta < keep:
                # m, the largest kept index, is the request's flag (row_stats_kernel left it 0).
                tl.atomic_max(_record(work_ptr, geometry_ptr, WORK_STOP_FLAG, tl.int32) + request, position)


# Counts that change from call to call are not specialised on.
@triton.jit
def _tile_law(x, y, target_max, target_log_sum, draft_max, draft_log_sum, inv_temperature, tokens,
              vocab_size, draft_token, residual):  # fmt: skip
    """The weights of a tile under the final row's law: ``(log p, fraction, has mass)``.

    A token's weight is ``p * fraction``: the residual ``(p - q)+ = p (1 - q / p)`` where ``p > q``,
    else ``p`` itself (without ``draft_token``); ``has mass`` marks the tokens of positive weight.
    A token past the vocabulary has no mass, whatever it reads (``-inf`` equals the max of a row
    without a finite logit, whose tokens are uniform).
    """
    log_p = _scaled(_clean(x), target_max, inv_temperature) - target_log_sum
    # A probability float64 rounds to zero never wins, as in the specification.
    log_p = tl.where((log_p >= LOG_ZERO) & (tokens < vocab_size), log_p, NEG_INF)
    if residual:
        log_q = _scaled(_clean(y), draft_max, inv_temperature) - draft_log_sum
        log_q = tl.where(log_q >= LOG_ZERO, log_q, NEG_INF)
        # 1 - q / p is 0 or at least 2**-24.
        fraction = 1.0 - tl.exp(log_q - log_p)
        has_mass = (log_p > log_q) & (fraction > 0.0)
    else:
        fraction = tl.full(log_p.shape, 1.0, tl.float32)
        has_mass = (log_p > NEG_INF) & (tokens != draft_token)
    return log_p, fraction, has_mass


@triton.jit
def _block_mass(log_p, fraction, has_mass, axis: tl.constexpr, keep_dims: tl.constexpr):
    """The mass of a block of tokens along ``axis`` as ``(scale, sum)``: ``exp(scale) * sum`` is the
    sum of the weights ``p * fraction`` (`_tile_law`), with ``scale`` the block's largest ``log p``
    (``-inf`` and 0 where the block has no mass): no underflow however small the block's mass."""
    scale = tl.max(tl.where(has_mass, log_p, NEG_INF), axis=axis, keep_dims=True)
    weight = tl.exp(log_p - tl.where(scale > NEG_INF, scale, 0.0)) * fraction
    total = tl.sum(tl.where(has_mass, weight, 0.0), axis=axis, keep_dims=keep_dims)
    return tl.max(scale, axis=axis, keep_dims=keep_dims), total


@triton.jit
def _row_block_mass(log_p, fraction, has_mass, top, axis: tl.constexpr):
    """`_block_mass` with the row's bound ``top >= log p`` for a scale, with no reduction before the
    exponential: ``(top or -inf where the block has no mass, sum)``. Weights more than ``2**-126``
    below ``exp(top)`` underflow; `_emit_token` recomputes a row whose masses sum below
    ``FAST_MASS_FLOOR`` with `_block_mass`, so what underflows is at most ``V 2**-126 / 2**-60`` of
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
    probability under ``2**-1075`` weighs 0 as in `_tile_law`, since the fast row's log-sum puts
    ``e_p`` far into float32's underflow there, and so does ``q`` under ``2**-1075``."""
    if RESIDUAL:
        # A NaN target logit fails the comparison: p = 0 weighs 0, with no need to clean it first.
        e_p = (x.to(tl.float32) - target_max) * inv_temperature
        log_p = e_p - residual_log_sum
        log_q = (_clean(y) - draft_max) * inv_temperature - draft_log_sum
        weight = tl.exp(e_p)
        weight = tl.where(log_p > log_q, weight - weight * tl.exp(log_q - log_p), 0.0)
    else:
        weight = tl.where(tokens != draft_token, tl.exp((_clean(x) - target_max) * inv_temperature), 0.0)
    return weight


@triton.jit
def _fast_row(in_vocab, target_inside, draft_inside, residual, target_max, draft_max, residual_log_sum):
    """Whether `sample_kernel` may read a split the fast way (`_fast_weights`): every token of it
    inside the vocabulary (``in_vocab``), the rows inside their tensors, both maxima finite (a row
    of ``+inf`` logits or without a finite one takes `_tile_law`), and the residual's log-sum at
    most ``FAST_LOG_SUM`` (a weight ``w`` of block verification above ``exp(-600)``), so that
    ``w p < 2**-1075`` puts ``e_p`` below float32's smallest exponential."""
    finite = (target_max > NEG_INF) & (target_max < float("inf"))
    draft_finite = (draft_max > NEG_INF) & (draft_max < float("inf"))
    fits = in_vocab & target_inside & (residual_log_sum <= FAST_LOG_SUM)
    return fits & finite & ((draft_inside & draft_finite) | (residual == 0))


@triton.jit
def _fast_block_masses(target_row_ptr, draft_row_ptr, first, records, block_scale_ptr, block_sum_ptr, top,
                       target_max, residual_log_sum, draft_max, draft_log_sum, inv_temperature, draft_token,
                       SPAN: tl.constexpr, RESIDUAL: tl.constexpr):  # fmt: skip
    """`sample_kernel`'s fast way (`_fast_row`) over the ``SPAN`` tokens from ``first``, a block of
    ``NOISE_GROUP`` at a time: each block's mass recorded as ``(top, sum)`` of its `_fast_weights`,
    or ``(-inf, 0)`` where the sum is 0 (`_emit_token` then tells a row without mass from one whose
    weights all underflowed by computing it again). Draft logits are read only if ``RESIDUAL``."""
    lanes = tl.arange(0, NOISE_GROUP)
    for group in range(0, SPAN, NOISE_GROUP):
        tokens = first + group + lanes
        x = tl.load(target_row_ptr + tokens)
        y = tl.load(draft_row_ptr + tokens) if RESIDUAL else x
        weights = _fast_weights(
            x, y, target_max, residual_log_sum, draft_max, draft_log_sum, inv_temperature, tokens,
            draft_token, RESIDUAL,
        )  # fmt: skip
        total = tl.sum(weights, axis=0)
        tl.store(block_scale_ptr + records + group // NOISE_GROUP, tl.where(total > 0.0, top, NEG_INF))
        tl.store(block_sum_ptr + records + group // NOISE_GROUP, total)


@triton.jit
def _block_keys(log_p, fraction, has_mass, u, residual):
    """The Gumbel-max keys of a tile, ``log(p * fraction) - log(E)`` with ``E = -log u`` (``+inf``
    at ``u == 0``, where the key is ``-inf`` as the Gumbel noise would make it)."""
    exponential = -tl.log(u)
    if residual:  # noqa: SIM108 (a runtime scalar in the split plan: a branch, not a select)
        # fraction is 0 or at least 2**-24 and E at most 21.5: the quotient never underflows.
        keys = log_p + tl.log(fraction / exponential)
    else:
        keys = log_p - tl.log(exponential)
    return tl.where(has_mass, keys, NEG_INF)


@triton.jit
def _block_uniform(seed, step, position):
    """The row's 53-bit block uniform, float64 in ``[0, 1)``: words 0 and 1 of the Philox call at
    ``_offsets(step, position, BLOCK_PURPOSE, 0)``, ``((w0 >> 5) 2**26 + (w1 >> 6)) 2**-53``."""
    w0, w1, _, _ = _philox(seed, step, position, BLOCK_PURPOSE, tl.zeros_like(position).to(tl.int32))
    bits = (w0 >> 5).to(tl.int64) * 67108864 + (w1 >> 6).to(tl.int64)
    return bits.to(tl.float64) * 1.1102230246251565e-16


@triton.jit
def _pick_block(scale, total, u, NUM_BLOCKS: tl.constexpr):
    """Per row of ``[N, NUM_BLOCKS]`` block masses ``(scale, sum)``, the block whose cumulative mass
    first exceeds ``u`` (``[N, 1]``) times the row's mass, ``[N, 1]``: the masses in float64,
    relative to the row's largest scale; never past the last block with mass, 0 for a row without
    mass."""
    top = tl.max(scale, axis=1, keep_dims=True)
    relative = tl.where(scale > NEG_INF, scale - tl.where(top > NEG_INF, top, 0.0), 0.0).to(tl.float64)
    mass = tl.where(scale > NEG_INF, tl.exp(relative) * total.to(tl.float64), 0.0)
    cumulative = tl.cumsum(mass, axis=1)
    whole = tl.max(cumulative, axis=1, keep_dims=True)
    picked = tl.sum((cumulative <= u * whole).to(tl.int32), axis=1, keep_dims=True)
    index = tl.arange(0, NUM_BLOCKS)[None, :]
    last = tl.max(tl.where(mass > 0.0, index, 0), axis=1, keep_dims=True)
    return tl.minimum(picked, last)


@triton.jit
def _row_offset(offset, ROW_ALIGN: tl.constexpr):
    """A row offset of a final row (-1 for a row outside its tensor, which reads
    nothing) as the row's first element, a multiple of ``ROW_ALIGN`` elements: the plan found every
    row stride a multiple of it, and saying so lets the compiler load the row in vectors."""
    # Rounding down to a multiple changes nothing and tells the compiler (a hint does not survive).
    return tl.maximum(offset, 0) // ROW_ALIGN * ROW_ALIGN


@triton.jit
def _final_row(info_int, info_float, mode):
    """What `sample_kernel` recorded of a request's final row: ``(target offset, draft offset, the
    excluded draft token, residual or not, (target max, target log-sum, the residual's log-sum,
    draft max, draft log-sum))``; the draft fields only in residual mode."""
    residual = mode == SAMPLE_RESIDUAL
    target_log_sum = tl.load(info_float + INFO_TARGET_LOG_SUM)
    # The residual's p is weighted (block verification's w_m, else 1): log(w p) = e - (log_sum - log w).
    residual_log_sum = target_log_sum - tl.where(residual, tl.load(info_float + INFO_LOG_WEIGHT), 0.0)
    laws = (
        tl.load(info_float + INFO_TARGET_MAX),
        target_log_sum,
        residual_log_sum,
        tl.load(info_float + INFO_DRAFT_MAX, mask=residual, other=NEG_INF),
        tl.load(info_float + INFO_DRAFT_LOG_SUM, mask=residual, other=0.0),
    )
    target_offset = tl.load(info_int + INFO_TARGET_OFFSET)
    draft_offset = tl.load(info_int + INFO_DRAFT_OFFSET, mask=residual, other=-1)
    return target_offset, draft_offset, tl.load(info_int + INFO_DRAFT_TOKEN), residual, laws


@triton.jit
def _final_block(target_row_ptr, draft_row_ptr, target_inside, draft_inside, block, vocab_size, draft_token,
                 target_max, law_log_sum, draft_max, draft_log_sum, inv_temperature, residual):  # fmt: skip
    """Block ``block`` of a final row under its law: ``(tokens, target logits, log p, fraction, has mass)``
    (`_tile_law`), the emit step's read of one block."""
    tokens = block * NOISE_GROUP + tl.arange(0, NOISE_GROUP)
    in_vocab = tokens < vocab_size
    x = tl.load(target_row_ptr + tokens, mask=in_vocab & target_inside, other=NEG_INF)
    y = tl.load(draft_row_ptr + tokens, mask=in_vocab & residual & draft_inside, other=NEG_INF)
    log_p, fraction, has_mass = _tile_law(
        x, y, target_max, law_log_sum, draft_max, draft_log_sum, inv_temperature, tokens, vocab_size,
        draft_token, residual,
    )  # fmt: skip
    return tokens, x, log_p, fraction, has_mass


@triton.jit
def _row_block_masses(target_row_ptr, draft_row_ptr, target_inside, draft_inside, scale, total, num_blocks,
                      vocab_size, draft_token, target_max, law_log_sum, draft_max, draft_log_sum,
                      inv_temperature, residual, NUM_BLOCKS: tl.constexpr):  # fmt: skip
    """A final row's ``[1, NUM_BLOCKS]`` block masses ``(scale, sum)`` (`_block_mass`), read block by
    block in one program, each relative to its own largest weight: `_emit_token`'s slow way."""
    blocks = tl.arange(0, NUM_BLOCKS)[None, :]
    block = 0
    while block < num_blocks:
        _, _, log_p, fraction, has_mass = _final_block(
            target_row_ptr, draft_row_ptr, target_inside, draft_inside, block, vocab_size, draft_token,
            target_max, law_log_sum, draft_max, draft_log_sum, inv_temperature, residual,
        )  # fmt: skip
        block_scale, block_total = _block_mass(log_p, fraction, has_mass, 0, False)
        scale = tl.where(blocks == block, block_scale, scale)
        total = tl.where(blocks == block, block_total, total)
        block += 1
    return scale, total


@triton.jit
def _emit_token(target_row_ptr, draft_row_ptr, target_inside, draft_inside, block_scale_ptr, block_sum_ptr,
                request, num_blocks, vocab_size, mode, draft_token, target_max, target_log_sum,
                residual_log_sum, draft_max, draft_log_sum, inv_temperature, seed, step, position, out,
                token_ids_ptr, logprobs_ptr, NUM_BLOCKS: tl.constexpr):  # fmt: skip
    """Draw a final row's token from its block masses, and write it and its logprob at ``out``.

    The block is the one whose cumulative mass first exceeds ``u`` times the row's (``u`` the row's
    53-bit block uniform, `_block_uniform`; the masses summed in float64); the token is the
    Gumbel-max of that block alone, under the canonical noise (`_noise_tile`). A row's masses whose
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
            residual, NUM_BLOCKS,
        )  # fmt: skip
        if tl.max(tl.max(scale, axis=1), axis=0) == NEG_INF:
            # The residual has no mass: the target law, as the specification says.
            residual = mode < 0
            draft_token = tl.full([], -1, tl.int64)
            law_log_sum = target_log_sum
            scale, total = _row_block_masses(
                target_row_ptr, draft_row_ptr, target_inside, draft_inside, scale, total, num_blocks,
                vocab_size, draft_token, target_max, law_log_sum, draft_max, draft_log_sum,
                inv_temperature, residual, NUM_BLOCKS,
            )  # fmt: skip
    u = _block_uniform(seed, step, position)
    block = tl.sum(tl.reshape(_pick_block(scale, total, u, NUM_BLOCKS), (1,)), axis=0)
    tokens, x, log_p, fraction, has_mass = _final_block(
        target_row_ptr, draft_row_ptr, target_inside, draft_inside, block, vocab_size, draft_token,
        target_max, law_log_sum, draft_max, draft_log_sum, inv_temperature, residual,
    )  # fmt: skip
    noise = _noise_tile(seed, step, position, block * NOISE_GROUP)
    keys = _block_keys(log_p, fraction, has_mass, noise, residual)
    key = tl.max(keys, axis=0)
    token = tl.min(tl.where(keys == key, tokens, NO_SPLIT), axis=0)
    # A block with mass has a finite key; a row without any (only where every logit rounds
    # to probability 0) emits the block's first token, as the walk's argmax of -inf does.
    token = tl.where(key > NEG_INF, token, block * NOISE_GROUP)
    # log p of the token from the tile in hand, rather than a second read of the row.
    logit = tl.max(tl.where(tokens == token, _clean(x), NEG_INF), axis=0)
    tl.store(token_ids_ptr + out, token.to(tl.int64))
    tl.store(logprobs_ptr + out, _logit_log_prob(logit, target_max, target_log_sum, inv_temperature))


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
        log_p = tl.load(row_float_ptr + (out_row + position) * ROW_FLOATS + ROW_DRAFT_LOG_PROB, mask=keep)
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
        token = tl.load(row_int_ptr + (out_row + stop) * ROW_INTS + ROW_TOKEN)
        log_p = tl.load(row_float_ptr + (out_row + stop) * ROW_FLOATS + ROW_TOKEN_LOG_PROB)
        tl.store(token_ids_ptr + out_row + stop, token.to(tl.int64))
        tl.store(logprobs_ptr + out_row + stop, log_p)


@triton.jit(do_not_specialize=["max_num_drafts"])
def sample_kernel(
    target_ptr,
    draft_ptr,
    draft_ids_ptr,
    cu_ptr,
    temperature_ptr,
    draft_slot_ptr,
    work_ptr,
    geometry_ptr,
    token_ids_ptr,
    logprobs_ptr,
    num_emitted_ptr,
    target_stride,
    draft_stride,
    slot_stride,
    vocab_size,
    max_num_drafts,
    METHOD: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    SLOTTED: tl.constexpr,
    POS_BLOCK: tl.constexpr,
    TILES_PER_SPLIT: tl.constexpr,
    BLOCK_V: tl.constexpr,
    ROW_ALIGN: tl.constexpr,
    PDL: tl.constexpr,
):
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
    last split and odd rows the general way (`_tile_law`, `_row_block_mass`).

    Args:
        target_ptr: ``[R, V]`` fp32/fp16/bf16 target logits.
        draft_ptr: ``[D, V]`` or ``[S, K, V]`` draft logits (read only in residual mode).
        draft_ids_ptr: ``[D]`` int64 draft token ids.
        cu_ptr: ``[B + 1]`` int32 prefix sums of the draft counts.
        temperature_ptr: ``[B]`` fp32.
        draft_slot_ptr: ``[B]`` int32/int64 (unused unless ``SLOTTED``).
        work_ptr: the call's int32 workspace: the request's flag (``WORK_STOP_FLAG``) and the row
            records of `_finish_row` are read; written are the final row's records
            (``WORK_INFO_INT``, ``[B, 5]`` int64: sample mode, final position, target and draft row
            offsets, the excluded draft token; ``WORK_INFO_FLOAT``, ``[B, 5]`` fp32: target max and
            log-sum, draft max and log-sum, log weight) and the block masses (``WORK_BLOCK_SCALE``
            and ``WORK_BLOCK_SUM``, ``[B * num_blocks]`` fp32, the mass of each block as
            ``exp(scale) * sum``, `_block_mass`; ``-inf`` and 0 for a block without mass).
        geometry_ptr: ``[GEOMETRY_FIELDS]`` int64 geometry record: the counts that bound reads and
            the records' offsets.
        token_ids_ptr: ``[B, max_n + 1]`` int64 output.
        logprobs_ptr: ``[B, max_n + 1]`` fp32 output.
        num_emitted_ptr: ``[B]`` int32 output.
    """
    # Grid (B, num_splits): one program per request and vocabulary split. Rows after the first
    # rejection may never have been finished (row_stats_kernel skips them): none is read.
    request = tl.program_id(0)
    split = tl.program_id(1)
    # The geometry and the batch's loads go out while the previous launch finishes.
    num_target_rows = _geometry(geometry_ptr, GEO_NUM_TARGET_ROWS)
    num_draft_ids = _geometry(geometry_ptr, GEO_NUM_DRAFT_IDS)
    num_draft_rows = _geometry(geometry_ptr, GEO_NUM_DRAFT_ROWS)
    slot_capacity = _geometry(geometry_ptr, GEO_SLOT_CAPACITY)
    stop_flag_ptr = _record(work_ptr, geometry_ptr, WORK_STOP_FLAG, tl.int32)
    row_float_ptr = _record(work_ptr, geometry_ptr, WORK_ROW_FLOAT, tl.float32)
    row_int_ptr = _record(work_ptr, geometry_ptr, WORK_ROW_INT, tl.int32)
    info_int = _record(work_ptr, geometry_ptr, WORK_INFO_INT, tl.int64) + request * INFO_INTS
    info_float = _record(work_ptr, geometry_ptr, WORK_INFO_FLOAT, tl.float32) + request * INFO_FLOATS
    draft_start, num_drafts = _request_span(cu_ptr, request, max_num_drafts)
    temperature = tl.load(temperature_ptr + request)
    _after_previous_launch(PDL)
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
    is_draft, draft_id, real = _draft_at(
        draft_ids_ptr, draft_start, stop, num_drafts, num_draft_ids, vocab_size
    )
    if METHOD == STRICT:
        mode = tl.full([], SAMPLE_NONE, tl.int64)
    else:
        if METHOD == PROBABILISTIC or METHOD == BLOCK:  # noqa: SIM109 (constexprs)
            rejected_mode = SAMPLE_RESIDUAL if HAS_DRAFT else SAMPLE_WITHOUT_DRAFT
            mode = tl.where(real, rejected_mode, SAMPLE_TARGET).to(tl.int64)
        else:
            mode = tl.full([], SAMPLE_TARGET, tl.int64)
        mode = tl.where(sampled, mode, SAMPLE_NONE)
    if split == 0:
        _write_decided(
            draft_ids_ptr, row_float_ptr, row_int_ptr, token_ids_ptr, logprobs_ptr, num_emitted_ptr, request,
            out_row, draft_start, num_draft_ids, stop, width, mode == SAMPLE_NONE, POS_BLOCK,
        )  # fmt: skip
        tl.store(info_int + INFO_MODE, mode)
    if mode != SAMPLE_NONE:
        row_float = row_float_ptr + (out_row + stop) * ROW_FLOATS
        target_row = draft_start + request + stop
        target_inside = target_row < num_target_rows
        target_offset = tl.where(target_inside, target_row * target_stride, -1)
        target_max = tl.load(row_float + ROW_TARGET_MAX)
        target_log_sum = tl.load(row_float + ROW_TARGET_LOG_SUM)
        residual = mode == SAMPLE_RESIDUAL
        log_weight = tl.full([], 0.0, tl.float32)
        draft_max = tl.full([], NEG_INF, tl.float32)
        draft_log_sum = tl.full([], 0.0, tl.float32)
        draft_offset = tl.full([], -1, tl.int64)
        if METHOD == BLOCK:  # noqa: SIM102
            # w_m of the residual max(w_m p - q, 0) after a stop at m < n (w_0 = 1).
            if (stop > 0) & is_draft:
                log_weight = tl.load(row_float + ROW_LOG_WEIGHT)
        # The compile-time test stands apart so the branch is compiled only where drafts exist.
        if (METHOD == PROBABILISTIC or METHOD == BLOCK) and HAS_DRAFT:  # noqa: SIM102, SIM109
            if residual:
                draft_offset = _draft_row_offset(
                    request, draft_start, stop, draft_slot_ptr, num_draft_rows, slot_capacity,
                    draft_stride, slot_stride, SLOTTED,
                )  # fmt: skip
                draft_max = tl.load(row_float + ROW_DRAFT_MAX)
                draft_log_sum = tl.load(row_float + ROW_DRAFT_LOG_SUM)
        # Only a rejected one-hot draft is excluded from the sample.
        draft_token = tl.where(mode == SAMPLE_WITHOUT_DRAFT, draft_id, -1)
        if split == 0:
            tl.store(info_int + INFO_POSITION, stop)
            tl.store(info_int + INFO_TARGET_OFFSET, target_offset)
            tl.store(info_int + INFO_DRAFT_OFFSET, draft_offset)
            tl.store(info_int + INFO_DRAFT_TOKEN, draft_token)
            tl.store(info_float + INFO_TARGET_MAX, target_max)
            tl.store(info_float + INFO_TARGET_LOG_SUM, target_log_sum)
            tl.store(info_float + INFO_DRAFT_MAX, draft_max)
            tl.store(info_float + INFO_DRAFT_LOG_SUM, draft_log_sum)
            tl.store(info_float + INFO_LOG_WEIGHT, log_weight)
        # The residual's p is weighted (block verification's w_m, else 1): log(w p) = e - (log_sum - log w).
        residual_log_sum = target_log_sum - tl.where(residual, log_weight, 0.0)
        target_row_ptr = target_ptr + _row_offset(target_offset, ROW_ALIGN)
        draft_row_ptr = draft_ptr + _row_offset(draft_offset, ROW_ALIGN)
        _split_block_masses(
            target_row_ptr, draft_row_ptr, target_offset >= 0, residual & (draft_offset >= 0), work_ptr,
            geometry_ptr, request, split, vocab_size, draft_token, residual, target_max, residual_log_sum,
            draft_max, draft_log_sum, _inv_temperature(temperature), TILES_PER_SPLIT, BLOCK_V,
        )  # fmt: skip


@triton.jit
def _split_block_masses(target_row_ptr, draft_row_ptr, target_inside, draft_inside, work_ptr, geometry_ptr,
                        request, split, vocab_size, draft_token, residual, target_max, residual_log_sum,
                        draft_max, draft_log_sum, inv_temperature,
                        TILES_PER_SPLIT: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """`sample_kernel`'s block masses of split ``split`` of a sampled final row, recorded as
    ``(scale, sum)``: the fast way where `_fast_row` allows it, else `_tile_law` and
    `_row_block_mass` a block at a time."""
    block_scale_ptr = _record(work_ptr, geometry_ptr, WORK_BLOCK_SCALE, tl.float32)
    block_sum_ptr = _record(work_ptr, geometry_ptr, WORK_BLOCK_SUM, tl.float32)
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
            TILES_PER_SPLIT * BLOCK_V, True,
        )  # fmt: skip
    elif fast:
        _fast_block_masses(
            target_row_ptr, draft_row_ptr, first, records, block_scale_ptr, block_sum_ptr, top,
            target_max, residual_log_sum, draft_max, draft_log_sum, inv_temperature, draft_token,
            TILES_PER_SPLIT * BLOCK_V, False,
        )  # fmt: skip
    else:
        for group in range(0, TILES_PER_SPLIT * BLOCK_V, NOISE_GROUP):
            tokens = first + group + lanes
            in_vocab = tokens < vocab_size
            x = tl.load(target_row_ptr + tokens, mask=in_vocab & target_inside, other=NEG_INF)
            y = tl.load(draft_row_ptr + tokens, mask=in_vocab & draft_inside, other=NEG_INF)
            log_p, fraction, has_mass = _tile_law(
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
    token_ids_ptr,
    logprobs_ptr,
    vocab_size,
    max_num_drafts,
    num_blocks,
    NUM_BLOCKS: tl.constexpr,
    ROW_ALIGN: tl.constexpr,
    PDL: tl.constexpr,
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
        token_ids_ptr: ``[B, max_n + 1]`` int64 output.
        logprobs_ptr: ``[B, max_n + 1]`` fp32 output.
    """
    # Grid (B,): one program per request.
    request = tl.program_id(0)
    temperature = tl.load(temperature_ptr + request)
    seed = tl.load(seed_ptr + request)
    step = tl.load(step_ptr + request)
    _after_previous_launch(PDL)
    info_int = info_int_ptr + request.to(tl.int64) * INFO_INTS
    mode = tl.load(info_int + INFO_MODE)
    if mode != SAMPLE_NONE:
        target_offset, draft_offset, draft_token, residual, laws = _final_row(
            info_int, info_float_ptr + request.to(tl.int64) * INFO_FLOATS, mode
        )
        target_max, target_log_sum, residual_log_sum, draft_max, draft_log_sum = laws
        position = tl.load(info_int + INFO_POSITION)
        target_row_ptr = target_ptr + _row_offset(target_offset, ROW_ALIGN)
        _emit_token(
            target_row_ptr, draft_ptr + _row_offset(draft_offset, ROW_ALIGN),
            target_offset >= 0, residual & (draft_offset >= 0), block_scale_ptr, block_sum_ptr, request,
            num_blocks, vocab_size, mode, draft_token, target_max, target_log_sum, residual_log_sum,
            draft_max, draft_log_sum, _inv_temperature(temperature), seed, step, position,
            request.to(tl.int64) * (max_num_drafts + 1) + position, token_ids_ptr, logprobs_ptr, NUM_BLOCKS,
        )  # fmt: skip
