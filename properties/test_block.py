"""Block verification's specification (`reference.block`), proved by enumeration on tiny vocabularies.

A tiny autoregressive "model" is a table from every prefix to a law over ``V`` tokens, one for the
target and one for the draft. Enumerating every draft sequence gives the exact law of what block
verification emits; continuing that output with the target to ``n + 1`` tokens must give exactly
the target's law of ``n + 1`` tokens (lossless).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

from specsample.reference.block import BlockLaw, block_law, kept_drafts

Model = dict[tuple[int, ...], np.ndarray]


def _model(rng: np.random.Generator, vocab: int, depth: int, sharpness: float = 3.0) -> Model:
    """A law for every prefix of length at most ``depth``: random and peaked, some entries near 0."""
    model = {}
    for length in range(depth + 1):
        for prefix in itertools.product(range(vocab), repeat=length):
            weights = rng.random(vocab) ** sharpness
            model[prefix] = weights / weights.sum()
    return model


def _rows(target: Model, draft: Model, drafts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    n = len(drafts)
    return (
        np.stack([target[drafts[:i]] for i in range(n + 1)]),
        np.stack([draft[drafts[:i]] for i in range(n)]),
    )


def token_law(target: np.ndarray, draft: np.ndarray, ids: tuple[int, ...]) -> BlockLaw:
    """Token-wise (probabilistic) verification's law, written here independently, for comparison."""
    n = len(ids)
    stop, reach = np.zeros(n + 1), 1.0
    tokens = np.zeros((n + 1, target.shape[1]))
    for i, d in enumerate(ids):
        accept = min(1.0, target[i, d] / draft[i, d]) if draft[i, d] > 0 else float(target[i, d] > 0)
        stop[i] = reach * (1 - accept)
        residual = np.maximum(target[i] - draft[i], 0.0)
        tokens[i] = residual / residual.sum() if residual.sum() > 0 else target[i]
        reach *= accept
    stop[n], tokens[n] = reach, target[n]
    return BlockLaw(np.ones(n + 1), np.ones(n + 1), stop, tokens)


Verifier = Callable[[np.ndarray, np.ndarray, tuple[int, ...]], BlockLaw]


def _emitted_law(target: Model, draft: Model, n: int, vocab: int, verify: Verifier) -> tuple[dict, float]:
    """The law of the n + 1 tokens emitted and then continued by the target; E[drafts kept]."""
    law: dict[tuple[int, ...], float] = {}
    expected = 0.0
    for drafts in itertools.product(range(vocab), repeat=n):
        q = float(np.prod([draft[drafts[:i]][drafts[i]] for i in range(n)]))
        result = verify(*_rows(target, draft, drafts), drafts)
        expected += q * result.expected_accepted
        for kept in range(n + 1):
            for y in range(vocab):
                weight = q * result.stop_probs[kept] * result.token_probs[kept, y]
                emitted = (*drafts[:kept], y)
                for rest in itertools.product(range(vocab), repeat=n - kept):
                    full = emitted + rest
                    tail = np.prod([target[full[:k]][full[k]] for k in range(len(emitted), n + 1)])
                    law[full] = law.get(full, 0.0) + weight * float(tail)
    return law, expected


@pytest.mark.parametrize(("vocab", "n", "seed"), [(2, 2, 0), (3, 3, 1), (3, 2, 2), (4, 2, 3), (2, 4, 4)])
def test_block_verification_is_lossless_and_keeps_at_least_as_many(vocab: int, n: int, seed: int) -> None:
    """Emitted-then-continued tokens follow the target's law exactly (to 1e-12), and E[m] is at least
    token-wise verification's on the same models."""
    rng = np.random.default_rng(seed)
    target, draft = _model(rng, vocab, n), _model(rng, vocab, n)
    exact = {
        z: float(np.prod([target[z[:k]][z[k]] for k in range(n + 1)]))
        for z in itertools.product(range(vocab), repeat=n + 1)
    }
    law, block_mean = _emitted_law(target, draft, n, vocab, block_law)
    assert max(abs(law[z] - exact[z]) for z in exact) < 1e-12
    token, token_mean = _emitted_law(target, draft, n, vocab, token_law)
    assert max(abs(token[z] - exact[z]) for z in exact) < 1e-12  # the comparison is itself right
    assert block_mean >= token_mean - 1e-12


