"""The Triton sampler's tree verification, on a GPU where there is one and under the interpreter
otherwise: coupled with the walk node for node, every invariant kept, on the harness's own tree
batches (chains, stars past 32 siblings, bushy and deep trees, repeated sibling tokens, requests
without drafts, greedy rows, filters, every draft layout and dtype), in both launch plans."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch
import triton
from hypothesis import given, settings

from specsample.kernels import rejection_kernels as jit
from specsample.kernels.rejection import TritonRejectionSampler, rejection_sample
from specsample.properties.checks.coupled import agreement
from specsample.properties.checks.invariants import violations
from specsample.properties.strategies import WIDE_SIBLINGS, spec_batches
from specsample.reference.contract import RequestData, SpecBatch, make_batch
from specsample.reference.sampler import reference_sample

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
# Both launch plans under the interpreter; the split plan on a GPU (see test_kernels.PLANS). The
# interpreter runs the split plan both ways a tree batch may take: every row read ("every-row"), or
# only the rows of the paths ("path", `rejection_kernels.TREE_EVERY_ROW_MAX` lowered to 0 so every
# batch takes it); a GPU compiles the module's value, and takes each way by its batch's size.
PLANS = ("rows", "split-every-row", "split-path") if DEVICE == "cpu" else ("split",)


@pytest.fixture
def plan(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The launch plan of ``request.param``, the split plan's way for trees set where it names one."""
    name = str(request.param)
    if name == "split-path":
        monkeypatch.setattr(jit, "TREE_EVERY_ROW_MAX", triton.language.constexpr(0))
    elif name == "split-every-row":
        monkeypatch.setattr(jit, "TREE_EVERY_ROW_MAX", triton.language.constexpr(2**40))
    return name.split("-")[0]


CAPABILITIES = TritonRejectionSampler().capabilities


def _coupled(batch: SpecBatch, plan: str) -> None:
    """The kernel's output keeps every invariant and agrees with the walk, near ties excused."""
    output = rejection_sample(batch, plan=plan)
    assert output.accepted_nodes is not None
    assert violations(batch, output) == []
    assert agreement(batch, output).unexplained == []


# Under the interpreter a batch costs the split plan up to about 1 s (a star of 33+ rows), the rows plan less.
EXAMPLES = {"cpu": {"split": 12, "rows": 25}, "cuda": {"split": 100}}
TREE_BATCHES = spec_batches(
    methods=("tree",), capabilities=CAPABILITIES, max_vocab=40, max_requests=4, max_drafts=6, device=DEVICE
)


@pytest.mark.parametrize("plan", PLANS, indirect=True)
def test_trees_agree_with_the_walk_node_for_node(plan: str) -> None:
    """Every generated tree batch: the emitted tokens, logprobs, counts and accepted nodes are the
    walk's (`agreement` replays it on the kernel's streams), and the output keeps the tree invariants."""

    @settings(max_examples=EXAMPLES[DEVICE][plan], deadline=None)
    @given(batch=TREE_BATCHES)
    def coupled(batch: SpecBatch) -> None:
        _coupled(batch, plan)

    coupled()


def _requests(rng: np.random.Generator, parents: list[list[int]], vocab_size: int) -> list[RequestData]:
    """One request per parent list: Gaussian target rows, each node's token its parent row's argmax
    or, for every other node, a random token (so walks go deep and stop)."""
    requests = []
    for index, tree in enumerate(parents):
        target = rng.normal(size=(len(tree) + 1, vocab_size)) * 2.0
        tokens = [
            int(np.argmax(target[parent + 1])) if node % 2 == 0 else int(rng.integers(vocab_size))
            for node, parent in enumerate(tree)
        ]
        requests.append(
            RequestData(target, tokens, None, 0.0 if index == 1 else 1.0, seed=index, tree_parent=tree)
        )
    return requests


@pytest.mark.parametrize("plan", PLANS, indirect=True)
def test_a_chain_verified_as_a_tree_emits_what_strict_verification_emits(plan: str) -> None:
    """On a chain every node has one child: tree and strict verification draw the same sample at
    each row, so their outputs are equal token for token, and the accepted nodes are 0, 1, ...."""
    chains = [list(range(-1, n - 1)) for n in (5, 0, 3, 7)]
    for seed in range(4):
        requests = _requests(np.random.default_rng(seed), chains, 19)
        tree = rejection_sample(make_batch(requests, method="tree", device=DEVICE), plan=plan)
        chain = [dataclasses.replace(request, tree_parent=None) for request in requests]
        strict = rejection_sample(make_batch(chain, method="strict", device=DEVICE), plan=plan)
        assert torch.equal(tree.token_ids, strict.token_ids)
        assert torch.equal(tree.num_emitted, strict.num_emitted)
        assert tree.accepted_nodes is not None
        for b, emitted in enumerate(tree.num_emitted.tolist()):
            assert tree.accepted_nodes[b, : emitted - 1].tolist() == list(range(emitted - 1))


@pytest.mark.parametrize("plan", PLANS, indirect=True)
def test_wide_and_deep_trees_equal_the_reference_sampler(plan: str) -> None:
    """A star of more than 32 children whose likeliest token is the last child, a deep tree and a
    greedy bushy tree beside a request without drafts: the kernel emits the reference sampler's
    tokens and accepted nodes (its coupled replay), node for node."""
    wide = [-1] * (WIDE_SIBLINGS + 3)
    deep = [-1, 0, 1, 1, 3, 4, 4, 6, 7]
    bushy = [-1, -1, 0, 0, 1, 2, 3, 3, 5]
    for seed in range(3):
        rng = np.random.default_rng(100 + seed)
        requests = _requests(rng, [wide, bushy, [], deep], 45)
        # The star's likeliest token is its last child's: a verifier that reads 32 siblings misses it.
        root = np.asarray(requests[0].target_logits)
        tokens = [int(t) for t in np.argsort(root[0])[-len(wide) :]]
        requests[0] = RequestData(root, tokens, None, 1.0, seed=seed, tree_parent=wide)
        batch = make_batch(requests, method="tree", device=DEVICE)
        output = rejection_sample(batch, plan=plan)
        reference = reference_sample(batch)
        assert violations(batch, output) == []
        found = agreement(batch, output)
        assert found.unexplained == []
        if found.mismatches == 0:
            assert torch.equal(output.token_ids.cpu(), reference.token_ids)
            assert output.accepted_nodes is not None and reference.accepted_nodes is not None
            assert torch.equal(output.accepted_nodes.cpu(), reference.accepted_nodes)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
def test_a_large_tree_batch_reads_only_its_paths_and_agrees_with_the_walk() -> None:
    """A batch of more than `TREE_EVERY_ROW_MAX` rows takes the path-only way on a GPU (rows wait for
    their parents' rows): coupled with the walk, greedy and sampled requests, bushy and deep trees."""
    trees = [[-1, -1, 0, 0, 1, 2, 3, 3, 5, 4, 9, 10]] * 6 + [list(range(-1, 29))] * 6
    assert sum(len(tree) + 1 for tree in trees) > jit.TREE_EVERY_ROW_MAX
    for seed in range(20):
        requests = _requests(np.random.default_rng(seed), trees, 4097)
        _coupled(make_batch(requests, method="tree", device=DEVICE), "split")
