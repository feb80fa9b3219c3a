"""`reference.law.exact_law`: proper laws, the speculative-sampling theorem, docs/design.md's edge cases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specsample.reference.contract import RequestData, make_batch
from specsample.reference.law import RequestInputs, exact_law, request_law, row_probs

METHODS = ("probabilistic", "strict", "synthetic", "block")


def _logits(rng: np.random.Generator, shape: tuple[int, ...], family: str) -> np.ndarray:
    """Logits of a named family: normal, peaked, masked (-inf entries), tied."""
    if family == "normal":
        return rng.normal(size=shape)
    if family == "peaked":
        return rng.normal(size=shape) * 6.0
    if family == "masked":
        logits = rng.normal(size=shape)
        logits[rng.random(size=shape) < 0.4] = -np.inf
        logits[..., 0] = np.where(np.isneginf(logits).all(axis=-1), 0.0, logits[..., 0])
        return logits
    return np.round(rng.normal(size=shape))  # tied


@st.composite
def request_batches(draw: st.DrawFn) -> tuple[str, list[RequestData], bool]:
    """Small batches over every method (trees of random shape), family, temperature (greedy included)
    and placeholder."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    method = draw(st.sampled_from(METHODS))
    vocab_size = draw(st.integers(1, 9))
    one_hot = draw(st.booleans())
    requests = []
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(0, 4))
        family = draw(st.sampled_from(["normal", "peaked", "masked", "tied"]))
        ids = rng.integers(-1, vocab_size, size=n)
        parents = [int(rng.integers(-1, i)) for i in range(n)] if method == "tree" else None
        requests.append(
            RequestData(
                target_logits=_logits(rng, (n + 1, vocab_size), family),
                draft_token_ids=ids,
                draft_logits=None if one_hot else _logits(rng, (n, vocab_size), family),
                temperature=draw(st.sampled_from([0.0, 1e-3, 0.7, 1.0, 25.0])),
                tree_parent=parents,
            )
        )
    return method, requests, one_hot


@given(request_batches())
def test_laws_are_proper(case: tuple[str, list[RequestData], bool]) -> None:
    """Every law is non-negative and sums to 1 within 1e-12; acceptance probabilities lie in [0, 1]."""
    method, requests, _ = case
    rates = np.linspace(0.9, 0.5, 4)
    batch = make_batch(requests, method=method, synthetic_rates=rates)  # type: ignore[arg-type]
    for law in exact_law(batch):
        assert np.all(law.accept_probs >= 0) and np.all(law.accept_probs <= 1)
        assert np.all(law.stop_probs >= 0) and abs(law.stop_probs.sum() - 1.0) < 1e-12
        assert np.all(law.token_probs >= 0)
        np.testing.assert_allclose(law.token_probs.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        np.testing.assert_allclose(law.target_probs.sum(axis=1), 1.0, rtol=0, atol=1e-12)


def _position_marginals(
    method: str,
    target: np.ndarray,
    draft: np.ndarray | None,
    temperature: float,
    draft_sequences: list[tuple[int, ...]],
    weights: list[float],
) -> np.ndarray:
    """The law of the token emitted at each position k, given the output reaches position k."""
    n = target.shape[0] - 1
    vocab_size = target.shape[1]
    reach_and_token = np.zeros((n + 1, vocab_size))
    reach = np.zeros(n + 1)
    for drafts, weight in zip(draft_sequences, weights, strict=True):
        inputs = RequestInputs(target, draft, np.array(drafts, dtype=np.int64), temperature, 0, 0, None)
        law = request_law(method, inputs)
        tail = np.cumsum(law.stop_probs[::-1])[::-1]  # P(m >= k)
        for k in range(n + 1):
            reach[k] += weight * tail[k]
            reach_and_token[k] += weight * law.stop_probs[k] * law.token_probs[k]
            if k < n:
                reach_and_token[k, drafts[k]] += weight * tail[k + 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        return reach_and_token / reach[:, None]  # NaN rows: positions never reached


def _theorem_inputs(
    rng: np.random.Generator, vocab_size: int, num_drafts: int, family: str, temperature: float
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, ...]], list[float]]:
    """Target and draft logits of ``family``, every draft sequence and its probability under q."""
    target = _logits(
        rng, (num_drafts + 1, vocab_size), "normal" if family in ("equal", "disjoint") else family
    )
    draft = _logits(
        rng, (num_drafts, vocab_size), family if family not in ("equal", "disjoint") else "normal"
    )
    if family == "equal":
        draft = target[:num_drafts].copy()
    if family == "disjoint" and vocab_size > 1:
        half = vocab_size // 2
        target[:, :half] = -np.inf
        draft[:, half:] = -np.inf
    q = np.array([row_probs(row, temperature) for row in draft]).reshape(num_drafts, vocab_size)
    sequences = list(itertools.product(range(vocab_size), repeat=num_drafts))
    weights = [float(np.prod([q[i, d] for i, d in enumerate(seq)])) for seq in sequences]
    return target, draft, sequences, weights


