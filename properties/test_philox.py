"""`reference.philox` and the schemes built on it are bit-identical to Triton's tl.randint and tl.rand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from specsample.kernels import rules
from specsample.reference import philox
from specsample.reference.schemes import (
    ACCEPT_PURPOSE,
    BLOCK_PURPOSE,
    CANONICAL,
    MRV2,
    NOISE_GROUP,
    NOISE_RUN,
    RAND_MIN,
    SAMPLE_PURPOSE,
    CanonicalV3,
    stream_offsets,
)

# Known-answer vectors of Random123 (kat_vectors, philox4x32 with 10 rounds): counter, key, output.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize(("counter", "key", "expected"), KNOWN_ANSWERS)
def test_known_answer_vectors(
    counter: tuple[int, ...], key: tuple[int, int], expected: tuple[int, ...]
) -> None:
    """The block function reproduces Random123's published Philox4x32-10 outputs."""
    words = philox.philox4x32(counter, key)  # type: ignore[arg-type]
    assert tuple(int(w) for w in words) == expected


def test_uniform_range_and_endpoints() -> None:
    """rand maps the words 0 and 0xFFFFFFFF to 0.0 and never reaches 1.0."""
    words = np.array([0, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 1], dtype=np.uint32)
    uniforms = philox.uint_to_uniform(words)
    assert uniforms[0] == 0.0 and uniforms[1] == 0.0
    assert uniforms.max() < 1.0
    assert uniforms[2] == np.float32(0.99999994)


@triton.jit
def _philox_probe(seed_ptr, offset_ptr, word_ptr, uniform_ptr, NUM: tl.constexpr):
    """Write tl.randint and tl.rand for each (seed, offset) pair.

    Args:
        seed_ptr: [NUM] int64 seeds.
        offset_ptr: [NUM] int64 offsets.
        word_ptr: [NUM] int32 output words (bitcast from uint32).
        uniform_ptr: [NUM] float32 output uniforms.
    """
    # One program; NUM lanes.
    lanes = tl.arange(0, NUM)
    seed = tl.load(seed_ptr + lanes)
    offset = tl.load(offset_ptr + lanes)
    tl.store(word_ptr + lanes, tl.randint(seed, offset).to(tl.int32, bitcast=True))
    tl.store(uniform_ptr + lanes, tl.rand(seed, offset))


