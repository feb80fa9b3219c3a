"""`reference.tree`, the specification of tree verification: the parent array checked, the exact law
of the emitted sequence enumerated, and the reference sampler on a chain equal to strict's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specsample.reference import tree
from specsample.reference.contract import Capabilities, RequestData, make_batch
from specsample.reference.law import exact_law, request_inputs, request_law, row_probs
from specsample.reference.sampler import reference_sample, sample_tree, scheme_noise
from specsample.reference.walk import walk


@st.composite
def trees(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tree of up to 7 nodes over a vocabulary of 2 to 5 tokens: parents before children, sibling
    tokens that repeat, placeholders, and target laws with zeros."""
    n = draw(st.integers(0, 7))
    parents = np.array([draw(st.integers(-1, i - 1)) for i in range(n)], dtype=np.int64)
    vocab_size = draw(st.integers(2, 5))
    tokens = np.array([draw(st.integers(-1, vocab_size - 1)) for _ in range(n)], dtype=np.int64)
    weights = draw(
        st.lists(
            st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 7.0]), min_size=vocab_size, max_size=vocab_size),
            min_size=n + 1,
            max_size=n + 1,
        )
    )
    targets = np.array(weights, dtype=np.float64).reshape(n + 1, vocab_size)
    targets[:, 0] += targets.sum(axis=1) == 0  # every row a law
    return parents, tokens, targets / targets.sum(axis=1, keepdims=True)


@pytest.mark.parametrize(
    ("parents", "message"),
    [
        ([0], "tree_parent[0] is 0: a parent at or after it"),
        ([-1, 2, 1], "tree_parent[1] is 2: a parent at or after it"),
        ([-1, -2], "tree_parent[1] is -2: a parent outside the request"),
        ([-1, 5], "tree_parent[1] is 5: a parent outside the request"),
        ([[-1]], "tree_parent is [[-1]]"),
        ([-1, 0.5], "tree_parent is [-1.0, 0.5]"),
        (
            [-1, *range(tree.MAX_DEPTH)],
            f"tree_parent[{tree.MAX_DEPTH}] puts its node at depth {tree.MAX_DEPTH + 1}",
        ),
    ],
)
def test_a_bad_parent_array_is_an_error_naming_it(parents: list[int], message: str) -> None:
    """A parent at or after its child (a cycle among them), outside the request, a parent array
    that is not a list of integers, a path past `MAX_DEPTH`: a `ValueError` naming the node and value."""
    with pytest.raises(ValueError, match="tree_parent") as error:
        tree.check_parents(parents)
    assert message in str(error.value)


def test_good_parent_arrays_pass_with_their_depths_and_children() -> None:
    """A star, a chain at the deepest allowed, and a bushy tree check out, with their depths and
    children in sibling order."""
    star = tree.check_parents([-1] * 40)
    assert tree.depths(star).tolist() == [1] * 40 and tree.children(star)[0] == list(range(40))
    chain = tree.check_parents([-1, *range(tree.MAX_DEPTH - 1)])
    assert int(tree.depths(chain).max()) == tree.MAX_DEPTH
    bushy = tree.check_parents([-1, -1, 0, 0, 1, 3])
    assert tree.depths(bushy).tolist() == [1, 1, 2, 2, 2, 3]
    assert tree.children(bushy) == [[0, 1], [2, 3], [4], [], [5], [], []]
    assert tree.check_parents([]).size == 0


