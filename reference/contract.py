"""The contract every sampler implements: `SpecBatch` in, `SpecOutput` out.

A sampler, ours or foreign, is a `Variant`: a callable ``SpecBatch -> SpecOutput`` with a ``name``
and the random scheme it draws from (``streams``). This module defines the two data types,
validates them (every error names the argument and the bad value), and offers helpers to build a
batch from per-request data and to split an output per request.

Layout of a batch with ``B`` requests, request ``b`` holding ``n_b >= 0`` drafts:

- ``target_logits [R, V]``, ``R = sum(n_b + 1)``: request ``b`` owns rows
  ``cu_num_drafts[b] + b ... cu_num_drafts[b + 1] + b``, one per draft position, then its bonus row.
- ``draft_logits``: ``None`` (one-hot drafts), ``[D, V]`` flat (``D = sum(n_b)``, request ``b``'s
  rows start at ``cu_num_drafts[b]``), or ``[S, K, V]`` read through ``draft_slot [B]``.
- ``top_k``, ``top_p``, ``min_p``: optional ``[B]`` sampling parameters; every method verifies
  against the processed law they give (`reference.filters`), and ``draft_filter`` says whether the
  sampler applies them to the draft logits too.
- ``tree_parent``: ``[D]``, method ``"tree"`` only: request ``b``'s drafts are the nodes of a tree,
  ``tree_parent[cu_num_drafts[b] + i]`` node ``i``'s parent within the request (``-1``: the root),
  always a smaller index; target row ``cu_num_drafts[b] + b`` is the root's, row ``+ 1 + i`` node
  ``i``'s (`reference.tree`). The output then lists the accepted nodes (``accepted_nodes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import torch

from . import tree
from .filters import FILTER_FLAGS, FILTER_OFF, FILTERS
from .methods import CHAIN_METHODS
from .methods import METHODS as METHOD_TABLE
from .methods import MethodName as Method
from .schemes import RandomScheme

METHODS: tuple[str, ...] = tuple(METHOD_TABLE)

LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
# The devices a batch may live on: a CUDA GPU, or the CPU (where Triton's interpreter runs the kernels).
DEVICE_TYPES = ("cpu", "cuda")

# The canonical streams give a request 128 positions (its drafts, then the bonus) and 2**22 token lanes.
MAX_NUM_DRAFTS = 128 - 1
MAX_VOCAB_SIZE = 1 << 22
# A step must leave the offset layout injective: (step * 128 + i) * 4 + purpose < 2**42.
MAX_STEP = 1 << 32


@dataclass(frozen=True)
class SpecBatch:
    """One verification step of speculative decoding for a batch of requests.

    Attributes:
        target_logits: ``[R, V]`` fp32/fp16/bf16, one row per draft position then the bonus row.
        draft_logits: ``None`` (one-hot drafts), ``[D, V]`` flat, or ``[S, K, V]`` slotted.
        draft_token_ids: ``[D]`` int64; ``-1`` is a placeholder that is never accepted.
        cu_num_drafts: ``[B + 1]`` int32 exclusive prefix sums of the draft counts.
        temperature: ``[B]`` fp32; ``0`` means greedy.
        seed: ``[B]`` int64.
        step: ``[B]`` int64 in ``[0, 2**32)``.
        method: ``"strict"``, ``"probabilistic"``, ``"synthetic"``, ``"block"`` or ``"tree"``.
        synthetic_rates: ``[K]`` float64 conditional acceptance rates, required for synthetic.
        draft_slot: ``[B]`` int32/int64 slot of each request in slotted ``draft_logits``.
        max_num_drafts: optional host-side ``max(n_b)``; lets a GPU sampler size its output
            without reading ``cu_num_drafts`` back from the device.
        top_k: optional ``[B]`` int32/int64; ``0`` or ``>= V`` is off (`reference.filters`).
        top_p: optional ``[B]`` fp32 in ``(0, 1]``; ``1`` is off.
        min_p: optional ``[B]`` fp32 in ``[0, 1)``; ``0`` is off. ``None`` is off for every request.
        draft_filter: ``False``: the draft logits already are the law the drafts were drawn from
            (the engine filtered them); ``True``: the sampler applies each request's filters to
            its draft logits as to its target logits.
        tree_parent: ``[D]`` int32/int64, method ``"tree"`` only: each draft node's parent within its
            request (``-1``: the root), a smaller index than the node's; a path at most
            `reference.tree.MAX_DEPTH` deep. Draft logits, where given, are not read.
    """

    target_logits: torch.Tensor
    draft_logits: torch.Tensor | None
    draft_token_ids: torch.Tensor
    cu_num_drafts: torch.Tensor
    temperature: torch.Tensor
    seed: torch.Tensor
    step: torch.Tensor
    method: Method = "probabilistic"
    synthetic_rates: torch.Tensor | None = None
    draft_slot: torch.Tensor | None = None
    max_num_drafts: int | None = field(default=None, compare=False)
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None
    draft_filter: bool = False
    tree_parent: torch.Tensor | None = None

    @property
    def filtered(self) -> bool:
        """Whether the batch carries any sampling parameter (``top_k``, ``top_p`` or ``min_p``)."""
        return any(getattr(self, name) is not None for name in FILTERS)

    @property
    def num_requests(self) -> int:
        """``B``, the number of requests."""
        return int(self.cu_num_drafts.shape[0]) - 1

    @property
    def vocab_size(self) -> int:
        """``V``, the vocabulary size."""
        return int(self.target_logits.shape[-1])

    @property
    def device(self) -> torch.device:
        """The device every tensor of the batch lives on."""
        return self.target_logits.device

    @property
    def slotted(self) -> bool:
        """Whether draft logits are a persistent ``[S, K, V]`` buffer read through ``draft_slot``."""
        return self.draft_logits is not None and self.draft_logits.dim() == 3

    def num_drafts(self) -> list[int]:
        """The per-request draft counts ``n_b``, read from ``cu_num_drafts`` on the host and checked
        like `validate`'s value checks (a ``ValueError`` naming ``cu_num_drafts`` otherwise), so a
        count read never sizes anything unchecked."""
        return _draft_counts(self)

    def resolved_max_num_drafts(self) -> int:
        """``max(n_b)``: the host hint when given (checked by `validate` against the batch's shapes),
        else read from ``cu_num_drafts`` and checked."""
        return self.max_num_drafts if self.max_num_drafts is not None else max(self.num_drafts(), default=0)

    def validate(self, *, check_values: bool | None = True) -> None:
        """Raise ``ValueError`` naming the argument and the value if the batch breaks the contract.

        Structural checks need no device synchronisation and always run first, whatever the input:
        each field's Python type, layout, device (``cpu`` or ``cuda``, one for all), shape, dtype and
        contiguity, and the host-side ``max_num_drafts`` against the shapes, so that no size comes
        from an unchecked value. ``check_values`` adds those that read tensor contents (counts, slots,
        temperatures, steps); ``None`` reads them only where the batch is on the CPU, where reading
        costs no device synchronisation. NaN logits and draft ids outside ``[-1, V)`` are no errors:
        their semantics are defined (NaN counts as ``-inf``, such an id as a placeholder); see
        `odd_values`.
        """
        validate_batch(self, check_values=check_values)


@dataclass(frozen=True)
class SpecOutput:
    """What a sampler emits for a `SpecBatch`.

    Attributes:
        token_ids: ``[B, max_n + 1]`` int64, emitted tokens left-aligned, ``-1`` after them.
        num_emitted: ``[B]`` int32 in ``[1, n_b + 1]``: accepted drafts plus the emitted token.
        logprobs: optional ``[B, max_n + 1]`` fp32 target log-probabilities of the emitted tokens
            (``log softmax(target / T)``, with ``T = 1`` for greedy rows, of the row each was drawn
            from); ``nan`` after them.
        accepted_nodes: ``[B, max_n]`` int32, tree verification only: the accepted nodes in order
            (each a child of the one before, the first a child of the root), ``-1`` after them;
            ``token_ids`` holds their tokens, then the emitted one.
    """

    token_ids: torch.Tensor
    num_emitted: torch.Tensor
    logprobs: torch.Tensor | None = None
    accepted_nodes: torch.Tensor | None = None


@runtime_checkable
class Variant(Protocol):
    """A rejection sampler under test: ``SpecBatch -> SpecOutput``.

    ``streams`` is the random scheme the sampler draws from (`reference.schemes`), which the
    float64 walk replays for the coupled check; ``None`` for a sampler with its own generator. A
    variant may also declare ``capabilities`` (`Capabilities`; every method, dtype and input by
    default): the harness then checks it inside them and says what it left out.
    """

    name: str
    streams: RandomScheme | None

    def __call__(self, batch: SpecBatch) -> SpecOutput: ...


Arithmetic = Literal["log", "fp32-probs"]
DRAFT_KINDS = ("one-hot", "flat", "slotted")
# The smallest normal float32: an fp32 probability below it flushes to zero.
FP32_TINY = 2.0**-126


@dataclass(frozen=True)
class Capabilities:
    """What a sampler implements and the inputs it is defined on; the harness checks inside them.

    Attributes:
        methods: the methods it implements (by default the chain methods: every one but ``"tree"``).
        dtypes: the logit dtypes it takes.
        draft_kinds: the kinds of draft logits it takes: ``"one-hot"``, ``"flat"``, ``"slotted"``.
        logprobs: whether it reports logprobs.
        nan_logits: whether NaN logits may reach it (they read as ``-inf``).
        infinite_logits: whether ``+inf`` logits and rows with no finite logit may reach it
            (``-inf`` entries in a row that keeps a finite logit always may: that is masking).
        greedy_below: temperatures below this are greedy to it (vLLM's front end: ``1e-5``); it
            gets no temperature in ``(0, greedy_below)``.
        out_of_range_ids: whether draft ids outside ``[-1, V)`` may reach it (read as ``-1``).
        max_vocab: the largest vocabulary it takes.
        arithmetic: ``"log"`` (log space, exact as far as float32 goes), or ``"fp32-probs"``:
            probabilities in float32, where a probability below the smallest normal (``2**-126``)
            is zero; the exact law the checks use flushes them too.
        filters: which of ``top_k``, ``top_p``, ``min_p`` and ``draft_filter`` it takes (none by
            default: the harness never sends a sampling parameter it does not declare).
        pivot_ties: ``"value"``: every token tied with a pivot is kept (the specification); or
            ``"index"``: ties at a pivot are broken by index, as a sort gives, so the strategies
            never put exact ties at a pivot.
        filter_ulps: the rounding of its filter arithmetic, in float32 ulps per comparison: a
            token within that many ulps of a pivot (``reference.filters.pivot_band``: per
            ``sqrt(V)`` for the mass above a token) may be kept or dropped (a near pivot).
    """

    methods: tuple[str, ...] = CHAIN_METHODS
    dtypes: tuple[torch.dtype, ...] = LOGIT_DTYPES
    draft_kinds: tuple[str, ...] = DRAFT_KINDS
    logprobs: bool = True
    nan_logits: bool = True
    infinite_logits: bool = True
    greedy_below: float = 0.0
    out_of_range_ids: bool = True
    max_vocab: int = MAX_VOCAB_SIZE
    arithmetic: Arithmetic = "log"
    filters: tuple[str, ...] = ()
    pivot_ties: Literal["value", "index"] = "value"
    filter_ulps: float = 4.0

    def not_checked(self) -> list[str]:
        """What the harness leaves out for a sampler with these capabilities, one line each."""
        lines = [f"method {m}" for m in METHODS if m not in self.methods]
        lines += [f"dtype {str(d).removeprefix('torch.')}" for d in LOGIT_DTYPES if d not in self.dtypes]
        lines += [f"{kind} draft logits" for kind in DRAFT_KINDS if kind not in self.draft_kinds]
        flags = (
            (not self.logprobs, "logprobs (the sampler reports none)"),
            (not self.nan_logits, "NaN logits"),
            (not self.infinite_logits, "+inf logits and rows with no finite logit"),
            (self.greedy_below > 0, f"temperatures in (0, {self.greedy_below:g}) (greedy to the sampler)"),
            (not self.out_of_range_ids, "draft ids outside [-1, V)"),
            (self.max_vocab < MAX_VOCAB_SIZE, f"vocabularies above {self.max_vocab}"),
            (
                self.arithmetic == "fp32-probs",
                "probabilities below 2**-126 (zero in the sampler's fp32 arithmetic and in its law)",
            ),
        )
        lines += [
            f"{name} (the sampler does not take it)" for name in FILTER_FLAGS if name not in self.filters
        ]
        if self.filters and self.pivot_ties == "index":
            lines.append("exact ties at a filter's pivot (the sampler breaks them by index)")
        return lines + [text for off, text in flags if off]

    def admits(self, batch: SpecBatch) -> str | None:
        """Why ``batch`` lies outside these capabilities (the first reason), or ``None`` if it lies inside."""
        kind = "one-hot" if batch.draft_logits is None else "slotted" if batch.slotted else "flat"
        logits = [batch.target_logits] + ([] if batch.draft_logits is None else [batch.draft_logits])
        infinite = any(bool(t.isposinf().any() or (~torch.isfinite(t).any(dim=-1)).any()) for t in logits)
        temperature = batch.temperature.detach().cpu()
        cool = bool(((temperature > 0) & (temperature < self.greedy_below)).any())
        ids = batch.draft_token_ids.detach().cpu()
        out_of_range = bool(((ids < -1) | (ids >= batch.vocab_size)).any())
        checks = (
            (batch.method in self.methods, f"method {batch.method}"),
            (batch.target_logits.dtype in self.dtypes, f"dtype {batch.target_logits.dtype}"),
            (kind in self.draft_kinds, f"{kind} draft logits"),
            (batch.vocab_size <= self.max_vocab, f"vocabulary size {batch.vocab_size}"),
            (self.nan_logits or not any(bool(t.isnan().any()) for t in logits), "NaN logits"),
            (self.infinite_logits or not infinite, "+inf logits or a row with no finite logit"),
            (not cool, f"a temperature in (0, {self.greedy_below:g})"),
            (self.out_of_range_ids or not out_of_range, "draft ids outside [-1, V)"),
            *(
                (name in self.filters or getattr(batch, name) is None, f"{name} (not declared in filters)")
                for name in FILTERS
            ),
            (
                "draft_filter" in self.filters or not batch.draft_filter,
                "draft_filter (not declared in filters)",
            ),
        )
        return next((text for inside, text in checks if not inside), None)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field and the value of a capability the harness does not know."""
        for name, chosen, known in (
            ("methods", self.methods, METHODS),
            ("dtypes", self.dtypes, LOGIT_DTYPES),
            ("draft_kinds", self.draft_kinds, DRAFT_KINDS),
        ):
            if not chosen or any(c not in known for c in chosen):
                raise _fail(f"capabilities.{name}", f"is {chosen}; expected a non-empty subset of {known}")
        if any(name not in FILTER_FLAGS for name in self.filters):
            raise _fail("capabilities.filters", f"is {self.filters}; expected a subset of {FILTER_FLAGS}")
        if self.pivot_ties not in ("value", "index"):
            raise _fail("capabilities.pivot_ties", f"is {self.pivot_ties!r}; expected 'value' or 'index'")
        if not (self.filter_ulps >= 0 and np.isfinite(self.filter_ulps)):
            raise _fail("capabilities.filter_ulps", f"is {self.filter_ulps}; expected a finite value >= 0")
        if self.arithmetic not in ("log", "fp32-probs"):
            raise _fail("capabilities.arithmetic", f"is {self.arithmetic!r}; expected 'log' or 'fp32-probs'")
        if not (self.greedy_below >= 0 and np.isfinite(self.greedy_below)):
            raise _fail("capabilities.greedy_below", f"is {self.greedy_below}; expected a finite value >= 0")
        if not 1 <= self.max_vocab <= MAX_VOCAB_SIZE:
            raise _fail(
                "capabilities.max_vocab", f"is {self.max_vocab}; expected 1 <= max_vocab <= {MAX_VOCAB_SIZE}"
            )


def capabilities(variant: object) -> Capabilities:
    """The capabilities ``variant`` declares (every chain method, dtype and input when it declares none)."""
    declared = getattr(variant, "capabilities", None)
    if declared is None:
        return Capabilities()
    if not isinstance(declared, Capabilities):
        raise _fail("capabilities", f"is {type(declared).__name__}; expected reference.contract.Capabilities")
    declared.validate()
    return declared


# Validation


def _fail(argument: str, problem: str) -> ValueError:
    return ValueError(f"{argument} {problem}")


def _wrong_type(value: object) -> str:
    """How an error names a value of the wrong type: ``is None``, ``has type numpy.ndarray``."""
    if value is None:
        return "is None"
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"has type {name}"


def _check_tensor(
    name: str,
    value: object,
    dims: tuple[int, ...],
    dtypes: tuple[torch.dtype, ...],
    device: torch.device | None = None,
    num_requests: int | None = None,
) -> torch.Tensor:
    """``value``, checked: a dense tensor of ``dims`` and ``dtypes`` on a device of `DEVICE_TYPES`
    (``device`` when given), ``[num_requests]`` long when given."""
    if not isinstance(value, torch.Tensor):
        raise _fail(name, f"{_wrong_type(value)}; expected a torch.Tensor")
    if value.is_nested or value.layout != torch.strided:
        layout = "nested" if value.is_nested else str(value.layout).removeprefix("torch.")
        raise _fail(name, f"has layout {layout}; expected a dense (strided) tensor")
    if value.device.type not in DEVICE_TYPES:
        raise _fail(name, f"is on device {value.device}; expected a {' or '.join(DEVICE_TYPES)} tensor")
    if device is not None and value.device != device:
        raise _fail(name, f"is on device {value.device}; expected {device} (the device of target_logits)")
    if value.dim() not in dims:
        raise _fail(name, f"has shape {tuple(value.shape)}; expected {' or '.join(f'{d}-D' for d in dims)}")
    if value.dtype not in dtypes:
        expected = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise _fail(name, f"has dtype {value.dtype}; expected one of {expected}")
    if value.dim() > 0 and value.shape[-1] > 1 and value.stride(-1) != 1:
        raise _fail(name, f"has stride {value.stride()}; rows must be contiguous (last stride 1)")
    if num_requests is not None and value.shape[0] != num_requests:
        raise _fail(name, f"has shape {tuple(value.shape)}; expected [B] = [{num_requests}]")
    return value


def validate_batch(batch: object, *, check_values: bool | None = True) -> None:
    """See `SpecBatch.validate`; ``batch`` may be any object (anything but a `SpecBatch` is refused)."""
    if not isinstance(batch, SpecBatch):
        raise _fail("batch", f"{_wrong_type(batch)}; expected a SpecBatch")
    target = _check_tensor("target_logits", batch.target_logits, (2,), LOGIT_DTYPES)
    device = target.device
    num_rows, vocab_size = target.shape
    if not 1 <= vocab_size <= MAX_VOCAB_SIZE:
        raise _fail("target_logits", f"has vocab size {vocab_size}; expected 1 <= V <= {MAX_VOCAB_SIZE}")
    if not isinstance(batch.method, str):
        raise _fail("method", f"{_wrong_type(batch.method)}; expected one of {', '.join(METHODS)}")
    if batch.method not in METHODS:
        raise _fail("method", f"is {batch.method!r}; expected one of {', '.join(METHODS)}")

    cu = _check_tensor("cu_num_drafts", batch.cu_num_drafts, (1,), (torch.int32,), device)
    num_requests = cu.shape[0] - 1
    if num_requests < 1:
        raise _fail("cu_num_drafts", f"has shape {tuple(cu.shape)}; expected [B + 1] with B >= 1")
    num_draft_rows = num_rows - num_requests
    if num_draft_rows < 0:
        raise _fail("target_logits", f"has {num_rows} rows; expected at least B = {num_requests}")
    for name, dtype in (("temperature", torch.float32), ("seed", torch.int64), ("step", torch.int64)):
        _check_tensor(name, getattr(batch, name), (1,), (dtype,), device, num_requests)
    ids = _check_tensor("draft_token_ids", batch.draft_token_ids, (1,), (torch.int64,), device)
    if ids.shape[0] != num_draft_rows:
        raise _fail(
            "draft_token_ids",
            f"has shape {tuple(ids.shape)}; expected [D] = [{num_draft_rows}] "
            f"(target_logits rows {num_rows} minus B = {num_requests})",
        )

    draft, slot = batch.draft_logits, batch.draft_slot
    if draft is None:
        if slot is not None:
            raise _fail("draft_slot", "is given but draft_logits is None; slots index [S, K, V] draft logits")
    else:
        _check_tensor("draft_logits", draft, (2, 3), LOGIT_DTYPES, device)
        if draft.shape[-1] != vocab_size:
            raise _fail(
                "draft_logits",
                f"has vocab size {draft.shape[-1]} (shape {tuple(draft.shape)}); "
                f"expected V = {vocab_size}, the vocab size of target_logits",
            )
        if draft.dim() == 2:
            if draft.shape[0] != num_draft_rows:
                raise _fail(
                    "draft_logits",
                    f"has shape {tuple(draft.shape)}; expected [D, V] = [{num_draft_rows}, {vocab_size}]",
                )
            if slot is not None:
                raise _fail("draft_slot", "is given but draft_logits is flat [D, V]; slots need [S, K, V]")
        else:
            if slot is None:
                raise _fail("draft_slot", "is None but draft_logits is slotted [S, K, V]; expected [B] slots")
            _check_tensor("draft_slot", slot, (1,), INDEX_DTYPES, device, num_requests)

    if METHOD_TABLE[batch.method].verifies_tree:
        parents = _check_tensor("tree_parent", batch.tree_parent, (1,), INDEX_DTYPES, device)
        if parents.shape[0] != num_draft_rows:
            raise _fail(
                "tree_parent",
                f"has shape {tuple(parents.shape)}; expected [D] = [{num_draft_rows}], one per draft",
            )
    elif batch.tree_parent is not None:
        raise _fail("tree_parent", f"is given but method is {batch.method!r}; only method 'tree' reads it")
    if batch.synthetic_rates is not None:
        _check_tensor("synthetic_rates", batch.synthetic_rates, (1,), (torch.float64,), device)
    elif METHOD_TABLE[batch.method].takes_rates:
        raise _fail("synthetic_rates", f"is None; method {batch.method!r} needs [K] conditional rates")
    for name, dtypes in (("top_k", INDEX_DTYPES), ("top_p", (torch.float32,)), ("min_p", (torch.float32,))):
        if getattr(batch, name) is not None:
            _check_tensor(name, getattr(batch, name), (1,), dtypes, device, num_requests)
    if not isinstance(batch.draft_filter, bool):
        raise _fail("draft_filter", f"{_wrong_type(batch.draft_filter)}; expected a bool")
    # The hint sizes a GPU sampler's output unchecked against cu_num_drafts: bound it by the shapes.
    hint = batch.max_num_drafts
    if hint is not None:
        if not isinstance(hint, int) or isinstance(hint, bool):
            raise _fail("max_num_drafts", f"{_wrong_type(hint)}; expected an int (host-side) or None")
        limit = min(MAX_NUM_DRAFTS, num_draft_rows)
        if not 0 <= hint <= limit:
            raise _fail(
                "max_num_drafts",
                f"is {hint}; expected 0 <= max_num_drafts <= {limit} "
                f"(at most {MAX_NUM_DRAFTS} drafts a request, D = {num_draft_rows} in the batch)",
            )

    if check_values or (check_values is None and device.type == "cpu"):
        _validate_values(batch)


def _check_entries(name: str, values: torch.Tensor, ok: torch.Tensor, expected: str) -> None:
    """Raise the ``ValueError`` naming the first entry of ``values`` where ``ok`` is false."""
    if not bool(ok.all()):
        i = int(torch.nonzero(~ok)[0, 0])
        raise _fail(name, f"[{i}] is {values[i].item()}; expected {expected}")


def _draft_counts(batch: SpecBatch) -> list[int]:
    """The draft counts ``n_b`` of a structurally valid batch, read from ``cu_num_drafts`` (a device
    synchronisation on a GPU) and checked: it starts at 0, never decreases, ends at ``D`` and gives
    no request more than `MAX_NUM_DRAFTS` drafts."""
    cu = batch.cu_num_drafts.detach().cpu().tolist()
    if cu[0] != 0:
        raise _fail("cu_num_drafts", f"starts at {cu[0]}; expected 0")
    counts = [end - start for start, end in pairwise(cu)]
    for b, count in enumerate(counts):
        if count < 0:
            raise _fail(
                "cu_num_drafts",
                f"decreases at request {b} ({cu[b]} -> {cu[b + 1]}); draft counts must be >= 0",
            )
    num_draft_rows = batch.target_logits.shape[0] - batch.num_requests
    if cu[-1] != num_draft_rows:
        raise _fail(
            "cu_num_drafts",
            f"ends at {cu[-1]}; expected D = {num_draft_rows} (rows of target_logits minus B)",
        )
    max_count = max(counts, default=0)
    if max_count > MAX_NUM_DRAFTS:
        raise _fail("cu_num_drafts", f"gives a request {max_count} drafts; at most {MAX_NUM_DRAFTS}")
    return counts


def _validate_values(batch: SpecBatch) -> None:
    counts = _draft_counts(batch)
    max_count = max(counts, default=0)
    if batch.tree_parent is not None:
        parents = batch.tree_parent.detach().cpu().to(torch.int64).numpy()
        start = 0
        for b, count in enumerate(counts):
            tree.check_parents(parents[start : start + count], "tree_parent", start, b)
            start += count
    if batch.max_num_drafts is not None and batch.max_num_drafts != max_count:
        raise _fail("max_num_drafts", f"is {batch.max_num_drafts}; cu_num_drafts gives {max_count}")

    temperature = batch.temperature.detach().cpu()
    ok = torch.isfinite(temperature) & (temperature >= 0)
    _check_entries("temperature", temperature, ok, "a finite value >= 0")
    step = batch.step.detach().cpu()
    _check_entries("step", step, (step >= 0) & (step < MAX_STEP), "0 <= step < 2**32")

    if batch.slotted:
        assert batch.draft_logits is not None and batch.draft_slot is not None
        num_slots, capacity = batch.draft_logits.shape[:2]
        slot = batch.draft_slot.detach().cpu().to(torch.int64)
        _check_entries("draft_slot", slot, (slot >= 0) & (slot < num_slots), f"a slot in [0, {num_slots})")
        if max_count > capacity:
            raise _fail("draft_logits", f"holds K = {capacity} drafts per slot; a request has {max_count}")

    if batch.top_k is not None:
        top_k = batch.top_k.detach().cpu()
        _check_entries("top_k", top_k, top_k >= 0, "k >= 0 (0 or >= V: off)")
    if batch.top_p is not None:
        top_p = batch.top_p.detach().cpu()
        _check_entries("top_p", top_p, (top_p > 0) & (top_p <= 1), "a value in (0, 1] (1: off)")
    if batch.min_p is not None:
        min_p = batch.min_p.detach().cpu()
        _check_entries("min_p", min_p, (min_p >= 0) & (min_p < 1), "a value in [0, 1) (0: off)")

    if METHOD_TABLE[batch.method].takes_rates:
        assert batch.synthetic_rates is not None
        rates = batch.synthetic_rates.detach().cpu()
        if rates.shape[0] < max_count:
            raise _fail("synthetic_rates", f"has {rates.shape[0]} rates; a request has {max_count} drafts")
        _check_entries("synthetic_rates", rates, (rates >= 0) & (rates <= 1), "a rate in [0, 1]")


def odd_values(batch: SpecBatch) -> list[str]:
    """The legal but odd values of ``batch``, one note each: NaN or infinite logits, draft ids outside
    ``[-1, V)``. Their semantics are defined, so `SpecBatch.validate` accepts them; this flags them."""
    notes = []
    for name, tensor in (("target_logits", batch.target_logits), ("draft_logits", batch.draft_logits)):
        if tensor is not None and bool(torch.isnan(tensor).any()):
            notes.append(f"{name} has NaN entries (read as -inf)")
        if tensor is not None and bool(torch.isinf(tensor).any()):
            notes.append(f"{name} has infinite entries")
    ids = batch.draft_token_ids
    out_of_range = (ids < -1) | (ids >= batch.vocab_size)
    if bool(out_of_range.any()):
        notes.append(f"draft_token_ids has {int(out_of_range.sum())} ids outside [-1, V) (read as -1)")
    return notes


# Building batches and splitting outputs


@dataclass(frozen=True)
class RequestData:
    """One request's inputs, the unit from which `make_batch` assembles a `SpecBatch`.

    Attributes:
        target_logits: ``[n + 1, V]``: one row per draft position, then the bonus row.
        draft_token_ids: ``[n]`` integer ids, ``-1`` for a placeholder.
        draft_logits: ``[n, V]``, or ``None`` for one-hot drafts.
        temperature: ``0`` means greedy.
        seed, step: the request's random stream.
        top_k, top_p, min_p: the request's sampling parameters (off by default).
        tree_parent: ``[n]`` each draft node's parent (``-1``: the root), method ``"tree"`` only
            (``None`` there: a chain).
    """

    target_logits: np.ndarray | torch.Tensor
    draft_token_ids: Sequence[int] | np.ndarray | torch.Tensor
    draft_logits: np.ndarray | torch.Tensor | None = None
    temperature: float = 1.0
    seed: int = 0
    step: int = 0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    tree_parent: Sequence[int] | np.ndarray | None = None


def make_batch(
    requests: Sequence[RequestData],
    *,
    method: Method = "probabilistic",
    dtype: torch.dtype = torch.float32,
    synthetic_rates: Sequence[float] | np.ndarray | None = None,
    slots: Sequence[int] | None = None,
    num_slots: int | None = None,
    slot_capacity: int | None = None,
    device: torch.device | str = "cpu",
    draft_filter: bool = False,
) -> SpecBatch:
    """Assemble a validated `SpecBatch` from per-request data.

    Draft logits are all given or all ``None``. With ``slots`` (one distinct slot per request) they
    go into a ``[num_slots, slot_capacity, V]`` buffer read through ``draft_slot``; unused slot rows
    hold zeros. Otherwise they are stacked flat ``[D, V]``. A sampling parameter becomes a ``[B]``
    tensor where some request sets it, and stays ``None`` where none does. Method ``"tree"`` takes
    each request's ``tree_parent`` (``[n]``; a request without one is a chain, each node the child of
    the one before), the other methods none.
    """
    if not requests:
        raise _fail("requests", "is empty; expected at least one request")
    has_draft = [r.draft_logits is not None for r in requests]
    if any(has_draft) and not all(has_draft):
        raise _fail("requests", "mixes draft_logits and None; give draft logits for all or none")

    def as_tensor(x: np.ndarray | torch.Tensor | Sequence[int], tensor_dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).to(tensor_dtype)

    targets = [as_tensor(r.target_logits, torch.float64) for r in requests]
    for b, r in enumerate(requests):
        given = r.draft_token_ids
        raw = given if isinstance(given, torch.Tensor) else np.asarray(given)
        if raw.dtype not in (torch.int32, torch.int64, np.dtype(np.int32), np.dtype(np.int64)) and len(raw):
            raise _fail(f"requests[{b}].draft_token_ids", f"has dtype {raw.dtype}; expected integers")
        for name in ("seed", "step"):
            value = getattr(r, name)
            if not isinstance(value, int | np.integer) or not -(2**63) <= int(value) < 2**63:
                raise _fail(f"requests[{b}].{name}", f"is {value!r}; expected an int64 integer")
    ids = [as_tensor(r.draft_token_ids, torch.int64).reshape(-1) for r in requests]
    counts = [int(i.shape[0]) for i in ids]
    for b, (t, n) in enumerate(zip(targets, counts, strict=True)):
        if t.dim() != 2 or t.shape[0] != n + 1 or t.shape[1] != targets[0].shape[-1]:
            raise _fail(
                f"requests[{b}].target_logits",
                f"has shape {tuple(t.shape)}; expected [n + 1, V] with n = {n} and the V of request 0",
            )
    dev = torch.device(device)
    cu = torch.tensor([0, *np.cumsum(counts)], dtype=torch.int32, device=dev)
    vocab_size = targets[0].shape[1]
    draft_logits: torch.Tensor | None = None
    draft_slot: torch.Tensor | None = None
    if all(has_draft):
        drafts = [as_tensor(r.draft_logits, torch.float64) for r in requests]  # type: ignore[arg-type]
        for b, (d, n) in enumerate(zip(drafts, counts, strict=True)):
            if tuple(d.shape) != (n, vocab_size):
                raise _fail(
                    f"requests[{b}].draft_logits",
                    f"has shape {tuple(d.shape)}; expected [n, V] = [{n}, {vocab_size}] (V of target_logits)",
                )
        if slots is None:
            draft_logits = torch.cat(drafts).reshape(-1, vocab_size).to(dev, dtype)
        else:
            if len(slots) != len(requests):
                raise _fail("slots", f"has {len(slots)} entries; expected one per request ({len(requests)})")
            capacity = slot_capacity if slot_capacity is not None else max(1, max(counts))
            num = num_slots if num_slots is not None else max(slots) + 1
            if len(set(slots)) != len(slots):
                raise _fail("slots", f"is {list(slots)}; two requests cannot share a slot of draft logits")
            if min(slots) < 0 or max(slots) >= num:
                raise _fail("slots", f"is {list(slots)}; expected slots in [0, num_slots = {num})")
            if max(counts) > capacity:
                raise _fail("slot_capacity", f"is {capacity}; a request has {max(counts)} drafts")
            buffer = torch.zeros(num, capacity, vocab_size, dtype=torch.float64)
            for s, d in zip(slots, drafts, strict=True):
                buffer[s, : d.shape[0]] = d
            draft_logits = buffer.to(dev, dtype)
            draft_slot = torch.tensor(list(slots), dtype=torch.int64, device=dev)
    elif slots is not None:
        raise _fail("slots", "is given but the requests have no draft logits")
    parents: torch.Tensor | None = None
    # (An unknown method is `SpecBatch.validate`'s error, below.)
    if method in METHOD_TABLE and METHOD_TABLE[method].verifies_tree:
        given_parents = []
        for b, (r, n) in enumerate(zip(requests, counts, strict=True)):
            if r.tree_parent is None:
                given_parents.append(np.arange(-1, n - 1, dtype=np.int64))  # a chain
                continue
            if np.asarray(r.tree_parent).reshape(-1).shape[0] != n:
                got = f"{np.asarray(r.tree_parent).tolist()}"
                raise _fail(
                    f"requests[{b}].tree_parent", f"is {got}; expected [n] = [{n}] parents for method 'tree'"
                )
            given_parents.append(np.asarray(r.tree_parent, dtype=np.int64).reshape(-1))
        flat = np.concatenate([np.zeros(0, np.int64), *given_parents])
        parents = torch.tensor(flat.tolist(), dtype=torch.int32, device=dev)
    else:
        for b, r in enumerate(requests):
            if r.tree_parent is not None:
                raise _fail(
                    f"requests[{b}].tree_parent", f"is given but method is {method!r}; only 'tree' reads it"
                )
    rates = None if synthetic_rates is None else np.asarray(synthetic_rates, dtype=np.float64)
    dtypes = {"top_k": torch.int32, "top_p": torch.float32, "min_p": torch.float32}
    params = {
        name: torch.tensor([getattr(r, name) for r in requests], dtype=dtypes[name], device=dev)
        if any(getattr(r, name) != FILTER_OFF[name] for r in requests)
        else None
        for name in FILTERS
    }
    batch = SpecBatch(
        target_logits=torch.cat(targets).to(dev, dtype),
        draft_logits=draft_logits,
        draft_token_ids=torch.cat(ids).to(dev),
        cu_num_drafts=cu,
        temperature=torch.tensor([r.temperature for r in requests], dtype=torch.float32, device=dev),
        seed=torch.tensor([r.seed for r in requests], dtype=torch.int64, device=dev),
        step=torch.tensor([r.step for r in requests], dtype=torch.int64, device=dev),
        method=method,
        synthetic_rates=None if rates is None else torch.as_tensor(rates, device=dev),
        draft_slot=draft_slot,
        max_num_drafts=max(counts),
        draft_filter=draft_filter,
        tree_parent=parents,
        **params,
    )
    batch.validate()
    return batch


@dataclass(frozen=True)
class RequestOutput:
    """One request's share of a `SpecOutput`: the emitted tokens and their log-probabilities, and the
    accepted nodes of a tree."""

    token_ids: list[int]
    num_accepted: int
    logprobs: list[float] | None
    accepted_nodes: list[int] | None = None


def split_output(output: SpecOutput) -> list[RequestOutput]:
    """Split a `SpecOutput` per request: the first ``num_emitted[b]`` tokens of each row."""
    tokens = output.token_ids.detach().cpu().tolist()
    emitted = output.num_emitted.detach().cpu().tolist()
    logprobs = None if output.logprobs is None else output.logprobs.detach().cpu().tolist()
    nodes = None if output.accepted_nodes is None else output.accepted_nodes.detach().cpu().tolist()
    return [
        RequestOutput(
            row[:n],
            n - 1,
            None if logprobs is None else logprobs[b][:n],
            None if nodes is None else nodes[b][: n - 1],
        )
        for b, (row, n) in enumerate(zip(tokens, emitted, strict=True))
    ]


def validate_output(output: SpecOutput, batch: SpecBatch) -> None:
    """Raise ``ValueError`` if an output's shapes and dtypes break the contract for ``batch``."""
    shape = (batch.num_requests, batch.resolved_max_num_drafts() + 1)
    if METHOD_TABLE[batch.method].verifies_tree and output.accepted_nodes is None:
        raise _fail("accepted_nodes", f"is None; method 'tree' expects int32 {(shape[0], shape[1] - 1)}")
    for name, dtype, expected in (
        ("token_ids", torch.int64, shape),
        ("num_emitted", torch.int32, shape[:1]),
        ("logprobs", torch.float32, shape),
        ("accepted_nodes", torch.int32, (shape[0], shape[1] - 1)),
    ):
        tensor = getattr(output, name)
        if tensor is not None and (tensor.dtype != dtype or tuple(tensor.shape) != expected):
            raise _fail(
                name,
                f"has dtype {tensor.dtype} and shape {tuple(tensor.shape)}; "
                f"expected {str(dtype).removeprefix('torch.')} {expected}",
            )
