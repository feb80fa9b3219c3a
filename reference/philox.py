"""Philox4x32-10 in numpy, bit-identical to Triton's ``tl.randint`` and ``tl.rand``.

Triton keys Philox with the 64-bit seed (low word, high word) and counts with the 64-bit offset
(low word, high word, 0, 0); ``randint`` is the first output word. ``rand`` reads that word as an
int32, folds negatives with a bitwise NOT, converts to float32 and scales by ``2**-31`` rounded to
float32, so a uniform lies in ``[0, 0.99999994]``: never 1.0.

numpy's own ``Philox`` bit generator is another variant and cannot stand in for this one.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

MASK32 = np.uint64(0xFFFFFFFF)
SHIFT = np.uint64(32)
ROUND_A = np.uint64(0xD2511F53)  # multiplies counter word 0
ROUND_B = np.uint64(0xCD9E8D57)  # multiplies counter word 2
KEY_A = np.uint64(0x9E3779B9)
KEY_B = np.uint64(0xBB67AE85)
NUM_ROUNDS = 10
UNIFORM_SCALE = np.float32(4.6566127342e-10)

U64Array = npt.NDArray[np.uint64]
U32Array = npt.NDArray[np.uint32]


def _as_u64(values: npt.ArrayLike) -> U64Array:
    """Read integers as 64-bit words: negative int64 values wrap, as a bitcast does."""
    array = np.asarray(values)
    if array.dtype.kind == "u":
        return array.astype(np.uint64)
    if array.dtype.kind == "i":
        return array.astype(np.int64).view(np.uint64)
    if array.dtype == object:
        return np.array([int(v) % (1 << 64) for v in array.reshape(-1)], dtype=np.uint64).reshape(array.shape)
    raise TypeError(f"offsets and seeds must be integers; got dtype {array.dtype}")


def philox4x32(
    counter: tuple[npt.ArrayLike, npt.ArrayLike, npt.ArrayLike, npt.ArrayLike],
    key: tuple[npt.ArrayLike, npt.ArrayLike],
    num_rounds: int = NUM_ROUNDS,
) -> tuple[U32Array, U32Array, U32Array, U32Array]:
    """The Philox4x32 block function on broadcast arrays of 32-bit words (rounds as commented)."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & MASK32 for c in counter)
    k0, k1 = (np.asarray(k, dtype=np.uint64) & MASK32 for k in key)
    # Own, writable copies of the broadcast words: the rounds below update them in place, which
    # halves the time of the walk's noise against a new array per operation.
    c0, c1, c2, c3 = (np.array(c) for c in np.broadcast_arrays(c0, c1, c2, c3, k0, k1)[:4])
    product_a, product_b = np.empty_like(c0), np.empty_like(c0)
    for _ in range(num_rounds):
        np.multiply(c0, ROUND_A, out=product_a)  # < 2**64: a 32x32-bit product is exact in uint64
        np.multiply(c2, ROUND_B, out=product_b)
        np.right_shift(product_b, SHIFT, out=c0)  # c0' = hi(B * c2) ^ c1 ^ k0
        c0 ^= c1
        c0 ^= k0
        np.bitwise_and(product_b, MASK32, out=c1)  # c1' = lo(B * c2)
        np.right_shift(product_a, SHIFT, out=c2)  # c2' = hi(A * c0) ^ c3 ^ k1
        c2 ^= c3
        c2 ^= k1
        np.bitwise_and(product_a, MASK32, out=c3)  # c3' = lo(A * c0)
        k0 = (k0 + KEY_A) & MASK32  # the key is bumped by (KEY_A, KEY_B)
        k1 = (k1 + KEY_B) & MASK32
    return (c0.astype(np.uint32), c1.astype(np.uint32), c2.astype(np.uint32), c3.astype(np.uint32))


def randint4x(seed: npt.ArrayLike, offsets: npt.ArrayLike) -> tuple[U32Array, U32Array, U32Array, U32Array]:
    """``tl.randint4x(seed, offsets)``: all four Philox words, as uint32, for 64-bit offsets."""
    seed64, offset64 = _as_u64(seed), _as_u64(offsets)
    return philox4x32(
        (offset64 & MASK32, offset64 >> np.uint64(32), np.uint64(0), np.uint64(0)),
        (seed64 & MASK32, seed64 >> np.uint64(32)),
    )


def randint(seed: npt.ArrayLike, offsets: npt.ArrayLike) -> U32Array:
    """``tl.randint(seed, offsets)``: the first Philox word, as uint32, for 64-bit offsets."""
    return randint4x(seed, offsets)[0]


def uint_to_uniform(words: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Triton's ``uint_to_uniform_float`` for 32-bit words: float32 in ``[0, 0.99999994]``."""
    signed = np.asarray(words, dtype=np.uint32).view(np.int32)
    folded = np.where(signed < 0, ~signed, signed)
    return folded.astype(np.float32) * UNIFORM_SCALE


def rand(seed: npt.ArrayLike, offsets: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """``tl.rand(seed, offsets)``: float32 uniforms in ``[0, 1)`` for 64-bit offsets."""
    return uint_to_uniform(randint(seed, offsets))