@pytest.mark.parametrize("method", ["probabilistic", "strict"])
@pytest.mark.parametrize("vocab_size", [1, 2, 3, 6])
@pytest.mark.parametrize("num_drafts", [0, 1, 2, 3])
@pytest.mark.parametrize("family", ["normal", "peaked", "masked", "tied", "equal", "disjoint"])
@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_speculative_sampling_theorem(
    method: str, vocab_size: int, num_drafts: int, family: str, temperature: float
) -> None:
    """Averaged over drafts drawn from q, every emitted position is distributed exactly as p."""
    rng = np.random.default_rng([vocab_size, num_drafts, len(family), int(temperature * 10)])
    target, draft, sequences, weights = _theorem_inputs(rng, vocab_size, num_drafts, family, temperature)
    marginals = _position_marginals(method, target, draft, temperature, sequences, weights)
    expected = np.array([row_probs(row, temperature) for row in target])
    reached = ~np.isnan(marginals).any(axis=1)
    assert reached[0]
    np.testing.assert_allclose(marginals[reached], expected[reached], rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", ["probabilistic", "strict"])
def test_theorem_for_one_hot_and_greedy_drafts(method: str) -> None:
    """With one-hot drafts (any fixed sequence) or greedy rows, every position is still distributed as p."""
    rng = np.random.default_rng(7)
    vocab_size, n = 5, 3
    target = rng.normal(size=(n + 1, vocab_size))
    for temperature in (0.0, 1.0):
        expected = np.array([row_probs(row, temperature) for row in target])
        for drafts in itertools.product(range(-1, vocab_size), repeat=n):
            marginals = _position_marginals(method, target, None, temperature, [drafts], [1.0])
            reached = ~np.isnan(marginals).any(axis=1)
            np.testing.assert_allclose(marginals[reached], expected[reached], rtol=0, atol=1e-12)


def _continued_marginals(
    target: np.ndarray, draft: np.ndarray | None, temperature: float, sequences: list, weights: list[float]
) -> np.ndarray:
    """Block verification's output continued by the target: the law of token k given that the tokens
    before it equal the drafts before it, averaged over the draft sequences (NaN where never so)."""
    n, vocab_size = target.shape[0] - 1, target.shape[1]
    p = np.array([row_probs(row, temperature) for row in target])
    joint, given = np.zeros((n + 1, vocab_size)), np.zeros(n + 1)
    for drafts, weight in zip(sequences, weights, strict=True):
        inputs = RequestInputs(target, draft, np.array(drafts, dtype=np.int64), temperature, 0, 0, None)
        law = request_law("block", inputs)
        for m, y in itertools.product(range(n + 1), range(vocab_size)):
            chance = weight * law.stop_probs[m] * law.token_probs[m, y]
            for rest in itertools.product(range(vocab_size), repeat=n - m):
                sequence = (*drafts[:m], y, *rest)
                tail = chance * np.prod([p[m + 1 + j, t] for j, t in enumerate(rest)])
                for k in range(n + 1):
                    if sequence[:k] == tuple(drafts[:k]):
                        joint[k, sequence[k]] += tail
                        given[k] += tail
    with np.errstate(invalid="ignore", divide="ignore"):
        return joint / given[:, None]


@pytest.mark.parametrize("vocab_size", [1, 2, 3])
@pytest.mark.parametrize("num_drafts", [0, 1, 2, 3])
@pytest.mark.parametrize("family", ["normal", "peaked", "masked", "equal", "disjoint"])
@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_block_output_continued_by_the_target_follows_it(
    vocab_size: int, num_drafts: int, family: str, temperature: float
) -> None:
    """Block verification, drafts drawn from q: given that the output continued by the target starts
    with the drafts d_0 .. d_{k-1}, its token k is distributed exactly as p_k (the marginal check's
    statement for methods that verify jointly), to 1e-12."""
    rng = np.random.default_rng([vocab_size, num_drafts, len(family), int(temperature * 10), 16])
    target, draft, sequences, weights = _theorem_inputs(rng, vocab_size, num_drafts, family, temperature)
    marginals = _continued_marginals(target, draft, temperature, sequences, weights)
    expected = np.array([row_probs(row, temperature) for row in target])
    assert not np.isnan(marginals[0]).any()
    reached = ~np.isnan(marginals).any(axis=1)
    np.testing.assert_allclose(marginals[reached], expected[reached], rtol=0, atol=1e-12)


def test_block_output_continued_by_the_target_with_fixed_drafts() -> None:
    """With one-hot drafts (any fixed sequence, placeholders included) or greedy rows, the block
    output continued by the target still follows p position by position."""
    rng = np.random.default_rng(9)
    vocab_size, n = 3, 3
    target = rng.normal(size=(n + 1, vocab_size))
    for temperature in (0.0, 1.0):
        expected = np.array([row_probs(row, temperature) for row in target])
        for drafts in itertools.product(range(-1, vocab_size), repeat=n):
            marginals = _continued_marginals(target, None, temperature, [drafts], [1.0])
            reached = ~np.isnan(marginals).any(axis=1)
            np.testing.assert_allclose(marginals[reached], expected[reached], rtol=0, atol=1e-12)


def test_synthetic_law_of_m_follows_rates() -> None:
    """Synthetic sampling stops at m = j with probability c_0 ... c_{j-1} (1 - c_j); a placeholder stops."""
    rng = np.random.default_rng(3)
    rates = np.array([0.9, 0.6, 0.3])
    inputs = RequestInputs(
        rng.normal(size=(4, 5)), rng.normal(size=(3, 5)), np.array([1, 4, 2]), 1.0, 0, 0, rates
    )
    law = request_law("synthetic", inputs)
    np.testing.assert_allclose(law.stop_probs, [0.1, 0.9 * 0.4, 0.9 * 0.6 * 0.7, 0.9 * 0.6 * 0.3], atol=1e-15)
    np.testing.assert_allclose(law.token_probs, law.target_probs, atol=1e-15)
    stopped = RequestInputs(inputs.target_logits, None, np.array([1, -1, 2]), 0.0, 0, 0, rates)
    np.testing.assert_allclose(request_law("synthetic", stopped).stop_probs, [0.1, 0.9, 0.0, 0.0], atol=1e-15)


def test_greedy_ties_go_to_the_lowest_index() -> None:
    """A greedy row is one-hot on the first of its tied maxima, NaN read as -inf."""
    np.testing.assert_array_equal(row_probs(np.array([1.0, 3.0, 3.0, np.nan]), 0.0), [0, 1, 0, 0])
    np.testing.assert_array_equal(row_probs(np.array([np.nan, -np.inf, np.nan]), 0.0), [1, 0, 0])
    target = np.array([[0.0, 2.0, 2.0], [5.0, 5.0, 1.0]])
    law = request_law("probabilistic", RequestInputs(target, None, np.array([2]), 0.0, 0, 0, None))
    np.testing.assert_array_equal(law.accept_probs, [0.0])
    np.testing.assert_array_equal(law.token_probs[0], [0, 1, 0])
    law = request_law("probabilistic", RequestInputs(target, None, np.array([1]), 0.0, 0, 0, None))
    np.testing.assert_array_equal(law.stop_probs, [0.0, 1.0])
    np.testing.assert_array_equal(law.token_probs[1], [1, 0, 0])


def test_odd_rows() -> None:
    """NaN counts as -inf; +inf entries share the mass; a row without a finite logit is uniform."""
    np.testing.assert_allclose(row_probs(np.array([0.0, np.nan, 0.0]), 1.0), [0.5, 0.0, 0.5])
    np.testing.assert_allclose(row_probs(np.array([np.inf, 1.0, np.inf]), 1.0), [0.5, 0.0, 0.5])
    np.testing.assert_allclose(row_probs(np.array([-np.inf, np.nan]), 1.0), [0.5, 0.5])
    np.testing.assert_allclose(row_probs(np.array([0.0, -1e4]), 1e-3), [1.0, 0.0])


@pytest.mark.parametrize("method", ["probabilistic", "strict"])
def test_placeholder_rejects_and_samples_the_target(method: str) -> None:
    """A placeholder is rejected with certainty and y ~ p_j."""
    rng = np.random.default_rng(11)
    target, draft = rng.normal(size=(3, 4)), rng.normal(size=(2, 4))
    law = request_law(method, RequestInputs(target, draft, np.array([2, -1]), 1.0, 0, 0, None))
    assert law.accept_probs[1] == 0.0
    np.testing.assert_allclose(law.token_probs[1], row_probs(target[1], 1.0), atol=1e-15)
    assert law.stop_probs[2] == 0.0


def test_one_hot_drafts() -> None:
    """One-hot drafts give a = p(d) and the residual p without d."""
    target = np.log(np.array([[0.2, 0.5, 0.3], [0.3, 0.3, 0.4]]))
    law = request_law("probabilistic", RequestInputs(target, None, np.array([1]), 1.0, 0, 0, None))
    np.testing.assert_allclose(law.accept_probs, [0.5], atol=1e-15)
    np.testing.assert_allclose(law.token_probs[0], [0.4, 0.0, 0.6], atol=1e-15)


def test_empty_residual_falls_back_to_the_target() -> None:
    """When p == q the residual has no mass and y ~ p; acceptance is certain anyway."""
    target = np.log(np.array([[0.2, 0.5, 0.3], [0.3, 0.3, 0.4]]))
    law = request_law("probabilistic", RequestInputs(target, target[:1], np.array([0]), 1.0, 0, 0, None))
    np.testing.assert_allclose(law.accept_probs, [1.0], atol=1e-15)
    np.testing.assert_allclose(law.token_probs[0], [0.2, 0.5, 0.3], atol=1e-15)


def test_zero_target_is_never_accepted_even_where_q_is_zero() -> None:
    """p(d) = 0 rejects at every u (strict >), and q(d) = 0 < p(d) accepts with certainty."""
    target = np.array([[-np.inf, 0.0, 0.0], [0.0, 0.0, 0.0]])
    draft = np.array([[0.0, -np.inf, 0.0]])
    rejected = request_law("probabilistic", RequestInputs(target, draft, np.array([0]), 1.0, 0, 0, None))
    assert rejected.accept_probs[0] == 0.0
    accepted = request_law("probabilistic", RequestInputs(target, draft, np.array([1]), 1.0, 0, 0, None))
    assert accepted.accept_probs[0] == 1.0


def test_flat_and_slotted_drafts_give_the_same_law() -> None:
    """Reading drafts through a permuted draft_slot gives the law of the flat layout."""
    rng = np.random.default_rng(5)
    requests = [
        RequestData(rng.normal(size=(n + 1, 7)), rng.integers(-1, 7, size=n), rng.normal(size=(n, 7)))
        for n in (2, 0, 4, 1)
    ]
    flat = exact_law(make_batch(requests))
    slotted = exact_law(make_batch(requests, slots=[5, 0, 2, 3], num_slots=6, slot_capacity=4))
    for a, b in zip(flat, slotted, strict=True):
        np.testing.assert_array_equal(a.stop_probs, b.stop_probs)
        np.testing.assert_array_equal(a.token_probs, b.token_probs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_are_upcast_after_rounding(dtype: torch.dtype) -> None:
    """fp16 and bf16 logits give the law of their own rounded values, exactly."""
    rng = np.random.default_rng(9)
    request = RequestData(rng.normal(size=(3, 6)), [1, 4], rng.normal(size=(2, 6)), temperature=0.8)
    law = exact_law(make_batch([request], dtype=dtype))[0]
    rounded = torch.as_tensor(request.target_logits).to(dtype).double().numpy()
    draft_rounded = torch.as_tensor(request.draft_logits).to(dtype).double().numpy()
    temperature = float(np.float32(0.8))
    expected = request_law(
        "probabilistic", RequestInputs(rounded, draft_rounded, np.array([1, 4]), temperature, 0, 0, None)
    )
    np.testing.assert_array_equal(law.token_probs, expected.token_probs)
    np.testing.assert_array_equal(law.stop_probs, expected.stop_probs)


def test_no_drafts() -> None:
    """A request with n = 0 emits the bonus token with certainty: y ~ p_0."""
    target = np.array([[0.0, 1.0, 2.0]])
    law = exact_law(make_batch([RequestData(target, [])]))[0]
    np.testing.assert_array_equal(law.stop_probs, [1.0])
    np.testing.assert_allclose(law.token_probs[0], row_probs(target[0], 1.0), atol=1e-15)
