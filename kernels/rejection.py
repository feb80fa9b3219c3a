"""The production rejection sampler: validates a `SpecBatch`, allocates, and launches the Triton kernels.

One call runs `rejection_kernels.row_stats_kernel` (every target row, and the draft rows that the
probabilistic test needs, read once, except rows after a rejection already decided; each row's
last program decides it), for block verification `block_keep_kernel` (its residual masses and
joint keep decisions), `sample_kernel` (each request's final row from the first rejection, the
outputs that need no sampling, and the block masses of the one final row of each sampled
request), and for every method but strict `emit_kernel` (the block its uniform picks and a
Gumbel-max within it).
No call reads anything back to the host, except ``cu_num_drafts`` once when
``batch.max_num_drafts`` is not given (its counts then size the output, so they are checked).

Everything a call launches except the buffers' addresses is a function of the batch's structure
(`make_plan`): each launch's arguments by the kernel's parameter names (`kernels.launch.Launch`),
and a per-plan geometry record on the device with the counts that bound reads and where the
records of the call's one workspace lie. The first call of a structure launches through Triton's
dispatch, which specialises the kernels on the arguments and compiles them; on the Triton releases
that `kernels.launch` supports, the launcher keeps the plan and the compiled kernels under a key
that determines every specialisation (`_plan_key`: shapes, strides, dtypes, the method, the
current device, 16-byte alignment of each input) and launches them directly afterwards, which
saves most of the host time of a small call. Under a launch hook (a profiler's), on another
Triton release, or with ``SPECSAMPLE_DIRECT_LAUNCH=0``, every call goes through Triton's dispatch.
Such a call also keeps its workspace from call to call, one per plan and stream
(`_resident_workspace`): a call's last launch zeroes the counters and flags that its first launch
needs zeroed, so no fill is launched and nothing is allocated for it. Where no value is read back,
a batch structure (`batch_structure`) is validated once, then recognised.
On a GPU of compute capability 9.0 or later the launches after the first are programmatically
dependent (`programmatic_launch`; ``SPECSAMPLE_PDL=0`` turns it off): each waits in the kernel for
the one before, rather than behind a launch gap.

Behaviour on odd values (the launcher checks them only when asked, see `rejection_sample`):

- NaN logits count as ``-inf``; a row with ``+inf`` logits is uniform over them; a row with no
  finite logit is uniform over the vocabulary. Probabilities below ``2**-1075`` (zero in float64,
  the specification's precision) count as zero.
- A draft id outside ``[0, V)`` is a placeholder: rejected with certainty, and ``y ~ p``.
- A temperature that is not ``> 0`` (zero, negative, NaN) makes the request greedy; temperatures
  above ``1e30`` act as ``1e30``.
- Draft counts from ``cu_num_drafts`` are clamped to ``[0, max_num_drafts]`` (the host-side hint,
  which validation bounds by the shapes) and a negative start to 0; a target row, draft row or
  draft id that falls outside its tensor reads as no finite logit (a placeholder for an id). A
  ``draft_slot`` outside ``[0, S)``, or a position at or past the slot capacity ``K``, reads no
  draft logits: that draft row counts as having no finite logit, so ``q`` is uniform. A synthetic
  position past the end of ``synthetic_rates`` has rate 0.

Whatever the values, no kernel reads or writes out of bounds, every emitted id lies in ``[0, V)``,
and no size comes from an unchecked value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specsample.kernels import launch, rows_kernels
from specsample.kernels import rejection_kernels as jit
from specsample.kernels.filters import apply_thresholds, filter_thresholds, row_parameters
from specsample.kernels.launch import programmatic_launch
from specsample.kernels.records import GEOMETRY, SPLIT, WORKSPACE
from specsample.kernels.rules import ALL_ROWS, NOISE_GROUP, TARGET_ROWS
from specsample.reference.contract import Capabilities, SpecBatch, SpecOutput, validate_batch
from specsample.reference.filters import FILTER_FLAGS, FILTERS
from specsample.reference.methods import METHODS
from specsample.reference.schemes import CANONICAL

CHECK_VALUES_ENV = "SPECSAMPLE_CHECK_VALUES"
# The launch plans: "split" (what a GPU runs: up to four launches of one program per request,
# position and vocabulary split) and "rows" (one launch whose programs each take whole requests,
# `rows_kernels`), which the Triton interpreter runs 60 to 300 times faster (kernels/RESULTS.md).
# The default is "rows" on the CPU and "split" on a GPU; this environment variable, or the
# `rejection_sample` argument, picks one for both.
LAUNCH_PLAN_ENV = "SPECSAMPLE_LAUNCH_PLAN"
LAUNCH_PLANS = ("split", "rows")
# A rows-plan program holds its requests' rows as one [requests, positions, vocabulary tile] tile
# of at most this many elements, its vocabulary tile at most this many tokens. Under the
# interpreter, the larger the tile the fewer the operations it pays for (2**20 is Triton's largest
# tensor; B=200 n=3 V=1000: 0.17 s a call at 2**20, 0.30 s at 2**19, kernels/RESULTS.md). A GPU runs
# the rows plan only to check it against the split plan, in tiles Triton compiles quickly: its
# compile time grows faster than the tile (sm_90, one structure: 256 elements 2-4 s, 1024 12 s,
# 4096 over 5 minutes).
ROWS_TILE_ELEMENTS = {"cpu": 2**20, "cuda": 2**8}
ROWS_BLOCK_V = {"cpu": 1024, "cuda": 64}
# A split is at most 32 per row, of 4096 tokens or a multiple. Each kernel walks it in its own
# tiles (sizes from a block-size sweep on an H200, kernels/RESULTS.md): the memory-bound statistics
# pass in 2048-token tiles with 4 warps; strict sampling (a Gumbel-max over every row, bound by
# Philox and log arithmetic) and the sampling pass's blocks in 1024-token tiles, few tokens per
# thread, so registers stay low and occupancy high.
SPLIT_BLOCK_V = 4096
MAX_SPLITS = 32
STATS_BLOCK_V, STATS_WARPS = 2048, 4
# The sampling pass reads a row a block (1024 tokens) at a time, 4 warps a program at every batch
# size. A block's mass is a float32 sum whose rounding depends on the warps that reduce it (an
# H200 summed 36 % of 100,000 rows of 1024 differently with 8 warps than with 4), and the masses
# pick the block a token is drawn from: warps chosen by the batch's size would make a request's
# token depend on the batch it rides in (8 warps at B=1 took 2.5 us against 2.8; H100).
SAMPLE_BLOCK_V, SAMPLE_WARPS = 1024, 4
# The sampling pass and the emit step read rows from recorded offsets, hinted as multiples of up to
# this many elements (16 bytes of fp32 at 4, 32 at 16 of fp16).
MAX_ROW_ALIGN = 16
STRICT_BLOCK_V, STRICT_WARPS = 1024, 4
MAX_POS_BLOCK = 16
# The methods the kernels have a branch for (their ``METHOD`` codes).
KERNEL_METHODS = ("strict", "probabilistic", "synthetic", "block", "tree")
# A small batch has too few splits to fill the GPU with sampling programs; the sampling pass then
# cuts each split into parts of whole tiles, up to this many programs. Its result is the same: each
# block's mass is its own, however the row is cut. (Cutting every batch's splits into one-tile parts,
# up to 8192 programs, evened the last wave at B=64, 86.6 against 89.2 us on an H200, but a greedy
# batch then paid 58.3 against 50.8 us for programs that have nothing to sample; capping the
# registers below fits B=64's 2048 programs in one wave instead: 87.2 and 49.8 us.)
SAMPLE_PROGRAMS = 512
# The sampling pass's register cap on a GPU: 32 lets 16 programs of 4 warps share an SM (ptxas gives
# it 40 otherwise, 12 programs), so the 2048 of B=64 n=4 V=128256 run in one wave of 132 SMs.
SAMPLE_MAX_REGISTERS = 32
# Warps of the emit step, one program per request (H200, B=64 n=4 V=128256, whole call: 88.0 us
# with 4 warps, 89.7 with 8, 90.9 with 16).
EMIT_WARPS = 4
# Register caps of the statistics pass per method code (0 probabilistic, 1 strict, 2 synthetic,
# 3 block, 4 tree: strict's, whose sampling it shares). Left alone, ptxas gives it 80 / 124 / 80
# registers (probabilistic, strict, synthetic) for the rarely run row-finishing code; under these
# caps it needs no spill (sm_90, `cuobjdump -res-usage`) and more programs fit on an SM.
STATS_MAX_REGISTERS = {0: 56, 1: 80, 2: 56, 3: 56, 4: 80}


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


def _row_alignment(*strides: int) -> int:
    """The largest power of two up to `MAX_ROW_ALIGN` that divides every nonzero stride (in
    elements), so every row offset: the sampling pass then loads a row in vectors where the
    tensor's start is 16-byte aligned too (Triton specialises on that)."""
    align = MAX_ROW_ALIGN
    while align > 1 and any(stride % align for stride in strides if stride):
        align //= 2
    return align


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


