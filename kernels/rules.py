"""The rules of rejection sampling as the kernels compute them, each in one ``@triton.jit`` function.

Only ``@triton.jit`` code and its constants live here. Both launch plans call these functions: the
split plan (`kernels.rejection_kernels`, what a GPU runs) and the rows plan (`kernels.rows_kernels`,
what the Triton interpreter runs), so a rule cannot drift between them. Each function works on
scalars or on tiles of any shape. The specification they implement is `reference.methods` (the
acceptance and residual rules), `reference.block` (block verification's weights and keep
probabilities) and `reference.schemes` (the canonical random scheme, ``canonical-v3``).

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

from specsample.reference.methods import METHODS

# The ``METHOD`` codes of the kernels' branches, as `reference.methods` numbers them.
PROBABILISTIC = tl.constexpr(METHODS["probabilistic"].kernel_code)
STRICT = tl.constexpr(METHODS["strict"].kernel_code)
SYNTHETIC = tl.constexpr(METHODS["synthetic"].kernel_code)
BLOCK = tl.constexpr(METHODS["block"].kernel_code)
TREE = tl.constexpr(METHODS["tree"].kernel_code)

# What the final row of a request needs (`records.INFO_INT.mode`).
SAMPLE_NONE = tl.constexpr(0)  # the token is already known (greedy argmax, strict sample)
SAMPLE_TARGET = tl.constexpr(1)  # y ~ p: bonus row, placeholder draft, synthetic rejection
SAMPLE_WITHOUT_DRAFT = tl.constexpr(2)  # one-hot draft rejected: y ~ p restricted to x != d
SAMPLE_RESIDUAL = tl.constexpr(3)  # y ~ (p - q)+

# The purposes of the canonical Philox offsets.
ACCEPT_PURPOSE = tl.constexpr(0)
SAMPLE_PURPOSE = tl.constexpr(1)
BLOCK_PURPOSE = tl.constexpr(2)
# The canonical scheme reads each word of a Philox call as a run of NOISE_RUN tokens, four runs a
# group; a group is also the block the final row's inverse CDF picks.
NOISE_RUN = tl.constexpr(256)
NOISE_GROUP = tl.constexpr(1024)

# ln(2**-1075): float64 rounds a probability below this to zero.
LOG_ZERO = tl.constexpr(-745.1332191019412)
# Temperatures above this act as this: the law is uniform to within 1e-30 either way, and the
# reciprocal stays a normal float32.
MAX_TEMPERATURE = tl.constexpr(1e30)
NEG_INF = tl.constexpr(float("-inf"))
NO_SPLIT = tl.constexpr(2**30)


@triton.jit
def after_previous_launch(PDL: tl.constexpr):
    """Where a call's launches after the first are programmatically dependent (``PDL``, sm_90 and
    later, `kernels.launch.programmatic_launch`): wait until the previous launch has finished and its
    writes are visible, then let the next launch place its programs, which wait here in turn. Called
    before any write and any read of what a launch writes; the batch's own tensors, which no launch
    writes, may be read first, while the previous launch finishes."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def clean_logit(x):
    """A float32 logit with NaN read as ``-inf``."""
    x = x.to(tl.float32)
    return tl.where(x == x, x, NEG_INF)


@triton.jit
def scaled_logit(x, row_max, inv_temperature):
    """``e(x) = (x - max) / T``, exactly 0 where ``x`` equals the max (so all-``inf`` rows work)."""
    return tl.where(x == row_max, 0.0, (x - row_max) * inv_temperature)


@triton.jit
def weight(x, inside, row_max, inv_temperature):
    """``exp(e(x))``, the unnormalised probability of each logit, 0 where not ``inside`` (past the
    vocabulary or the rows): the term of every sum of a row's mass."""
    return tl.where(inside, tl.exp(scaled_logit(x, row_max, inv_temperature)), 0.0)


@triton.jit
def rescale_factor(old_max, new_max, inv_temperature):
    """The factor that moves a sum of ``exp(e)`` from ``old_max`` to ``new_max >= old_max``."""
    return tl.where(old_max == new_max, 1.0, tl.exp((old_max - new_max) * inv_temperature))


@triton.jit
def inverse_temperature(temperature):
    """``1 / T`` for a sampled request; 1 for a greedy one (its logprobs use ``T = 1``)."""
    sampled = temperature > 0.0
    safe = tl.where(sampled, tl.minimum(temperature, MAX_TEMPERATURE), 1.0)
    return 1.0 / safe


