"""The production rejection sampler: validates a `SpecBatch`, allocates, and launches the Triton kernels.

One call runs `rejection_kernels.row_stats_kernel` (every target row, and the draft rows that the
probabilistic test needs, read once, except rows after a rejection already decided; each row's
last program decides it), `decide_kernel` (the walk to the first rejection and the accepted
prefix), and for probabilistic and synthetic batches `sample_kernel` and `emit_kernel`
(Gumbel-max over the one final row of each request). No call reads anything back to the host,
except ``cu_num_drafts`` once when ``batch.max_num_drafts`` is not given.

Everything a call launches except the buffers' addresses is a function of the batch's structure
(`make_plan`). The first call of a structure launches through Triton's dispatch, which specialises
the kernels on the arguments and compiles them; the launcher keeps the compiled kernels
(`CachedLaunch`) under a key that determines every specialisation (`_plan_key`: shapes, strides,
dtypes, the method, the current device, 16-byte alignment of each input) and launches them
directly afterwards, which saves most of the host time of a small call. Under a launch hook (a
profiler's) every call goes through Triton's dispatch, which calls the hook.

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
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from triton import knobs
from triton.runtime import driver

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
# A small batch has too few splits to fill the GPU with sampling programs; the sampling pass then
# cuts each split into parts of whole tiles, up to this many programs. Its result is the same: a
# Gumbel-max is exact however the row is cut (equal keys go to the lowest token either way).
SAMPLE_PROGRAMS = 512
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


# The records of one call, in the order they are laid out in its workspaces: name and dtype.
# Every record starts 16-byte aligned, so the kernels' pointer specialisation does not depend on
# the batch; only the split counters and the rejection flags must start at zero.
WORK_RECORDS = (
    ("target_max", torch.float32), ("target_sum", torch.float32), ("draft_max", torch.float32),
    ("draft_sum", torch.float32), ("cand_logit", torch.float32), ("cand_gumbel", torch.float32),
    ("row_float", torch.float32), ("info_float", torch.float32), ("res_key", torch.float32),
    ("res_mass", torch.float32), ("info_int", torch.int64), ("target_arg", torch.int32),
    ("cand_token", torch.int32), ("res_token", torch.int32), ("row_int", torch.int32),
)  # fmt: skip
ZEROED_RECORDS = ("counter", "stop_flag")


class Buffers(NamedTuple):
    """Every buffer the kernels of one call address.

    Tensors on the call that compiles a `Plan` (Triton specialises on them); their device
    addresses as ints on the calls that reuse it.
    """

    target: Any
    draft: Any
    draft_ids: Any
    cu: Any
    temperature: Any
    seed: Any
    step: Any
    slot: Any
    rates: Any
    target_max: Any
    target_sum: Any
    draft_max: Any
    draft_sum: Any
    cand_logit: Any
    cand_gumbel: Any
    row_float: Any
    info_float: Any
    res_key: Any
    res_mass: Any
    info_int: Any
    target_arg: Any
    cand_token: Any
    res_token: Any
    row_int: Any
    counter: Any
    stop_flag: Any
    token_ids: Any
    logprobs: Any
    num_emitted: Any


Launch = tuple[Any, tuple[int, int, int], tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class Plan:
    """Everything one call launches, except the buffers' addresses: a function of the batch's
    structure (method, shapes, strides, dtypes), not of its values.

    Attributes:
        work_offsets: offset of each record of `WORK_RECORDS` in the workspace, in 4-byte words.
        work_words: the workspace's size in 4-byte words.
        zeroed_words: the sizes of the `ZEROED_RECORDS` in 4-byte words.
        sample_splits: programs of the sampling pass per request (`SAMPLE_PROGRAMS`).
    """

    method: str
    num_requests: int
    width: int
    max_num_drafts: int
    vocab_size: int
    layout: VocabLayout
    work_offsets: tuple[int, ...]
    work_words: int
    zeroed_words: tuple[int, int]
    num_target_rows: int
    num_draft_ids: int
    num_draft_rows: int
    slot_capacity: int
    num_rates: int
    target_stride: int
    draft_stride: int
    slot_stride: int
    sample_splits: int
    stats_meta: dict[str, Any]
    decide_meta: dict[str, Any]
    sample_meta: dict[str, Any]
    emit_meta: dict[str, Any]

    def launches(self, buf: Buffers) -> list[Launch]:
        """``(kernel, grid, runtime arguments, constexpr arguments)`` of each launch, in order."""
        b, layout = self.num_requests, self.layout
        counts = (self.num_target_rows, self.num_draft_ids, self.num_draft_rows, self.slot_capacity)
        geometry = (
            self.target_stride, self.draft_stride, self.slot_stride, self.vocab_size, self.max_num_drafts,
        )  # fmt: skip
        stats_args = (
            buf.target, buf.draft, buf.draft_ids, buf.cu, buf.temperature, buf.seed, buf.step, buf.slot,
            buf.rates, buf.target_max, buf.target_sum, buf.target_arg, buf.draft_max, buf.draft_sum,
            buf.cand_logit, buf.cand_gumbel, buf.cand_token, buf.row_float, buf.row_int, buf.counter,
            buf.stop_flag, *counts, self.num_rates, *geometry, layout.num_splits,
        )  # fmt: skip
        decide_args = (
            buf.draft_ids, buf.cu, buf.temperature, buf.slot, buf.row_float, buf.row_int, buf.info_int,
            buf.info_float, buf.token_ids, buf.logprobs, buf.num_emitted, *counts, *geometry,
        )  # fmt: skip
        calls = [
            (jit.row_stats_kernel, (b * layout.num_splits, self.width, 1), stats_args, self.stats_meta),
            (jit.decide_kernel, (b, 1, 1), decide_args, self.decide_meta),
        ]
        if self.method != "strict":
            sample_args = (
                buf.target, buf.draft, buf.temperature, buf.seed, buf.step, buf.info_int, buf.info_float,
                buf.res_key, buf.res_token, buf.res_mass, self.vocab_size, self.sample_splits,
            )  # fmt: skip
            emit_args = (
                buf.target, buf.temperature, buf.seed, buf.step, buf.info_int, buf.info_float, buf.res_key,
                buf.res_token, buf.res_mass, buf.token_ids, buf.logprobs, self.vocab_size,
                self.max_num_drafts, self.sample_splits,
            )  # fmt: skip
            calls.append((jit.sample_kernel, (b, self.sample_splits, 1), sample_args, self.sample_meta))
            calls.append((jit.emit_kernel, (b, 1, 1), emit_args, self.emit_meta))
        return calls


def make_plan(batch: SpecBatch) -> Plan:
    """The `Plan` of a validated batch."""
    num_requests, vocab_size = batch.num_requests, batch.vocab_size
    max_num_drafts = batch.resolved_max_num_drafts()
    width = max_num_drafts + 1
    layout = vocab_layout(vocab_size)
    num_splits = layout.num_splits
    method = METHOD_CODES[batch.method]
    draft = batch.draft_logits
    strict = batch.method == "strict"

    num_records = num_requests * width * num_splits
    num_rows = num_requests * width
    draft_records = num_records if batch.method == "probabilistic" and draft is not None else 1
    strict_records = num_records if strict else 1
    sample_block, sample_tiles = layout.tiles(SAMPLE_BLOCK_V)
    parts = 1
    while sample_tiles % (2 * parts) == 0 and num_requests * num_splits * 2 * parts <= SAMPLE_PROGRAMS:
        parts *= 2
    sample_splits = num_splits * parts
    sample_records = num_requests * sample_splits
    record_words = (
        num_records, num_records, draft_records, draft_records, strict_records, strict_records,
        num_rows * jit.ROW_FLOATS.value, num_requests * jit.INFO_FLOATS.value, sample_records,
        sample_records, 2 * num_requests * jit.INFO_INTS.value, num_records, strict_records,
        sample_records, num_rows * jit.ROW_INTS.value,
    )  # fmt: skip
    offsets = [0]
    for words in record_words:
        offsets.append(offsets[-1] + _aligned(words))

    if draft is None:
        num_draft_rows, slot_capacity, draft_stride, slot_stride = 0, 0, 0, 0
    elif batch.slotted:
        num_draft_rows, slot_capacity = draft.shape[0], draft.shape[1]
        draft_stride, slot_stride = draft.stride(1), draft.stride(0)
    else:
        num_draft_rows, slot_capacity, draft_stride, slot_stride = draft.shape[0], 0, draft.stride(0), 0
    rates = batch.synthetic_rates
    num_rates = rates.shape[0] if rates is not None and batch.method == "synthetic" else 0
    shared = dict(METHOD=method, HAS_DRAFT=draft is not None, SLOTTED=batch.slotted)
    stats_block, stats_tiles = layout.tiles(STRICT_BLOCK_V if strict else STATS_BLOCK_V)
    pos_block = min(MAX_POS_BLOCK, _next_power_of_2(max(max_num_drafts, 1)))
    stats_meta = dict(
        TILES_PER_SPLIT=stats_tiles, BLOCK_V=stats_block, SPLIT_BLOCK=layout.split_block,
        POS_BLOCK=pos_block, num_warps=STRICT_WARPS if strict else STATS_WARPS, **shared,
    )  # fmt: skip
    if batch.device.type == "cuda":
        stats_meta["maxnreg"] = STATS_MAX_REGISTERS[method]
    return Plan(
        method=batch.method,
        num_requests=num_requests,
        width=width,
        max_num_drafts=max_num_drafts,
        vocab_size=vocab_size,
        layout=layout,
        work_offsets=tuple(offsets[:-1]),
        work_words=offsets[-1],
        zeroed_words=(_aligned(num_rows), _aligned(num_requests)),
        num_target_rows=batch.target_logits.shape[0],
        num_draft_ids=batch.draft_token_ids.shape[0],
        num_draft_rows=num_draft_rows,
        slot_capacity=slot_capacity,
        num_rates=num_rates,
        target_stride=batch.target_logits.stride(0),
        draft_stride=draft_stride,
        slot_stride=slot_stride,
        stats_meta=stats_meta,
        decide_meta=dict(POS_BLOCK=pos_block, num_warps=4, **shared),
        sample_splits=sample_splits,
        sample_meta=dict(TILES_PER_SPLIT=sample_tiles // parts, BLOCK_V=sample_block, num_warps=SAMPLE_WARPS),
        emit_meta=dict(SPLIT_BLOCK=_next_power_of_2(sample_splits), BLOCK_V=sample_block, num_warps=4),
    )


def _batch_tensors(batch: SpecBatch) -> tuple[torch.Tensor, ...]:
    """The batch's tensors as the kernels take them (stand-ins where an input is absent: never read)."""
    target = batch.target_logits
    draft = batch.draft_logits if batch.draft_logits is not None else target
    slot = batch.draft_slot if batch.draft_slot is not None else batch.cu_num_drafts
    rates = batch.synthetic_rates if batch.method == "synthetic" else None
    return (
        target, draft, batch.draft_token_ids, batch.cu_num_drafts, batch.temperature, batch.seed,
        batch.step, slot, rates if rates is not None else batch.temperature,
    )  # fmt: skip


