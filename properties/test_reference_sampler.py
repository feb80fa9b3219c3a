"""`reference.sampler.reference_sample` draws from `exact_law` from the canonical streams."""

from __future__ import annotations

import numpy as np
import pytest

from specsample.properties.stats import goodness_of_fit
from specsample.reference.contract import RequestData, make_batch, split_output
from specsample.reference.law import exact_law
from specsample.reference.sampler import RequestNoise, reference_sample, scheme_noise

NUM_SAMPLES = 4000
# alpha per assertion; at N = 4000 over <= 24 pooled cells the G-test detects TV >= 0.082 with power 0.999.
ALPHA = 1e-6

CASES = {
    "probabilistic": dict(method="probabilistic", one_hot=False, temperature=1.0, ids=[1, 3, 0]),
    "probabilistic one-hot": dict(method="probabilistic", one_hot=True, temperature=1.0, ids=[2, 2, 4]),
    "probabilistic cold with placeholder": dict(
        method="probabilistic", one_hot=False, temperature=0.5, ids=[0, -1, 1]
    ),
    "strict": dict(method="strict", one_hot=False, temperature=1.0, ids=[4, 1, 1]),
    "synthetic": dict(method="synthetic", one_hot=False, temperature=1.0, ids=[1, 2, 3]),
    "greedy": dict(method="probabilistic", one_hot=False, temperature=0.0, ids=[1, 2, 3]),
    "block": dict(method="block", one_hot=False, temperature=1.0, ids=[1, 3, 0]),
    "block one-hot": dict(method="block", one_hot=True, temperature=1.0, ids=[2, 2, 4]),
    "block cold with placeholder": dict(method="block", one_hot=False, temperature=0.5, ids=[0, -1, 1]),
    "block greedy": dict(method="block", one_hot=False, temperature=0.0, ids=[1, 2, 3]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_samples_follow_the_exact_law(case: str) -> None:
    """Over independent seeds, the joint law of (m, y) matches exact_law (G-test, alpha 1e-6)."""
    spec = CASES[case]
    rng = np.random.default_rng(list(CASES).index(case))
    vocab_size, n = 5, 3
    target = rng.normal(size=(n + 1, vocab_size)) * 1.5
    target[2, 4] = -np.inf
    draft = None if spec["one_hot"] else rng.normal(size=(n, vocab_size)) * 1.5
    requests = [
        RequestData(target, spec["ids"], draft, spec["temperature"], seed=s, step=s % 7)
        for s in range(NUM_SAMPLES)
    ]
    batch = make_batch(requests, method=spec["method"], synthetic_rates=[0.8, 0.6, 0.5])
    law = exact_law(make_batch(requests[:1], method=spec["method"], synthetic_rates=[0.8, 0.6, 0.5]))[0]
    counts = np.zeros((n + 1, vocab_size))
    for request in split_output(reference_sample(batch)):
        counts[request.num_accepted, request.token_ids[-1]] += 1
        assert request.token_ids[:-1] == spec["ids"][: request.num_accepted]
    result = goodness_of_fit(counts, law.joint_probs(), alpha=ALPHA)
    assert not result.reject, result.reason
    assert result.detectable_tv < 0.1


def test_same_seed_and_step_give_the_same_output() -> None:
    """A request's output depends on its seed and step, not on its neighbours; a new step changes it."""
    rng = np.random.default_rng(2)
    target, draft = rng.normal(size=(5, 50)), rng.normal(size=(4, 50))
    mine = RequestData(target, [1, 2, 3, 4], draft, seed=2**40 + 3, step=9)
    other = RequestData(rng.normal(size=(5, 50)), [0, 0, 0, 0], rng.normal(size=(4, 50)), seed=1)
    alone = split_output(reference_sample(make_batch([mine])))[0]
    crowded = split_output(reference_sample(make_batch([other, mine, other])))[1]
    assert alone == crowded
    outputs = {
        tuple(
            split_output(
                reference_sample(
                    make_batch([RequestData(target, [1, 2, 3, 4], draft, seed=2**40 + 3, step=step)])
                )
            )[0].token_ids
        )
        for step in range(20)
    }
    assert len(outputs) > 1


def test_zero_uniform_never_accepts_a_zero_probability_draft() -> None:
    """At u = 0 the strict `>` still rejects a draft of target probability 0 (M01)."""
    target = np.array([[-np.inf, 0.0, 0.0], [0.0, 0.0, 0.0]])
    batch = make_batch([RequestData(target, [0], np.zeros((1, 3)))])
    noise = [RequestNoise(np.zeros(1), scheme_noise(batch)[0].rows)]
    request = split_output(reference_sample(batch, noise))[0]
    assert request.num_accepted == 0
    assert request.token_ids[0] in (1, 2)


def test_logprobs_are_target_log_probabilities() -> None:
    """logprobs hold log softmax(target / T) of each emitted token, NaN after them."""
    rng = np.random.default_rng(4)
    target = rng.normal(size=(3, 6))
    output = reference_sample(make_batch([RequestData(target, [1, 2], rng.normal(size=(2, 6)), 0.5, seed=3)]))
    assert output.logprobs is not None
    request = split_output(output)[0]
    assert request.logprobs is not None
    for i, (token, logprob) in enumerate(zip(request.token_ids, request.logprobs, strict=True)):
        scaled = target[i] / np.float32(0.5)
        expected = scaled[token] - np.log(np.exp(scaled - scaled.max()).sum()) - scaled.max()
        assert logprob == pytest.approx(expected, abs=1e-5)
    assert np.isnan(output.logprobs[0, len(request.token_ids) :].numpy()).all()