@dataclass(frozen=True)
class WorkRecord:
    """A record of a call's workspace after the split records.

    Attributes:
        parameter: the kernel parameter that takes the record as its own pointer (a view of the
            workspace), if any.
        field: its `records.GEOMETRY` field, where kernels find it through the geometry record.
        dtype: the record's element type.
        offset: its first word; a multiple of 4 (16 bytes).
    """

    parameter: str | None
    field: int | None
    dtype: torch.dtype
    offset: int


# The buffers of one call by kernel parameter name: the batch's tensors (in the order of
# `_batch_tensors`), the workspace, the plan's geometry record, the workspace records that kernels
# take as their own pointers, and the outputs (in the order of `_outputs`). Each kernel takes the
# ones its parameters name.
INPUT_BUFFERS = (
    "target_ptr", "draft_ptr", "draft_ids_ptr", "cu_ptr", "temperature_ptr", "seed_ptr", "step_ptr",
    "draft_slot_ptr", "rates_ptr", "threshold_ptr",
)  # fmt: skip
RECORD_BUFFERS = tuple(f"{work.name}_ptr" for work in WORKSPACE if work.pointer)
OUTPUT_BUFFERS = ("token_ids_ptr", "logprobs_ptr", "num_emitted_ptr", "accepted_nodes_ptr")
CALL_BUFFERS = frozenset({*INPUT_BUFFERS, "work_ptr", "geometry_ptr", *RECORD_BUFFERS, *OUTPUT_BUFFERS})


@dataclass(frozen=True)
class Plan:
    """Everything one call launches, except the buffers' addresses: a function of the batch's
    structure (method, shapes, strides, dtypes), not of its values.

    Attributes:
        work_words: the size of a call's int32 workspace in 4-byte words.
        zeroed: the words of the workspace that must be zero at launch: the split counters and
            the rejection flags.
        records: the workspace records that kernels take as their own pointers.
        geometry: ``[GEOMETRY.SIZE]`` int64 on the batch's device, made once per plan: the counts
            that bound reads and the offsets of the records row_stats_kernel reads through it
            (`_workspace_layout`).
        sample_splits: programs of the sampling pass per request (`SAMPLE_PROGRAMS`).
        launches: the kernel launches, in order, with the call's buffers left open.
        tree: whether the output lists accepted nodes (tree verification).
    """

    num_requests: int
    width: int
    work_words: int
    zeroed: slice
    records: tuple[WorkRecord, ...]
    geometry: torch.Tensor
    sample_splits: int
    launches: tuple[launch.Launch, ...]
    tree: bool = False


