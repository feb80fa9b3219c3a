"""The benchmark shapes, the inputs built for them, and the bytes each one must move.

A `Case` is one point of the grid of docs/design.md ("Benchmark grid"): batch ``B``, drafts per
request ``n``, vocabulary ``V``, logit dtype, draft layout (flat ``[D, V]`` or slotted ``[S, K, V]``),
temperature and method. Three grids use it:

- `GATE_CASES`: the representative subset the performance gate times (a few minutes on a GPU):
  every target of issue 6, each method, layout, dtype and temperature, and both ends of the vocab.
- `full_grid()`: the whole cross product for RESULTS.md.
- `SMOKE_CASES`: tiny shapes with the same structural variety, run once untimed on a CPU under the
  Triton interpreter.

A sampler is timed on the cases inside its declared capabilities (`within`): its methods, logit
dtypes, draft kinds (the layout) and largest vocabulary.

Byte accounting (`min_bytes`) follows docs/design.md ("Benchmark grid"): every target logit once,
every draft logit once when the law needs ``q`` (probabilistic and block rows with ``T > 0``; strict,
synthetic and greedy rows never depend on ``q``), the small per-request inputs once and the outputs
once.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import torch

from specsample.kernels.rejection import KERNEL_METHODS
from specsample.reference.contract import Capabilities, SpecBatch
from specsample.reference.methods import METHODS as METHOD_TABLE

BATCH_SIZES = (1, 16, 64, 256)
NUM_DRAFTS = (1, 4, 8)
VOCAB_SIZES = (32000, 128256, 151936, 262144)
DTYPES = ("fp32", "bf16")
LAYOUTS = ("flat", "slotted")
TEMPERATURES = (1.0, 0.0)
# The chain methods the Triton kernels have a branch for (trees have cases of their own, `TREES`).
METHODS = tuple(m for m in KERNEL_METHODS if not METHOD_TABLE[m].verifies_tree)
# Tree verification's shapes (issue 31): EAGLE-2-like trees of (nodes, depth), at these batches.
TREES = ((16, 5), (32, 6), (64, 8))
TREE_BATCH_SIZES = (1, 16, 64)
TREE_VOCAB_SIZES = (128256, 151936)
# An EAGLE-2-like tree expands the likeliest few nodes of each level.
TREE_EXPANDED = 4

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Target logits are N(0, LOGIT_SCALE^2): a few tokens carry most of the mass at T = 1, as in a
# trained model. Drafts are the target plus N(0, DRAFT_NOISE^2) and propose their own argmax, so
# acceptance is high but not certain and every code path (accept, residual, bonus) runs.
LOGIT_SCALE = 3.0
DRAFT_NOISE = 1.0
SYNTHETIC_RATE = 0.7


@dataclass(frozen=True)
class Case:
    """One benchmark shape.

    Attributes:
        method: ``"probabilistic"``, ``"strict"``, ``"synthetic"``, ``"block"`` or ``"tree"``.
        dtype: ``"fp32"`` or ``"bf16"``, for target and draft logits alike.
        layout: ``"flat"`` (``[D, V]`` drafts), ``"slotted"`` (``[B, n, V]`` read through a
            permuted ``draft_slot``) or ``"one-hot"`` (no draft logits: tree verification's).
        temperature: the temperature of every request; ``0`` is greedy.
        batch: ``B``, the number of requests.
        num_drafts: ``n``, drafts per request (every request has the same count); a tree's nodes.
        vocab: ``V``.
        filters: the sampling parameters of every request, ``(name, value)`` pairs of ``top_k``,
            ``top_p`` and ``min_p`` (none by default: the unfiltered law).
        depth: a tree's depth (`eagle_tree`); 0 for the chain methods.
    """

    method: str
    dtype: str
    layout: str
    temperature: float
    batch: int
    num_drafts: int
    vocab: int
    filters: tuple[tuple[str, float], ...] = ()
    depth: int = 0

    @property
    def id(self) -> str:
        """A stable test id such as ``probabilistic-fp32-flat-T1-B64-n4-V128256``, with the filters
        after it when there are any (``...-V128256-top_k50-top_p0.9-min_p0.05``) and a tree's depth
        (``tree-fp32-one-hot-T1-B16-n64-V128256-depth8``)."""
        filters = "".join(f"-{name}{value:g}" for name, value in self.filters)
        depth = f"-depth{self.depth}" if self.depth else ""
        return (
            f"{self.method}-{self.dtype}-{self.layout}-T{self.temperature:g}"
            f"-B{self.batch}-n{self.num_drafts}-V{self.vocab}{filters}{depth}"
        )

    @property
    def element_size(self) -> int:
        """Bytes per logit."""
        return torch.empty(0, dtype=TORCH_DTYPES[self.dtype]).element_size()

    @property
    def needs_draft_logits(self) -> bool:
        """Whether the law depends on the draft logits: probabilistic or block sampling at ``T > 0``."""
        return METHOD_TABLE[self.method].uses_draft_law and self.temperature > 0

    @property
    def logit_bytes(self) -> int:
        """Bytes of the logits the law depends on: every target row, and the draft rows when needed."""
        rows = self.batch * (self.num_drafts + 1)
        if self.needs_draft_logits:
            rows += self.batch * self.num_drafts
        return rows * self.vocab * self.element_size


def min_bytes(case: Case) -> int:
    """The fewest bytes one call must move: the logits it needs, the small inputs, the outputs.

    Small inputs: ``draft_token_ids`` (int64), ``cu_num_drafts`` (int32), ``temperature`` (fp32),
    ``seed`` and ``step`` (int64), ``draft_slot`` (int64) when slotted, ``synthetic_rates`` (fp64)
    when synthetic, ``tree_parent`` (int64) for a tree. Outputs: ``token_ids`` (int64) and
    ``logprobs`` (fp32) ``[B, n + 1]``, ``num_emitted`` (int32) ``[B]``, and a tree's
    ``accepted_nodes`` (int32) ``[B, n]``. A tree's floor is thus reading each node's target row once.
    """
    b, n = case.batch, case.num_drafts
    small = 8 * b * n + 4 * (b + 1) + 4 * b + 8 * b + 8 * b
    if case.layout == "slotted":
        small += 8 * b
    if METHOD_TABLE[case.method].takes_rates:
        small += 8 * n
    outputs = 8 * b * (n + 1) + 4 * b * (n + 1) + 4 * b
    if METHOD_TABLE[case.method].verifies_tree:
        small += 8 * b * n
        outputs += 4 * b * n
    return case.logit_bytes + small + outputs


# Filtered verification's benchmark settings (issue 29): what serving front ends commonly send.
TOP_K_P_MIN_P: tuple[tuple[str, float], ...] = (("top_k", 50), ("top_p", 0.9), ("min_p", 0.05))
TOP_P: tuple[tuple[str, float], ...] = (("top_p", 0.9),)


def _gate_cases() -> tuple[Case, ...]:
    base = Case("probabilistic", "fp32", "flat", 1.0, 64, 4, 128256)
    return (
        # Issue 6 targets: 1.25x the floor here, 1.3x at B >= 64, 1.35x with bf16 drafts, 20 us at
        # B = 1, greedy and strict no slower than probabilistic at the same shape.
        base,
        Case("probabilistic", "bf16", "flat", 1.0, 64, 4, 128256),
        Case("probabilistic", "fp32", "flat", 1.0, 1, 4, 128256),
        Case("probabilistic", "fp32", "flat", 1.0, 256, 4, 128256),
        Case("probabilistic", "fp32", "flat", 0.0, 64, 4, 128256),
        Case("strict", "fp32", "flat", 1.0, 64, 4, 128256),
        Case("synthetic", "fp32", "flat", 1.0, 64, 4, 128256),
        Case("block", "fp32", "flat", 1.0, 64, 4, 128256),
        Case("probabilistic", "fp32", "slotted", 1.0, 64, 4, 128256),
        # The ends of the vocabulary and draft axes, and the odd split layout of V = 151936.
        Case("probabilistic", "fp32", "flat", 1.0, 64, 1, 32000),
        Case("probabilistic", "fp32", "flat", 1.0, 16, 8, 262144),
        Case("probabilistic", "bf16", "slotted", 1.0, 256, 8, 151936),
        Case("strict", "bf16", "slotted", 0.0, 16, 1, 151936),
        # Filtered verification: top-k, top-p and min-p on every request, at B = 64 and B = 1, and
        # top-p alone (the threshold search without a top-k bound).
        dataclasses.replace(base, filters=TOP_K_P_MIN_P),
        Case("probabilistic", "fp32", "flat", 1.0, 1, 4, 128256, TOP_K_P_MIN_P),
        dataclasses.replace(base, filters=TOP_P),
        # Tree verification: B = 16 with 64-node trees (issue 31's target), and one request.
        Case("tree", "fp32", "one-hot", 1.0, 16, 64, 128256, depth=8),
        Case("tree", "fp32", "one-hot", 1.0, 1, 64, 128256, depth=8),
    )


GATE_CASES = _gate_cases()
# The host-latency target: B = 1, n = 4, V = 128256, measured from Python as a user calls it.
CALL_LATENCY_CASE = Case("probabilistic", "fp32", "flat", 1.0, 1, 4, 128256)


def within(case: Case, capabilities: Capabilities) -> bool:
    """Whether a sampler that declares ``capabilities`` takes the inputs of ``case``: its method, its
    logit dtype, its draft logits (the layout names the draft kind), its vocabulary and its filters."""
    return (
        case.method in capabilities.methods
        and TORCH_DTYPES[case.dtype] in capabilities.dtypes
        and case.layout in capabilities.draft_kinds
        and case.vocab <= capabilities.max_vocab
        and all(name in capabilities.filters for name, _ in case.filters)
    )


def full_grid() -> tuple[Case, ...]:
    """Every case of the grid of docs/design.md: 4 batches x 3 draft counts x 4 vocabs x 2 dtypes
    x 2 layouts x 2 temperatures x 4 methods (1536 cases), ordered so cases sharing logits run
    together; then filtered verification's cases: probabilistic, flat drafts, ``T = 1``, ``n = 4``,
    ``V = 128256``, 4 batches x 2 dtypes x 2 filter settings (16 cases); then tree verification's:
    3 trees x 3 batches x 2 vocabs x 2 dtypes x 2 temperatures (72 cases)."""
    unfiltered = tuple(
        Case(method, dtype, layout, temperature, batch, num_drafts, vocab)
        for dtype, batch, num_drafts, vocab, layout, temperature, method in itertools.product(
            DTYPES, BATCH_SIZES, NUM_DRAFTS, VOCAB_SIZES, LAYOUTS, TEMPERATURES, METHODS
        )
    )
    filtered = tuple(
        Case("probabilistic", dtype, "flat", 1.0, batch, 4, 128256, filters)
        for dtype, batch, filters in itertools.product(DTYPES, BATCH_SIZES, (TOP_K_P_MIN_P, TOP_P))
    )
    trees = tuple(
        Case("tree", dtype, "one-hot", temperature, batch, nodes, vocab, depth=depth)
        for dtype, batch, (nodes, depth), vocab, temperature in itertools.product(
            DTYPES, TREE_BATCH_SIZES, TREES, TREE_VOCAB_SIZES, TEMPERATURES
        )
    )
    return unfiltered + filtered + trees


def _smoke_cases() -> tuple[Case, ...]:
    # Every method, dtype, layout and temperature, at a vocabulary of two 4096-token tiles so the
    # split combine runs, and two requests so the per-request offsets matter; one filtered case (run
    # for the samplers that declare its filters) and one tree (for those that verify trees).
    axes = itertools.product(METHODS, DTYPES, LAYOUTS, TEMPERATURES)
    return (
        *(
            Case(method, dtype, layout, temperature, 2, 2, 5000)
            for method, dtype, layout, temperature in axes
        ),
        Case("probabilistic", "fp32", "flat", 1.0, 2, 2, 5000, TOP_K_P_MIN_P),
        Case("tree", "fp32", "one-hot", 1.0, 2, 6, 5000, depth=3),
    )


SMOKE_CASES = _smoke_cases()


def make_inputs(case: Case, device: torch.device | str, seed: int = 0) -> SpecBatch:
    """A `SpecBatch` for ``case`` built directly on ``device``.

    Target logits are Gaussian; draft logits are the target rows of the draft positions plus Gaussian
    noise; each draft token is its draft row's argmax. Slotted drafts live in a ``[B, n, V]`` buffer
    whose slots are a random permutation of the requests, so the sampler must read through
    ``draft_slot``. Every request shares the case's method, temperature and draft count; seeds
    differ. Cases that differ only in method or temperature can share the logits via `specialise`.
    A tree case's requests are each an `eagle_tree` (`_tree_drafts`), without draft logits.
    """
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    b, n, v = case.batch, case.num_drafts, case.vocab
    dtype = TORCH_DTYPES[case.dtype]
    target = torch.randn(b, n + 1, v, device=device, generator=generator).mul_(LOGIT_SCALE)
    draft_slot = draft_logits = tree_parent = None
    if METHOD_TABLE[case.method].verifies_tree:
        draft_ids, tree_parent = _tree_drafts(case, target, generator)
    else:
        draft_ids, draft_logits, draft_slot = _chain_drafts(case, target, generator)
    batch = SpecBatch(
        target_logits=target.reshape(b * (n + 1), v).to(dtype),
        draft_logits=draft_logits,
        draft_token_ids=draft_ids,
        cu_num_drafts=torch.arange(0, b * n + 1, n, dtype=torch.int32, device=device),
        temperature=torch.ones(b, dtype=torch.float32, device=device),
        seed=torch.arange(seed * b, (seed + 1) * b, dtype=torch.int64, device=device),
        step=torch.zeros(b, dtype=torch.int64, device=device),
        draft_slot=draft_slot,
        max_num_drafts=n,
        method=case.method,  # type: ignore[arg-type]
        tree_parent=tree_parent,
    )
    batch = specialise(batch, case)
    batch.validate(check_values=False)
    return batch


def _chain_drafts(
    case: Case, target: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A chain case's ``(draft_token_ids, draft_logits, draft_slot)`` over ``target`` ``[B, n + 1, V]``:
    each draft row its target row plus Gaussian noise, each draft its row's argmax; slotted drafts
    in a ``[B, n, V]`` buffer under a random permutation of the requests."""
    b, n, v = target.shape[0], case.num_drafts, case.vocab
    device, dtype = target.device, TORCH_DTYPES[case.dtype]
    draft = (
        target[:, :n]
        .clone()
        .add_(torch.randn(b, n, v, device=device, generator=generator), alpha=DRAFT_NOISE)
    )
    draft_ids = draft.argmax(dim=-1).reshape(-1)
    draft_slot = None
    if case.layout == "slotted":
        draft_slot = torch.randperm(b, device=device, generator=generator)
        buffer = torch.empty_like(draft)
        buffer[draft_slot] = draft
        draft_logits = buffer.to(dtype)
    else:
        draft_logits = draft.reshape(b * n, v).to(dtype)
    return draft_ids, draft_logits, draft_slot


def eagle_tree(num_nodes: int, depth: int) -> list[int]:
    """The parents of an EAGLE-2-like tree of ``num_nodes`` draft nodes and ``depth`` levels (``-1``:
    the root): the nodes split as evenly as they go over the levels, the first `TREE_EXPANDED` nodes
    of each level (a drafter's likeliest) the parents of the next, in turn."""
    if not 1 <= depth <= num_nodes:
        raise ValueError(f"depth is {depth}; expected 1 <= depth <= num_nodes = {num_nodes}")
    sizes = [num_nodes // depth + (level < num_nodes % depth) for level in range(depth)]
    parents: list[int] = []
    previous = [-1]
    for size in sizes:
        first = len(parents)
        expanded = previous[:TREE_EXPANDED]
        parents += [expanded[i % len(expanded)] for i in range(size)]
        previous = list(range(first, first + size))
    return parents


def _tree_drafts(
    case: Case, target: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A tree case's ``(draft_token_ids, tree_parent)``: every request an `eagle_tree` over ``target``
    ``[B, n + 1, V]``, each node's token its rank among its siblings in its parent's row plus Gaussian
    noise (the first child the likeliest, as a drafter proposes)."""
    b, n = target.shape[0], case.num_drafts
    device = target.device
    parents = eagle_tree(n, case.depth)
    rank = [parents[:node].count(parents[node]) for node in range(n)]
    noisy = target.clone().add_(
        torch.randn(target.shape, device=device, generator=generator), alpha=DRAFT_NOISE
    )
    ranked = noisy.topk(max(rank) + 1, dim=-1).indices  # [B, n + 1, ranks]
    del noisy
    rows = torch.tensor([parent + 1 for parent in parents], device=device)
    tokens = ranked[:, rows, torch.tensor(rank, device=device)]  # [B, n]
    return tokens.reshape(-1).contiguous(), torch.tensor(parents * b, dtype=torch.int64, device=device)


def specialise(batch: SpecBatch, case: Case) -> SpecBatch:
    """``batch`` with the method, temperature, synthetic rates and sampling parameters of ``case``,
    sharing its logits."""
    rates = None
    if METHOD_TABLE[case.method].takes_rates:
        rates = torch.full((case.num_drafts,), SYNTHETIC_RATE, dtype=torch.float64, device=batch.device)
    settings = dict(case.filters)
    parameters = {
        name: None
        if name not in settings
        else torch.full((case.batch,), settings[name], dtype=dtype, device=batch.device)
        for name, dtype in (("top_k", torch.int32), ("top_p", torch.float32), ("min_p", torch.float32))
    }
    return dataclasses.replace(
        batch,
        method=case.method,  # type: ignore[arg-type]
        temperature=torch.full_like(batch.temperature, case.temperature),
        synthetic_rates=rates,
        **parameters,  # type: ignore[arg-type]
    )
