"""The production rejection sampler: validates a `SpecBatch`, allocates, and launches the Triton kernels.

One call runs `rejection_kernels.row_stats_kernel` (every target row, and the draft rows that the
probabilistic test needs, read once, except rows after a rejection already decided; each row's
last program decides it), `decide_kernel` (the walk to the first rejection and the accepted
prefix), and for probabilistic and synthetic batches `sample_kernel` and `emit_kernel`
(Gumbel-max over the one final row of each request). No call reads anything back to the host,
except ``cu_num_drafts`` once when ``batch.max_num_drafts`` is not given.

Behaviour on odd values (the launcher checks them only when asked, see `rejection_sample`):

- NaN logits count as ``-inf``; a row with ``+inf`` logits is uniform over them; a row with no
  finite logit is uniform over the vocabulary. Probabilities below ``2**-1075`` (zero in float64,
  the specification's precision) count as zero.
- A draft id outside ``[0, V)`` is a placeholder: rejected with certainty, and ``y ~ p``.
- A temperature that is not ``> 0`` (zero, negative, NaN) makes the request greedy; temperatures
  above ``1e30`` act as ``1e30``.
- Draft counts from ``cu_num_drafts`` are clamped to ``[0, max_num_drafts]`` and a negative start
  to 0; a target row, draft row or draft id that falls outside its tensor reads as no finite
  logit (a placeholder for an id). A ``draft_slot`` outside ``[0, S)``, or a position at or past
  the slot capacity ``K``, reads no draft logits: that draft row counts as having no finite logit,
  so ``q`` is uniform. A synthetic position past the end of ``synthetic_rates`` has rate 0.

Whatever the values, no kernel reads or writes out of bounds and every emitted id lies in ``[0, V)``.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass

import numpy as np
import torch

from kernels import rejection_kernels as jit
from reference.contract import SpecBatch, SpecOutput

CHECK_VALUES_ENV = "SPECSAMPLE_CHECK_VALUES"
METHOD_CODES = {"probabilistic": 0, "strict": 1, "synthetic": 2}
# A split is at most 32 per row, of 4096 tokens or a multiple. Each kernel walks it in its own
# tiles (sizes from a block-size sweep on an H200, kernels/RESULTS.md): the memory-bound statistics
# pass in 2048-token tiles with 4 warps; the Gumbel passes, bound by Philox and log arithmetic, in
# 1024-token tiles, few tokens per thread, so registers stay low and occupancy high.
SPLIT_BLOCK_V = 4096
MAX_SPLITS = 32
STATS_BLOCK_V, STATS_WARPS = 2048, 4
SAMPLE_BLOCK_V, SAMPLE_WARPS = 1024, 8
STRICT_BLOCK_V, STRICT_WARPS = 1024, 4
MAX_POS_BLOCK = 16
# Register caps of the statistics pass per method (probabilistic, strict, synthetic). Left alone,
# ptxas gives it 80 / 124 / 80 registers for the rarely run row-finishing code; under these caps
# it needs no spill (sm_90, `cuobjdump -res-usage`) and more programs fit on an SM.
STATS_MAX_REGISTERS = {0: 56, 1: 80, 2: 56}


@dataclass(frozen=True)
class VocabLayout:
    """How a row is cut into programs: ``num_splits`` splits of ``split_size`` tokens.

    The layout depends on ``V`` alone, so a request's statistics, and therefore its output, do not
    depend on the batch it rides in.
    """

    split_size: int
    num_splits: int

    @property
    def split_block(self) -> int:
        """``num_splits`` rounded up to a power of two, the width of the combine blocks."""
        return _next_power_of_2(self.num_splits)

    def tiles(self, block_v: int) -> tuple[int, int]:
        """``(tile size, tiles per split)`` for a kernel that walks a split in tiles of ``block_v``."""
        block = min(block_v, self.split_size)
        return block, self.split_size // block


def _next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n``, for ``n >= 1`` (plain Python: this is the host's hot path)."""
    return 1 << (n - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=256)
def vocab_layout(vocab_size: int) -> VocabLayout:
    """Splits of 4096 tokens (fewer for a small vocabulary), at most 32 (wider splits beyond)."""
    block = min(SPLIT_BLOCK_V, max(16, _next_power_of_2(vocab_size)))
    tiles_per_split = _cdiv(_cdiv(vocab_size, block), MAX_SPLITS)
    split_size = block * tiles_per_split
    return VocabLayout(split_size=split_size, num_splits=_cdiv(vocab_size, split_size))


