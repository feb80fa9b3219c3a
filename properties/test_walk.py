"""`reference.walk`: the vectorised walk equals the scalar reference on every scheme and flags near ties."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specsample.properties import strategies
from specsample.reference.contract import METHODS, RequestData, SpecBatch, make_batch
from specsample.reference.sampler import reference_sample
from specsample.reference.schemes import CANONICAL, SCHEMES, RandomScheme
from specsample.reference.walk import WalkSampler, walk


@given(
    batch=strategies.spec_batches(max_vocab=300, max_requests=4, max_drafts=4),
    scheme=st.sampled_from(list(SCHEMES.values())),
)
def test_walk_equals_reference_sample(batch: SpecBatch, scheme: RandomScheme) -> None:
    """Tokens, counts and logprobs equal reference_sample's bit for bit, on every family, shape and scheme."""
    _assert_walk_is_reference(batch, scheme)


@given(
    batch=strategies.spec_batches(methods=("block",), max_vocab=300, max_requests=4, max_drafts=5),
    scheme=st.sampled_from(list(SCHEMES.values())),
)
def test_walk_equals_reference_sample_on_block(batch: SpecBatch, scheme: RandomScheme) -> None:
    """On block batches of every family the walk's tokens, counts and logprobs equal the scalar
    reference sampler's bit for bit, on every scheme; near ties lie on emitted positions only."""
    _assert_walk_is_reference(batch, scheme)


def _assert_walk_is_reference(batch: SpecBatch, scheme: RandomScheme) -> None:
    """The walk's output equals reference_sample's bit for bit; near ties lie on emitted positions only."""
    expected = reference_sample(batch, scheme=scheme)
    got = walk(batch, scheme, max_elements=256)  # small chunks: the chunking is exercised too
    assert torch.equal(got.output.token_ids, expected.token_ids)
    assert torch.equal(got.output.num_emitted, expected.num_emitted)
    assert expected.logprobs is not None and got.output.logprobs is not None
    np.testing.assert_array_equal(got.output.logprobs.numpy(), expected.logprobs.numpy())
    emitted = expected.num_emitted.numpy()
    assert not (got.near & (np.arange(got.near.shape[1])[None, :] >= emitted[:, None])).any()


@pytest.mark.parametrize("method", METHODS)
def test_near_ties_are_rare_on_ordinary_batches(method: str) -> None:
    """On 600 ordinary requests of each method, at most 1% of decisions are near ties."""
    rng = np.random.default_rng(5)
    vocab_size, n = 33, 3
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
    sample = walk(make_batch(requests, method=method, synthetic_rates=[0.9, 0.8, 0.7]))
    assert sample.num_decisions > 0 and sample.near_ties <= 0.01 * sample.num_decisions


@pytest.mark.parametrize("scheme", list(SCHEMES.values()), ids=list(SCHEMES))
def test_a_gumbel_decision_within_float32_rounding_is_a_near_tie(scheme: RandomScheme) -> None:
    """Two tokens whose Gumbel scores differ by 2e-6 make the bonus sample a near tie; 1e-2 does not."""
    seed, step, vocab_size = 12345, 3, 8
    gumbel = scheme.gumbel_noise(np.array([seed]), np.array([step]), 0, vocab_size).gumbel[0]
    for gap, near in ((2e-6, True), (1e-2, False)):
        logits = np.full((1, vocab_size), -30.0)
        logits[0, 2] = 0.0
        logits[0, 5] = gumbel[2] - gumbel[5] + gap  # token 5 wins by `gap`
        batch = make_batch([RequestData(logits, [], None, 1.0, seed=seed, step=step)])
        sample = walk(batch, scheme)
        assert int(sample.output.token_ids[0, 0]) == 5
        assert bool(sample.near[0, 0]) is near


def test_walk_sampler_is_a_variant_on_its_scheme() -> None:
    """WalkSampler declares its scheme and returns the reference output of that scheme."""
    rng = np.random.default_rng(1)
    batch = make_batch([RequestData(rng.normal(size=(3, 10)), [1, 2], rng.normal(size=(2, 10)), seed=9)])
    for scheme in SCHEMES.values():
        sampler = WalkSampler(scheme)
        assert sampler.streams is scheme and sampler.name == ("walk" if scheme is CANONICAL else "walk-mrv2")
        assert torch.equal(sampler(batch).token_ids, reference_sample(batch, scheme=scheme).token_ids)
