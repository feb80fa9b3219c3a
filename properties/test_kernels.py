"""The Triton and PyTorch samplers keep the hard invariants, and Triton agrees with the float64 reference."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch
import triton
from hypothesis import given, settings
from hypothesis import strategies as st

from specsample.kernels import registry, rejection
from specsample.kernels import rejection_kernels as jit
from specsample.kernels.rejection import KERNEL_METHODS as METHODS
from specsample.kernels.rejection import LAUNCH_PLANS, rejection_sample, vocab_layout
from specsample.properties.checks.coupled import agreement
from specsample.properties.checks.invariants import violations
from specsample.properties.strategies import TREE_SHAPES, tree_drafts, tree_parents
from specsample.reference.contract import (
    RequestData,
    SpecBatch,
    SpecOutput,
    make_batch,
    split_output,
)
from specsample.reference.methods import METHODS as METHOD_TABLE
from specsample.reference.sampler import reference_sample

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
NO_GPU = "needs a CUDA GPU; the CPU suite runs the kernels under the Triton interpreter"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Block edges of the small tiles the interpreter runs (16 is the smallest tile).
VOCAB_SIZES = (1, 2, 3, 5, 15, 16, 17, 31, 33)
TEMPERATURES = (0.0, 1e-30, 1e-3, 0.5, 1.0, 2.0, 1e4)
FAMILIES = ("normal", "peaked", "ties", "masked", "odd", "p_equals_q", "p_near_q", "disjoint")
# Both launch plans under the interpreter. A GPU runs the split plan on generated batches: the rows
# plan (the interpreter's) takes seconds to compile per structure, and gets fixed batches here and
# in benchmarks/sanitize_launches.py.
PLANS = LAUNCH_PLANS if DEVICE == "cpu" else ("split",)


def _logits(
    family: str, rng: np.random.Generator, rows: int, vocab_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(target [rows, V], draft [rows, V])`` logits of one distribution family.

    Families: Gaussian; one dominant token; integer logits (exact ties); random ``-inf`` masks
    (whole rows too); NaN and ``+-inf`` sprinkled; ``p == q``; ``p ~= q`` within rounding; and
    disjoint supports (``q = 0`` where ``p > 0``).
    """
    target = rng.normal(size=(rows, vocab_size)) * 2.0
    draft = rng.normal(size=(rows, vocab_size)) * 2.0
    if family == "peaked":
        target[np.arange(rows), rng.integers(0, vocab_size, rows)] += 12.0
        draft[np.arange(rows), rng.integers(0, vocab_size, rows)] += 12.0
    elif family == "ties":
        target, draft = np.round(target / 2), np.round(draft / 2)
    elif family == "masked":
        target[rng.random(target.shape) < 0.5] = -np.inf
        draft[rng.random(draft.shape) < 0.5] = -np.inf
    elif family == "odd":
        for logits in (target, draft):
            pick = rng.random(logits.shape)
            logits[pick < 0.15] = np.nan
            logits[(pick >= 0.15) & (pick < 0.3)] = -np.inf
            logits[pick > 0.93] = np.inf
    elif family == "p_equals_q":
        draft = target.copy()
    elif family == "p_near_q":
        draft = target + rng.normal(size=target.shape) * 1e-6
    elif family == "disjoint":
        half = rng.random(vocab_size) < 0.5
        target[:, half] = -np.inf
        draft[:, ~half] = -np.inf
    return target, draft


