"""Random schemes: where a sampler's uniforms come from, so the float64 walk can replay them.

A scheme maps ``(seed, step, position, purpose, token)`` to the uniforms a sampler consumes and says
how it turns them into a sample (`draw`). Every scheme here samples by Gumbel-max: the token
emitted from a row of weights ``w`` is ``argmax_x(log w(x) + g_x)``, ties to the lowest index, with
the Gumbel noise ``g`` the scheme derives from its uniforms; a scheme with a *block uniform* runs
the Gumbel-max within one block of `BLOCK_TOKENS` tokens, picked by the inverse CDF of the block
masses. A scheme gives:

- `RandomScheme.accept_uniforms`: the uniform ``u`` each acceptance test compares
  (``p(d) > u * q(d)``; synthetic sampling accepts iff ``u < c``);
- `RandomScheme.gumbel_noise`: the noise of every token of one row, the float32 tolerance of
  each value (how far a kernel computing it in float32 may land from the float64 value), and the
  row's block uniform where the scheme has one.

A variant declares its scheme in its ``streams`` attribute (``None`` for a sampler with its own
generator): every variant on a scheme the walk replays gets the coupled check. A scheme may say
``step_is_position = True``: its ``step`` is a sequence position (the number of tokens before the
first draft), so draws at ``(step + 1, i)`` and ``(step, i + 1)`` are the same position by design,
and the check of independence across steps (`properties.checks.step_pairs`) does not apply to it.
Without the attribute the step is the contract's, advanced by one every decoding step.

Two schemes ship:

- `CANONICAL` (``canonical-v3``), our kernels': Philox4x32-10 keyed by the seed, counted by
  ``offset = (((step * 128 + i) * 4 + purpose) << 22) + c`` (`stream_offsets`). The acceptance
  uniform of position ``i`` is ``tl.rand(seed, offset(step, i, 0, 0))``. The noise of row ``i``
  takes all four words of each Philox call: token ``t = 1024 g + 256 j + k`` (``j < 4``,
  ``k < 256``) reads word ``j`` of the call at ``c = 256 g + k`` (purpose 1), mapped to ``[0, 1)``
  as `tl.rand` maps a word, and ``g = -log(-log u)``. A kernel tile of 1024 tokens makes 256
  Philox calls and reads each word as a run of 256 consecutive tokens, with no shuffle.
  The block uniform of row ``i`` is 53 bits of the call at ``offset(step, i, 2, 0)``:
  ``((w0 >> 5) * 2**26 + (w1 >> 6)) * 2**-53``, exact in float64. A row is drawn in two steps
  (`draw`): the block ``k`` (tokens ``[1024 k, 1024 (k + 1))``) whose cumulative mass first
  exceeds ``u * M`` (``M`` the row's mass), then the Gumbel-max within block ``k``. This is exact:
  ``P(x) = (M_k / M) (w(x) / M_k)``. A kernel therefore computes one exponential per token and
  row (the block masses) and draws noise for one block only; Gumbel-max over the whole row
  (``canonical-v2``, retired: a Philox quarter-call and two logarithms per token) made the
  sampling pass arithmetic-bound. Strict rows, which a kernel samples in the same pass that
  finds the row's normaliser, still draw by Gumbel-max over the whole row.
- `MRV2` (``mrv2``), shaped like vLLM's Model Runner V2: a row's position in the sequence is
  ``pos = step + i`` (``step`` plays the number of tokens computed before the first draft). The
  acceptance uniform is ``tl.rand(seed, pos)``; the noise of token ``t`` is drawn from a 32-bit
  hash of ``(seed, pos, t)``, ``u_t = tl.rand(tl.randint(seed, pos), t)``, with
  ``g = -log(-log1p(-u_t))``. Both uniforms are clamped below at ``2**-31`` (never 0).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from . import philox

F64Array = npt.NDArray[np.float64]
F32Array = npt.NDArray[np.float32]
I64Array = npt.NDArray[np.int64]

# A float32 computation of a noise value lands within TOL_ULPS * 2**-23 * (|g| + 2) of float64's.
EPS32 = 2.0**-23
TOL_ULPS = 8.0
ACCEPT_PURPOSE = 0
SAMPLE_PURPOSE = 1
BLOCK_PURPOSE = 2
# canonical-v3's blocks: the inverse CDF picks one of these, the Gumbel-max a token within it.
BLOCK_TOKENS = 1024
# A float32 kernel's block mass (a sum of BLOCK_TOKENS weights, one exponential each) lands within
# this relative distance of the sum of the weights it was given.
BLOCK_MASS_RTOL = TOL_ULPS * EPS32 * (4 + 10)
# The canonical scheme reads each Philox word of a call as a run of NOISE_RUN tokens, four runs a group.
NOISE_RUN = 256
NOISE_GROUP = 4 * NOISE_RUN
# The smallest uniform `tl.rand` makes other than 0.
RAND_MIN = float(philox.UNIFORM_SCALE)


@dataclass(frozen=True)
class Noise:
    """The Gumbel noise of rows of tokens and its float32 tolerance.

    Attributes:
        uniforms: ``[A, V]`` float32, the uniforms the noise derives from (a mutant that samples by
            inverse CDF reads them).
        gumbel: ``[A, V]`` float64, ``-inf`` where the uniform rules a token out.
        tolerance: ``[A, V]`` float64, 0 where the noise is infinite.
        block_uniform: ``[A]`` float64, the uniform that picks each row's block (`draw`), or
            ``None``: Gumbel-max over the whole row.
    """

    uniforms: F32Array
    gumbel: F64Array
    tolerance: F64Array
    block_uniform: F64Array | None = None

    def whole_row(self) -> Noise:
        """The same noise for a Gumbel-max over the whole row (strict rows)."""
        return replace(self, block_uniform=None)


def block_masses(weights: F64Array) -> F64Array:
    """``[A, ceil(V / BLOCK_TOKENS)]`` the sum of the weights of each block of each row."""
    num_blocks = -(-weights.shape[1] // BLOCK_TOKENS)
    padded = np.zeros((weights.shape[0], num_blocks * BLOCK_TOKENS))
    padded[:, : weights.shape[1]] = weights
    return np.asarray(padded.reshape(weights.shape[0], num_blocks, BLOCK_TOKENS).sum(axis=2))


def pick_blocks(masses: F64Array, uniform: F64Array) -> npt.NDArray[np.int64]:
    """The block of each row whose cumulative mass first exceeds ``u * M`` (a row without mass: 0)."""
    cumulative = np.cumsum(masses, axis=1)
    threshold = uniform * cumulative[:, -1]
    picked = np.sum(cumulative <= threshold[:, None], axis=1)
    last = masses.shape[1] - 1 - np.argmax(masses[:, ::-1] > 0, axis=1)  # the last block with mass
    return np.asarray(np.where(cumulative[:, -1] > 0, np.minimum(picked, last), 0), dtype=np.int64)


def in_blocks(blocks: npt.NDArray[np.int64], vocab_size: int) -> npt.NDArray[np.bool_]:
    """``[A, V]`` whether each token lies in its row's block."""
    return np.asarray(np.arange(vocab_size)[None, :] // BLOCK_TOKENS == blocks[:, None])


def draw(weights: F64Array, noise: Noise) -> npt.NDArray[np.int64]:
    """The token each row of ``weights`` (unnormalised) emits: Gumbel-max, within the block the
    block uniform picks where the noise has one; ties to the lowest index."""
    with np.errstate(divide="ignore"):
        keys = np.log(weights) + noise.gumbel
    if noise.block_uniform is not None:
        blocks = pick_blocks(block_masses(weights), noise.block_uniform)
        keys = np.where(in_blocks(blocks, weights.shape[1]), keys, -np.inf)
    return np.asarray(np.argmax(keys, axis=1), dtype=np.int64)


def block_uniform(words0: npt.ArrayLike, words1: npt.ArrayLike) -> F64Array:
    """53 bits of two Philox words as a float64 uniform in ``[0, 1)``, as the kernels make it."""
    high = np.asarray(words0, dtype=np.uint64) >> np.uint64(5)
    low = np.asarray(words1, dtype=np.uint64) >> np.uint64(6)
    return np.asarray((high * np.uint64(1 << 26) + low).astype(np.float64) * 2.0**-53)


@runtime_checkable
class RandomScheme(Protocol):
    """How a sampler draws its random numbers, replayable in float64.

    ``seed`` and ``step`` are ``[A]`` int64 (one entry per row sampled), ``position`` the draft
    index ``i`` (``n`` for the bonus row) of each row.
    """

    name: str

    def accept_uniforms(self, seed: I64Array, step: I64Array, position: npt.ArrayLike) -> F64Array:
        """``[A]`` the uniform each acceptance test compares, as the kernel holds it."""
        ...

    def gumbel_noise(self, seed: I64Array, step: I64Array, position: npt.ArrayLike, vocab_size: int) -> Noise:
        """``[A, V]`` the Gumbel noise of every token of each row."""
        ...


def stream_offsets(
    step: npt.ArrayLike, position: npt.ArrayLike, purpose: int, token: npt.ArrayLike
) -> npt.NDArray[np.uint64]:
    """The canonical Philox offsets, computed modulo 2**64 as the kernels' int64 arithmetic does."""
    row = np.asarray(step).astype(np.uint64) * np.uint64(128) + np.asarray(position, dtype=np.uint64)
    return ((row * np.uint64(4) + np.uint64(purpose)) << np.uint64(22)) + np.asarray(token, dtype=np.uint64)


def _tolerance(gumbel: F64Array) -> F64Array:
    finite = np.isfinite(gumbel)
    return np.where(finite, TOL_ULPS * EPS32 * (np.abs(np.where(finite, gumbel, 0.0)) + 2.0), 0.0)


def _column(values: npt.ArrayLike) -> npt.NDArray[np.generic]:
    return np.asarray(values).reshape(-1, 1)


# The most bytes of noise `CanonicalV3` keeps (`_NoiseMemo`).
NOISE_MEMO_BYTES = 512 * 2**20


class _NoiseMemo:
    """Noise already computed, by its inputs, least recently used dropped past ``budget`` bytes.

    Noise is a function of ``(seed, step, position, V)`` alone, and the same rows' noise is asked
    for again and again (each planted bug of a self-test walks the same cases, and Philox in numpy
    is most of a walk's time). The arrays are read-only, so no caller can change another's."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0
        self.entries: OrderedDict[tuple[object, ...], Noise] = OrderedDict()

    @staticmethod
    def key(
        seed: npt.ArrayLike, step: npt.ArrayLike, rows: npt.ArrayLike, vocab_size: int
    ) -> tuple[object, ...]:
        arrays = [np.ascontiguousarray(a) for a in (seed, step, rows)]
        return (vocab_size, *((a.dtype.str, a.shape, a.tobytes()) for a in arrays))

    def get(self, key: tuple[object, ...]) -> Noise | None:
        noise = self.entries.get(key)
        if noise is not None:
            self.entries.move_to_end(key)
        return noise

    def put(self, key: tuple[object, ...], noise: Noise) -> Noise:
        """Keep ``noise`` under ``key``, its arrays made read-only; return it."""
        for array in _arrays(noise):
            array.flags.writeable = False
        size = _nbytes(noise)
        if size <= self.budget:
            self.entries[key] = noise
            self.held += size
            while self.held > self.budget:
                self.held -= _nbytes(self.entries.popitem(last=False)[1])
        return noise


def _arrays(noise: Noise) -> list[npt.NDArray[np.generic]]:
    arrays: list[npt.NDArray[np.generic]] = [noise.uniforms, noise.gumbel, noise.tolerance]
    return arrays if noise.block_uniform is None else [*arrays, noise.block_uniform]


def _nbytes(noise: Noise) -> int:
    return sum(array.nbytes for array in _arrays(noise))


class CanonicalV3:
    """Our kernels' scheme: four tokens a Philox call; a row drawn within a block its uniform picks."""

    name = "canonical-v3"
    step_is_position = False

    def __init__(self) -> None:
        self._memo = _NoiseMemo(NOISE_MEMO_BYTES)

    def accept_uniforms(self, seed: I64Array, step: I64Array, position: npt.ArrayLike) -> F64Array:
        """``tl.rand(seed, offset(step, i, 0, 0))``."""
        offsets = stream_offsets(step, position, ACCEPT_PURPOSE, 0)
        return philox.rand(np.asarray(seed), offsets).astype(np.float64)

    def gumbel_noise(self, seed: I64Array, step: I64Array, position: npt.ArrayLike, vocab_size: int) -> Noise:
        """``g = -log(-log u)``, ``u`` word ``j`` of the call ``256 g + k`` for ``t = 1024 g + 256 j + k``
        (read-only arrays, kept for the next call with the same inputs: `_NoiseMemo`)."""
        rows = np.broadcast_to(np.asarray(position), np.shape(seed))
        key = _NoiseMemo.key(seed, step, rows, vocab_size)
        known = self._memo.get(key)
        if known is not None:
            return known
        tokens = np.arange(vocab_size)
        calls = np.arange(-(-vocab_size // NOISE_GROUP) * NOISE_RUN)
        offsets = stream_offsets(_column(step), _column(rows), SAMPLE_PURPOSE, calls[None, :])
        words = np.stack(philox.randint4x(_column(seed), offsets))  # [4, A, calls]
        call = tokens // NOISE_GROUP * NOISE_RUN + tokens % NOISE_RUN
        uniforms = philox.uint_to_uniform(words[tokens % NOISE_GROUP // NOISE_RUN, :, call].T)
        with np.errstate(divide="ignore"):
            gumbel = -np.log(-np.log(uniforms.astype(np.float64)))
        return self._memo.put(
            key, Noise(uniforms, gumbel, _tolerance(gumbel), self.block_uniforms(seed, step, rows))
        )

    def block_uniforms(self, seed: I64Array, step: I64Array, position: npt.ArrayLike) -> F64Array:
        """``[A]`` the 53-bit uniform of the call at ``offset(step, i, 2, 0)`` (words 0 and 1)."""
        offsets = stream_offsets(step, position, BLOCK_PURPOSE, 0)
        words = philox.randint4x(np.asarray(seed), offsets)
        return block_uniform(words[0], words[1])


class Mrv2:
    """A scheme shaped like vLLM Model Runner V2's: positions, and noise hashed from the row's draw."""

    name = "mrv2"
    step_is_position = True  # vLLM's convention: pos = step + i

    def accept_uniforms(self, seed: I64Array, step: I64Array, position: npt.ArrayLike) -> F64Array:
        """``max(tl.rand(seed, step + i), 2**-31)``."""
        pos = np.asarray(step, dtype=np.int64) + np.asarray(position, dtype=np.int64)
        return np.maximum(philox.rand(np.asarray(seed), pos).astype(np.float64), RAND_MIN)

    def gumbel_noise(self, seed: I64Array, step: I64Array, position: npt.ArrayLike, vocab_size: int) -> Noise:
        """``g = -log(-log1p(-u))``, ``u = max(tl.rand(tl.randint(seed, step + i), token), 2**-31)``.

        ``tl.randint`` gives a uint32, which keys the second draw zero-extended: key ``(hash, 0)``.
        """
        pos = np.asarray(step, dtype=np.int64) + np.asarray(position, dtype=np.int64)
        row_hash = philox.randint(np.asarray(seed), pos).astype(np.uint64)
        draws = philox.rand(_column(row_hash), np.arange(vocab_size)[None, :])
        uniforms = np.maximum(draws, np.float32(RAND_MIN))
        gumbel = -np.log(-np.log1p(-uniforms.astype(np.float64)))
        return Noise(uniforms, gumbel, _tolerance(gumbel))


CANONICAL = CanonicalV3()
MRV2 = Mrv2()
SCHEMES: dict[str, RandomScheme] = {scheme.name: scheme for scheme in (CANONICAL, MRV2)}