@triton.jit
def request_span(cu_ptr, request, max_num_drafts):
    """The first draft index and the draft count of a request, clamped so no value reads out of bounds.

    Args:
        cu_ptr: ``[B + 1]`` int32 prefix sums of the draft counts.
    """
    start = tl.maximum(tl.load(cu_ptr + request).to(tl.int64), 0)
    end = tl.load(cu_ptr + request + 1).to(tl.int64)
    num_drafts = tl.minimum(tl.maximum(end - start, 0), max_num_drafts)
    return start, num_drafts


@triton.jit
def geometry_field(geometry_ptr, field):
    """Field ``field`` (a `records.GEOMETRY` field) of the geometry record, int64.

    Args:
        geometry_ptr: ``[GEOMETRY.SIZE]`` int64 geometry record.
    """
    # Every program reads the record, and the logit stream would push it out of L1: keep it there
    # (without the hint row_stats_kernel ran about 4% slower at B = 256 on an H100).
    return tl.load(geometry_ptr + field, eviction_policy="evict_last")


@triton.jit
def philox_offset(step, position, purpose, token):
    """The canonical Philox offsets ``(((step * 128 + i) * 4 + purpose) << 22) + token``, mod 2**64."""
    return (((step * 128 + position) * 4 + purpose) << 22) + token


@triton.jit
def philox(seed, step, position, purpose, calls):
    """The four words of Philox4x32-10 at ``philox_offset(step, position, purpose, calls)``, for
    ``calls < 2**22``.

    Key ``seed``, counter ``(offset low, offset high, 0, 0)``, as `tl.randint4x`. The offset of a
    call is the row's base, whose low 22 bits are zero, plus the call, so the high counter word is
    the row's own, one scalar: the first two rounds then multiply a single vector word, not two.
    Each multiplication is one 32 x 32 -> 64-bit product giving both halves.
    """
    base = philox_offset(step, position, purpose, 0)
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
def to_uniform(word):
    """A Philox word mapped to ``[0, 1)`` as `tl.rand` maps it."""
    word = word.to(tl.int32, bitcast=True)
    word = tl.where(word < 0, -word - 1, word)
    return word * 4.6566127342e-10