@st.composite
def batches(
    draw: st.DrawFn,
    max_requests: int = 4,
    max_drafts: int = 4,
    vocab_sizes: tuple[int, ...] = VOCAB_SIZES,
    methods: tuple[str, ...] = METHODS,
) -> SpecBatch:
    """A small batch of mixed requests: every method, dtype, draft layout and odd family.

    Per request: draft count 0..max_drafts, temperature (0, tiny, ordinary, huge), distribution
    family, drafts drawn from ``q`` or uniformly with placeholders and out-of-range ids, seed and step;
    for method tree, a tree of each shape of `TREE_SHAPES` over the drafts (`tree_drafts`' tokens).
    """
    method = draw(st.sampled_from(methods))
    vocab_size = draw(st.sampled_from(vocab_sizes))
    dtype = draw(st.sampled_from(DTYPES))
    layout = draw(st.sampled_from(("one-hot", "flat", "slotted")))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    requests = []
    for _ in range(draw(st.integers(1, max_requests))):
        n = draw(st.integers(0, max_drafts))
        target, draft = _logits(draw(st.sampled_from(FAMILIES)), rng, n + 1, vocab_size)
        ids = rng.integers(0, vocab_size, n)
        odd = rng.random(n)
        ids[odd < 0.1] = -1
        ids[(odd >= 0.1) & (odd < 0.15)] = vocab_size + rng.integers(0, 3)
        ids[(odd >= 0.15) & (odd < 0.18)] = -7
        parents = None
        if METHOD_TABLE[method].verifies_tree:
            parents = tree_parents(rng, draw(st.sampled_from(TREE_SHAPES)), n)
            ids = tree_drafts(rng, parents, target, ids)
        requests.append(
            RequestData(
                target_logits=target,
                draft_token_ids=ids,
                draft_logits=None if layout == "one-hot" else draft[:n],
                temperature=draw(st.sampled_from(TEMPERATURES)),
                seed=draw(st.integers(-(2**63), 2**63 - 1)),
                step=draw(st.integers(0, 2**32 - 1)),
                tree_parent=parents,
            )
        )
    slots = None
    if layout == "slotted":
        slots = draw(st.permutations(range(len(requests) + 1)))[: len(requests)]
    rates = draw(st.lists(st.floats(0.0, 1.0), min_size=max_drafts, max_size=max_drafts))
    return make_batch(requests, method=method, dtype=dtype, synthetic_rates=rates, slots=slots, device=DEVICE)


def _requests(output: SpecOutput) -> list[tuple[list[int], list[float] | None]]:
    return [(r.token_ids, r.logprobs) for r in split_output(output)]


@pytest.mark.parametrize("plan", PLANS)
@given(batch=batches())
def test_invariants_hold_and_only_near_ties_disagree_with_the_reference(plan: str, batch: SpecBatch) -> None:
    """Every output of either launch plan keeps the hard invariants and equals reference_sample
    except at near ties."""
    output = rejection_sample(batch, plan=plan)
    assert violations(batch, output) == []
    found = agreement(batch, output)
    assert found.unexplained == []
    reference = reference_sample(batch)
    differ = output.token_ids.cpu() != reference.token_ids.cpu()
    assert found.mismatches == int(differ.any(dim=1).sum())


@pytest.mark.parametrize("plan", PLANS)
@given(batch=batches(max_requests=3, max_drafts=3), data=st.data())
def test_output_depends_only_on_the_request(plan: str, batch: SpecBatch, data: st.DataObject) -> None:
    """A request's output depends on its own data, seed and step, not on neighbours, order or slot."""
    requests = _split_requests(batch)
    order = data.draw(st.permutations(range(len(requests))))
    neighbour = dataclasses.replace(requests[0], seed=requests[0].seed ^ 0x5EED, step=7)
    crowded = [neighbour, *(requests[i] for i in order)]
    slots = None
    if batch.slotted:
        slots = data.draw(st.permutations(range(len(crowded) + 2)))[: len(crowded)]
    shuffled = make_batch(
        crowded,
        method=batch.method,
        dtype=batch.target_logits.dtype,
        synthetic_rates=None if batch.synthetic_rates is None else batch.synthetic_rates.cpu().numpy(),
        slots=slots,
        device=DEVICE,
    )
    alone = _requests(rejection_sample(batch, plan=plan))
    again = _requests(rejection_sample(batch, plan=plan))
    together = _requests(rejection_sample(shuffled, plan=plan))
    assert again == alone
    for position, index in enumerate(order):
        assert together[position + 1] == alone[index]


def _split_requests(batch: SpecBatch) -> list[RequestData]:
    """The per-request data of a batch, drafts read through their slots."""
    cu = batch.cu_num_drafts.tolist()
    slot = None if batch.draft_slot is None else batch.draft_slot.tolist()
    requests = []
    for b in range(batch.num_requests):
        start, end = cu[b], cu[b + 1]
        if batch.draft_logits is None:
            draft = None
        elif slot is not None:
            draft = batch.draft_logits[slot[b], : end - start].float().cpu()
        else:
            draft = batch.draft_logits[start:end].float().cpu()
        requests.append(
            RequestData(
                target_logits=batch.target_logits[start + b : end + b + 1].float().cpu(),
                draft_token_ids=batch.draft_token_ids[start:end].cpu(),
                draft_logits=draft,
                temperature=float(batch.temperature[b]),
                seed=int(batch.seed[b]),
                step=int(batch.step[b]),
                tree_parent=None if batch.tree_parent is None else batch.tree_parent[start:end].tolist(),
            )
        )
    return requests


