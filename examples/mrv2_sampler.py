"""A sampler of the kind an engine writes, on a random scheme shaped like vLLM Model Runner V2's.

`Mrv2Sampler` is a small Triton probabilistic rejection sampler (one program per request, greedy
rows, flat or one-hot drafts) that draws every random number the way `reference.schemes.MRV2`
says: the acceptance uniform of position ``i`` is ``tl.rand(seed, step + i)``, and the Gumbel noise
of token ``t`` is hashed from the row's draw, ``tl.rand(tl.randint(seed, step + i), t)``. Because it
declares that scheme (``streams = MRV2``), the harness replays it sample for sample: it gets the
coupled check. Check it with::

    python -m specsample.fuzz run --variant examples/mrv2_sampler.py:Mrv2Sampler --methods probabilistic

`Mrv2ShiftedPositions` plants a bug no law can show: it keys its draws by the draft's own
position (``step + i + 1``) instead of the position before it. Its output law is still exact, so
the statistical checks pass it; but it no longer draws what its scheme declares (a request replayed
from its seed and position, after a preemption or by the engine's own replay, diverges), and the
coupled check kills it at once.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import triton
import triton.language as tl

from specsample.reference.contract import Capabilities, SpecBatch, SpecOutput
from specsample.reference.schemes import MRV2

RAND_MIN = tl.constexpr(4.6566127342e-10)
NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _log_softmax_stats(row_ptr, vocab_size, inv_t, BLOCK: tl.constexpr):
    """``(max, log sum exp((x - max) / T), argmax)`` of one row; NaN reads as ``-inf``."""
    lanes = tl.arange(0, BLOCK)
    top = tl.full([], NEG_INF, tl.float32)
    total = tl.full([], 0.0, tl.float32)
    argmax = tl.full([], 0, tl.int64)
    start = 0
    while start < vocab_size:
        x = tl.load(row_ptr + start + lanes, mask=start + lanes < vocab_size, other=NEG_INF).to(tl.float32)
        x = tl.where(x == x, x, NEG_INF)
        tile_max, tile_arg = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        argmax = tl.where(tile_max > top, start + tile_arg, argmax)
        new_top = tl.maximum(top, tile_max)
        # x == max gives exactly exp(0), so rows of +inf (or of -inf only) are uniform over them.
        weights = tl.where(x == new_top, 1.0, tl.exp((x - new_top) * inv_t))
        scale = tl.where(top == new_top, 1.0, tl.exp((top - new_top) * inv_t))
        total = total * scale + tl.sum(tl.where(start + lanes < vocab_size, weights, 0.0), axis=0)
        top = new_top
        start += BLOCK
    return top, tl.log(total), argmax


@triton.jit
def _log_prob(x, top, log_total, inv_t):
    """``log softmax(x / T)`` of logits ``x`` of the row of `_log_softmax_stats`; NaN reads as ``-inf``."""
    x = x.to(tl.float32)
    x = tl.where(x == x, x, NEG_INF)
    return tl.where(x == top, 0.0, (x - top) * inv_t) - log_total


@triton.jit
def _gumbel_max(target_ptr, draft_ptr, token, residual, row_hash, vocab_size, inv_t, top, log_total,
                draft_top, draft_log_total, HAS_DRAFT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """Gumbel-max over ``(p - q)+`` (where ``residual``) or over ``p`` without ``token`` (``-1``: none);
    over ``p`` if nothing is left.

    The noise of token ``t`` is ``-log(-log1p(-u_t))``, ``u_t = max(tl.rand(row_hash, t), 2**-31)``,
    computed in float64.
    """
    lanes = tl.arange(0, BLOCK)
    best_key = tl.full([BLOCK], NEG_INF, tl.float64)
    best_token = tl.zeros([BLOCK], tl.int64)
    plain_key = tl.full([BLOCK], NEG_INF, tl.float64)
    plain_token = tl.zeros([BLOCK], tl.int64)
    start = 0
    while start < vocab_size:
        tokens = start + lanes
        inside = tokens < vocab_size
        log_p = _log_prob(tl.load(target_ptr + tokens, mask=inside, other=NEG_INF), top, log_total, inv_t)
        u = tl.maximum(tl.rand(row_hash, tokens), RAND_MIN).to(tl.float64)
        gumbel = -tl.log(-tl.log(1.0 - u))
        has_mass = inside & (log_p > NEG_INF) & (tokens != token)
        log_w = log_p
        if HAS_DRAFT:
            y = tl.load(draft_ptr + tokens, mask=inside & residual, other=NEG_INF)
            log_q = _log_prob(y, draft_top, draft_log_total, inv_t)
            # (p - q)+ = p (1 - q / p) where p > q.
            fraction = 1.0 - tl.exp(log_q - log_p)
            positive = inside & (log_p > log_q) & (fraction > 0.0)
            has_mass = tl.where(residual, positive, has_mass)
            log_w = tl.where(residual, log_p + tl.log(tl.where(positive, fraction, 1.0)), log_p)
        keys = tl.where(has_mass, log_w.to(tl.float64) + gumbel, NEG_INF)
        take = keys > best_key
        best_key = tl.where(take, keys, best_key)
        best_token = tl.where(take, tokens, best_token)
        plain = tl.where(inside & (log_p > NEG_INF), log_p.to(tl.float64) + gumbel, NEG_INF)
        take = plain > plain_key
        plain_key = tl.where(take, plain, plain_key)
        plain_token = tl.where(take, tokens, plain_token)
        start += BLOCK
    key = tl.max(best_key, axis=0)
    chosen = tl.min(tl.where(best_key == key, best_token, vocab_size), axis=0)
    fallback = tl.max(plain_key, axis=0)
    fallback_token = tl.min(tl.where(plain_key == fallback, plain_token, vocab_size), axis=0)
    return tl.where(key > NEG_INF, chosen, fallback_token)


@triton.jit
def mrv2_kernel(target_ptr, draft_ptr, ids_ptr, cu_ptr, temperature_ptr, seed_ptr, position_ptr,
                token_ids_ptr, num_emitted_ptr, vocab_size, width,
                HAS_DRAFT: tl.constexpr, BLOCK: tl.constexpr, WIDTH: tl.constexpr):  # fmt: skip
    """Verify one request's drafts and emit its tokens.

    Args:
        target_ptr: ``[R, V]`` target logits (contiguous rows).
        draft_ptr: ``[D, V]`` draft logits (read only if ``HAS_DRAFT``).
        ids_ptr: ``[D]`` int64 drafts, ``-1`` placeholders.
        cu_ptr: ``[B + 1]`` int32 prefix sums of the draft counts.
        temperature_ptr: ``[B]`` fp32, 0 for greedy.
        seed_ptr, position_ptr: ``[B]`` int64: each request's seed and the position of its first row.
        token_ids_ptr: ``[B, width]`` int64 output, ``-1`` after the emitted tokens.
        num_emitted_ptr: ``[B]`` int32 output.
    """
    # Grid (B,): one program per request walks its positions until the first rejection.
    b = tl.program_id(0)
    start = tl.load(cu_ptr + b).to(tl.int64)
    n = tl.load(cu_ptr + b + 1).to(tl.int64) - start
    temperature = tl.load(temperature_ptr + b)
    greedy = temperature == 0.0
    inv_t = tl.where(greedy, 1.0, 1.0 / tl.where(greedy, 1.0, temperature))
    seed = tl.load(seed_ptr + b)
    first = tl.load(position_ptr + b)
    i = tl.full([], 0, tl.int64)
    walking = i == 0
    while walking:
        target_row = target_ptr + (start + b + i) * vocab_size
        draft_row = draft_ptr + (start + tl.minimum(i, tl.maximum(n - 1, 0))) * vocab_size
        top, log_total, argmax = _log_softmax_stats(target_row, vocab_size, inv_t, BLOCK)
        token = tl.load(ids_ptr + start + i, mask=i < n, other=-1)
        real = (i < n) & (token >= 0) & (token < vocab_size)
        safe = tl.where(real, token, 0)
        log_p = _log_prob(tl.load(target_row + safe), top, log_total, inv_t)
        draft_top = tl.full([], 0.0, tl.float32)
        draft_log_total = tl.full([], 0.0, tl.float32)
        log_q = tl.full([], 0.0, tl.float32)
        # The compile-time test stands apart so the branch is compiled only where drafts exist.
        if HAS_DRAFT:  # noqa: SIM102
            if real:
                draft_top, draft_log_total, _ = _log_softmax_stats(draft_row, vocab_size, inv_t, BLOCK)
                log_q = _log_prob(tl.load(draft_row + safe), draft_top, draft_log_total, inv_t)
        u = tl.maximum(tl.rand(seed, first + i), RAND_MIN)
        accept = tl.where(greedy, real & (token == argmax), real & (log_p > tl.log(u) + log_q))
        if accept:
            tl.store(token_ids_ptr + b * width + i, token)
            i += 1
        else:
            if greedy:
                emitted = argmax
            else:
                row_hash = tl.randint(seed, first + i)
                emitted = _gumbel_max(
                    target_row, draft_row, tl.where(real, token, -1), real, row_hash, vocab_size, inv_t,
                    top, log_total, draft_top, draft_log_total, HAS_DRAFT, BLOCK,
                )  # fmt: skip
            tl.store(token_ids_ptr + b * width + i, emitted)
            tl.store(num_emitted_ptr + b, (i + 1).to(tl.int32))
            walking = i < 0
    columns = tl.arange(0, WIDTH)
    tl.store(token_ids_ptr + b * width + columns, -1, mask=(columns > i) & (columns < width))


class Mrv2Sampler:
    """The sampler as a `Variant` on the `MRV2` scheme: probabilistic method, flat or one-hot drafts."""

    name = "mrv2-example"
    streams = MRV2
    capabilities = Capabilities(methods=("probabilistic",), draft_kinds=("one-hot", "flat"))

    def positions(self, batch: SpecBatch) -> torch.Tensor:
        """``[B]`` the position of each request's first row: ``step`` (the scheme's ``pos = step + i``)."""
        return batch.step

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample ``batch`` on its device."""
        batch.validate()
        if batch.method != "probabilistic":
            raise ValueError(f"method is {batch.method!r}; this example implements 'probabilistic' only")
        if batch.slotted:
            raise ValueError("draft_logits is slotted [S, K, V]; this example takes flat or one-hot drafts")
        if batch.filtered or batch.draft_filter:
            raise ValueError("top_k, top_p, min_p or draft_filter is given; this example applies no filters")
        num_requests, vocab_size = batch.num_requests, batch.vocab_size
        width = batch.resolved_max_num_drafts() + 1
        token_ids = torch.empty(num_requests, width, dtype=torch.int64, device=batch.device)
        num_emitted = torch.empty(num_requests, dtype=torch.int32, device=batch.device)
        target = batch.target_logits.contiguous()
        draft = target if batch.draft_logits is None else batch.draft_logits.contiguous()
        # The CPU interpreter evaluates both sides of every tl.where, warning on -inf - -inf.
        quiet = np.errstate(all="ignore") if batch.device.type == "cpu" else contextlib.nullcontext()
        with quiet:
            mrv2_kernel[(num_requests,)](
                target, draft, batch.draft_token_ids, batch.cu_num_drafts, batch.temperature, batch.seed,
                self.positions(batch).contiguous(), token_ids, num_emitted, vocab_size, width,
                HAS_DRAFT=batch.draft_logits is not None, BLOCK=min(1024, triton.next_power_of_2(vocab_size)),
                WIDTH=triton.next_power_of_2(width),
            )  # fmt: skip
        return SpecOutput(token_ids=token_ids, num_emitted=num_emitted)


class Mrv2ShiftedPositions(Mrv2Sampler):
    """The planted bug: draws keyed by the draft's own position, ``step + i + 1``, not ``step + i``."""

    name = "mrv2-example-shifted"

    def positions(self, batch: SpecBatch) -> torch.Tensor:
        """One position too far: exact in law, but not the declared scheme."""
        return batch.step + 1