def _aligned(size: int) -> int:
    """``size`` elements of 4 bytes rounded up to a multiple of 16 bytes."""
    return (size + 3) // 4 * 4


def _carve(
    sizes: list[int], dtype: torch.dtype, device: torch.device, *, zero: bool = False
) -> tuple[torch.Tensor, ...]:
    """One allocation (zeroed if ``zero``) cut into consecutive views of at least the given sizes,
    each 16-byte aligned.

    The kernels address the views through pointers only, so each keeps its rounding padding.
    """
    aligned = [_aligned(size) for size in sizes]
    allocate = torch.zeros if zero else torch.empty
    return allocate(sum(aligned), dtype=dtype, device=device).split(aligned)


def _check_values_default(batch: SpecBatch) -> bool:
    return batch.device.type == "cpu" or os.environ.get(CHECK_VALUES_ENV, "") not in ("", "0")


def rejection_sample(batch: SpecBatch, *, check_values: bool | None = None) -> SpecOutput:
    """Run the rejection sampler of ``batch.method`` on ``batch`` with the canonical random streams.

    Args:
        batch: the inputs; every tensor on one device (a CUDA GPU, or the CPU under
            ``TRITON_INTERPRET=1``).
        check_values: also run the value checks of `SpecBatch.validate`, which read tensors back to
            the host. Default: on for CPU tensors or when ``SPECSAMPLE_CHECK_VALUES`` is set to a
            value other than ``0``; off otherwise, so a GPU call never synchronises.

    Returns:
        The emitted tokens, their count and their target log-probabilities, on ``batch.device``.
    """
    if check_values is None:
        check_values = _check_values_default(batch)
    batch.validate(check_values=check_values)
    num_requests, vocab_size = batch.num_requests, batch.vocab_size
    max_num_drafts = batch.resolved_max_num_drafts()
    width = max_num_drafts + 1
    layout = vocab_layout(vocab_size)
    num_splits = layout.num_splits
    method = METHOD_CODES[batch.method]
    device = batch.device
    target = batch.target_logits
    draft = batch.draft_logits
    slotted = batch.slotted

    num_records = num_requests * width * num_splits
    num_rows = num_requests * width
    needs_draft = batch.method == "probabilistic" and draft is not None
    draft_records = num_records if needs_draft else 1
    strict_records = num_records if batch.method == "strict" else 1
    sample_records = num_requests * num_splits
    # Three workspaces, carved into the per-kernel records (each segment starts 16-byte aligned, so
    # the kernels' pointer specialisation does not depend on the batch): one allocation per kind
    # instead of one per record keeps the host cost of a small call down. Only the split counters
    # and the rejection flags must start at zero.
    float_sizes = [
        num_records, num_records, draft_records, draft_records, strict_records, strict_records,
        num_rows * jit.ROW_FLOATS.value, num_requests * jit.INFO_FLOATS.value, sample_records,
        sample_records,
    ]  # fmt: skip
    int_sizes = [
        2 * num_requests * jit.INFO_INTS.value, num_records, strict_records, sample_records,
        num_rows * jit.ROW_INTS.value,
    ]  # fmt: skip
    (target_max, target_sum, draft_max, draft_sum, cand_logit, cand_gumbel, row_float, info_float,
     res_key, res_mass) = _carve(float_sizes, torch.float32, device)  # fmt: skip
    info_int, target_arg, cand_token, res_token, row_int = _carve(int_sizes, torch.int32, device)
    info_int = info_int.view(torch.int64)
    counter, stop_flag = _carve([num_rows, num_requests], torch.int32, device, zero=True)
    token_ids = torch.empty(num_requests, width, dtype=torch.int64, device=device)
    logprobs = torch.empty(num_requests, width, dtype=torch.float32, device=device)
    num_emitted = torch.empty(num_requests, dtype=torch.int32, device=device)

    if draft is None:
        draft_arg, num_draft_rows, slot_capacity, draft_stride, slot_stride = target, 0, 0, 0, 0
    elif slotted:
        draft_arg, num_draft_rows, slot_capacity = draft, draft.shape[0], draft.shape[1]
        draft_stride, slot_stride = draft.stride(1), draft.stride(0)
    else:
        draft_arg, num_draft_rows, slot_capacity = draft, draft.shape[0], 0
        draft_stride, slot_stride = draft.stride(0), 0
    slot_arg = batch.draft_slot if batch.draft_slot is not None else batch.cu_num_drafts
    rates = batch.synthetic_rates
    rates_arg = rates if rates is not None and batch.method == "synthetic" else info_float
    num_rates = rates.shape[0] if rates is not None and batch.method == "synthetic" else 0
    num_draft_ids = batch.draft_token_ids.shape[0]
    shared = dict(METHOD=method, HAS_DRAFT=draft is not None, SLOTTED=slotted)
    strict = batch.method == "strict"
    stats_block, stats_tiles = layout.tiles(STRICT_BLOCK_V if strict else STATS_BLOCK_V)
    sample_block, sample_tiles = layout.tiles(SAMPLE_BLOCK_V)
    stats_args = (
        target, draft_arg, batch.draft_token_ids, batch.cu_num_drafts, batch.temperature,
        batch.seed, batch.step, slot_arg, rates_arg,
        target_max, target_sum, target_arg, draft_max, draft_sum, cand_logit, cand_gumbel, cand_token,
        row_float, row_int, counter, stop_flag,
        target.shape[0], num_draft_ids, num_draft_rows, slot_capacity, num_rates,
        target.stride(0), draft_stride, slot_stride, vocab_size, max_num_drafts, num_splits,
    )  # fmt: skip
    pos_block = min(MAX_POS_BLOCK, _next_power_of_2(max(max_num_drafts, 1)))
    stats_meta = dict(
        TILES_PER_SPLIT=stats_tiles, BLOCK_V=stats_block, SPLIT_BLOCK=layout.split_block,
        POS_BLOCK=pos_block, num_warps=STRICT_WARPS if strict else STATS_WARPS, **shared,
    )  # fmt: skip
    if device.type == "cuda":
        stats_meta["maxnreg"] = STATS_MAX_REGISTERS[method]

    # The interpreter evaluates both sides of every tl.where with numpy, which warns on log(0) and
    # inf - inf; the kernels define the result of every such lane.
    quiet = np.errstate(all="ignore") if device.type == "cpu" else contextlib.nullcontext()
    with quiet:
        jit.row_stats_kernel[(num_requests * num_splits, width)](*stats_args, **stats_meta)
        jit.decide_kernel[(num_requests,)](
            batch.draft_token_ids, batch.cu_num_drafts, batch.temperature, slot_arg, row_float, row_int,
            info_int, info_float, token_ids, logprobs, num_emitted,
            target.shape[0], num_draft_ids, num_draft_rows, slot_capacity,
            target.stride(0), draft_stride, slot_stride, vocab_size, max_num_drafts,
            POS_BLOCK=pos_block, num_warps=4, **shared,
        )  # fmt: skip
        if batch.method != "strict":
            jit.sample_kernel[(num_requests, num_splits)](
                target, draft_arg, batch.temperature, batch.seed, batch.step, info_int, info_float,
                res_key, res_token, res_mass, vocab_size, num_splits,
                TILES_PER_SPLIT=sample_tiles, BLOCK_V=sample_block, num_warps=SAMPLE_WARPS,
            )  # fmt: skip
            jit.emit_kernel[(num_requests,)](
                target, batch.temperature, batch.seed, batch.step, info_int, info_float,
                res_key, res_token, res_mass, token_ids, logprobs, vocab_size, max_num_drafts,
                num_splits, SPLIT_BLOCK=layout.split_block, BLOCK_V=sample_block, num_warps=4,
            )  # fmt: skip
    return SpecOutput(token_ids=token_ids, num_emitted=num_emitted, logprobs=logprobs)


class TritonRejectionSampler:
    """The production sampler as a `Variant`: every method, canonical random streams.

    Args:
        check_values: passed to `rejection_sample` (default: on for CPU tensors or when the
            ``SPECSAMPLE_CHECK_VALUES`` environment variable asks).
    """

    name = "triton"
    canonical_rng = True

    def __init__(self, check_values: bool | None = None) -> None:
        self.check_values = check_values

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample ``batch`` on its device."""
        return rejection_sample(batch, check_values=self.check_values)