@pytest.mark.parametrize("method", METHODS)
def test_near_ties_are_rare_on_ordinary_batches(method: str) -> None:
    """On 96 ordinary requests, at most 1% of decisions are near ties and only those disagree, with
    the reference and between the two launch plans."""
    rng = np.random.default_rng(METHODS.index(method))
    vocab_size, n = 33, 3
    requests = [
        RequestData(
            target_logits=rng.normal(size=(n + 1, vocab_size)) * 2,
            draft_token_ids=rng.integers(0, vocab_size, n),
            draft_logits=rng.normal(size=(n, vocab_size)) * 2,
            temperature=float(rng.choice([0.0, 0.7, 1.0])),
            seed=int(rng.integers(0, 2**62)),
            step=b,
        )
        for b in range(96)
    ]
    batch = make_batch(requests, method=method, synthetic_rates=[0.9, 0.8, 0.7], device=DEVICE)
    outputs = {plan: rejection_sample(batch, plan=plan) for plan in LAUNCH_PLANS}
    for output in outputs.values():
        found = agreement(batch, output)
        assert found.unexplained == []
        assert found.near_ties <= 0.01 * found.num_decisions
        assert found.mismatches <= found.near_ties
        assert violations(batch, output) == []
    split, rows = (_requests(outputs[plan]) for plan in LAUNCH_PLANS)
    assert sum(a != b for a, b in zip(split, rows, strict=True)) <= found.near_ties


@pytest.mark.parametrize("plan", LAUNCH_PLANS)
def test_split_vocabulary_agrees_with_the_reference(plan: str) -> None:
    """A vocabulary cut into several splits and tiles per split gives the reference's samples."""
    vocab_size = 4096 * 33 + 5  # 17 splits of 8192 tokens, the last one ragged
    layout = vocab_layout(vocab_size)
    assert (layout.split_size, layout.num_splits, layout.tiles(2048)) == (8192, 17, (2048, 4))
    rng = np.random.default_rng(11)
    requests = [
        RequestData(
            target_logits=rng.normal(size=(2, vocab_size)) * 3,
            draft_token_ids=[int(rng.integers(0, vocab_size))],
            draft_logits=rng.normal(size=(1, vocab_size)) * 3,
            temperature=1.0,
            seed=seed,
        )
        for seed in range(1)
    ]
    for method in METHODS:
        batch = make_batch(requests, method=method, synthetic_rates=[0.5], device=DEVICE)
        output = rejection_sample(batch, plan=plan)
        assert violations(batch, output) == []
        assert agreement(batch, output).unexplained == []


@pytest.mark.parametrize("name", ["triton", "torch"])
@given(data=st.data())
def test_registered_variants_keep_the_invariants(name: str, data: st.DataObject) -> None:
    """Every registered sampler keeps the hard invariants on the methods it implements; the canonical
    flag says which streams it uses."""
    variant = registry.get(name)
    methods = tuple(variant.capabilities.methods)
    batch = data.draw(batches(max_requests=3, max_drafts=3, methods=methods))
    assert (variant.streams is not None) == (name == "triton")
    assert violations(batch, variant(batch)) == []


