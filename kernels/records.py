"""The record layouts the launcher and the kernels share, each described once.

A record is a row of fields; `record` numbers them in the order given and exposes each index as a
``tl.constexpr`` attribute, so kernels read ``row_float + ROW_FLOAT.target_max`` and the launcher
sizes a record with ``ROW_FLOAT.SIZE``. A layout is a module object because Triton lets a kernel
read the attributes of a module global (and only constexpr globals otherwise).

The workspace of a call (int32 words) starts with the split records of the statistics pass, one
entry per program each, indexed like its programs (`SPLIT`); the records in `WORKSPACE` follow,
each 16-byte aligned. The geometry record (`GEOMETRY`, int64, one per plan) holds first the counts
that bound reads (they change from call to call, so no kernel is specialised on them), then where
each workspace record lies, in 4-byte words: kernels without a parameter to spare find their
records through it. A workspace record whose name is a `GEOMETRY` field is found there; the
others are passed as kernel parameters named ``<name>_ptr`` (some are both).
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import triton.language as tl


def record(name: str, *fields: str) -> types.ModuleType:
    """A record layout: each field's index as a ``tl.constexpr`` attribute, ``FIELDS`` the names in
    order and ``SIZE`` their count."""
    layout = types.ModuleType(name)
    for index, field in enumerate(fields):
        setattr(layout, field, tl.constexpr(index))
    layout.FIELDS = fields
    layout.SIZE = tl.constexpr(len(fields))
    return layout


# Per program of the statistics pass, ``[B * (max_n + 1) * num_splits]`` each.
SPLIT = record(
    "SPLIT",
    "target_max",  # fp32
    "target_sum",  # fp32
    "target_arg",  # int32, the first argmax
    "draft_max",  # fp32, probabilistic and block
    "draft_sum",  # fp32, probabilistic and block
    "cand_logit",  # fp32, strict: the split's Gumbel-max candidate
    "cand_gumbel",  # fp32, strict
    "cand_token",  # int32, strict
)
# Per row, written where the row is decided (the statistics pass), read by the later launches.
ROW_FLOAT = record(
    "ROW_FLOAT",
    "target_max",
    "target_log_sum",
    "draft_max",
    "draft_log_sum",
    "draft_log_prob",  # log p(d_i), the logprob of an accepted draft
    "token_log_prob",  # log p of ROW_INT.token
    "log_ratio",  # block: log p(d) - log q(d) (-inf where p(d) = 0, +inf where q(d) = 0)
    "log_weight",  # block: log w_i of the row (rows 1 to n, sampled requests)
    "target_threshold",  # filtered calls: the kept set's least logit of the target row (-inf: all)
    "draft_threshold",  # and of the draft row, with draft_filter (-inf: all); unwritten without it
)
ROW_INT = record(
    "ROW_INT",
    "token",  # the argmax of a greedy row, the target sample of a strict one
)
# Per request: its final row as the sampling pass found it, for the emit step.
INFO_INT = record(
    "INFO_INT",
    "mode",  # a SAMPLE_* code of `kernels.rules`
    "position",
    "target_offset",
    "draft_offset",
    "draft_token",  # the excluded one-hot draft, or -1
)
INFO_FLOAT = record(
    "INFO_FLOAT",
    "target_max",
    "target_log_sum",
    "draft_max",
    "draft_log_sum",
    "log_weight",  # log w of the final row's residual max(w p - q, 0): 0 but for block
    "target_threshold",  # the final row's ROW_FLOAT thresholds (filtered calls)
    "draft_threshold",  # (with draft_filter only)
)
GEOMETRY = record(
    "GEOMETRY",
    "num_target_rows",
    "num_draft_ids",
    "num_draft_rows",  # D, or S for slotted drafts
    "slot_capacity",  # K of slotted drafts
    "num_rates",
    "counter",
    "stop_flag",
    "ticket",
    "row_float",
    "row_int",
    "num_requests",  # B, read by the rows plan only
    "max_num_drafts",  # max_n, read by the rows plan and the sampling pass
    "vocab_size",  # V, read by the rows plan only
    "info_int",
    "info_float",
    "block_scale",
    "block_sum",
)


@dataclass(frozen=True)
class WorkspaceRecord:
    """A record of the workspace after the split records.

    Attributes:
        name: the `GEOMETRY` field where kernels find it, if it is one; ``<name>_ptr`` is the kernel
            parameter that takes it as a pointer (a view of the workspace), where ``pointer``.
        dtype: the name of its torch dtype.
        per: what it has one entry per: ``"row"`` (``B * (max_n + 1)``), ``"request"``, ``"call"`` (one),
            ``"block"`` (a final row's blocks, ``B * num_blocks``) or ``"split"`` (a row's splits,
            ``B * (max_n + 1) * num_splits``).
        width: fields per entry (a layout's ``SIZE``).
        pointer: some kernel takes it as a parameter.
        zeroed: zero at launch (such records come first).
        only_block: allocated for block verification only.
    """

    name: str
    dtype: str
    per: str
    width: int = 1
    pointer: bool = True
    zeroed: bool = False
    only_block: bool = False


WORKSPACE = (
    # The splits finished per row (a tree's row: `rejection_kernels.TREE_SKIPPED` where it lies off
    # the path, num_splits + 1 once decided).
    WorkspaceRecord("counter", "int32", "row", pointer=False, zeroed=True),
    # max_n + 1 - j for a request's first rejection j (the statistics pass); for a sampled block
    # verification request, m, its largest kept index (the keep step).
    WorkspaceRecord("stop_flag", "int32", "request", pointer=False, zeroed=True),
    # Tree verification: the statistics pass's programs taken so far (each takes its row by ticket).
    WorkspaceRecord("ticket", "int32", "call", pointer=False, zeroed=True),
    WorkspaceRecord("row_float", "float32", "row", ROW_FLOAT.SIZE.value, pointer=False),
    WorkspaceRecord("row_int", "int32", "row", ROW_INT.SIZE.value, pointer=False),
    WorkspaceRecord("info_float", "float32", "request", INFO_FLOAT.SIZE.value),
    WorkspaceRecord("info_int", "int64", "request", INFO_INT.SIZE.value),
    # A final row's block masses, each exp(scale) * sum.
    WorkspaceRecord("block_scale", "float32", "block"),
    WorkspaceRecord("block_sum", "float32", "block"),
    # The split shares of block verification's residual masses S_i.
    WorkspaceRecord("mass", "float32", "split", only_block=True),
)