@triton.jit
def draft_row_offset(
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
def draft_at(draft_ids_ptr, draft_start, position, num_drafts, num_draft_ids, vocab_size):
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
def synthetic_accepts(
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
    is_draft, _, real = draft_at(draft_ids_ptr, draft_start, position, num_drafts, num_draft_ids, vocab_size)
    rate = tl.load(rates_ptr + position, mask=is_draft & (position < num_rates), other=0.0)
    return real & (accept_uniform(seed, step, position).to(tl.float64) < rate)


@triton.jit
def log_prob_at(target_row_ptr, target_inside, token, row_max, log_sum, inv_temperature, vocab_size,
                threshold=NEG_INF, FILTERED: tl.constexpr = 0):  # fmt: skip
    """``log p(token)`` under the target law; ``-inf`` below float64's smallest probability.

    Args:
        target_row_ptr: the row's first logit, fp32/fp16/bf16 (read at ``token`` if inside).
        threshold, FILTERED: where ``FILTERED``, the row is read through its threshold
            (`kept_logit`), as its filtered copy holds it.
    """
    logit = logit_at(target_row_ptr, target_inside, token, vocab_size)
    return log_prob(kept_logit(logit, threshold, FILTERED), row_max, log_sum, inv_temperature)


@triton.jit
def logit_at(row_ptr, row_inside, token, vocab_size):
    """A row's logit at ``token`` as stored (fp32/fp16/bf16), ``-inf`` where the row lies outside its
    tensor or ``token`` outside ``[0, V)``."""
    inside = row_inside & (token >= 0) & (token < vocab_size)
    return tl.load(row_ptr + tl.where(inside, token, 0), mask=inside, other=NEG_INF)


# The split plan's kernels' ``FILTERED``: 0, rows are read as they are; `TARGET_ROWS`, the target rows
# through per-row thresholds (`kept_logit`); `ALL_ROWS`, the draft rows too (``draft_filter``).
TARGET_ROWS = tl.constexpr(1)
ALL_ROWS = tl.constexpr(2)
# A filtered row's kept sum that the filters did not find (`kernels.filters.filter_select_kernel`):
# the statistics pass reads the row for it.
UNKNOWN_MASS = tl.constexpr(-1.0)


@triton.jit
def kept_logit(x, threshold, FILTERED: tl.constexpr):
    """A loaded logit as its filtered row holds it: where ``FILTERED``, float32 and ``-inf`` below the
    row's threshold ``t`` (NaN included: `kernels.filters.apply_thresholds` without the copy), else as
    loaded."""
    if FILTERED:
        x = x.to(tl.float32)
        x = tl.where(x >= threshold, x, NEG_INF)
    return x


@triton.jit
def log_prob(logit, row_max, log_sum, inv_temperature):
    """``log p`` of a logit under the target law; ``-inf`` below float64's smallest probability."""
    value = scaled_logit(clean_logit(logit), row_max, inv_temperature) - log_sum
    return tl.where(value < LOG_ZERO, NEG_INF, value)


@triton.jit
def law_weights(x, y, target_max, target_log_sum, draft_max, draft_log_sum, inv_temperature, tokens,
                vocab_size, draft_token, residual):  # fmt: skip
    """The weights of a tile under the final row's law: ``(log p, fraction, has mass)``.

    A token's weight is ``p * fraction``: the residual ``(p - q)+ = p (1 - q / p)`` where ``p > q``,
    else ``p`` itself (without ``draft_token``); ``has mass`` marks the tokens of positive weight.
    A token past the vocabulary has no mass, whatever it reads (``-inf`` equals the max of a row
    without a finite logit, whose tokens are uniform).
    """
    # A probability float64 rounds to zero never wins, as in the specification.
    log_p = tl.where(tokens < vocab_size, log_prob(x, target_max, target_log_sum, inv_temperature), NEG_INF)
    if residual:
        fraction = residual_weight(1.0, log_p, log_prob(y, draft_max, draft_log_sum, inv_temperature))
        has_mass = fraction > 0.0
    else:
        fraction = tl.full(log_p.shape, 1.0, tl.float32)
        has_mass = (log_p > NEG_INF) & (tokens != draft_token)
    return log_p, fraction, has_mass


@triton.jit
def block_mass(log_p, fraction, has_mass, axis: tl.constexpr, keep_dims: tl.constexpr):
    """The mass of a block of tokens along ``axis`` as ``(scale, sum)``: ``exp(scale) * sum`` is the
    sum of the weights ``p * fraction`` (`law_weights`), with ``scale`` the block's largest ``log p``
    (``-inf`` and 0 where the block has no mass): no underflow however small the block's mass."""
    scale = tl.max(tl.where(has_mass, log_p, NEG_INF), axis=axis, keep_dims=True)
    weight = tl.exp(log_p - tl.where(scale > NEG_INF, scale, 0.0)) * fraction
    total = tl.sum(tl.where(has_mass, weight, 0.0), axis=axis, keep_dims=keep_dims)
    return tl.max(scale, axis=axis, keep_dims=keep_dims), total


@triton.jit
def block_keys(log_p, fraction, has_mass, u, residual):
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
def block_uniform(seed, step, position):
    """The row's 53-bit block uniform, float64 in ``[0, 1)``: words 0 and 1 of the Philox call at
    ``philox_offset(step, position, BLOCK_PURPOSE, 0)``, ``((w0 >> 5) 2**26 + (w1 >> 6)) 2**-53``."""
    w0, w1, _, _ = philox(seed, step, position, BLOCK_PURPOSE, tl.zeros_like(position).to(tl.int32))
    bits = (w0 >> 5).to(tl.int64) * 67108864 + (w1 >> 6).to(tl.int64)
    return bits.to(tl.float64) * 1.1102230246251565e-16


@triton.jit
def pick_block(scale, total, u, NUM_BLOCKS: tl.constexpr):
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
def noise_group(seed, step, position, group_start):
    """The uniforms of tokens ``group_start + [0, NOISE_GROUP)`` of one row's sampling stream.

    Returns four ``[NOISE_RUN]`` runs, run ``j`` the tokens ``group_start + j * NOISE_RUN + lane``:
    word ``j`` of the Philox call ``group_start / 4 + lane`` (``canonical-v3``,
    `reference.schemes`). ``group_start`` is a multiple of ``NOISE_GROUP``.
    """
    calls = group_start // 4 + tl.arange(0, NOISE_RUN)
    w0, w1, w2, w3 = philox(seed, step, position, SAMPLE_PURPOSE, calls)
    return to_uniform(w0), to_uniform(w1), to_uniform(w2), to_uniform(w3)


@triton.jit
def noise_tile(seed, step, position, group_start):
    """The ``[NOISE_GROUP]`` uniforms of tokens ``group_start + [0, NOISE_GROUP)``, in token order."""
    u0, u1, u2, u3 = noise_group(seed, step, position, group_start)
    # [run, lane] flattened: join gives [lane, a, b] with run a + 2 b; permute puts the run first.
    joined = tl.join(tl.join(u0, u1), tl.join(u2, u3))
    return tl.reshape(tl.permute(joined, (2, 1, 0)), (NOISE_GROUP,))


@triton.jit
def accept_uniform(seed, step, position):
    """The acceptance uniform of ``position`` (a scalar or a tile of positions): ``tl.rand`` at the
    canonical offset of purpose ``ACCEPT_PURPOSE``, token 0."""
    return tl.rand(seed, philox_offset(step, position.to(tl.int64), ACCEPT_PURPOSE, 0))


@triton.jit
def accepts(log_p, log_q, u, real):
    """Probabilistic verification's decision on a draft: ``p(d) > u q(d)``, in the log domain.

    Strict ``>``: a draft with ``p = 0`` is never accepted, even at ``u = 0``; a draft with
    ``q = 0 < p`` always is. A placeholder (not ``real``) never is.
    """
    return real & (log_p > NEG_INF) & (log_p > tl.log(u) + log_q)


@triton.jit
def residual_weight(weight, log_p, log_q):
    """The residual ``(p - q)+`` at a token whose ``p`` is ``weight`` in the caller's unit, from
    ``log p`` and ``log q`` (block verification: ``w p`` for ``p``): ``p (1 - q / p)`` where
    ``p > q``, else 0. In ``p``'s own unit (``weight`` 1) it is the fraction of ``p`` that the
    residual keeps, 0 or at least ``2**-24``."""
    return tl.where(log_p > log_q, weight - weight * tl.exp(log_q - log_p), 0.0)


@triton.jit
def block_log_ratio(log_p, log_q, real):
    """Block verification's ``log p(d) / q(d)`` of a draft: ``-inf`` where ``p(d) = 0`` or at a
    placeholder (not ``real``), ``+inf`` where ``q(d) = 0 < p(d)``."""
    log_ratio = tl.where(log_p > NEG_INF, tl.where(log_q > NEG_INF, log_p - log_q, float("inf")), NEG_INF)
    return tl.where(real, log_ratio, NEG_INF)


@triton.jit
def block_next_log_weight(log_weight, log_ratio):
    """Block verification's weight recurrence ``log w_{i+1} = min(0, log w_i + log p(d_i) / q(d_i))``
    (``log w_0 = 0``); once ``-inf``, it stays ``-inf``."""
    return tl.where(log_weight > NEG_INF, tl.minimum(log_weight + log_ratio, 0.0), NEG_INF)


@triton.jit
def block_keep_probability(mass, weight):
    """Block verification's ``h_i = S_i / (S_i + 1 - w_i)`` from the residual mass ``S_i`` and the
    weight ``w_i``; 1 where both ``S_i`` and ``1 - w_i`` are 0."""
    total = mass + (1.0 - weight)
    return tl.where(total > 0.0, mass / total, 1.0)


@triton.jit
def block_residual(x, y, tokens, vocab_size, target_max, target_log_sum, log_weight, draft_max, draft_log_sum,
                   draft_id, inv_temperature, HAS_DRAFT: tl.constexpr):  # fmt: skip
    """Block verification's residual ``max(w p(x) - q(x), 0)`` at each token of a tile (0 past the
    vocabulary), from its target logits ``x`` and draft logits ``y`` (read where ``HAS_DRAFT``;
    else ``q = onehot(draft_id)``). A placeholder ``draft_id`` (outside the vocabulary) has no
    draft mass. ``log(w p) = e(x) - log_sum + log w``."""
    log_p = scaled_logit(clean_logit(x), target_max, inv_temperature) - target_log_sum + log_weight
    real = (draft_id >= 0) & (draft_id < vocab_size)
    if HAS_DRAFT:
        log_q = scaled_logit(clean_logit(y), draft_max, inv_temperature) - draft_log_sum
        log_q = tl.where(real, log_q, NEG_INF)
    else:
        log_q = tl.where(tokens == draft_id, 0.0, NEG_INF)
    return tl.where(tokens < vocab_size, residual_weight(tl.exp(log_p), log_p, log_q), 0.0)


@triton.jit
def gumbel_noise(u):
    """The Gumbel noise ``-log(-log u)`` of a uniform: a Gumbel-max draw takes the token of the
    largest ``e(x) + noise``."""
    return -tl.log(-tl.log(u))


@triton.jit
def tree_child(nodes, ids, parents, real, parent, token, none, axis: tl.constexpr, keep_dims: tl.constexpr):
    """The child a token drawn at node ``parent``'s row accepts (tree verification, `reference.tree`):
    the first of ``nodes`` (the lowest index) along ``axis`` that is a child of ``parent`` holding
    ``token``, ``none`` where none is. A placeholder (not ``real``) holds no token. ``-1`` is the root."""
    holds = real & (parents == parent) & (ids == token)
    return tl.min(tl.where(holds, nodes, none), axis=axis, keep_dims=keep_dims)


@triton.jit
def gumbel_max(keys, tokens, first, axis: tl.constexpr, keep_dims: tl.constexpr):
    """The token of the largest key along ``axis`` (of a vector, or with ``keep_dims``), ties to the
    lowest token; ``first`` (the first token of the block drawn in) where no key is finite, as the
    specification's argmax of ``-inf`` gives."""
    key = tl.max(keys, axis=axis, keep_dims=keep_dims)
    token = tl.min(tl.where(keys == key, tokens, NO_SPLIT), axis=axis, keep_dims=keep_dims)
    return tl.where(key > NEG_INF, token, first)


@triton.jit
def final_mode(real, sampled, METHOD: tl.constexpr, HAS_DRAFT: tl.constexpr):
    """What a request's final row needs, a ``SAMPLE_*`` code (int64, the shape of ``real`` and
    ``sampled``): nothing for greedy and strict rows (the token is known); after a real draft's
    rejection, the residual (without draft logits, the target law without the one-hot draft);
    else (a placeholder, the bonus row, synthetic) the target law."""
    if METHOD == STRICT:
        mode = tl.where(sampled, SAMPLE_NONE, SAMPLE_NONE).to(tl.int64)
    else:
        if METHOD == PROBABILISTIC or METHOD == BLOCK:  # noqa: SIM109 (constexprs)
            rejected_mode = SAMPLE_RESIDUAL if HAS_DRAFT else SAMPLE_WITHOUT_DRAFT
            mode = tl.where(real, rejected_mode, SAMPLE_TARGET).to(tl.int64)
        else:
            mode = tl.where(real, SAMPLE_TARGET, SAMPLE_TARGET).to(tl.int64)
        mode = tl.where(sampled, mode, SAMPLE_NONE)
    return mode


# ---------------------------------------------------------------------------------------------
# Filtered verification (`reference.filters`): a row's kept set is ``{x : z_x >= t}``; the searches
# compare int32 order keys of float32 values, whose integer order is the float order.

# The largest finite float32: min-p's cut is clamped to -FLT_MAX before its conversion to float32.
FLT_MAX = tl.constexpr(3.4028234663852886e38)
POS_INF = tl.constexpr(float("inf"))
# Bits that `order_key` flips in negative values (every bit but the sign).
MAGNITUDE_BITS = tl.constexpr(0x7FFFFFFF)
# Below every order key (the least, -inf's, is NEG_INF_KEY) and every bound and cut.
NO_KEY = tl.constexpr(-(2**31))
NEG_INF_KEY = tl.constexpr(-(2**31) + 2**23 - 1)


@triton.jit
def order_key(x):
    """The int32 order key of float32 values ``x`` (no NaN): ``a < b`` iff ``key(a) < key(b)``, and
    ``-0.0`` has the key of ``+0.0``."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ MAGNITUDE_BITS)


@triton.jit
def key_value(key):
    """The float32 value of an int32 order key (`order_key`'s inverse)."""
    bits = tl.where(key >= 0, key, key ^ MAGNITUDE_BITS)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def masked_key(x, inside):
    """`order_key` of ``x`` where ``inside``, `NO_KEY` (below every key) elsewhere."""
    return tl.where(inside, order_key(x), NO_KEY)


@triton.jit
def min_p_key(row_max, temperature, min_p):
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
    key = order_key(nearest)
    return tl.where(nearest.to(tl.float64) < cut, key + 1, key)


@triton.jit
def filters_row(temperature, row_max):
    """Whether a row can filter at all: greedy rows, rows without a finite logit and rows with ``+inf``
    logits filter nothing."""
    return (temperature > 0.0) & (row_max > NEG_INF) & (row_max < POS_INF)