def test_torch_sampler_is_deterministic_per_request() -> None:
    """The PyTorch sampler's output depends on each request's own seed and step only."""
    rng = np.random.default_rng(5)
    requests = [
        RequestData(rng.normal(size=(4, 9)), rng.integers(0, 9, 3), rng.normal(size=(3, 9)), 1.0, seed=s)
        for s in range(6)
    ]
    sampler = registry.get("torch")
    alone = _requests(sampler(make_batch(requests, device=DEVICE)))
    reversed_output = _requests(sampler(make_batch(requests[::-1], device=DEVICE)))
    assert reversed_output[::-1] == alone


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason=NO_GPU)
@settings(max_examples=12)
@pytest.mark.parametrize("plan", PLANS)
@given(batch=batches(max_requests=8, max_drafts=8, vocab_sizes=(4095, 4096, 4097, 32000, 151936, 262144)))
def test_large_vocabularies_agree_with_the_reference(plan: str, batch: SpecBatch) -> None:
    """On the GPU, large vocabularies keep the invariants and agree with the reference except at near ties."""
    output = rejection_sample(batch, check_values=True, plan=plan)
    assert violations(batch, output) == []
    assert agreement(batch, output).unexplained == []


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason=NO_GPU)
@pytest.mark.parametrize("plan", LAUNCH_PLANS)
@pytest.mark.parametrize("method", METHODS)
def test_rows_past_two_to_the_31_elements(method: str, plan: str) -> None:
    """Rows whose offset row * V exceeds 2**31 are read where they are (M23: 64-bit index arithmetic)."""
    vocab_size, num_requests, n = 262144, 1640, 4  # 8200 rows: the last ones start past 2**31 elements
    generator = torch.Generator(device="cuda").manual_seed(METHODS.index(method))
    target = torch.randn(num_requests * (n + 1), vocab_size, generator=generator, device="cuda")
    target = (target * 3).to(torch.float16)
    draft = (torch.randn(num_requests * n, vocab_size, generator=generator, device="cuda") * 3).half()
    ids = torch.randint(0, vocab_size, (num_requests * n,), generator=generator, device="cuda")
    batch = SpecBatch(
        target_logits=target,
        draft_logits=draft,
        draft_token_ids=ids,
        cu_num_drafts=torch.arange(0, num_requests * n + 1, n, dtype=torch.int32, device="cuda"),
        temperature=torch.ones(num_requests, device="cuda"),
        seed=torch.arange(num_requests, device="cuda"),
        step=torch.zeros(num_requests, dtype=torch.int64, device="cuda"),
        method=method,
        synthetic_rates=torch.full((n,), 0.6, dtype=torch.float64, device="cuda"),
        max_num_drafts=n,
        # A tree's nodes: a chain in each request.
        tree_parent=torch.arange(-1, n - 1, device="cuda").repeat(num_requests) if method == "tree" else None,
    )
    assert (num_requests - 1) * (n + 1) * vocab_size > 2**31
    output = rejection_sample(batch, plan=plan)
    tail = slice(num_requests - 3, num_requests)
    rows = slice(tail.start * (n + 1), num_requests * (n + 1))
    small = dataclasses.replace(
        batch,
        target_logits=target[rows].contiguous(),
        draft_logits=draft[tail.start * n :].contiguous(),
        draft_token_ids=ids[tail.start * n :],
        cu_num_drafts=torch.arange(0, 3 * n + 1, n, dtype=torch.int32, device="cuda"),
        temperature=batch.temperature[tail],
        seed=batch.seed[tail],
        step=batch.step[tail],
        tree_parent=None if batch.tree_parent is None else batch.tree_parent[tail.start * n :],
    )
    alone = rejection_sample(small, plan=plan)
    assert torch.equal(alone.token_ids, output.token_ids[tail])
    assert torch.equal(alone.num_emitted, output.num_emitted[tail])
    assert agreement(small, alone).unexplained == []


def test_plan_key_tells_structures_apart() -> None:
    """Batches of one structure share a cached plan; an input's alignment or a shape gives another one."""
    rng = np.random.default_rng(7)
    requests = [RequestData(rng.normal(size=(3, 40)), rng.integers(0, 40, 2), rng.normal(size=(2, 40)), 1.0)]
    batch = make_batch(requests, device="cpu")
    same = dataclasses.replace(batch, target_logits=batch.target_logits.clone() + 1.0, seed=batch.seed + 5)
    wider = torch.zeros(batch.target_logits.shape[0], 41)
    shifted = dataclasses.replace(batch, target_logits=wider[:, 1:])  # 4-byte aligned, not 16
    flat = torch.zeros(batch.target_logits.numel() + 1)
    moved = dataclasses.replace(batch, target_logits=flat[1:].view(batch.target_logits.shape))  # same strides

    def key(batch: SpecBatch, device_index: int = 0) -> tuple[object, ...]:
        addresses = [tensor.data_ptr() for tensor in rejection._batch_tensors(batch)]
        return rejection._plan_key(batch, device_index, addresses)

    assert key(same) == key(batch)
    assert key(shifted) != key(batch)
    assert key(moved) != key(batch) and key(moved)[0] == key(batch)[0]
    assert key(batch, 1) != key(batch)
    assert key(dataclasses.replace(batch, method="strict")) != key(batch)
    assert key(dataclasses.replace(batch, max_num_drafts=1)) != key(batch)