def _workspace_layout(
    num_requests: int, width: int, num_splits: int, num_blocks: int, block: bool
) -> tuple[tuple[WorkRecord, ...], int, slice]:
    """Where each record of a call's workspace lies (`records.WORKSPACE`).

    The workspace starts with the `records.SPLIT` split records of row_stats_kernel, one word per
    program each, where `rejection_kernels._split_record` finds them from the kernel's grid. The
    records of `records.WORKSPACE` follow in its order, the zero-initialised ones first.
    row_stats_kernel finds the records it needs through the geometry record (it has no parameter
    to spare); the other kernels take theirs as pointers, so their first loads wait for no other.

    Returns:
        The records after the split records, the workspace's size in 4-byte words, and its
        zero-initialised words.
    """
    num_rows = num_requests * width
    entries = {"row": num_rows, "request": num_requests, "block": num_requests * num_blocks, "call": 1}
    entries["split"] = num_rows * num_splits
    placed = []
    words = SPLIT.SIZE.value * _aligned(num_rows * num_splits)
    for work in WORKSPACE:
        dtype = getattr(torch, work.dtype)
        field = getattr(GEOMETRY, work.name, None)
        parameter = f"{work.name}_ptr" if work.pointer else None
        placed.append(WorkRecord(parameter, None if field is None else field.value, dtype, words))
        size = 0 if work.only_block and not block else entries[work.per] * work.width
        words += _aligned(size * dtype.itemsize // 4)
    zeroed = [record for record, work in zip(placed, WORKSPACE, strict=True) if work.zeroed]
    if [work.zeroed for work in WORKSPACE[: len(zeroed)]] != [True] * len(zeroed):
        raise RuntimeError("the zero-initialised records must come first in records.WORKSPACE")
    return tuple(placed), words, slice(placed[0].offset, placed[len(zeroed)].offset)


def _geometry(fields: dict[str, int], device: torch.device) -> torch.Tensor:
    """The geometry record (`records.GEOMETRY`) holding ``fields`` (value by field name) on ``device``.

    On a GPU the copy is asynchronous (from pinned memory, on the current stream), so making a plan
    never waits for the GPU.
    """
    if sorted(fields) != sorted(GEOMETRY.FIELDS):
        raise RuntimeError(
            f"the geometry record has fields {sorted(fields)}; expected {sorted(GEOMETRY.FIELDS)}"
        )
    values = torch.tensor([fields[name] for name in GEOMETRY.FIELDS], dtype=torch.int64)
    if device.type == "cuda":
        return values.pin_memory().to(device, non_blocking=True)
    return values.to(device)


def _draft_layout(batch: SpecBatch) -> tuple[int, int, int, int]:
    """``(draft rows D or slots S, slot capacity K, row stride, slot stride)`` of the draft logits."""
    draft = batch.draft_logits
    if draft is None:
        return 0, 0, 0, 0
    if batch.slotted:
        return draft.shape[0], draft.shape[1], draft.stride(1), draft.stride(0)
    return draft.shape[0], 0, draft.stride(0), 0


def _read_bounds(batch: SpecBatch, num_draft_rows: int, slot_capacity: int) -> dict[str, int]:
    """The geometry record's counts that bound reads (`records.GEOMETRY` field -> value)."""
    rates = batch.synthetic_rates if METHODS[batch.method].takes_rates else None
    return dict(
        num_target_rows=batch.target_logits.shape[0],
        num_draft_ids=batch.draft_token_ids.shape[0],
        num_draft_rows=num_draft_rows,
        slot_capacity=slot_capacity,
        num_rates=0 if rates is None else rates.shape[0],
        num_requests=batch.num_requests,
        max_num_drafts=batch.resolved_max_num_drafts(),
        vocab_size=batch.vocab_size,
    )


def make_plan(batch: SpecBatch, filtered: int = 0) -> Plan:
    """The `Plan` of a validated batch; ``filtered`` (`rules.TARGET_ROWS`, `rules.ALL_ROWS`): its rows
    are read through per-row thresholds (`split_filters`), as the masked rows would be."""
    num_requests, vocab_size = batch.num_requests, batch.vocab_size
    max_num_drafts = batch.resolved_max_num_drafts()
    width = max_num_drafts + 1
    layout = vocab_layout(vocab_size)
    num_splits = layout.num_splits
    rules = METHODS[batch.method]
    method = rules.kernel_code
    draft = batch.draft_logits
    # Strict rows draw their target sample in the statistics pass, in tiles of their own.
    strict = rules.decides_by_sampling

    sample_block, sample_tiles = layout.tiles(SAMPLE_BLOCK_V)
    parts = 1
    while sample_tiles % (2 * parts) == 0 and num_requests * num_splits * 2 * parts <= SAMPLE_PROGRAMS:
        parts *= 2
    sample_splits = num_splits * parts
    sample_registers = dict(maxnreg=SAMPLE_MAX_REGISTERS) if batch.device.type == "cuda" else {}
    block = rules.verifies_jointly
    # The final row's block masses (`reference.schemes`, canonical-v3), one per block of NOISE_GROUP tokens.
    num_blocks = _cdiv(vocab_size, NOISE_GROUP.value)
    records, work_words, zeroed = _workspace_layout(num_requests, width, num_splits, num_blocks, block)

    num_draft_rows, slot_capacity, draft_stride, slot_stride = _draft_layout(batch)
    row_align = _row_alignment(batch.target_logits.stride(0), draft_stride, slot_stride)
    counts = _read_bounds(batch, num_draft_rows, slot_capacity)

    shared = dict(METHOD=method, HAS_DRAFT=draft is not None, SLOTTED=batch.slotted, FILTERED=filtered)
    pdl = programmatic_launch(batch.device)
    dependent = launch.pdl_options(pdl)
    strides = dict(
        target_stride=batch.target_logits.stride(0), draft_stride=draft_stride, slot_stride=slot_stride,
        vocab_size=vocab_size,
    )  # fmt: skip
    stats_block, stats_tiles = layout.tiles(STRICT_BLOCK_V if strict else STATS_BLOCK_V)
    # row_stats_kernel counts its splits from the vocabulary and its tiles.
    assert stats_block * stats_tiles == layout.split_size, (stats_block, stats_tiles, layout)
    pos_block = min(MAX_POS_BLOCK, _next_power_of_2(max(max_num_drafts, 1)))
    stats_options: dict[str, Any] = dict(num_warps=STRICT_WARPS if strict else STATS_WARPS)
    if batch.device.type == "cuda":
        stats_options["maxnreg"] = STATS_MAX_REGISTERS[method]
    launches = [
        launch.Launch.of(
            jit.row_stats_kernel, (num_requests * num_splits, width, 1),
            values=dict(
                **strides, TILES_PER_SPLIT=stats_tiles, BLOCK_V=stats_block, SPLIT_BLOCK=layout.split_block,
                POS_BLOCK=pos_block, **shared,
            ),
            options=stats_options, buffers=CALL_BUFFERS,
        ),
    ]  # fmt: skip
    if block and max_num_drafts > 0:
        launches.append(
            launch.Launch.of(
                jit.block_keep_kernel, (num_requests * num_splits, max_num_drafts, 1),
                values=dict(
                    **strides, max_num_drafts=max_num_drafts, num_splits=num_splits,
                    TILES_PER_SPLIT=stats_tiles, BLOCK_V=stats_block, SPLIT_BLOCK=layout.split_block,
                    HAS_DRAFT=draft is not None, SLOTTED=batch.slotted, FILTERED=filtered, PDL=pdl,
                ),
                options=dict(num_warps=STATS_WARPS, **dependent), buffers=CALL_BUFFERS,
            )
        )  # fmt: skip
    if rules.verifies_tree:
        # The rows of the paths (of a small batch, every row) drew their tokens in the statistics
        # pass; one program per request walks its tree over them.
        launches.append(
            launch.Launch.of(
                jit.tree_walk_kernel, (num_requests, 1, 1),
                values=dict(
                    vocab_size=vocab_size, max_num_drafts=max_num_drafts,
                    NODES=_next_power_of_2(max(width, 16)), PDL=pdl,
                ),
                options=dict(num_warps=EMIT_WARPS, **dependent), buffers=CALL_BUFFERS,
            )
        )  # fmt: skip
        return _plan(num_requests, width, work_words, zeroed, records, counts, sample_splits, launches, batch)
    # The sampling pass decides each request's final row; strict rows need no sampling, so one
    # program per request writes their outputs and nothing follows.
    launches.append(
        launch.Launch.of(
            jit.sample_kernel, (num_requests, 1 if strict else sample_splits, 1),
            values=dict(
                **strides, POS_BLOCK=pos_block, TILES_PER_SPLIT=sample_tiles // parts, BLOCK_V=sample_block,
                ROW_ALIGN=row_align, PDL=pdl, **shared,
            ),
            options=dict(num_warps=SAMPLE_WARPS, **sample_registers, **dependent), buffers=CALL_BUFFERS,
        )
    )  # fmt: skip
    if not strict:
        launches.append(
            launch.Launch.of(
                jit.emit_kernel, (num_requests, 1, 1),
                values=dict(
                    vocab_size=vocab_size, max_num_drafts=max_num_drafts, num_blocks=num_blocks,
                    NUM_BLOCKS=_next_power_of_2(num_blocks), ROW_ALIGN=row_align, PDL=pdl, FILTERED=filtered,
                ),
                options=dict(num_warps=EMIT_WARPS, **dependent), buffers=CALL_BUFFERS,
            )
        )  # fmt: skip
    return _plan(num_requests, width, work_words, zeroed, records, counts, sample_splits, launches, batch)


def _plan(
    num_requests: int,
    width: int,
    work_words: int,
    zeroed: slice,
    records: tuple[WorkRecord, ...],
    counts: dict[str, int],
    sample_splits: int,
    launches: list[launch.Launch],
    batch: SpecBatch,
) -> Plan:
    """The `Plan` of `make_plan`'s parts, its geometry record with the records' offsets."""
    offsets = {GEOMETRY.FIELDS[record.field]: record.offset for record in records if record.field is not None}
    return Plan(
        num_requests=num_requests,
        width=width,
        work_words=work_words,
        zeroed=zeroed,
        records=tuple(record for record in records if record.parameter is not None),
        geometry=_geometry({**counts, **offsets}, batch.device),
        sample_splits=sample_splits,
        launches=tuple(launches),
        tree=METHODS[batch.method].verifies_tree,
    )


def _batch_tensors(batch: SpecBatch, thresholds: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """The batch's tensors as the kernels take them, in the order of `INPUT_BUFFERS` (stand-ins where
    an input is absent: never read), the rows' thresholds (`split_filters`) last."""
    target = batch.target_logits
    draft = batch.draft_logits if batch.draft_logits is not None else target
    slot = batch.draft_slot if batch.draft_slot is not None else batch.cu_num_drafts
    rates = batch.synthetic_rates if METHODS[batch.method].takes_rates else None
    # A tree takes no rates: its parents travel in their place (`rates_ptr`).
    if batch.tree_parent is not None:
        rates = batch.tree_parent
    return (
        target, draft, batch.draft_token_ids, batch.cu_num_drafts, batch.temperature, batch.seed,
        batch.step, slot, rates if rates is not None else batch.temperature,
        batch.temperature if thresholds is None else thresholds,
    )  # fmt: skip


def _workspace(plan: Plan, device: torch.device) -> torch.Tensor:
    """A call's int32 workspace, its zero-initialised records zeroed."""
    work = torch.empty(plan.work_words, dtype=torch.int32, device=device)
    work[plan.zeroed].zero_()
    return work


def _record_views(plan: Plan, work: torch.Tensor) -> dict[str, torch.Tensor]:
    """The workspace records that kernels take as their own pointers, as typed views of ``work``."""
    return {record.parameter: work[record.offset :].view(record.dtype) for record in plan.records}


def _outputs(plan: Plan, device: torch.device) -> tuple[torch.Tensor, ...]:
    return _outputs_of(plan.num_requests, plan.width, device, plan.tree)


def _outputs_of(b: int, width: int, device: torch.device, tree: bool) -> tuple[torch.Tensor, ...]:
    """A call's outputs in the order of `OUTPUT_BUFFERS`: token ids, logprobs, counts, and the accepted
    nodes (``[B, max_n]`` for a tree; otherwise an empty stand-in, never written, one per device)."""
    return (
        torch.empty(b, width, dtype=torch.int64, device=device),
        torch.empty(b, width, dtype=torch.float32, device=device),
        torch.empty(b, dtype=torch.int32, device=device),
        torch.empty(b, width - 1, dtype=torch.int32, device=device) if tree else _no_nodes(device),
    )


@functools.lru_cache(maxsize=64)
def _no_nodes(device: torch.device) -> torch.Tensor:
    """The empty stand-in for the accepted nodes of a call that verifies no tree (kept: an allocation
    less per call)."""
    return torch.empty(0, dtype=torch.int32, device=device)


def _output(outputs: tuple[torch.Tensor, ...], tree: bool) -> SpecOutput:
    """The `SpecOutput` of a call's outputs (`_outputs_of`)."""
    token_ids, logprobs, num_emitted, nodes = outputs
    return SpecOutput(token_ids, num_emitted, logprobs, nodes if tree else None)


def _compile_and_run(
    batch: SpecBatch, plan: Plan, thresholds: torch.Tensor | None = None, work: torch.Tensor | None = None
) -> tuple[SpecOutput, list[launch.CachedLaunch]]:
    """Launch through Triton's dispatch (which compiles, or loads from its cache) with tensors, on
    the workspace ``work`` (its zeroed records zero; default: a fresh one).

    Returns:
        The output, and on a GPU the launches to cache (none under the interpreter, or where
        `launch.direct_launch_available` says no).
    """
    device = batch.device
    outputs = _outputs(plan, device)
    buffers = dict(zip(INPUT_BUFFERS, _batch_tensors(batch, thresholds), strict=True))
    buffers.update(zip(OUTPUT_BUFFERS, outputs, strict=True))
    work = _workspace(plan, device) if work is None else work
    buffers.update(work_ptr=work, geometry_ptr=plan.geometry, **_record_views(plan, work))
    # The interpreter evaluates both sides of every tl.where with numpy, which warns on log(0) and
    # inf - inf; the kernels define the result of every such lane.
    quiet = np.errstate(all="ignore") if device.type == "cpu" else contextlib.nullcontext()
    with quiet:
        cached = launch.dispatch(plan.launches, buffers, keep=device.type == "cuda")
    return _output(outputs, plan.tree), cached


def launch_plan(device: torch.device, plan: str | None = None) -> str:
    """The launch plan a call on ``device`` takes: ``plan`` if given, else ``SPECSAMPLE_LAUNCH_PLAN``
    if set, else "rows" on the CPU (the interpreter) and "split" on a GPU.

    Raises:
        ValueError: the plan, or the environment variable, names no plan in `LAUNCH_PLANS`.
    """
    source, chosen = "plan", plan
    if chosen is None and os.environ.get(LAUNCH_PLAN_ENV):
        source, chosen = LAUNCH_PLAN_ENV, os.environ[LAUNCH_PLAN_ENV]
    if chosen is None:
        return "rows" if device.type == "cpu" else "split"
    if chosen not in LAUNCH_PLANS:
        raise ValueError(f"{source} is {chosen!r}; expected one of {', '.join(LAUNCH_PLANS)}")
    return chosen


def rows_launch(batch: SpecBatch) -> launch.Launch:
    """The one launch of the rows plan (`rows_kernels.rows_kernel`) for a validated batch."""
    num_requests, vocab_size = batch.num_requests, batch.vocab_size
    max_num_drafts = batch.resolved_max_num_drafts()
    positions = _next_power_of_2(max_num_drafts + 1)
    device = "cpu" if batch.device.type == "cpu" else "cuda"
    tile = ROWS_TILE_ELEMENTS[device]
    block_v = max(16, min(ROWS_BLOCK_V[device], _next_power_of_2(vocab_size), tile // positions))
    requests = max(1, min(_next_power_of_2(num_requests), tile // (positions * block_v)))
    requests = 1 << (requests.bit_length() - 1)  # a power of two, at most the tile allows
    _, _, draft_stride, slot_stride = _draft_layout(batch)
    return launch.Launch.of(
        rows_kernels.rows_kernel, (_cdiv(num_requests, requests), 1, 1),
        values=dict(
            target_stride=batch.target_logits.stride(0), draft_stride=draft_stride, slot_stride=slot_stride,
            METHOD=METHODS[batch.method].kernel_code,
            HAS_DRAFT=batch.draft_logits is not None, SLOTTED=batch.slotted, REQUESTS=requests,
            POSITIONS=positions, BLOCK_V=block_v,
            NUM_BLOCKS=_next_power_of_2(_cdiv(vocab_size, NOISE_GROUP.value)),
        ),
        options=dict(num_warps=4), buffers=CALL_BUFFERS,
    )  # fmt: skip


def _run_rows(batch: SpecBatch) -> SpecOutput:
    """One call of the rows plan, through Triton's dispatch."""
    num_draft_rows, slot_capacity, _, _ = _draft_layout(batch)
    bounds = _read_bounds(batch, num_draft_rows, slot_capacity)
    # The rows plan has no workspace: the geometry record's workspace offsets are unused.
    fields = {name: bounds.get(name, 0) for name in GEOMETRY.FIELDS}
    geometry = _geometry(fields, batch.device)
    tree = METHODS[batch.method].verifies_tree
    outputs = _outputs_of(batch.num_requests, batch.resolved_max_num_drafts() + 1, batch.device, tree)
    buffers: dict[str, Any] = dict(zip(INPUT_BUFFERS, _batch_tensors(batch), strict=True))
    buffers.update(zip(OUTPUT_BUFFERS, outputs, strict=True), geometry_ptr=geometry)
    quiet = np.errstate(all="ignore") if batch.device.type == "cpu" else contextlib.nullcontext()
    with quiet:
        launch.dispatch([rows_launch(batch)], buffers, keep=False)
    return _output(outputs, tree)


# Plans and their compiled launches by batch structure (`_plan_key`), for the calls after the
# first; the least recently used goes when there are more than 1024.
_cache = launch.PlanCache(size=1024)


# The field names of `SpecBatch`, in order, for `batch_structure`.
_BATCH_FIELDS = tuple(field.name for field in dataclasses.fields(SpecBatch))


def batch_structure(batch: object) -> tuple[Any, ...] | None:
    """All that `validate_batch`'s structural checks and a call's plan see of ``batch``: each field's
    type and, for a tensor, its shape, strides, dtype, device and layout; for any other value, the
    value. ``None`` where it cannot be told (not a `SpecBatch`, an unhashable value, a tensor without
    strides): such a batch is validated on every call."""
    if type(batch) is not SpecBatch:
        return None
    parts: list[Any] = []
    try:
        for name in _BATCH_FIELDS:
            value = getattr(batch, name)
            if isinstance(value, torch.Tensor):
                parts.append((
                    type(value), value.is_nested, value.layout, value.device, value.dtype, value.shape,
                    value.stride(),
                ))  # fmt: skip
            else:
                parts.append((type(value), value))
        structure = tuple(parts)
        hash(structure)
    except (RuntimeError, TypeError):
        return None
    return structure


# The structures (`batch_structure`) that passed `validate_batch` without a value check, the last
# 1024 seen: a call whose values are not checked validates a structure once. The checks it skips are
# a function of the structure, so a batch of a structure seen here passes them too.
_validated: launch.Recent[bool] = launch.Recent(1024)


def _reads_values(structure: tuple[Any, ...] | None, check_values: bool | None) -> bool:
    """Whether `validate_batch` with ``check_values`` reads a batch of ``structure`` back to the host:
    when asked, or by default on the CPU (target_logits' device is the fourth item of its entry; a
    target that is no tensor is checked in full, and refused)."""
    if check_values is not None or structure is None:
        return bool(check_values)
    target = structure[0]
    return len(target) < 4 or bool(target[3].type == "cpu")


def _validate(batch: object, structure: tuple[Any, ...] | None, check_values: bool | None) -> None:
    """`validate_batch` (``check_values`` as it takes it), except for a structure that passed it before
    where no value is read."""
    reads_values = _reads_values(structure, check_values)
    if structure is not None and not reads_values and _validated.get(structure):
        return
    validate_batch(batch, check_values=check_values)
    if structure is not None and not reads_values:
        _validated.keep(structure, True)


def _plan_key(
    batch: SpecBatch,
    device_index: int,
    addresses: list[int],
    filtered: int = 0,
    structure: tuple[Any, ...] | None = None,
) -> tuple[Any, ...]:
    """What a call's kernels depend on besides addresses and values: the batch's structure
    (`batch_structure`, of the batch as the caller gave it: ``structure`` where known), its draft count
    (`SpecBatch.resolved_max_num_drafts`), the current device, whether rows are read through
    thresholds, and which inputs (``addresses``, the device addresses of `_batch_tensors`) are
    16-byte aligned (Triton specialises on it)."""
    aligned = tuple(address % 16 == 0 for address in addresses)
    structure = batch_structure(batch) if structure is None else structure
    return structure, batch.resolved_max_num_drafts(), device_index, filtered, aligned


# On a GPU, a call launched from a cached plan takes its workspace from here, one kept per plan key
# and stream, rather than allocating one and zeroing its zeroed records (a fill launch and about 10
# us of host time): a call's last launch leaves those records zero again
# (`rejection_kernels._clear_zeroed`), and the calls on one stream run one after another. At most
# 64 MiB are kept, the least recently used given back first (to PyTorch's allocator, which reuses
# the memory only on the stream it was allocated on, in stream order). A call captured in a CUDA
# graph allocates its own, zeroed within the graph: a graph may outlive a kept workspace, and be
# replayed on any stream.
_resident: launch.Recent[torch.Tensor] = launch.Recent(64 * 2**20, weigh=lambda work: 4 * work.numel())


def _resident_workspace(plan: Plan, key: tuple[Any, ...], stream: int, device: torch.device) -> torch.Tensor:
    """The workspace kept for plan key ``key`` on ``stream`` (made zeroed the first time), or a fresh
    one (`_workspace`) while the stream is captured or where it would not fit in the budget."""
    if torch.cuda.is_current_stream_capturing() or 4 * plan.work_words > _resident.budget:
        return _workspace(plan, device)
    held = (key, stream)
    work = _resident.get(held)
    if work is None:
        work = torch.zeros(plan.work_words, dtype=torch.int32, device=device)
        _resident.keep(held, work)
    return work


def _run_cached(
    batch: SpecBatch,
    plan: Plan,
    cached: list[launch.CachedLaunch],
    addresses: list[int],
    device_index: int,
    key: tuple[Any, ...] | None = None,
) -> SpecOutput:
    """Launch ``plan``'s compiled kernels on ``batch`` with device addresses in place of tensors, on
    the current stream of ``device_index`` (the device Triton's dispatch would launch on), with the
    workspace kept for the plan's ``key`` on that stream (`_resident_workspace`; a fresh one without
    a key)."""
    device = batch.device
    outputs = _outputs(plan, device)
    stream = launch.current_stream(device_index)
    # The workspace tensor is held until the launches are enqueued (a free after that is ordered after
    # them on the stream): freed earlier, its memory could go back to the driver or to another
    # allocation while the kernels still use its address.
    work = _workspace(plan, device) if key is None else _resident_workspace(plan, key, stream, device)
    base = work.data_ptr()
    buffers = dict(zip(INPUT_BUFFERS, addresses, strict=True))
    buffers.update((record.parameter, base + 4 * record.offset) for record in plan.records)
    buffers.update(work_ptr=base, geometry_ptr=plan.geometry.data_ptr())
    buffers.update((name, tensor.data_ptr()) for name, tensor in zip(OUTPUT_BUFFERS, outputs, strict=True))
    launch.launch_cached(plan.launches, cached, buffers, stream)
    return _output(outputs, plan.tree)


def _check_values_default() -> bool | None:
    """On when ``SPECSAMPLE_CHECK_VALUES`` asks, else `SpecBatch.validate`'s ``None``: values are
    read only where the batch is on the CPU, so a GPU call never synchronises."""
    return True if os.environ.get(CHECK_VALUES_ENV, "") not in ("", "0") else None


def rejection_sample(
    batch: SpecBatch, *, check_values: bool | None = None, plan: str | None = None
) -> SpecOutput:
    """Run the rejection sampler of ``batch.method`` on ``batch`` with the canonical random streams.

    The first call with a given structure (method, shapes, strides, dtypes) goes through Triton's
    dispatch; later calls on a GPU reuse its plan and, where `kernels.launch.direct_launch_ready`
    allows it, its compiled kernels, launched directly, which takes a fraction of the host time.

    Args:
        batch: the inputs; every tensor on one device (a CUDA GPU, or the CPU under
            ``TRITON_INTERPRET=1``).
        check_values: also run the value checks of `SpecBatch.validate`, which read tensors back to
            the host. Default: on for CPU tensors or when ``SPECSAMPLE_CHECK_VALUES`` is set to a
            value other than ``0``; off otherwise, so a GPU call never synchronises. The structural
            checks run first whatever it says, and a ``cu_num_drafts`` read to size the output
            (``batch.max_num_drafts`` not given) is checked whatever it says.
        plan: the launch plan, "split" or "rows" (default: `launch_plan`'s choice for the device).

    Returns:
        The emitted tokens, their count and their target log-probabilities, on ``batch.device``.

    Raises:
        ValueError: naming the argument and the value, for anything that breaks the contract
            (`SpecBatch.validate`), whatever its type or device, before anything is allocated.
    """
    # First, before any attribute is read but the ones its structure takes (which read nothing from
    # the device): anything passed in gets a ValueError naming it.
    structure = batch_structure(batch)
    _validate(batch, structure, _check_values_default() if check_values is None else check_values)
    if batch.method not in KERNEL_METHODS:
        raise ValueError(
            f"method is {batch.method!r}; the kernels have a branch for {', '.join(KERNEL_METHODS)} only"
        )
    plan = launch_plan(batch.device, plan)
    thresholds, filtered = None, 0
    if plan == "rows":
        batch = filter_batch(batch, plan)
    else:
        batch, thresholds, filtered = split_filters(batch)
    if batch.max_num_drafts is None:
        # The one read of cu_num_drafts, checked whatever check_values says: it sizes the output.
        batch = dataclasses.replace(batch, max_num_drafts=batch.resolved_max_num_drafts())
    if plan == "rows":
        return _run_rows(batch)
    if batch.device.type != "cuda":
        return _compile_and_run(batch, make_plan(batch, filtered), thresholds)[0]
    tensors = _batch_tensors(batch, thresholds)
    addresses = [tensor.data_ptr() for tensor in tensors]
    device_index = launch.current_device()
    key = _plan_key(batch, device_index, addresses, filtered, structure)
    entry = _cache.get(key)
    if entry is not None and entry[1] and launch.direct_launch_ready():
        plan, cached = entry
        return _run_cached(batch, plan, cached, addresses, device_index, key)
    plan = make_plan(batch, filtered) if entry is None else entry[0]
    output, cached = _compile_and_run(batch, plan, thresholds)
    _cache.put(key, plan, cached)
    return output


def _threshold_rows(batch: SpecBatch) -> tuple[int, int]:
    """How many rows have a threshold: the target rows, and with ``draft_filter`` the draft rows (``D``,
    or ``S * K`` of slotted drafts; 0 without it)."""
    draft = batch.draft_logits
    if not batch.draft_filter or draft is None:
        return batch.target_logits.shape[0], 0
    return batch.target_logits.shape[0], draft.shape[0] * (draft.shape[1] if draft.dim() == 3 else 1)


def kept_stride(batch: SpecBatch) -> int:
    """The rows of each part of `split_filters`' thresholds buffer: those `_threshold_rows` counts,
    rounded up to a multiple of 4 (`rejection_kernels.row_stats_kernel` rounds them the same way)."""
    return -(-sum(_threshold_rows(batch)) // 4) * 4


def _row_thresholds(
    batch: SpecBatch, plan: str, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each target row's threshold (`kernels.filters.filter_thresholds`, in launch plan ``plan``) and,
    with ``draft_filter``, each draft row's (``[D]``, or ``[S * K]`` of slotted drafts: rows no request
    reads are greedy, so ``-inf``); ``None`` without it. No host synchronisation: each row's
    parameters are gathered on the device (`kernels.filters.row_parameters`, one launch), from
    shapes known on the host.

    ``out``, where given, is ``[3 N]`` fp32 (``N`` the rows `_threshold_rows` counts, rounded up to a
    multiple of 4 so that each part starts 16-byte aligned: `kept_stride`): the thresholds go to
    ``out[:N]`` (the target rows' first), and the rows' kept statistics
    (`kernels.filters.filter_select_kernel`: max, then kept sum) to ``out[N:2N]`` and ``out[2N:]``."""
    params = [getattr(batch, name) for name in FILTERS]
    num_target, _ = _threshold_rows(batch)
    num = kept_stride(batch)

    def thresholds(logits: torch.Tensor, extra: int, first: int) -> torch.Tensor:
        gathered = row_parameters(batch.cu_num_drafts, logits.shape[0], extra, batch.temperature, *params)
        rows = logits.shape[0]
        views: dict[str, torch.Tensor] = {}
        if out is not None:
            views["out"] = out[first : first + rows]
            views["kept"] = out[num:].view(2, num)[:, first : first + rows]
        return filter_thresholds(logits, *gathered, check_values=False, plan=plan, **views)

    target = thresholds(batch.target_logits, 1, 0)
    draft = batch.draft_logits
    if not batch.draft_filter or draft is None:
        return target, None
    if draft.dim() == 2:
        empty = torch.empty(0, dtype=torch.float32, device=batch.device)
        return target, thresholds(draft, 0, num_target) if draft.shape[0] else empty
    # Slotted drafts: a slot's rows belong to the request that names it; rows of a slot no request
    # names are greedy.
    assert batch.draft_slot is not None
    num_slots, capacity, vocab_size = draft.shape
    requests = torch.arange(batch.num_requests, device=batch.device)
    slot_owner = torch.full((num_slots,), -1, dtype=torch.int64, device=batch.device)
    slot_owner[batch.draft_slot.to(torch.int64)] = requests
    row_owner = slot_owner.repeat_interleave(capacity)
    owner = row_owner.clamp(min=0)
    temperature = torch.where(row_owner >= 0, batch.temperature[owner], 0.0)
    gathered = [None if param is None else param[owner] for param in params]
    views = {}
    if out is not None:
        end = num_target + num_slots * capacity
        views = {"out": out[num_target:end], "kept": out[num:].view(2, num)[:, num_target:end]}
    return target, filter_thresholds(
        draft.reshape(-1, vocab_size), temperature, *gathered, check_values=False, plan=plan, **views
    )


def _unfiltered(batch: SpecBatch, **logits: torch.Tensor) -> SpecBatch:
    """``batch`` without its sampling parameters (and with ``logits`` in place of its own)."""
    return dataclasses.replace(batch, **logits, top_k=None, top_p=None, min_p=None, draft_filter=False)


def filter_batch(batch: SpecBatch, plan: str | None = None) -> SpecBatch:
    """``batch`` with its sampling parameters applied: target rows (and, with ``draft_filter``, draft
    rows) masked to ``-inf`` below each row's threshold (`_row_thresholds`, in the launch plan
    ``plan``, default `launch_plan`'s), the parameters then dropped; ``batch`` itself when it has
    none. The rows plan reads the masked copy; the split plan reads the rows through the
    thresholds instead (`split_filters`)."""
    if not batch.filtered:
        return dataclasses.replace(batch, draft_filter=False) if batch.draft_filter else batch
    plan = launch_plan(batch.device, plan)
    target_t, draft_t = _row_thresholds(batch, plan)
    target = apply_thresholds(batch.target_logits, target_t)
    draft = batch.draft_logits
    if draft_t is not None and draft is not None:
        if draft.dim() == 2:
            draft = apply_thresholds(draft, draft_t) if draft.shape[0] else draft
        else:
            draft = apply_thresholds(draft.reshape(-1, draft.shape[-1]), draft_t).reshape(draft.shape)
    return _unfiltered(batch, target_logits=target, draft_logits=draft)


def split_filters(batch: SpecBatch) -> tuple[SpecBatch, torch.Tensor | None, int]:
    """The split plan's filtered call: ``batch`` without its sampling parameters; the thresholds
    through which the kernels read the rows (`rules.kept_logit`) where the rows plan reads a masked
    copy: each target row's, then with ``draft_filter`` each draft row's, followed by the rows' kept
    statistics, which spare the statistics pass its reads where the filters found them
    (`_row_thresholds`' ``out``: ``[3 N]``); and which rows are read through them (the kernels'
    ``FILTERED``: `rules.TARGET_ROWS` or `rules.ALL_ROWS`). ``(batch, None, 0)`` without
    parameters."""
    if not batch.filtered:
        return (dataclasses.replace(batch, draft_filter=False) if batch.draft_filter else batch), None, 0
    out = torch.empty(3 * kept_stride(batch), dtype=torch.float32, device=batch.device)
    _, draft_t = _row_thresholds(batch, "split", out)
    return _unfiltered(batch), out, TARGET_ROWS.value if draft_t is None else ALL_ROWS.value


# Whether the sampler declares the sampling parameters (`TritonRejectionSampler`): unset or anything but
# "0", it declares every one, on a GPU and under the interpreter alike (whose filters take a block of
# rows a program, `kernels.filter_rows_kernels`); "0" declares none, so the harness sends none.
FILTERS_ENV = "SPECSAMPLE_FILTERS"


def declares_filters() -> bool:
    """Whether a `TritonRejectionSampler` declares its filters by default: unless `FILTERS_ENV` is
    ``0``."""
    return os.environ.get(FILTERS_ENV) != "0"


class TritonRejectionSampler:
    """The production sampler as a `Variant`: every method and sampling parameter, canonical streams.

    Args:
        check_values: passed to `rejection_sample` (default: on for CPU tensors or when the
            ``SPECSAMPLE_CHECK_VALUES`` environment variable asks).
        filters: the sampling parameters its capabilities declare (default: every one, none where
            ``SPECSAMPLE_FILTERS=0``). The kernels apply them whatever is declared; the declaration
            says what the harness sends it.
    """

    name = "triton"
    streams = CANONICAL

    def __init__(self, check_values: bool | None = None, filters: tuple[str, ...] | None = None) -> None:
        self.check_values = check_values
        if filters is None:
            filters = FILTER_FLAGS if declares_filters() else ()
        self.capabilities = Capabilities(methods=KERNEL_METHODS, filters=filters)

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample ``batch`` on its device."""
        return rejection_sample(batch, check_values=self.check_values)
