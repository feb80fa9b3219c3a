"""Block verification as a method: its exact law and its samplers (its planted bugs: fuzz/tests/)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specsample.reference import block
from specsample.reference.contract import RequestData, SpecBatch, make_batch
from specsample.reference.law import exact_law, request_inputs
from specsample.reference.schemes import CANONICAL
from specsample.reference.walk import walk

# ---------------------------------------------------------------------------------------------
# exact_law against an independent float64 computation


def _laws(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Rows of softmax(logits / T) in float64, or one-hot on the first largest logit at T = 0."""
    if temperature == 0.0:
        return np.eye(logits.shape[1])[np.argmax(logits, axis=1)]
    scaled = logits / temperature
    weights = np.exp(scaled - scaled.max(axis=1, keepdims=True))
    return weights / weights.sum(axis=1, keepdims=True)


def independent_law(p: np.ndarray, q: np.ndarray, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(P(m = i), law of y given m = i)`` by the paper's definitions, with plain loops: the 2**n
    outcomes of the independent keep events ``eta_i < h_i`` enumerated, ``m`` their largest index."""
    n, vocab = len(ids), p.shape[1]
    q = np.array([q[i] if ids[i] >= 0 else np.zeros(vocab) for i in range(n)]).reshape(n, vocab)
    w = [1.0]
    for i, d in enumerate(ids):
        if d < 0 or w[i] == 0.0 or p[i, d] == 0.0:
            w.append(0.0)
        elif q[i, d] == 0.0:
            w.append(1.0)
        else:
            w.append(min(1.0, w[i] * p[i, d] / q[i, d]))
    keep = [1.0]
    for i in range(1, n):
        mass = sum(max(w[i] * p[i, x] - q[i, x], 0.0) for x in range(vocab))
        keep.append(1.0 if mass + 1.0 - w[i] == 0.0 else mass / (mass + 1.0 - w[i]))
    keep += [w[n]] if n else []
    stop = np.zeros(n + 1)
    for outcome in itertools.product((False, True), repeat=n):
        chance = np.prod([keep[j + 1] if hit else 1.0 - keep[j + 1] for j, hit in enumerate(outcome)])
        stop[max((j + 1 for j, hit in enumerate(outcome) if hit), default=0)] += chance
    tokens = np.zeros((n + 1, vocab))
    tokens[n] = p[n]
    for i in range(n):
        residual = np.array([max(w[i] * p[i, x] - q[i, x], 0.0) for x in range(vocab)])
        tokens[i] = residual / residual.sum() if residual.sum() > 0.0 else p[i]
    return stop, tokens


@st.composite
def small_requests(draw: st.DrawFn) -> tuple[list[RequestData], list[tuple[np.ndarray, np.ndarray]]]:
    """One to three requests over at most 5 tokens and 4 drafts: flat or one-hot drafts, greedy rows,
    placeholders, ``-inf`` masks; with each request's float64 laws computed here from its float32 inputs."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    vocab = draw(st.integers(1, 5))
    one_hot = draw(st.booleans())
    requests, laws = [], []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(0, 4))
        temperature = float(np.float32(draw(st.sampled_from([0.0, 0.5, 1.0, 2.0]))))
        target = rng.normal(size=(n + 1, vocab)).astype(np.float32) * np.float32(2.0)
        draft = rng.normal(size=(n, vocab)).astype(np.float32) * np.float32(2.0)
        if draw(st.booleans()) and vocab > 1:
            target[rng.random(target.shape) < 0.3] = -np.inf
            target[:, 0] = np.where(np.isneginf(target).all(axis=1), 0.0, target[:, 0])
        ids = [int(x) for x in rng.integers(-1, vocab, size=n)]
        requests.append(RequestData(target, ids, None if one_hot else draft, temperature, seed=len(requests)))
        p = _laws(target.astype(np.float64), temperature)
        one_hot_q = np.eye(vocab)[np.maximum(np.asarray(ids, dtype=np.int64), 0)]
        q = one_hot_q if one_hot else _laws(draft.astype(np.float64), temperature)
        laws.append(independent_law(p, q.reshape(n, vocab), ids))
    return requests, laws