def test_batch_structure_is_what_validation_checks() -> None:
    """A batch's structure is told apart by every field validation checks, and a structure that passed
    validation once is not validated again while a batch with a bad structure is always refused."""
    rng = np.random.default_rng(3)
    requests = [RequestData(rng.normal(size=(3, 40)), rng.integers(0, 40, 2), rng.normal(size=(2, 40)), 1.0)]
    batch = make_batch(requests, device="cpu")
    structure = rejection.batch_structure(batch)
    assert structure is not None
    assert rejection.batch_structure(dataclasses.replace(batch, seed=batch.seed + 1)) == structure
    changed = {
        "dtype": dict(target_logits=batch.target_logits.to(torch.float16)),
        "strides": dict(target_logits=torch.zeros(40, 3).t()),
        "shape": dict(temperature=torch.ones(2)),
        "absent": dict(draft_logits=None),
        "method": dict(method="strict"),
        "flag": dict(draft_filter=True),
        "hint": dict(max_num_drafts=None),
    }
    for name, fields in changed.items():
        assert rejection.batch_structure(dataclasses.replace(batch, **fields)) != structure, name
    assert rejection.batch_structure(dataclasses.replace(batch, synthetic_rates=[0.5])) is None
    assert rejection.batch_structure("not a batch") is None

    rejection._validated.clear()
    rejection._validate(batch, structure, False)
    assert structure in rejection._validated
    bad = dataclasses.replace(batch, temperature=torch.ones(2))
    for _ in range(2):
        with pytest.raises(ValueError, match="temperature has shape"):
            rejection._validate(bad, rejection.batch_structure(bad), False)
    # Values read back are checked on every call: a seen structure with a bad value is refused.
    hot = dataclasses.replace(batch, temperature=torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="temperature"):
        rejection._validate(hot, rejection.batch_structure(hot), True)
    with pytest.raises(ValueError, match="temperature"):
        rejection._validate(hot, rejection.batch_structure(hot), None)  # a CPU batch: values read


@pytest.mark.parametrize("method", ["probabilistic", "synthetic", "block"])
def test_sampling_cut_into_parts_gives_the_same_tokens(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small batch's sampling pass cut into more programs draws the same tokens (each block's mass
    is its own, whatever the cut)."""
    vocab_size, n = 4097, 2  # two splits of four 1024-token sampling tiles
    rng = np.random.default_rng(11)
    requests = [
        RequestData(
            rng.normal(size=(n + 1, vocab_size)) * 3,
            rng.integers(0, vocab_size, n),
            rng.normal(size=(n, vocab_size)) * 3,
            temperature=1.0,
            seed=seed,
        )
        for seed in range(16)
    ]
    batch = make_batch(requests, method=method, synthetic_rates=[0.3, 0.3], device=DEVICE)
    plan = rejection.make_plan(batch)
    assert plan.sample_splits == 2 * 4
    cut, _ = rejection._compile_and_run(batch, plan)
    monkeypatch.setattr(rejection, "SAMPLE_PROGRAMS", 0)
    plan = rejection.make_plan(batch)
    assert plan.sample_splits == 2
    whole, _ = rejection._compile_and_run(batch, plan)
    assert torch.equal(cut.token_ids, whole.token_ids)
    assert torch.equal(cut.num_emitted, whole.num_emitted)
    assert bool((cut.num_emitted <= n).any()), "no request rejected a draft: nothing was sampled"


@pytest.mark.skipif(
    DEVICE != "cpu",
    reason="forces the recompute path by patching FAST_MASS_FLOOR, which only the interpreter reads per call "
    "(a compiled kernel fixes it at compile time)",
)
@pytest.mark.parametrize("method", ["probabilistic", "block"])
def test_rows_recomputed_block_by_block_draw_the_same_tokens(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The emit step recomputes a row's block masses, each block relative to its own largest weight,
    when the sampling pass's sum lies below FAST_MASS_FLOOR (a residual of tiny probabilities only,
    never reached at random). Forced on every row, it draws the walk's tokens but at near ties. The
    draft puts less mass than the target on the last block only, so every residual lies there and a
    recomputation that weighed the blocks by p instead would mostly pick another."""
    vocab_size, n = 3 * 1024 + 77, 2
    rng = np.random.default_rng(12)
    requests = []
    for seed in range(48):
        target = rng.normal(size=(n + 1, vocab_size))
        draft = target[:n].copy()
        draft[:, 3 * 1024 :] -= 2.0
        requests.append(RequestData(target, rng.integers(0, 3 * 1024, n), draft, temperature=1.0, seed=seed))
    batch = make_batch(requests, method=method, device=DEVICE)
    fast = rejection_sample(batch, plan="split")
    monkeypatch.setattr(jit, "FAST_MASS_FLOOR", triton.language.constexpr(float("inf")))
    recomputed = rejection_sample(batch, plan="split")
    result = agreement(batch, recomputed)
    assert not result.unexplained, result.unexplained
    assert int((fast.token_ids != recomputed.token_ids).sum()) <= result.near_ties
    assert bool((recomputed.num_emitted <= n).any()), "no request rejected a draft: nothing was sampled"


