"""`reference.walk`: the walk equals the scalar reference on every scheme; its record flags near ties."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specsample.properties import strategies
from specsample.reference.contract import METHODS, RequestData, SpecBatch, make_batch
from specsample.reference.law import BatchRows
from specsample.reference.near_ties import Draw, ExactDecision, judge
from specsample.reference.sampler import reference_sample
from specsample.reference.schemes import BLOCK_TOKENS, CANONICAL, SCHEMES, RandomScheme, pick_blocks
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
            tree_parent=[-1, -1, 0] if method == "tree" else None,
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


def test_the_near_tie_model_judges_a_record_on_its_own() -> None:
    """Judged from a record alone, a draw whose Gumbel scores differ by 2e-6 is a near tie and one
    at 1e-2 is not; a decision on exact values counts as a decision and is never near."""
    seed, step, vocab_size = 12345, 3, 8
    noise = CANONICAL.gumbel_noise(np.array([seed]), np.array([step]), 0, vocab_size)
    for gap, near in ((2e-6, True), (1e-2, False)):
        logits = np.full((1, vocab_size), -30.0)
        logits[0, 2] = 0.0
        logits[0, 5] = noise.gumbel[0, 2] - noise.gumbel[0, 5] + gap  # token 5 wins by `gap`
        rows = BatchRows.of(make_batch([RequestData(logits, [], None, 1.0, seed=seed, step=step)]))
        request = np.array([0])
        judged = judge(rows, [Draw(request, 0, 0, np.array([5]), noise)], width=1)
        assert judged.num_decisions == 1 and bool(judged.near[0, 0]) is near
        exact = judge(rows, [ExactDecision(request, 0)], width=1)
        assert exact.num_decisions == 1 and not exact.near.any()


def test_walk_sampler_is_a_variant_on_its_scheme() -> None:
    """WalkSampler declares its scheme and returns the reference output of that scheme."""
    rng = np.random.default_rng(1)
    batch = make_batch([RequestData(rng.normal(size=(3, 10)), [1, 2], rng.normal(size=(2, 10)), seed=9)])
    for scheme in SCHEMES.values():
        sampler = WalkSampler(scheme)
        assert sampler.streams is scheme and sampler.name == ("walk" if scheme is CANONICAL else "walk-mrv2")
        assert torch.equal(sampler(batch).token_ids, reference_sample(batch, scheme=scheme).token_ids)


def test_block_pick_is_the_inverse_cdf_of_the_block_masses() -> None:
    """Over a grid of uniforms each block is picked a share of the time equal to its share of the
    mass (to one grid point), a block without mass never, and the ends of [0, 1) pick the first and
    last blocks with mass."""
    rng = np.random.default_rng(7)
    masses = rng.exponential(size=(1, 12)) * (rng.random((1, 12)) < 0.7)
    masses[0, [0, 11]] = 0.0
    points = 100_000
    uniform = (np.arange(points) + 0.5) / points
    picked = pick_blocks(np.repeat(masses, points, axis=0), uniform)
    counts = np.bincount(picked, minlength=12)
    share = masses[0] / masses.sum()
    assert np.all(np.abs(counts - points * share) <= 1)
    assert np.all(counts[masses[0] == 0] == 0)
    ends = pick_blocks(np.repeat(masses, 2, axis=0), np.array([0.0, 1 - 2**-53]))
    with_mass = np.nonzero(masses[0])[0]
    assert ends.tolist() == [with_mass[0], with_mass[-1]]


@pytest.mark.parametrize("method", METHODS)
def test_walk_equals_reference_sample_across_blocks(method: str) -> None:
    """On vocabularies of several blocks (canonical-v3 draws within the block its uniform picks),
    the walk's tokens equal the scalar reference's, and every block is drawn from."""
    rng = np.random.default_rng(11)
    vocab_size = 3 * BLOCK_TOKENS + 100
    requests = []
    for b in range(40):
        target = rng.normal(size=(3, vocab_size)) * 0.5
        draft = target[:2] + rng.normal(size=(2, vocab_size))
        ids = [int(np.argmax(row)) for row in draft]
        parents = [-1, 0] if method == "tree" else None
        requests.append(
            RequestData(
                target, ids, draft, 1.0, seed=int(rng.integers(0, 2**62)), step=b, tree_parent=parents
            )
        )
    batch = make_batch(requests, method=method, synthetic_rates=[0.5, 0.5])
    expected = reference_sample(batch)
    got = walk(batch)
    assert torch.equal(got.output.token_ids, expected.token_ids)
    final = got.output.token_ids[torch.arange(40), got.output.num_emitted.long() - 1]
    assert set((final // BLOCK_TOKENS).tolist()) >= {0, 1, 2}


def test_a_block_decision_within_float32_rounding_is_a_near_tie() -> None:
    """Two flat blocks whose boundary lies a relative 2e-6 above ``u * M`` make the bonus sample a
    near tie; 1e-2 does not. The walk draws from the first block either way."""
    seed, step, vocab_size = 12345, 3, 2 * BLOCK_TOKENS
    u = float(CANONICAL.block_uniforms(np.array([seed]), np.array([step]), np.array([0]))[0])
    assert 0.1 < u < 0.9
    for gap, near in ((2e-6, True), (1e-2, False)):
        share = u * (1 + gap)  # the first block's share of the mass, just above u
        logits = np.zeros((1, vocab_size))
        logits[0, BLOCK_TOKENS:] = np.log((1 - share) / share)
        sample = walk(make_batch([RequestData(logits, [], None, 1.0, seed=seed, step=step)]))
        assert int(sample.output.token_ids[0, 0]) < BLOCK_TOKENS
        assert bool(sample.near[0, 0]) is near