def _triton_words(seeds: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    seeds_t = torch.as_tensor(seeds.astype(np.int64), device=device)
    offsets_t = torch.as_tensor(offsets.view(np.int64), device=device)
    words = torch.empty(seeds.shape[0], dtype=torch.int32, device=device)
    uniforms = torch.empty(seeds.shape[0], dtype=torch.float32, device=device)
    _philox_probe[(1,)](seeds_t, offsets_t, words, uniforms, NUM=seeds.shape[0])
    return words.cpu().numpy().view(np.uint32), uniforms.cpu().numpy()


def test_bit_identical_to_triton() -> None:
    """randint and rand equal Triton's for seeds past 2**32 and offsets around 2**32 and past 2**40."""
    rng = np.random.default_rng(20261121)
    seeds = np.array([0, 1, 2**32 - 1, 2**32, 2**32 + 7, 2**62 + 3, 2**63 - 1, -1, -(2**63)], dtype=np.int64)
    offsets = [0, 1, 2**32 - 1, 2**32, 2**32 + 1, 2**40, 2**40 + 12345, 2**41 - 1, 2**63 - 1]
    layout = [
        stream_offsets(step, position, purpose, token)
        for step, position, purpose, token in [
            (0, 0, ACCEPT_PURPOSE, 0),
            (1, 5, SAMPLE_PURPOSE, 262143),
            (2**31, 127, SAMPLE_PURPOSE, 2**22 - 1),
            (2**32 - 1, 64, ACCEPT_PURPOSE, 0),
            (12345, 3, SAMPLE_PURPOSE, 151935),
        ]
    ]
    all_offsets = np.array([*offsets, *(int(x) for x in layout)], dtype=np.uint64)
    random = rng.integers(0, 2**63, size=64 - all_offsets.shape[0], dtype=np.int64).view(np.uint64)
    all_offsets = np.concatenate([all_offsets, random])
    all_seeds = np.concatenate(
        [seeds, rng.integers(-(2**63), 2**63 - 1, size=64 - seeds.shape[0], dtype=np.int64)]
    )
    for shift in range(4):  # every seed meets every kind of offset
        seeds_now = np.roll(all_seeds, shift * 17)
        words, uniforms = _triton_words(seeds_now, all_offsets)
        np.testing.assert_array_equal(philox.randint(seeds_now, all_offsets), words)
        np.testing.assert_array_equal(philox.rand(seeds_now, all_offsets), uniforms)


@triton.jit
def _philox4x_probe(seed_ptr, offset_ptr, word_ptr, NUM: tl.constexpr):
    """Write the four words of tl.randint4x for each (seed, offset) pair, ``[4, NUM]``."""
    lanes = tl.arange(0, NUM)
    w0, w1, w2, w3 = tl.randint4x(tl.load(seed_ptr + lanes), tl.load(offset_ptr + lanes))
    tl.store(word_ptr + lanes, w0.to(tl.int32, bitcast=True))
    tl.store(word_ptr + NUM + lanes, w1.to(tl.int32, bitcast=True))
    tl.store(word_ptr + 2 * NUM + lanes, w2.to(tl.int32, bitcast=True))
    tl.store(word_ptr + 3 * NUM + lanes, w3.to(tl.int32, bitcast=True))


def test_four_words_bit_identical_to_triton() -> None:
    """randint4x equals tl.randint4x word for word, seeds and offsets past 2**32 included."""
    rng = np.random.default_rng(20261124)
    seeds = np.concatenate([[0, -1, 2**63 - 1, 2**32], rng.integers(-(2**63), 2**63 - 1, 28)]).astype(
        np.int64
    )
    offsets = np.concatenate([[0, 2**32 - 1, 2**32, 2**63 - 1], rng.integers(0, 2**63, 28)]).astype(np.int64)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    words = torch.empty(4, seeds.size, dtype=torch.int32, device=device)
    _philox4x_probe[(1,)](
        torch.as_tensor(seeds, device=device), torch.as_tensor(offsets, device=device), words, NUM=seeds.size
    )
    expected = np.stack(philox.randint4x(seeds, offsets.view(np.uint64)))
    np.testing.assert_array_equal(expected, words.cpu().numpy().view(np.uint32))


@triton.jit
def _canonical_noise_probe(seed_ptr, step_ptr, position_ptr, uniform_ptr, VOCAB: tl.constexpr):
    """Write the kernels' canonical sampling uniforms of one row per program, ``[rows, VOCAB]``."""
    row = tl.program_id(0)
    seed = tl.load(seed_ptr + row)
    step = tl.load(step_ptr + row)
    position = tl.load(position_ptr + row)
    for group_start in range(0, VOCAB, rules.NOISE_GROUP):
        tokens = group_start + tl.arange(0, rules.NOISE_GROUP)
        u = rules.noise_tile(seed, step, position, group_start)
        tl.store(uniform_ptr + row * VOCAB + tokens, u, mask=tokens < VOCAB)


def test_canonical_noise_is_the_kernels() -> None:
    """The canonical scheme's uniforms are the kernels', token for token, over three noise groups."""
    assert rules.NOISE_GROUP.value == NOISE_GROUP and rules.NOISE_RUN.value == NOISE_RUN
    seeds = np.array([0, -1, 2**63 - 1, 12345], dtype=np.int64)
    steps = np.array([0, 2**32 - 1, 7, 2**31], dtype=np.int64)
    positions = np.array([0, 127, 3, 8], dtype=np.int64)
    vocab = 2 * NOISE_GROUP + NOISE_RUN + 5
    device = "cuda" if torch.cuda.is_available() else "cpu"
    uniforms = torch.empty(seeds.size, vocab, dtype=torch.float32, device=device)
    _canonical_noise_probe[(seeds.size,)](
        *(torch.as_tensor(x, device=device) for x in (seeds, steps, positions)), uniforms, VOCAB=vocab
    )
    noise = CANONICAL.gumbel_noise(seeds, steps, positions, vocab)
    np.testing.assert_array_equal(noise.uniforms, uniforms.cpu().numpy())
    # Token 1024 g + 256 j + k is word j of call 256 g + k: one spot check by hand.
    token = NOISE_GROUP + 2 * NOISE_RUN + 5
    word = philox.randint4x(seeds[3], stream_offsets(steps[3], positions[3], SAMPLE_PURPOSE, NOISE_RUN + 5))[
        2
    ]
    assert noise.uniforms[3, token] == philox.uint_to_uniform(word)


@triton.jit
def _block_uniform_probe(seed_ptr, step_ptr, position_ptr, uniform_ptr):
    """Write the kernels' canonical-v3 block uniform of one row per program (float64)."""
    row = tl.program_id(0)
    seed = tl.load(seed_ptr + row)
    step = tl.load(step_ptr + row)
    position = tl.load(position_ptr + row)
    tl.store(uniform_ptr + row, rules.block_uniform(seed, step, position))


def test_block_uniform_is_the_kernels() -> None:
    """The block uniform of each row, 53 bits of two Philox words, is the kernels' to the last bit."""
    rng = np.random.default_rng(20261124)
    seeds = np.concatenate([[0, -1, 2**63 - 1, 12345], rng.integers(-(2**63), 2**63 - 1, 60)]).astype(
        np.int64
    )
    steps = np.concatenate([[0, 2**32 - 1, 7, 2**31], rng.integers(0, 2**40, 60)]).astype(np.int64)
    positions = np.concatenate([[0, 127, 3, 8], rng.integers(0, 128, 60)]).astype(np.int64)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    uniforms = torch.empty(seeds.size, dtype=torch.float64, device=device)
    _block_uniform_probe[(seeds.size,)](
        *(torch.as_tensor(x, device=device) for x in (seeds, steps, positions)), uniforms
    )
    expected = CANONICAL.block_uniforms(seeds, steps, positions)
    np.testing.assert_array_equal(expected, uniforms.cpu().numpy())
    assert expected.min() >= 0.0 and expected.max() < 1.0
    # By hand: words 0 and 1 of the call at offset(step, i, 2, 0).
    words = philox.randint4x(seeds[3], stream_offsets(steps[3], positions[3], BLOCK_PURPOSE, 0))
    assert expected[3] == ((int(words[0]) >> 5) * 2**26 + (int(words[1]) >> 6)) / 2**53


def test_stream_offsets_layout() -> None:
    """Offsets follow (((step * 128 + i) * 4 + purpose) << 22) + token, modulo 2**64."""
    assert int(stream_offsets(0, 0, 0, 0)) == 0
    assert int(stream_offsets(0, 1, 0, 0)) == 4 << 22
    assert int(stream_offsets(0, 0, 1, 5)) == (1 << 22) + 5
    assert int(stream_offsets(3, 2, 1, 7)) == (((3 * 128 + 2) * 4 + 1) << 22) + 7
    assert (
        int(stream_offsets(2**32 - 1, 127, 1, 2**22 - 1))
        == ((((2**32 - 1) * 128 + 127) * 4 + 1) << 22) + 2**22 - 1
    )


@triton.jit
def _mrv2_probe(seed_ptr, pos_ptr, accept_ptr, noise_ptr, NUM: tl.constexpr, VOCAB: tl.constexpr):
    """Write the mrv2 scheme's acceptance uniform and the noise uniforms of each (seed, pos) row.

    Args:
        seed_ptr: [NUM] int64 seeds.
        pos_ptr: [NUM] int64 positions.
        accept_ptr: [NUM] float32 output: max(tl.rand(seed, pos), 2**-31).
        noise_ptr: [NUM, VOCAB] float32 output: max(tl.rand(tl.randint(seed, pos), token), 2**-31).
    """
    # One program per row; VOCAB lanes.
    row = tl.program_id(0)
    seed = tl.load(seed_ptr + row)
    pos = tl.load(pos_ptr + row)
    tl.store(accept_ptr + row, tl.maximum(tl.rand(seed, pos), 4.6566127342e-10))
    tokens = tl.arange(0, VOCAB)
    row_hash = tl.randint(seed, pos)
    tl.store(noise_ptr + row * VOCAB + tokens, tl.maximum(tl.rand(row_hash, tokens), 4.6566127342e-10))


def test_mrv2_scheme_is_bit_identical_to_triton() -> None:
    """The mrv2 scheme's uniforms are Triton's, the hashed row key zero-extended from uint32."""
    rng = np.random.default_rng(20261123)
    seeds = np.concatenate([[0, -1, 2**63 - 1, -(2**63), 2**32 + 5], rng.integers(-(2**63), 2**63 - 1, 11)])
    steps = np.concatenate([[0, 1, 2**31, 2**32 - 9, 7], rng.integers(0, 2**32 - 8, 11)]).astype(np.int64)
    positions = rng.integers(0, 8, seeds.size)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vocab = 64
    accept = torch.empty(seeds.size, dtype=torch.float32, device=device)
    noise = torch.empty(seeds.size, vocab, dtype=torch.float32, device=device)
    _mrv2_probe[(seeds.size,)](
        torch.as_tensor(seeds, device=device),
        torch.as_tensor(steps + positions, device=device),
        accept,
        noise,
        NUM=seeds.size,
        VOCAB=vocab,
    )
    np.testing.assert_array_equal(MRV2.accept_uniforms(seeds, steps, positions), accept.cpu().numpy())
    expected = MRV2.gumbel_noise(seeds, steps, positions, vocab)
    np.testing.assert_array_equal(expected.uniforms, noise.cpu().numpy())
    assert expected.uniforms.min() >= np.float32(RAND_MIN)


def test_noise_asked_again_is_the_same_and_read_only() -> None:
    """`CanonicalV3` keeps the noise it computed (`_NoiseMemo`): the same inputs give the very arrays
    of the first call, equal to a fresh scheme's; other inputs (a seed, a step, a row, V) give their
    own; the arrays are read-only, so no caller changes what another gets; past its byte budget the
    least recently used noise is dropped and computed again."""
    scheme, fresh = CanonicalV3(), CanonicalV3()
    seeds, steps = np.array([5, 7, 9], dtype=np.int64), np.array([0, 3, 1], dtype=np.int64)
    first = scheme.gumbel_noise(seeds, steps, 2, 3000)
    again = scheme.gumbel_noise(seeds.copy(), steps.copy(), np.array(2), 3000)
    assert again.gumbel is first.gumbel and again.uniforms is first.uniforms
    expected = fresh.gumbel_noise(seeds, steps, 2, 3000)
    for got, want in zip(
        (first.uniforms, first.gumbel, first.tolerance, first.block_uniform),
        (expected.uniforms, expected.gumbel, expected.tolerance, expected.block_uniform),
        strict=True,
    ):
        assert np.array_equal(got, want)
        assert not got.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        first.gumbel[0, 0] = 0.0
    for other in (
        scheme.gumbel_noise(seeds + 1, steps, 2, 3000),
        scheme.gumbel_noise(seeds, steps + 1, 2, 3000),
        scheme.gumbel_noise(seeds, steps, 1, 3000),
    ):
        assert not np.array_equal(other.uniforms, first.uniforms)
    # A token's noise does not depend on V: a row one token shorter has the same noise, its own arrays.
    shorter = scheme.gumbel_noise(seeds, steps, 2, 2999)
    assert shorter.uniforms.shape == (3, 2999) and np.array_equal(shorter.uniforms, first.uniforms[:, :2999])
    small = CanonicalV3()
    small._memo.budget = first.uniforms.nbytes * 6  # room for one row set's noise, not two
    kept = small.gumbel_noise(seeds, steps, 2, 3000)
    small.gumbel_noise(seeds + 1, steps, 2, 3000)
    assert small._memo.held <= small._memo.budget
    assert small.gumbel_noise(seeds, steps, 2, 3000).gumbel is not kept.gumbel