@pytest.mark.parametrize("layout", ["flat", "one-hot"])
def test_split_plan_fast_sampling_pass_draws_the_walks_tokens(layout: str) -> None:
    """The sampling pass reads a split whose tokens all lie inside the vocabulary the fast way
    (`_fast_weights`: no masks, one reduction) and the vocabulary's last split the general way. With
    two full splits and a partial one, residual, restricted (one-hot drafts) and bonus rows, NaN
    logits among them, every token is the walk's but at near ties. The partial split holds about
    half of each residual, so a fast way that weighed its blocks 1.5 times too much against the
    general way's block would move the pick of about one request in ten: over some 50 sampled
    requests, it goes unseen with probability about 0.5 %."""
    vocab_size, n = 2 * 4096 + 77, 2
    rng = np.random.default_rng(21)
    requests = []
    for seed in range(80):
        target = rng.normal(size=(n + 1, vocab_size))
        target[:, 2 * 4096 :] += 4.0
        draft = target[:n] + rng.normal(size=(n, vocab_size)) * 1.5
        draft[:, 2 * 4096 :] -= 2.0  # the partial split holds about half the residual
        drafts = rng.integers(0, vocab_size, n)
        if seed % 8 == 1:  # drafts the target all but certainly accepts: a bonus row
            target[np.arange(n), drafts] += 20.0
            draft[np.arange(n), drafts] += 20.0
        if seed % 8 == 0:  # NaN logits read as -inf
            target[:, rng.integers(0, vocab_size, 50)] = np.nan
            draft[:, rng.integers(0, vocab_size, 50)] = np.nan
        requests.append(
            RequestData(target, drafts, None if layout == "one-hot" else draft, temperature=0.8, seed=seed)
        )
    batch = make_batch(requests, method="probabilistic", device=DEVICE)
    output = rejection_sample(batch, plan="split")
    result = agreement(batch, output)
    assert not result.unexplained, result.unexplained
    emitted = output.num_emitted.cpu()
    assert bool((emitted <= n).any()) and bool((emitted == n + 1).any()), emitted


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason=NO_GPU)
@settings(max_examples=30)
@given(batch=batches(max_requests=6, max_drafts=5, vocab_sizes=(33, 4097, 32000)), shift=st.floats(-3, 3))
def test_cached_launches_match_triton_dispatch(batch: SpecBatch, shift: float) -> None:
    """A call that reuses a cached plan, on new values and new buffers, equals a call through Triton's
    dispatch bit for bit."""
    rejection_sample(batch)  # caches the plan of this structure
    changed = dataclasses.replace(
        batch,
        target_logits=batch.target_logits.clone() * 0.5 + shift,
        seed=batch.seed + 1,
        step=batch.step + 3,
    )
    addresses = [tensor.data_ptr() for tensor in rejection._batch_tensors(changed)]
    assert rejection._plan_key(changed, torch.cuda.current_device(), addresses) in rejection._cache
    # Twice: the second call reuses the workspace the first one kept (`rejection._resident_workspace`).
    for again in range(2):
        changed = dataclasses.replace(changed, seed=changed.seed + again)
        cached = rejection_sample(changed)
        dispatched, _ = rejection._compile_and_run(changed, rejection.make_plan(changed))
        assert torch.equal(cached.token_ids, dispatched.token_ids)
        assert torch.equal(cached.num_emitted, dispatched.num_emitted)
        assert cached.logprobs is not None and dispatched.logprobs is not None
        assert torch.equal(cached.logprobs.nan_to_num(nan=7.0), dispatched.logprobs.nan_to_num(nan=7.0))
