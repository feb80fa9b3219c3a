"""`reference.tree`, the specification of tree verification: the parent array checked, the exact law
of the emitted sequence enumerated, and the reference sampler on a chain equal to strict's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specsample.reference import tree
from specsample.reference.contract import RequestData, make_batch
from specsample.reference.law import greedy_token, request_inputs, request_law
from specsample.reference.sampler import reference_sample, scheme_noise


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
        ([-1, *range(tree.MAX_DEPTH)], f"node {tree.MAX_DEPTH} at depth {tree.MAX_DEPTH + 1}"),
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
    batch, parents, tokens = _chain_batch(seed)
    inputs = request_inputs(batch)[0]
    greedy = greedy_token(inputs.target_logits) if inputs.greedy else None
    accepted, sequence = tree.sample_request(
        inputs.target_probs().reshape(tokens.size + 1, -1), parents, tokens, scheme_noise(batch)[0], greedy
    )
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
