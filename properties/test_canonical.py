"""`properties.canonical`: the vectorised reference equals `reference_sample` and flags near ties."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given

from properties import strategies
from properties.canonical import VectorisedSampler, canonical_sample
from reference import philox
from reference.contract import RequestData, SpecBatch, make_batch
from reference.sampler import SAMPLE_PURPOSE, reference_sample, stream_offsets


@given(batch=strategies.spec_batches(max_vocab=300, max_requests=4, max_drafts=4))
def test_vectorised_sampler_equals_reference_sample(batch: SpecBatch) -> None:
    """Tokens, counts and logprobs equal reference_sample's bit for bit, on every family and shape."""
    expected = reference_sample(batch)
    got = canonical_sample(batch, max_elements=256)  # small chunks: the chunking is exercised too
    assert torch.equal(got.output.token_ids, expected.token_ids)
    assert torch.equal(got.output.num_emitted, expected.num_emitted)
    assert expected.logprobs is not None and got.output.logprobs is not None
    np.testing.assert_array_equal(got.output.logprobs.numpy(), expected.logprobs.numpy())
    emitted = expected.num_emitted.numpy()
    assert not (got.near & (np.arange(got.near.shape[1])[None, :] >= emitted[:, None])).any()


def test_near_ties_are_rare_on_ordinary_batches() -> None:
    """On 600 ordinary requests of each method, at most 1% of decisions are near ties."""
    rng = np.random.default_rng(5)
    vocab_size, n = 33, 3
    for method in ("probabilistic", "strict", "synthetic"):
        requests = [
            RequestData(
                rng.normal(size=(n + 1, vocab_size)) * 2,
                rng.integers(0, vocab_size, n),
                rng.normal(size=(n, vocab_size)) * 2,
                temperature=float(rng.choice([0.0, 0.7, 1.0])),
                seed=int(rng.integers(0, 2**62)),
                step=b,
            )
            for b in range(600)
        ]
        sample = canonical_sample(make_batch(requests, method=method, synthetic_rates=[0.9, 0.8, 0.7]))
        assert sample.near_ties <= 0.01 * sample.num_decisions, method


def test_a_gumbel_decision_within_float32_rounding_is_a_near_tie() -> None:
    """Two tokens whose Gumbel scores differ by 1e-9 make the bonus sample a near tie; 1e-2 does not."""
    seed, step, vocab_size = 12345, 3, 8
    uniforms = philox.rand(seed, stream_offsets(step, 0, SAMPLE_PURPOSE, np.arange(vocab_size))).astype(
        np.float64
    )
    gumbel = -np.log(-np.log(uniforms))
    for gap, near in ((1e-9, True), (1e-2, False)):
        logits = np.full((1, vocab_size), -30.0)
        logits[0, 2] = 0.0
        logits[0, 5] = gumbel[2] - gumbel[5] + gap  # token 5 wins by `gap`
        batch = make_batch([RequestData(logits, [], None, 1.0, seed=seed, step=step)])
        sample = canonical_sample(batch)
        assert int(sample.output.token_ids[0, 0]) == 5
        assert bool(sample.near[0, 0]) is near


def test_vectorised_sampler_is_a_canonical_variant() -> None:
    """VectorisedSampler is a Variant on the canonical streams that returns the reference output."""
    rng = np.random.default_rng(1)
    batch = make_batch([RequestData(rng.normal(size=(3, 10)), [1, 2], rng.normal(size=(2, 10)), seed=9)])
    sampler = VectorisedSampler()
    assert sampler.canonical_rng and sampler.name == "vectorised"
    assert torch.equal(sampler(batch).token_ids, reference_sample(batch).token_ids)