@given(trees())
def test_the_sequence_law_is_a_law(case: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """The probabilities of the emitted sequences sum to 1, each sequence at most one token longer
    than the tree is deep."""
    parents, tokens, targets = case
    law = tree.sequence_law(targets, parents, tokens)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    deepest = int(tree.depths(parents).max()) if parents.size else 0
    assert all(0 < len(s) <= deepest + 1 and p > 0 for s, p in law.items())


@given(trees())
def test_each_token_is_distributed_as_the_target_at_its_node(
    case: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """Losslessness by enumeration: for every node the walk can reach (the root, and each child that
    is the first of its siblings with its token), the sequences that pass through it and then hold
    token ``x`` weigh ``P(reach) * p_node(x)``, for every ``x`` of the vocabulary."""
    parents, tokens, targets = case
    law = tree.sequence_law(targets, parents, tokens)
    kids = tree.children(parents)
    reachable = [(tree.ROOT, (), 1.0)]
    for node, prefix, reach in reachable:  # grows as the walk goes down
        row = targets[node + 1]
        for x in range(targets.shape[1]):
            through = sum(p for s, p in law.items() if s[: len(prefix) + 1] == (*prefix, x))
            assert through == pytest.approx(reach * row[x], abs=1e-12), (node, prefix, x)
            child = tree.matching_child(kids[node + 1], tokens, x)
            if child is not None and row[x] > 0:
                reachable.append((child, (*prefix, x), reach * row[x]))


@given(trees())
def test_the_walk_emits_the_sequences_of_the_law(case: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """`verify`, run over every combination of draws of the rows it visits (each weighted by its
    probability), gives `sequence_law`; its accepted nodes form a root path whose tokens begin the
    sequence."""
    parents, tokens, targets = case
    law = tree.sequence_law(targets, parents, tokens)
    found: dict[tuple[int, ...], float] = {}

    def explore(fixed: dict[int, int], weight: float) -> None:
        visited: list[int] = []

        def draw(row: int) -> int:
            visited.append(row)
            return fixed.get(row, -1)

        accepted, sequence = tree.verify(parents, tokens, draw)
        row = visited[-1]
        if row not in fixed:  # a row not drawn yet: branch on its tokens
            for x in np.nonzero(targets[row] > 0)[0].tolist():
                explore({**fixed, row: x}, weight * float(targets[row, x]))
            return
        assert [int(tokens[a]) for a in accepted] == sequence[:-1]
        assert all(int(parents[b]) == a for a, b in zip([tree.ROOT, *accepted], accepted, strict=False))
        found[tuple(sequence)] = found.get(tuple(sequence), 0.0) + weight

    explore({}, 1.0)
    assert found.keys() == law.keys()
    assert all(found[s] == pytest.approx(law[s], abs=1e-12) for s in law)


def _chain_batch(seed: int) -> tuple[object, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n, vocab_size = int(rng.integers(0, 5)), int(rng.integers(2, 7))
    logits = rng.normal(size=(n + 1, vocab_size)) * 2.0
    drafts = rng.integers(-1, vocab_size, size=n)
    temperature = 0.0 if seed % 4 == 3 else float(rng.uniform(0.5, 1.5))  # a greedy request in four
    batch = make_batch(
        [RequestData(logits, drafts.tolist(), None, temperature=temperature, seed=seed)], method="strict"
    )
    return batch, np.full(n, -1, dtype=np.int64) + np.arange(n), drafts.astype(np.int64)


@pytest.mark.parametrize("seed", range(12))
def test_on_a_chain_the_law_is_strict_verifications(seed: int) -> None:
    """A chain (node ``i``'s parent ``i - 1``) gives strict verification's exact law: the sequence of
    ``j`` accepted drafts then ``y`` weighs ``P(m = j) P(y | m = j)``."""
    batch, parents, tokens = _chain_batch(seed)
    strict = request_law("strict", request_inputs(batch)[0])
    law = tree.sequence_law(strict.target_probs, parents, tokens)
    expected = {
        (*tokens[:j].tolist(), x): float(strict.stop_probs[j] * strict.token_probs[j, x])
        for j in range(tokens.size + 1)
        for x in range(strict.token_probs.shape[1])
        if strict.stop_probs[j] * strict.token_probs[j, x] > 0
    }
    assert law.keys() == expected.keys()
    assert all(law[s] == pytest.approx(p, rel=1e-12) for s, p in expected.items())


@pytest.mark.parametrize("seed", range(40))
def test_the_reference_sampler_on_a_chain_is_strict_verifications(seed: int) -> None:
    """With the canonical row noise (a greedy request: each row's argmax), the tree sampler on a
    chain emits what the strict reference sampler emits, token for token, and accepts the nodes of
    the drafts it keeps."""
    batch, parents, _ = _chain_batch(seed)
    inputs = request_inputs(batch)[0]
    accepted, sequence = sample_tree(dataclasses.replace(inputs, tree_parent=parents), scheme_noise(batch)[0])
    strict = reference_sample(batch)
    count = int(strict.num_emitted[0])
    assert sequence == strict.token_ids[0, :count].tolist()
    assert accepted == list(range(count - 1))


def test_the_first_sibling_with_the_drawn_token_is_accepted_and_placeholders_never_are() -> None:
    """Siblings 0 and 1 both hold token 3: a draw of 3 at the root accepts node 0 and goes on from
    it; node 2 (token 5) under it is accepted next; node 2 has no children, so its draw is the bonus.
    A placeholder child (token -1) is never accepted, whatever is drawn."""
    parents, tokens = tree.check_parents([-1, -1, 0, -1]), np.array([3, 3, 5, -1])
    draws = {0: 3, 1: 5, 3: 1}
    assert tree.verify(parents, tokens, draws.__getitem__) == ([0, 2], [3, 5, 1])
    assert tree.verify(parents, tokens, lambda row: 4) == ([], [4])
    targets = np.full((5, 6), 1 / 6)
    law = tree.sequence_law(targets, parents, tokens)
    assert law[(3, 5, 1)] == pytest.approx(1 / 6**3) and (3, 4) in law and (4,) in law
    assert not any(s[0] == -1 for s in law)


def _path_tokens(parents: np.ndarray, tokens: np.ndarray, row: int) -> tuple[int, ...]:
    """The tokens of the root path of target row ``row`` (0 the root's, ``1 + v`` node ``v``'s)."""
    path, node = [], row - 1
    while node != tree.ROOT:
        path.append(int(tokens[node]))
        node = int(parents[node])
    return tuple(reversed(path))


@given(trees())
def test_the_law_by_stop_row_is_the_sequence_law(case: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """`tree_law`'s stop rows and emitted tokens give `sequence_law` (a stop row determines the accepted
    path); each node's acceptance is its parent's probability of its token, 0 for a placeholder or a
    later sibling of the same token; the stop rows form a law."""
    parents, tokens, targets = case
    accept, stop, given_stop = tree.tree_law(targets, parents, tokens)
    assert stop.sum() == pytest.approx(1.0, abs=1e-12)
    joint: dict[tuple[int, ...], float] = {}
    for row in range(parents.size + 1):
        for y in np.nonzero(given_stop[row] * stop[row] > 0)[0].tolist():
            key = (*_path_tokens(parents, tokens, row), y)
            joint[key] = joint.get(key, 0.0) + float(stop[row] * given_stop[row, y])
    law = tree.sequence_law(targets, parents, tokens)
    assert joint.keys() == {s for s, p in law.items() if p > 0}
    assert all(joint[s] == pytest.approx(law[s], rel=1e-9) for s in joint)
    first = tree.first_siblings(parents, tokens)
    for node in range(parents.size):
        expected = float(targets[parents[node] + 1, tokens[node]]) if first[node] else 0.0
        assert accept[node] == expected


def _tree_batch(method: str = "tree") -> object:
    """Two tree requests (a bushy tree with a repeated sibling token and a placeholder, a star) and
    one without drafts, over a vocabulary of 6."""
    rng = np.random.default_rng(3)
    requests = [
        RequestData(rng.normal(size=(5, 6)), [3, 3, 5, -1], None, seed=1, tree_parent=[-1, -1, 0, 0]),
        RequestData(
            rng.normal(size=(4, 6)), [0, 1, 2], None, temperature=0.0, seed=2, tree_parent=[-1, -1, -1]
        ),
        RequestData(rng.normal(size=(1, 6)), [], None, seed=3, tree_parent=[]),
    ]
    return make_batch(requests, method=method)  # type: ignore[arg-type]


def test_a_tree_batch_carries_its_parents_and_its_sampler_lists_the_accepted_nodes() -> None:
    """`make_batch` stacks the requests' parents; the reference sampler walks each tree with the
    canonical row noise, lists the accepted nodes (each a child of the one before), emits their tokens
    then one more, and reports each token's log-probability at the row it was drawn from."""
    batch = _tree_batch()
    assert batch.tree_parent is not None and batch.tree_parent.tolist() == [-1, -1, 0, 0, -1, -1, -1]
    output = reference_sample(batch)
    assert output.accepted_nodes is not None and tuple(output.accepted_nodes.shape) == (3, 4)
    inputs = request_inputs(batch)
    for b, x in enumerate(inputs):
        count = int(output.num_emitted[b])
        nodes = [v for v in output.accepted_nodes[b].tolist() if v >= 0]
        assert len(nodes) == count - 1 and output.accepted_nodes[b, count - 1 :].eq(-1).all()
        assert x.tree_parent is not None
        assert [int(x.tree_parent[v]) for v in nodes] == [tree.ROOT, *nodes][: len(nodes)]
        assert output.token_ids[b, : count - 1].tolist() == [int(x.draft_token_ids[v]) for v in nodes]
        rows = [0, *(v + 1 for v in nodes)]
        probs = row_probs(x.target_logits, x.temperature if x.temperature > 0 else 1.0)
        expected = np.log(probs[rows, output.token_ids[b, :count].numpy()])
        assert output.logprobs is not None
        np.testing.assert_allclose(output.logprobs[b, :count].numpy(), expected, rtol=1e-5)
    # The greedy star accepts its argmax child when one holds it, and emits the argmax after it.
    greedy = inputs[1]
    argmax = int(np.argmax(greedy.target_logits[0]))
    expected_nodes = [argmax] if argmax in (0, 1, 2) else []
    assert output.accepted_nodes[1, : len(expected_nodes)].tolist() == expected_nodes


def test_the_exact_law_of_a_tree_request_is_its_tree_law() -> None:
    """`exact_law` indexes a tree request's law by stop row (`reference.tree.tree_law`)."""
    batch = _tree_batch()
    laws = exact_law(batch)
    for law, x in zip(laws, request_inputs(batch), strict=True):
        assert x.tree_parent is not None
        accept, stop, given = tree.tree_law(x.target_probs(), x.tree_parent, x.draft_token_ids)
        np.testing.assert_array_equal(law.stop_probs, stop)
        np.testing.assert_array_equal(law.token_probs, given)
        np.testing.assert_array_equal(law.accept_probs, accept)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tree_parent": None}, "tree_parent is None; expected a torch.Tensor"),
        (
            {"tree_parent": torch.tensor([-1, -1, 0], dtype=torch.int32)},
            r"tree_parent has shape \(3,\); expected \[D\] = \[7\]",
        ),
        (
            {"tree_parent": torch.tensor([-1, -1, 0, 3, -1, -1, -1], dtype=torch.int32)},
            r"tree_parent\[3\] is 3 \(node 3 of request 0\): a parent at or after it",
        ),
        (
            {"tree_parent": torch.tensor([-1, -1, 0, 0, -1, 2, -1], dtype=torch.int32)},
            r"tree_parent\[5\] is 2 \(node 1 of request 1\): a parent at or after it",
        ),
        (
            {"tree_parent": torch.tensor([-1.0] * 7)},
            "tree_parent has dtype torch.float32; expected one of int32, int64",
        ),
        ({"method": "strict"}, "tree_parent is given but method is 'strict'; only method 'tree' reads it"),
    ],
)
def test_a_bad_tree_batch_is_an_error_naming_the_field(change: dict[str, object], message: str) -> None:
    """A tree batch without parents, with parents of another length or dtype, a parent after its node
    or in another request, or parents on a chain method: a `ValueError` naming ``tree_parent``."""
    batch = dataclasses.replace(_tree_batch(), **change)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        batch.validate()


def test_make_batch_takes_a_tree_of_each_request_and_of_no_chain() -> None:
    """Method "tree" takes each request's parents, of its draft count (none: a chain, each node the
    child of the one before); a chain method takes none."""
    target = np.zeros((3, 4))
    chain = make_batch([RequestData(target, [1, 2]), RequestData(target[:1], [])], method="tree")
    assert chain.tree_parent is not None and chain.tree_parent.tolist() == [-1, 0]
    with pytest.raises(ValueError, match=r"requests\[0\].tree_parent is \[-1\]; expected \[n\] = \[2\]"):
        make_batch([RequestData(target, [1, 2], tree_parent=[-1])], method="tree")
    with pytest.raises(ValueError, match=r"requests\[0\].tree_parent is given but method is 'strict'"):
        make_batch([RequestData(target, [1, 2], tree_parent=[-1, 0])], method="strict")


def test_a_tree_is_verified_only_by_a_sampler_that_declares_it() -> None:
    """The default capabilities are the chain methods: a tree batch lies outside them."""
    assert "tree" not in Capabilities().methods
    assert Capabilities().admits(_tree_batch()) == "method tree"  # type: ignore[arg-type]
    assert Capabilities(methods=("tree",)).admits(_tree_batch()) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(6))
def test_the_walk_on_a_tree_emits_the_reference_samplers_output(seed: int) -> None:
    """The vectorised walk and the scalar reference sampler agree token for token, node for node and
    logprob for logprob on tree batches (greedy rows, placeholders, repeated siblings, a request
    without drafts), and the walk judges near ties on them without error."""
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(8):
        n = int(rng.integers(0, 9))
        parents = [int(rng.integers(-1, i)) for i in range(n)]
        requests.append(
            RequestData(
                rng.normal(size=(n + 1, 5)) * 2,
                rng.integers(-1, 5, size=n).tolist(),
                None,
                temperature=float(rng.choice([0.0, 0.7, 1.0])),
                seed=int(rng.integers(2**40)),
                tree_parent=parents,
            )
        )
    batch = make_batch(requests, method="tree")
    expected = reference_sample(batch)
    result = walk(batch)
    got = result.output
    assert torch.equal(got.token_ids, expected.token_ids)
    assert torch.equal(got.num_emitted, expected.num_emitted)
    assert got.accepted_nodes is not None and expected.accepted_nodes is not None
    assert torch.equal(got.accepted_nodes, expected.accepted_nodes)
    assert got.logprobs is not None and expected.logprobs is not None
    torch.testing.assert_close(got.logprobs, expected.logprobs, equal_nan=True)
    assert result.num_decisions > 0


def test_a_tree_batch_without_any_draft_emits_one_token() -> None:
    """A tree batch whose requests have no drafts (no column of accepted nodes) emits each request's
    draw at its root, in the walk and the reference sampler alike (the search's first tree batches
    found the walk indexing that missing column)."""
    rng = np.random.default_rng(4)
    batch = make_batch(
        [RequestData(rng.normal(size=(1, 5)), [], None, seed=s, tree_parent=[]) for s in range(3)],
        method="tree",
    )
    for output in (walk(batch).output, reference_sample(batch)):
        assert output.accepted_nodes is not None and tuple(output.accepted_nodes.shape) == (3, 0)
        assert output.num_emitted.tolist() == [1, 1, 1] and (output.token_ids >= 0).all()
    assert torch.equal(walk(batch).output.token_ids, reference_sample(batch).token_ids)