def test_one_draft_is_token_verification() -> None:
    """With n = 1 block verification is probabilistic verification: the same law of (m, y)."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        target, draft = _model(rng, 5, 1), _model(rng, 5, 1)
        for d in range(5):
            rows = _rows(target, draft, (d,))
            block, token = block_law(*rows, (d,)), token_law(*rows, (d,))
            np.testing.assert_allclose(block.stop_probs, token.stop_probs, atol=1e-12)
            np.testing.assert_allclose(block.token_probs, token.token_probs, atol=1e-12)


def test_the_papers_example_accepts_eleven_ninths() -> None:
    """Context-free laws on {a, b}, target (1/3, 2/3), draft (2/3, 1/3), two drafts: block verification
    keeps 11/9 drafts on average, token verification 10/9 (the paper's motivating example)."""
    target = {p: np.array([1 / 3, 2 / 3]) for n in range(3) for p in itertools.product(range(2), repeat=n)}
    draft = {p: np.array([2 / 3, 1 / 3]) for n in range(3) for p in itertools.product(range(2), repeat=n)}
    _, block_mean = _emitted_law(target, draft, 2, 2, block_law)
    _, token_mean = _emitted_law(target, draft, 2, 2, token_law)
    assert block_mean == pytest.approx(11 / 9, abs=1e-12)
    assert token_mean == pytest.approx(10 / 9, abs=1e-12)


def test_the_law_of_m_agrees_with_enumerating_the_decisions() -> None:
    """P(m = i) from the closed form equals the sum over all 2**n outcomes of the independent events
    eta_j < h_j of the probability of those whose largest true index is i (to 1e-12); `kept_drafts`
    picks that index."""
    rng = np.random.default_rng(6)
    for n in (1, 2, 3, 5):
        target, draft = _model(rng, 4, n), _model(rng, 4, n)
        drafts = tuple(int(x) for x in rng.integers(0, 4, n))
        law = block_law(*_rows(target, draft, drafts), drafts)
        keep = law.keep
        enumerated = np.zeros(n + 1)
        for outcome in itertools.product((False, True), repeat=n):
            p = np.prod([keep[j + 1] if hit else 1 - keep[j + 1] for j, hit in enumerate(outcome)])
            top = max((j + 1 for j, hit in enumerate(outcome) if hit), default=0)
            enumerated[top] += p
            uniforms = np.array([0.0 if hit else 1.0 - 1e-12 for hit in outcome])
            if all(0 < keep[j + 1] < 1 for j in range(n)):
                assert kept_drafts(keep, uniforms) == top
        np.testing.assert_allclose(law.stop_probs, enumerated, atol=1e-12)
        assert law.stop_probs.sum() == pytest.approx(1.0, abs=1e-12)


def test_odd_drafts_greedy_rows_and_equal_laws() -> None:
    """A draft of target probability 0 (or a placeholder) is never kept, nor anything after it; a
    draft the draft law never proposes but the target allows gets weight 1; q = p keeps every draft;
    a one-hot (greedy) target keeps exactly the argmax chain and emits its next token."""
    rng = np.random.default_rng(7)
    target, draft = _model(rng, 4, 3), _model(rng, 4, 3)
    p, q = _rows(target, draft, (1, 2, 3))
    impossible = p.copy()
    impossible[1, 2] = 0.0
    law = block_law(impossible, q, (1, 2, 3))
    assert law.weights[2] == 0.0 and law.stop_probs[2:].sum() == 0.0
    assert block_law(p, q, (1, -1, 3)).stop_probs[2:].sum() == 0.0
    unproposed = q[:1].copy()
    unproposed[0, 1] = 0.0
    law = block_law(p[:2], unproposed, (1,))
    assert law.weights[1] == 1.0 and law.stop_probs[1] == 1.0
    assert block_law(p, p[:3], (0, 1, 3)).stop_probs[3] == pytest.approx(1.0, abs=1e-12)
    chain = np.array([2, 0, 3, 1])
    greedy = np.eye(4)[chain]  # p one-hot on the argmax chain
    for ids, kept in (((2, 0, 3), 3), ((2, 0, 1), 2), ((1, 0, 3), 0)):
        law = block_law(greedy, q, ids)
        assert law.stop_probs[kept] == pytest.approx(1.0, abs=1e-12), (ids, law.stop_probs)
        assert law.token_probs[kept, chain[kept]] == pytest.approx(1.0, abs=1e-12)