@given(small_requests())
def test_exact_law_agrees_with_an_independent_computation(
    case: tuple[list[RequestData], list[tuple[np.ndarray, np.ndarray]]],
) -> None:
    """`exact_law` of a block batch gives the law of m and of y given m of the paper's definitions,
    computed independently from the logits (temperature, greedy rows, one-hot drafts, placeholders,
    ragged counts, empty residuals), to 1e-9; accept_probs are P(m > i | m >= i)."""
    requests, laws = case
    for law, (stop, tokens) in zip(exact_law(make_batch(requests, method="block")), laws, strict=True):
        np.testing.assert_allclose(law.stop_probs, stop, rtol=0, atol=1e-9)
        np.testing.assert_allclose(law.token_probs, tokens, rtol=0, atol=1e-9)
        tail = np.cumsum(stop[::-1])[::-1]
        for i, a in enumerate(law.accept_probs):
            if tail[i] > 1e-9:
                assert a == pytest.approx(tail[i + 1] / tail[i], abs=1e-9)


def test_one_draft_block_law_is_the_probabilistic_law() -> None:
    """With one draft per request, block verification's exact law is probabilistic verification's."""
    rng = np.random.default_rng(3)
    requests = [
        RequestData(rng.normal(size=(2, 7)) * 2, [int(rng.integers(0, 7))], rng.normal(size=(1, 7)) * 2, t)
        for t in (1.0, 0.6, 0.0)
    ]
    for joint, token in zip(
        exact_law(make_batch(requests, method="block")),
        exact_law(make_batch(requests, method="probabilistic")),
        strict=True,
    ):
        np.testing.assert_allclose(joint.stop_probs, token.stop_probs, rtol=0, atol=1e-12)
        np.testing.assert_allclose(joint.token_probs, token.token_probs, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# The samplers


def test_a_keep_decision_within_float32_rounding_is_a_near_tie() -> None:
    """When ``h_1`` lies within 1e-6 of ``eta_1`` (on either side) the walk marks the request's emitted
    positions near; with ``h_1`` 0.05 away from ``eta_1`` it marks none."""
    rng = np.random.default_rng(8)
    # The last draft is a placeholder (h_2 = 0), so m is 1 or 0 as index 1 is kept or not.
    target, draft, ids = rng.normal(size=(3, 6)), rng.normal(size=(2, 6)), [2, -1]
    seed, step = 77, 3  # eta_1 = 0.45
    eta = float(CANONICAL.accept_uniforms(np.array([seed]), np.array([step]), np.array([0]))[0])

    def batch(shift: float) -> SpecBatch:
        logits = draft.copy()
        logits[0, ids[0]] += shift  # a larger q(d_0) lowers w_1, and h_1 with it
        return make_batch([RequestData(target, ids, logits, seed=seed, step=step)], method="block")

    def keep(shift: float) -> float:
        inputs = request_inputs(batch(shift))[0]
        return float(block.block_law(inputs.target_probs(), inputs.draft_probs(), ids).keep[1])

    def solve(value: float) -> tuple[float, float]:
        """Shifts on either side of ``keep(shift) = value`` (keep decreases with the shift)."""
        low, high = -20.0, 20.0
        assert keep(low) > value > keep(high)
        for _ in range(100):
            middle = (low + high) / 2
            low, high = (middle, high) if keep(middle) > value else (low, middle)
        return low, high

    for shift in solve(eta):
        assert abs(keep(shift) - eta) < 1e-6  # as close as float32 logits allow
        assert walk(batch(shift)).near.any()
    for gap in (-0.05, 0.05):
        shift = solve(eta + gap)[0]
        assert not walk(batch(shift)).near.any(), (gap, keep(shift) - eta)