def _outputs(plan: Plan, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, width = plan.num_requests, plan.width
    return (
        torch.empty(b, width, dtype=torch.int64, device=device),
        torch.empty(b, width, dtype=torch.float32, device=device),
        torch.empty(b, dtype=torch.int32, device=device),
    )


def _compile_and_run(batch: SpecBatch, plan: Plan) -> tuple[SpecOutput, list[CachedLaunch]]:
    """Launch through Triton's dispatch (which compiles, or loads from its cache) with tensors.

    Returns:
        The output, and on a GPU the launches to cache (none under the interpreter).
    """
    device = batch.device
    work = torch.empty(plan.work_words, dtype=torch.int32, device=device)
    zeroed = torch.zeros(sum(plan.zeroed_words), dtype=torch.int32, device=device)
    records = []
    for (_, dtype), start, end in zip(
        WORK_RECORDS, plan.work_offsets, (*plan.work_offsets[1:], plan.work_words), strict=True
    ):
        records.append(work[start:end].view(dtype))
    counter, stop_flag = zeroed.split(plan.zeroed_words)
    outputs = _outputs(plan, device)
    buf = Buffers(*_batch_tensors(batch), *records, counter, stop_flag, *outputs)
    # The interpreter evaluates both sides of every tl.where with numpy, which warns on log(0) and
    # inf - inf; the kernels define the result of every such lane.
    quiet = np.errstate(all="ignore") if device.type == "cpu" else contextlib.nullcontext()
    cached = []
    with quiet:
        for kernel, grid, args, meta in plan.launches(buf):
            compiled = kernel[grid](*args, **meta)
            if device.type == "cuda":
                cached.append(CachedLaunch.of(kernel, compiled, args, meta))
    token_ids, logprobs, num_emitted = outputs
    return SpecOutput(token_ids=token_ids, num_emitted=num_emitted, logprobs=logprobs), cached


@dataclass(frozen=True)
class CachedLaunch:
    """A compiled kernel and its constexpr arguments, launched without Triton's dispatch."""

    run: Any
    function: Any
    packed_metadata: Any
    constexprs: tuple[Any, ...]

    @classmethod
    def of(cls, kernel: Any, compiled: Any, args: tuple[Any, ...], meta: dict[str, Any]) -> CachedLaunch:
        """The cached form of ``compiled``, what launching ``kernel`` with ``args`` and ``meta`` returned."""
        constexprs = tuple(meta[name] for name in kernel.arg_names if name in meta)
        if len(args) + len(constexprs) != len(kernel.arg_names):
            raise RuntimeError(f"{kernel.__name__}: a constexpr argument was left to its default")
        return cls(compiled.run, compiled.function, compiled.packed_metadata, constexprs)


# Plans and their compiled launches by batch structure (`_plan_key`), for the calls after the
# first; the least recently used goes when there are more than `_CACHE_SIZE`.
_CACHE_SIZE = 1024
_cache: OrderedDict[tuple[Any, ...], tuple[Plan, list[CachedLaunch]]] = OrderedDict()


def _plan_key(batch: SpecBatch, device_index: int, tensors: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
    """What a call's kernels depend on besides addresses and values: shapes, strides, dtypes, the
    method, the current device, and which inputs are 16-byte aligned (Triton specialises on it)."""
    draft = batch.draft_logits
    return (
        device_index, batch.method, batch.resolved_max_num_drafts(), batch.cu_num_drafts.shape[0],
        batch.target_logits.shape, batch.target_logits.stride(), batch.target_logits.dtype,
        None if draft is None else (draft.shape, draft.stride(), draft.dtype),
        batch.draft_token_ids.shape[0],
        None if batch.draft_slot is None else batch.draft_slot.dtype,
        None if batch.synthetic_rates is None else batch.synthetic_rates.shape[0],
        tuple(tensor.data_ptr() & 15 == 0 for tensor in tensors),
    )  # fmt: skip


def _run_cached(
    batch: SpecBatch, plan: Plan, cached: list[CachedLaunch], addresses: list[int], device_index: int
) -> SpecOutput:
    """Launch ``plan``'s compiled kernels on ``batch`` with device addresses in place of tensors, on
    the current stream of ``device_index`` (the device Triton's dispatch would launch on)."""
    device = batch.device
    work = torch.empty(plan.work_words, dtype=torch.int32, device=device)
    zeroed = torch.zeros(sum(plan.zeroed_words), dtype=torch.int32, device=device)
    token_ids, logprobs, num_emitted = _outputs(plan, device)
    base = work.data_ptr()
    counter = zeroed.data_ptr()
    buf = Buffers(
        *addresses, *[base + 4 * offset for offset in plan.work_offsets], counter,
        counter + 4 * plan.zeroed_words[0], token_ids.data_ptr(), logprobs.data_ptr(), num_emitted.data_ptr(),
    )  # fmt: skip
    stream = driver.active.get_current_stream(device_index)
    for (_, grid, args, _), launch in zip(plan.launches(buf), cached, strict=True):
        launch.run(
            grid[0], grid[1], grid[2], stream, launch.function, launch.packed_metadata, None, None, None,
            *args, *launch.constexprs,
        )  # fmt: skip
    return SpecOutput(token_ids=token_ids, num_emitted=num_emitted, logprobs=logprobs)


def _launch_hooks_set() -> bool:
    """Whether a launch hook (a profiler's) is set: only Triton's dispatch calls it."""
    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    # Triton 3.6 keeps the hooks in chains, empty unless a hook was added.
    return any(hook is not None and getattr(hook, "calls", True) for hook in hooks)


def _check_values_default(batch: SpecBatch) -> bool:
    return batch.device.type == "cpu" or os.environ.get(CHECK_VALUES_ENV, "") not in ("", "0")


def rejection_sample(batch: SpecBatch, *, check_values: bool | None = None) -> SpecOutput:
    """Run the rejection sampler of ``batch.method`` on ``batch`` with the canonical random streams.

    The first call with a given structure (method, shapes, strides, dtypes) goes through Triton's
    dispatch; later calls on a GPU reuse its compiled kernels and launch them directly, which
    takes a fraction of the host time.

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
    if batch.device.type != "cuda":
        return _compile_and_run(batch, make_plan(batch))[0]
    tensors = _batch_tensors(batch)
    device_index = driver.active.get_current_device()
    key = _plan_key(batch, device_index, tensors)
    entry = _cache.get(key)
    if entry is None or _launch_hooks_set():
        plan = make_plan(batch)
        output, cached = _compile_and_run(batch, plan)
        _cache[key] = (plan, cached)
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
        return output
    _cache.move_to_end(key)
    plan, cached = entry
    return _run_cached(batch, plan, cached, [tensor.data_ptr() for tensor in tensors], device_index)


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
