"""The filters kernel (`kernels.filters`) against the float64 specification (`reference.filters`): each
row's threshold keeps exactly the specification's kept set, except near pivots.

Allowed differences, and only these: near pivots (`reference.filters.near_pivot` with the kernel's
declared band, ``pivot_band(4.0)``), and tokens whose float64 probability is subnormal or zero, where
float64 itself ties distinct logits (their membership moves no mass). Rows with ``+inf`` logits are
compared by their processed law, which a threshold of ``-inf`` leaves unchanged.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import event, given
from hypothesis import strategies as st

from specsample.kernels import filters, launch
from specsample.kernels.filters import (
    MID_SORT,
    MIN_SHARE,
    SEARCH_PASSES,
    SMALL_SORT,
    WAYS,
    _candidate_masses,
    apply_thresholds,
    default_block_v,
    exact_passes,
    filter_thresholds,
)
from specsample.kernels.rules import order_key
from specsample.reference.filters import FilterParams, kept_tokens, near_pivot, pivot_band, processed_probs
from specsample.reference.law import row_probs

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
BAND = pivot_band(4.0)
# float64's smallest normal: a probability below it is subnormal or zero, and float64 ties distinct logits.
NEGLIGIBLE = 2.0**-1022
INF, NAN = np.inf, np.nan


@dataclass(frozen=True)
class Rows:
    """Logits and per-row parameters; ``None`` leaves a filter off for every row (the kernel's ``HAS_*``)."""

    logits: torch.Tensor
    temperature: npt.NDArray[np.float32]
    top_k: npt.NDArray[np.int64] | None = None
    top_p: npt.NDArray[np.float32] | None = None
    min_p: npt.NDArray[np.float32] | None = None
    top_k_dtype: torch.dtype = torch.int64

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        """``(temperature, top_k, top_p, min_p)`` on the device, ``top_k`` as ``top_k_dtype``."""
        top_k = None if self.top_k is None else torch.as_tensor(self.top_k).to(self.top_k_dtype)
        return tuple(
            None if a is None else torch.as_tensor(a).to(DEVICE)
            for a in (self.temperature, top_k, self.top_p, self.min_p)
        )

    def params(self) -> FilterParams:
        """The specification's parameters, read from the values the kernel reads."""
        rows = self.logits.shape[0]
        off = FilterParams.off(rows)
        return FilterParams(
            off.top_k if self.top_k is None else self.top_k.astype(np.int64),
            off.top_p if self.top_p is None else self.top_p.astype(np.float64),
            off.min_p if self.min_p is None else self.min_p.astype(np.float64),
        )

    def float64(self) -> npt.NDArray[np.float64]:
        """The logits upcast after their own rounding (fp16 and bf16 are exact in float64)."""
        return self.logits.detach().float().cpu().numpy().astype(np.float64)


def _rows(
    logits: npt.ArrayLike,
    temperature: npt.ArrayLike,
    dtype: torch.dtype = torch.float32,
    *,
    top_k: npt.ArrayLike | None = None,
    top_p: npt.ArrayLike | None = None,
    min_p: npt.ArrayLike | None = None,
) -> Rows:
    """Rows of ``logits`` in ``dtype``, each parameter one value or one per row (``None``: off)."""
    z = torch.as_tensor(np.atleast_2d(np.asarray(logits, dtype=np.float64))).to(dtype).to(DEVICE)
    shape = z.shape[:1]
    return Rows(
        z,
        np.broadcast_to(np.asarray(temperature, dtype=np.float32), shape).copy(),
        None if top_k is None else np.broadcast_to(np.asarray(top_k, dtype=np.int64), shape).copy(),
        None if top_p is None else np.broadcast_to(np.asarray(top_p, dtype=np.float32), shape).copy(),
        None if min_p is None else np.broadcast_to(np.asarray(min_p, dtype=np.float32), shape).copy(),
    )


def _thresholds(
    rows: Rows,
    block_v: int | None = None,
    chunks: int | None = None,
    capacity: int | None = None,
    plan: str = "split",
    mass_programs: int | None = None,
) -> npt.NDArray[np.float32]:
    temperature, top_k, top_p, min_p = rows.tensors()
    assert temperature is not None
    t = filter_thresholds(
        rows.logits, temperature, top_k, top_p, min_p, block_v=block_v, chunks=chunks, capacity=capacity,
        plan=plan, mass_programs=mass_programs,
    )  # fmt: skip
    assert t.shape == (rows.logits.shape[0],) and t.dtype == torch.float32 and t.device == rows.logits.device
    return t.cpu().numpy()


def _both_plans(rows: Rows, block_v: int | None = None) -> npt.NDArray[np.float32]:
    """The thresholds of the split plan, which the rows plan's equal (cases without near pivots)."""
    split = _thresholds(rows, block_v, plan="split")
    np.testing.assert_array_equal(_thresholds(rows, block_v, plan="rows"), split)
    return split


def _cut_short(rows: Rows, passes: int, ways: int = WAYS, block_v: int = 64) -> npt.NDArray[np.float32]:
    """The thresholds of searches by passes alone (no sort), of ``ways`` keys, stopped after ``passes``."""
    temperature, top_k, top_p, min_p = rows.tensors()
    assert temperature is not None
    t = filter_thresholds(
        rows.logits, temperature, top_k, top_p, min_p, block_v=block_v, capacity=0, search_passes=passes,
        search_ways=ways, plan="split",
    )  # fmt: skip
    return t.cpu().numpy()


@dataclass(frozen=True)
class Comparison:
    """The kernel's kept sets against the specification's, ``[R, V]`` each."""

    kernel: npt.NDArray[np.bool_]
    reference: npt.NDArray[np.bool_]
    near: npt.NDArray[np.bool_]
    negligible: npt.NDArray[np.bool_]
    infinite_rows: npt.NDArray[np.bool_]

    @property
    def unexplained(self) -> list[tuple[int, int]]:
        """``(row, token)`` of every difference that is neither a near pivot nor a negligible token."""
        differ = (
            (self.kernel != self.reference) & ~self.near & ~self.negligible & ~self.infinite_rows[:, None]
        )
        return [(int(r), int(x)) for r, x in zip(*np.nonzero(differ), strict=True)]

    @property
    def near_differences(self) -> int:
        """How many near pivots the kernel decides otherwise (rows with ``+inf`` logits aside)."""
        return int(((self.kernel != self.reference) & self.near & ~self.infinite_rows[:, None]).sum())

    @property
    def negligible_differences(self) -> int:
        """How many negligible tokens (no near pivot) the kernel decides otherwise (``+inf`` rows aside)."""
        differ = (self.kernel != self.reference) & self.negligible & ~self.near
        return int((differ & ~self.infinite_rows[:, None]).sum())


def _compare(rows: Rows, thresholds: npt.NDArray[np.float32]) -> Comparison:
    z = rows.float64()
    t64 = rows.temperature.astype(np.float64)
    params = rows.params()
    clean = np.where(np.isnan(z), -INF, z)
    with np.errstate(invalid="ignore", divide="ignore"):
        near = near_pivot(z, t64, params, BAND)
        probs = row_probs(z, np.where(t64 > 0, t64, 1.0))
    sampled = (t64 > 0)[:, None]
    return Comparison(
        kernel=clean >= thresholds.astype(np.float64)[:, None],
        reference=kept_tokens(z, t64, params),
        near=near,
        negligible=sampled & (probs < NEGLIGIBLE),
        infinite_rows=np.asarray(np.isposinf(clean).any(axis=1)),
    )


def _check(rows: Rows, thresholds: npt.NDArray[np.float32]) -> Comparison:
    """Every property of the thresholds of ``rows``; returns the comparison for further checks."""
    z = rows.float64()
    clean = np.where(np.isnan(z), -INF, z)
    comparison = _compare(rows, thresholds)
    assert comparison.unexplained == []
    for r, t in enumerate(thresholds):
        # The largest token is always kept; t is -inf or a logit of the row, -inf where all are kept.
        assert clean[r].max() >= t
        assert t == -INF or t in clean[r]
        assert t == -INF or not comparison.kernel[r].all()
        if rows.temperature[r] <= 0 or np.isposinf(clean[r]).any() or np.isneginf(clean[r].max()):
            assert t == -INF
    # Rows with +inf logits: the processed law of the kernel's kept set is the specification's.
    infinite = np.nonzero(comparison.infinite_rows)[0]
    if infinite.size:
        t64 = rows.temperature.astype(np.float64)[infinite]
        masked = np.where(comparison.kernel[infinite], z[infinite], -INF)
        with np.errstate(invalid="ignore"):
            expected = processed_probs(z[infinite], t64, rows.params().take(infinite))
            actual = row_probs(masked, t64)
        np.testing.assert_array_equal(actual, expected)
    return comparison


# ---------------------------------------------------------------------------------------------
# Generated rows

TEMPERATURES = (0.0, 1e-3, 0.05, 0.3, 1.0, 1.7, 50.0, 1e6)
TOP_PS = (1.0, 1.0 - 2.0**-24, 0.999, 0.9, 0.5, 0.1, 1e-6)
MIN_PS = (0.0, 1e-30, 1e-6, 0.05, 0.5, 0.9, 0.999)
VOCAB_SIZES = (1, 2, 3, 7, 16, 17, 100, 255, 1000, 1025, 2000)


def _row_logits(
    rng: np.random.Generator, kind: str, vocab_size: int, scale: float
) -> npt.NDArray[np.float64]:
    """One row of logits: ``normal``, ``rounded`` (exact ties everywhere, so at the pivots),
    ``plateau`` (a few levels), ``holes`` (-inf and NaN entries), ``empty`` (no finite logit),
    ``infinite`` (+inf entries)."""
    z: npt.NDArray[np.float64] = rng.normal(size=vocab_size) * scale
    if kind == "rounded":
        z = np.round(z * 2) / 2
    elif kind == "plateau":
        z = rng.integers(0, 3, vocab_size).astype(np.float64) * scale
    elif kind == "holes":
        z[rng.random(vocab_size) < 0.3] = -INF
        z[rng.random(vocab_size) < 0.1] = NAN
    elif kind == "empty":
        z = np.where(rng.random(vocab_size) < 0.5, -INF, NAN)
    elif kind == "infinite":
        z[rng.integers(0, vocab_size, 1 + vocab_size // 50)] = INF
    return z


@st.composite
def filtered_rows(draw: st.DrawFn) -> tuple[Rows, int | None, int | None, int | None, str, int | None]:
    """A few rows over one vocabulary with a mix of filters, a tile width, a chunk count, a sort
    capacity, a launch plan and the programs of top-p's passes (``None``: the defaults; the rows plan
    takes a tile width alone)."""
    vocab_size = draw(st.one_of(st.sampled_from(VOCAB_SIZES), st.integers(1, 2000)))
    num_rows = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kinds = draw(
        st.lists(
            st.sampled_from(("normal", "normal", "rounded", "plateau", "holes", "empty", "infinite")),
            min_size=num_rows,
            max_size=num_rows,
        )
    )
    scales = draw(st.lists(st.sampled_from((0.1, 1.0, 4.0, 30.0)), min_size=num_rows, max_size=num_rows))
    logits = np.stack([_row_logits(rng, k, vocab_size, s) for k, s in zip(kinds, scales, strict=True)])
    dtype = draw(st.sampled_from((torch.float32, torch.float16, torch.bfloat16)))

    def per_row(values: st.SearchStrategy[float]) -> list[float]:
        return draw(st.lists(values, min_size=num_rows, max_size=num_rows))

    temperature = per_row(st.one_of(st.sampled_from(TEMPERATURES), st.floats(1e-3, 10.0)))
    top_k = top_p = min_p = None
    if draw(st.booleans()):
        top_k = per_row(st.one_of(st.sampled_from((0, 1, 2, 3)), st.integers(0, vocab_size + 2)))
    if draw(st.booleans()):
        top_p = per_row(st.one_of(st.sampled_from(TOP_PS), st.floats(1e-6, 1.0)))
    if draw(st.booleans()):
        min_p = per_row(st.one_of(st.sampled_from(MIN_PS), st.floats(0.0, 0.999)))
    rows = _rows(logits, temperature, dtype, top_k=top_k, top_p=top_p, min_p=min_p)
    rows = dataclasses.replace(rows, top_k_dtype=draw(st.sampled_from((torch.int32, torch.int64))))
    # Tile widths from 16 lanes up, at most 8 tiles a row (the interpreter's time grows with tiles).
    block_v = draw(st.sampled_from((None, 16, 64, 256)))
    if block_v is not None and vocab_size > 8 * block_v:
        block_v = None
    # Rows shared by several programs, as on a GPU (one chunk is the interpreter's default).
    chunks = draw(st.sampled_from((None, 1, 2, 3, 8)))
    # Searches that sort nothing, sort few tokens (the passes narrow first) or many (a GPU's 8,192
    # costs the interpreter about a minute a row); at 300, chunks' regions of 64 keys (8 chunks) to
    # 512 (one), which candidates crowded into one chunk overflow while the row's count fits.
    capacity = draw(st.sampled_from((None, 0, 1, 7, 64, 300)))
    # Top-p's passes with a program a chunk (the interpreter's default) or fewer, each taking every
    # G-th chunk of its row (a GPU's `default_mass_programs`).
    mass_programs = draw(st.sampled_from((None, 1, 2)))
    plan = draw(st.sampled_from(("split", "rows")))
    if plan == "rows":
        chunks = capacity = mass_programs = None
    return rows, block_v, chunks, capacity, plan, mass_programs


@given(case=filtered_rows())
def test_thresholds_keep_the_specification_kept_set(
    case: tuple[Rows, int | None, int | None, int | None, str, int | None],
) -> None:
    """The kernel's ``{z >= t}`` equals `reference.filters.kept_tokens` except near pivots and
    negligible tokens, in either launch plan, however many programs share a row and its top-p
    passes; the max is kept; ``t`` is ``-inf`` or a logit of its row; greedy rows, rows without a
    finite logit and rows with ``+inf`` logits keep everything; whether the searches sort their last
    tokens, narrow to one key or bisect (the rows plan)."""
    rows, block_v, chunks, capacity, plan, mass_programs = case
    event(f"plan: {plan}")
    comparison = _check(rows, _thresholds(rows, block_v, chunks, capacity, plan, mass_programs))
    event(f"near-pivot differences: {min(comparison.near_differences, 1)}")
    event(f"negligible differences: {min(comparison.negligible_differences, 1)}")


@pytest.mark.parametrize("capacity", [0, None])
def test_a_cold_rows_top_p_pivot_is_its_max(capacity: int | None) -> None:
    """A row at T = 0.001 whose min-p (0.25) and top-p (``1 - 2**-24``) keep its max alone gets the
    max's own logit as threshold, not a value just below it: the example the GPU profile of
    `test_thresholds_keep_the_specification_kept_set` found on an H200 (seed 250, V = 484, Gaussian
    logits at a scale of 30, a search by passes alone), where the kernel returned 93.446434 for a
    max of 93.44644 (the kept set was right): the compaction kernel computed top-p's second-pass
    cuts again and one rounded to the key below the max (`_pass_cuts`)."""
    rng = np.random.default_rng(250)
    logits = np.stack([_row_logits(rng, "normal", 484, 30.0), _row_logits(rng, "normal", 484, 0.1)])
    rows = _rows(logits, [0.001, 0.0], top_p=[0.99999994, 1.0], min_p=[0.25, 0.0])
    t = _thresholds(rows, capacity=capacity)
    assert t[0] == np.float32(logits[0].max()), (t[0], logits[0].max())
    _check(rows, t)


@pytest.mark.parametrize("capacity", [0, None])
def test_cold_rows_keep_their_max_alone_at_its_own_logit(capacity: int | None) -> None:
    """Rows whose filters keep the max alone (T = 1e-3 and 1e-4 over Gaussian logits at a scale of
    30, where the next token weighs ``exp(-1000)`` or less; min-p 0.25, top-p ``1 - 2**-24``) all get
    the max as threshold: top-p's chunked passes space their last cuts a few ulps below the max,
    where a cut recomputed in another kernel can round to the neighbouring key (`_pass_cuts`; on an
    H200 the pinned row above got the value one ulp below its max before the cuts were recorded).
    256 rows on a GPU, 16 under the interpreter."""
    rows_count = 256 if DEVICE == "cuda" else 16
    rng = np.random.default_rng(31)
    logits = rng.normal(size=(rows_count, 484)) * 30.0
    temperature = np.where(np.arange(rows_count) % 2 == 0, 1e-3, 1e-4)
    rows = _rows(logits, temperature, top_p=0.99999994, min_p=0.25)
    t = _thresholds(rows, capacity=capacity)
    maxima = logits.astype(np.float32).max(axis=1)
    wrong = np.nonzero(t != maxima)[0]
    assert wrong.size == 0, [(int(r), float(t[r]), float(maxima[r])) for r in wrong[:8]]
    _check(rows, t)


# ---------------------------------------------------------------------------------------------
# The conventions, one case each


def _kept(rows: Rows, block_v: int | None = None) -> list[list[int]]:
    thresholds = _both_plans(rows, block_v)
    comparison = _check(rows, thresholds)
    assert (comparison.kernel == comparison.reference).all()
    return [np.nonzero(row)[0].tolist() for row in comparison.kernel]


def test_top_k_then_top_p_over_the_renormalised_mass() -> None:
    """SGLang #36173's vector: top-k 4 keeps [.35, .25, .20, .05]; top-p .82 over that renormalised
    law keeps three; top-p alone keeps four."""
    logits = np.log([0.35, 0.25, 0.20, 0.05, 0.03, 0.03, 0.03, 0.03, 0.03])
    assert _kept(_rows(logits, 1.0, top_k=4, top_p=0.82)) == [[0, 1, 2]]
    assert _kept(_rows(logits, 1.0, top_p=0.82)) == [[0, 1, 2, 3]]


def test_top_p_keeps_the_token_that_crosses_it() -> None:
    """The token whose mass crosses ``top_p`` is kept: the mass above 0.1 is 0.8 < 0.85."""
    logits = np.log([0.5, 0.3, 0.1, 0.06, 0.04])
    assert _kept(_rows(logits, 1.0, top_p=0.85)) == [[0, 1, 2]]
    assert _kept(_rows(logits, 1.0, top_p=0.75)) == [[0, 1]]


def test_ties_at_a_pivot_are_kept_whole() -> None:
    """Top-k 2 keeps every token tied with the second value (signed zeros tie); top-p keeps a tie whole;
    min-p keeps the tokens tied with its threshold's token."""
    logits = [3.0, 2.0, -1.0, 2.0, 2.0, 1.0]
    assert _kept(_rows(logits, 1.0, top_k=2)) == [[0, 1, 3, 4]]
    assert _kept(_rows([1.0, 0.0, -0.0, -1.0, 0.0], 1.0, top_k=2)) == [[0, 1, 2, 4]]
    assert _kept(_rows(logits, 1.0, top_p=0.5)) == [[0, 1, 3, 4]]
    assert _kept(_rows(logits, 1.0, top_k=1, top_p=0.5)) == [[0]]
    assert _kept(_rows([0.0, -1.0, -2.0, -1.0], 1.0, min_p=0.3)) == [[0, 1, 3]]


def test_adjacent_float32_values_are_told_apart() -> None:
    """Logits one float32 ulp apart at both ends of a search: top-k 1 and a tiny top-p keep the max
    alone, not the value one ulp below it; top-k ``V - 1`` drops only the least value, one ulp below
    the next."""
    below_max = float(np.nextafter(np.float32(1.0), np.float32(0.0)))
    above_least = float(np.nextafter(np.float32(-3.0), np.float32(0.0)))
    logits = [[1.0, below_max, 0.5, above_least, -3.0]] * 3
    rows = _rows(logits, 1.0, top_k=[1, 0, 4], top_p=[1.0, 1e-6, 1.0])
    assert _kept(rows) == [[0], [0], [0, 1, 2, 3]]
    np.testing.assert_array_equal(_both_plans(rows, 16), [1.0, 1.0, above_least])


def test_a_kth_value_of_probability_zero_keeps_everything() -> None:
    """At ``T = 1e-3`` the third value's probability rounds to zero in float64 and ties with every zero
    (``-inf`` included): top-k 3 keeps every token (``t = -inf``); top-k 1 keeps the max."""
    logits = [[0.0, -1.0, -2.0, -3.0, -INF], [0.0, -1.0, -2.0, -3.0, -INF]]
    rows = _rows(logits, 1e-3, top_k=[3, 1])
    assert _kept(rows) == [[0, 1, 2, 3, 4], [0]]
    np.testing.assert_array_equal(_both_plans(rows), [-INF, 0.0])


def test_a_kth_value_within_log_v_of_zero_is_decided_by_the_rows_sum() -> None:
    """The statistics pass makes no sum in rows whose top-k filters; the start kernel makes it where
    the bound below the ``k``-th value lies within ``log V`` of zero's log probability. Third value
    ``-744.6`` at ``T = 1``: over a sum of 2 its probability rounds to zero (top-k 3 keeps everything,
    and the kept sum is the row's), over ``1 + e**-1`` it does not (top-k 3 keeps three tokens). V =
    64: four tiles of maxima, at least ``k``, so the statistics pass makes no sum."""
    logits = np.full((2, 64), -800.0)
    logits[:, :3] = [[0.0, 0.0, -744.6], [0.0, -1.0, -744.6]]
    rows = _rows(logits, 1.0, top_k=3)
    assert _kept(rows) == [list(range(64)), [0, 1, 2]]
    np.testing.assert_array_equal(_both_plans(rows), [-INF, np.float32(-744.6)])
    temperature, top_k, _, _ = rows.tensors()
    kept = torch.full((2, 2), np.nan, device=DEVICE)
    # (A capacity that sorts all 64 tokens: the kept sum of top-k's candidates is then known too.)
    filter_thresholds(rows.logits, temperature, top_k, plan="split", kept=kept, capacity=64)
    np.testing.assert_allclose(kept[1].cpu().numpy(), [2.0, 1.0 + np.exp(-1.0)], rtol=1e-6)


def test_min_p_binding_under_top_k_gives_its_smallest_kept_logit() -> None:
    """Top-k 900 of V = 1,000 with min-p 0.05 on Gaussian logits: min-p keeps 3 to 15 tokens, fewer than
    k, so ``t`` is the smallest logit min-p keeps. The select kernel takes it from top-k's sorted
    candidates (the default capacity holds them), or, where they were too many to sort (capacity 1),
    from a pass over the row; both equal the least logit of the specification's kept set, in any
    number of chunks."""
    rng = np.random.default_rng(11)
    logits = rng.standard_normal((3, 1000)) * 3.0
    rows = _rows(logits, [1.0, 0.7, 1.3], top_k=900, min_p=0.05)
    z = rows.float64()
    kept = kept_tokens(z, rows.temperature.astype(np.float64), rows.params())
    smallest = np.where(kept, z, INF).min(axis=1).astype(np.float32)
    assert kept.sum(axis=1).min() > 1 and kept.sum(axis=1).max() < 900
    for capacity, chunks in ((None, None), (None, 3), (1, None), (1, 3)):
        np.testing.assert_array_equal(_thresholds(rows, chunks=chunks, capacity=capacity), smallest)
    _check(rows, smallest)


def test_float64_ties_distinct_logits_at_subnormal_probabilities() -> None:
    """At ``T = 1e-3`` two distinct logits get the same subnormal float64 probability: the
    specification's top-k 2 keeps both as a tie, the kernel keeps the value pivot only. The
    difference is a negligible token's (it moves under ``2**-1022`` of mass), the only kind besides near
    pivots that the comparison allows."""
    rows = _rows([0.0, -0.7401, -0.740101, -2.0], 1e-3, top_k=2)
    comparison = _check(rows, _both_plans(rows))
    assert comparison.kernel.tolist() == [[True, True, False, False]]
    assert comparison.reference.tolist() == [[True, True, True, False]]
    assert comparison.negligible_differences == 1 and comparison.near_differences == 0


def test_rows_that_filter_nothing_keep_everything() -> None:
    """Greedy rows, rows with every filter off, rows without a finite logit and rows with ``+inf``
    logits get ``t = -inf``; a +inf row's processed law is uniform over its +inf entries."""
    logits = [
        [2.0, 1.0, 0.0, -1.0],  # greedy
        [2.0, 1.0, 0.0, -1.0],  # filters off
        [NAN, -INF, NAN, -INF],  # no finite logit
        [INF, 1.0, INF, 0.0],  # +inf entries
    ]
    rows = _rows(
        logits, [0.0, 1.0, 1.0, 1.0], top_k=[1, 0, 1, 1], top_p=[0.5, 1.0, 0.5, 0.5], min_p=[0.5, 0, 0.5, 0.5]
    )
    np.testing.assert_array_equal(_both_plans(rows), [-INF] * 4)
    _check(rows, _both_plans(rows))
    np.testing.assert_array_equal(_both_plans(_rows(logits, 1.0)), [-INF] * 4)
    # A row whose filters happen to keep every token.
    np.testing.assert_array_equal(_both_plans(_rows([0.0, -1.0, -2.0], 1.0, top_k=3, min_p=1e-3)), [-INF])


# ---------------------------------------------------------------------------------------------
# A search cut short is caught


def test_a_search_cut_short_disagrees_with_the_specification() -> None:
    """Searching by passes alone (no sort), one pass of 4 keys instead of `exact_passes` stops the
    top-k search far below the k-th value (it keeps extra tokens) and the top-p search far above the
    crossing token (it drops kept ones): the comparison reports tokens that are no near pivot. With
    `SEARCH_PASSES` passes of `WAYS` keys, or with the default sort, it reports none."""
    logits = np.linspace(-3.0, 3.0, 200)
    for params in ({"top_k": 5}, {"top_p": 0.5}, {"min_p": 0.01, "top_k": 20, "top_p": 0.9}):
        rows = _rows(np.stack([logits, logits[::-1] * 0.5]), [1.0, 0.7], **params)
        assert _compare(rows, _cut_short(rows, SEARCH_PASSES)).unexplained == []
        assert _compare(rows, _thresholds(rows)).unexplained == []
        short = _compare(rows, _cut_short(rows, 1, 4))
        assert len(short.unexplained) >= 2, params
        assert {r for r, _ in short.unexplained} == {0, 1}
    # The keys of float32 values span fewer than 2**32: after the pass by value, SEARCH_PASSES - 1
    # passes by key of WAYS keys each narrow them to one.
    assert exact_passes(WAYS) == SEARCH_PASSES
    assert WAYS ** (SEARCH_PASSES - 2) < 2**32 <= WAYS ** (SEARCH_PASSES - 1)


@pytest.mark.parametrize("ways", [2, 4, 8, 32])
def test_every_search_width_finds_the_same_thresholds(ways: int) -> None:
    """A search by passes alone of any width with `exact_passes` passes (bisection at 2 ways) ends on
    the same exact pivots as `SEARCH_PASSES` passes of `WAYS` ways, and as the searches that sort
    their last tokens (every capacity)."""
    rng = np.random.default_rng(11)
    logits = np.round(rng.normal(size=(3, 300)) * 8) / 8
    logits[1, :5] = np.nextafter(np.float32(2.5), np.float32(0.0))
    rows = _rows(logits, [1.0, 0.4, 3.0], top_k=[7, 40, 0], top_p=[0.8, 0.95, 0.3], min_p=[0.0, 0.02, 0.1])
    expected = _cut_short(rows, SEARCH_PASSES)
    _check(rows, expected)
    np.testing.assert_array_equal(_cut_short(rows, exact_passes(ways), ways), expected)
    for capacity in (1, 16, 300):
        np.testing.assert_array_equal(_thresholds(rows, capacity=capacity), expected)


def test_each_sort_width_reads_off_the_same_pivots() -> None:
    """Candidates sorted in each of `_sort_in_place`'s tiles (at most `SMALL_SORT`, at most `MID_SORT`,
    the full capacity of 2,048), and top-p's pivot read off them in that width, give the pivots that a
    search by passes alone finds. V = 3,000 in 47 maxima tiles of 64 tokens (the interpreter's): ``L``
    large logits fill the first tiles and every other tile's maximum is 1, so top-k's bound (at or
    below the ``k``-th largest tile maximum, at or above the least) is 1 and ``L`` tokens and a token
    a tile are its candidates; top-p then cuts the top-k's."""
    rng = np.random.default_rng(5)
    vocab, tile = 3000, 64
    large, ks = (200, 600, 1500), (10, 20, 30)
    logits = np.empty((3, vocab))
    for r, count in enumerate(large):
        logits[r, :count] = 100 + rng.permutation(count) / 16
        logits[r, count:] = rng.permutation(vocab - count) / vocab
        ends = np.minimum(np.arange(tile - 1, vocab + tile - 1, tile), vocab - 1)
        logits[r, ends[ends >= count]] = 1.0
    maxima = np.sort(np.pad(logits, ((0, 0), (0, -vocab % tile)), constant_values=-np.inf)
                     .reshape(3, -1, tile).max(axis=2), axis=1)[:, ::-1]  # fmt: skip
    fewest = [int((logits[r] >= maxima[r, k - 1]).sum()) for r, k in enumerate(ks)]
    most = [int((logits[r] >= maxima[r, -1]).sum()) for r in range(3)]
    assert most[0] <= SMALL_SORT.value < fewest[1] <= most[1] <= MID_SORT.value < fewest[2] <= most[2] <= 2048
    for top_p in ([1.0, 1.0, 0.9], [0.8, 0.6, 0.9]):
        rows = _rows(logits, [1.0, 1.0, 4.0], top_k=ks, top_p=top_p)
        expected = _cut_short(rows, SEARCH_PASSES)
        _check(rows, expected)
        np.testing.assert_array_equal(_thresholds(rows, capacity=2048), expected)


def test_candidates_crowded_into_one_chunk_are_compacted_by_the_rows_program() -> None:
    """A row whose candidates crowd one chunk past its region (`MIN_SHARE` keys) while the row's
    count fits the capacity: its program compacts them itself, and the pivots are a search's by
    passes alone. V = 3,000 in 8 chunks of 384 tokens. Top-k 20: 600 large logits in the first 600
    tokens, so the bound is a small logit and chunk 0's 384 tokens are all candidates. Top-p 0.5 at
    T = 2: 384 large logits, ascending, fill chunk 0, and its last interval holds most of them."""
    rng = np.random.default_rng(9)
    vocab = 3000
    logits = rng.permutation(vocab)[None, :].repeat(2, axis=0) / vocab
    logits[0, :600] = 100 + rng.permutation(600) / 1000
    logits[1, :384] = 100 + np.arange(384) / 1000
    rows = _rows(logits, [1.0, 2.0], top_k=[20, 0], top_p=[1.0, 0.5])
    assert MIN_SHARE < 384  # chunk 0's tokens
    expected = _cut_short(rows, SEARCH_PASSES)
    _check(rows, expected)
    np.testing.assert_array_equal(_thresholds(rows, block_v=128, chunks=8, capacity=2048), expected)


# ---------------------------------------------------------------------------------------------
# Memory: rows are read within their vocabulary


@pytest.mark.parametrize(
    ("block_v", "chunks", "plan"),
    [
        (16, None, "split"),
        (16, 2, "split"),
        (16, 3, "split"),
        (64, None, "split"),
        (None, None, "split"),
        (16, None, "rows"),
        (None, None, "rows"),
    ],
)
@pytest.mark.parametrize("pad", [INF, 1e30, NAN, -INF])
def test_rows_are_read_within_their_vocabulary(
    block_v: int | None, chunks: int | None, plan: str, pad: float
) -> None:
    """Rows of a strided view whose padding holds ``pad``: the thresholds are those of a contiguous copy,
    and the padding is never kept, counted or summed (any read of it would change them), whether one
    program or several (chunks of whole tiles, the last one short) read a row, or a program reads
    several rows (the rows plan, in one tile or several)."""
    rng = np.random.default_rng(7)
    vocab_size, stride = 37, 53
    storage = np.full((3, stride), pad)
    storage[:, :vocab_size] = np.round(rng.normal(size=(3, vocab_size)) * 4) / 4
    padded = torch.as_tensor(storage, dtype=torch.float32).to(DEVICE)
    view = padded[:, :vocab_size]
    assert view.stride() == (stride, 1)
    copy = _rows(
        view.cpu().numpy(), [1.0, 0.5, 2.0], top_k=[3, 0, 36], top_p=[1.0, 0.7, 0.95], min_p=[0.0, 0.01, 0.2]
    )
    as_view = Rows(view, copy.temperature, copy.top_k, copy.top_p, copy.min_p)
    thresholds = _thresholds(as_view, block_v, chunks, plan=plan)
    np.testing.assert_array_equal(thresholds, _thresholds(copy, block_v, chunks, plan=plan))
    _check(as_view, thresholds)
    assert (thresholds > -INF).all()


# ---------------------------------------------------------------------------------------------
# The Python entry points


def test_apply_thresholds_masks_below_the_threshold() -> None:
    """`apply_thresholds` keeps ``z >= t`` in the logits' dtype, and sets the rest and every NaN to -inf."""
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        logits = torch.tensor([[1.0, NAN, 0.5, -INF, 0.25], [NAN, 0.0, -1.0, 2.0, -INF]], dtype=dtype).to(
            DEVICE
        )
        masked = apply_thresholds(logits, torch.tensor([0.5, -INF], device=DEVICE))
        assert masked.dtype == dtype and masked.device == logits.device
        expected = torch.tensor([[1.0, -INF, 0.5, -INF, -INF], [-INF, 0.0, -1.0, 2.0, -INF]], dtype=dtype)
        assert torch.equal(masked.cpu(), expected)
    with pytest.raises(ValueError, match=r"thresholds is \(3,\); expected \[R\] = \[2\]"):
        apply_thresholds(torch.zeros(2, 4), torch.zeros(3))


def test_unfiltered_calls_and_empty_batches() -> None:
    """No parameter at all keeps everything; zero rows give an empty output; the default tile width
    covers the vocabulary up to its cap."""
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    t = filter_thresholds(logits, torch.ones(3, device=DEVICE))
    assert torch.equal(t.cpu(), torch.full((3,), -INF))
    empty = filter_thresholds(torch.zeros(0, 5, device=DEVICE), torch.zeros(0, device=DEVICE))
    assert empty.shape == (0,) and empty.dtype == torch.float32
    assert [default_block_v(v) for v in (1, 17, 1000, 5000, 200000)] == [16, 32, 1024, 1024, 1024]


def _bad_call(case: str) -> dict[str, object]:
    rows = 2
    args: dict[str, object] = {
        "logits": torch.zeros(rows, 8),
        "temperature": torch.ones(rows),
        "top_k": torch.zeros(rows, dtype=torch.int32),
        "top_p": torch.ones(rows),
        "min_p": torch.zeros(rows),
    }
    name, _, value = case.partition("=")
    args[name] = {
        "logits:list": [[0.0] * 8] * rows,
        "logits:1d": torch.zeros(8),
        "logits:f64": torch.zeros(rows, 8, dtype=torch.float64),
        "logits:empty": torch.zeros(rows, 0),
        "logits:columns": torch.zeros(8, rows).t(),
        "temperature:f64": torch.ones(rows, dtype=torch.float64),
        "temperature:short": torch.ones(rows + 1),
        "temperature:negative": torch.tensor([1.0, -0.5]),
        "temperature:nan": torch.tensor([NAN, 1.0]),
        "top_k:float": torch.zeros(rows),
        "top_k:negative": torch.tensor([0, -3], dtype=torch.int64),
        "top_p:zero": torch.tensor([1.0, 0.0]),
        "top_p:above": torch.tensor([1.5, 1.0]),
        "min_p:one": torch.tensor([0.0, 1.0]),
        "min_p:negative": torch.tensor([-0.25, 0.0]),
        "min_p:list": [0.0, 0.0],
        "out:short": torch.empty(rows + 1),
        "out:strided": torch.empty(2 * rows)[::2],
        "kept:f64": torch.empty(2, rows, dtype=torch.float64),
        "kept:shape": torch.empty(3, rows),
        "kept:columns": torch.empty(rows, 2).t(),
    }[f"{name}:{value}"]
    return args


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("logits=list", r"logits has type list; expected a torch.Tensor"),
        ("logits=1d", r"logits has shape \(8,\); expected \[R, V\]"),
        ("logits=f64", r"logits has dtype torch.float64; expected one of float32, float16, bfloat16"),
        ("logits=empty", r"logits has vocab size 0; expected V >= 1"),
        ("logits=columns", r"logits has stride \(1, 2\); rows must be contiguous"),
        ("temperature=f64", r"temperature has dtype torch.float64; expected one of float32"),
        ("temperature=short", r"temperature has shape \(3,\); expected \[R\] = \[2\]"),
        ("temperature=negative", r"temperature\[1\] is -0.5; expected a finite value >= 0"),
        ("temperature=nan", r"temperature\[0\] is nan; expected a finite value >= 0"),
        ("top_k=float", r"top_k has dtype torch.float32; expected one of int32, int64"),
        ("top_k=negative", r"top_k\[1\] is -3; expected k >= 0"),
        ("top_p=zero", r"top_p\[1\] is 0.0; expected a value in \(0, 1\]"),
        ("top_p=above", r"top_p\[0\] is 1.5; expected a value in \(0, 1\]"),
        ("min_p=one", r"min_p\[1\] is 1.0; expected a value in \[0, 1\)"),
        ("min_p=negative", r"min_p\[0\] is -0.25; expected a value in \[0, 1\)"),
        ("min_p=list", r"min_p has type list; expected a torch.Tensor"),
        ("out=short", r"out has shape \(3,\); expected \[R\] = \[2\]"),
        ("out=strided", r"out has stride \(2,\); expected a contiguous \[R\] tensor"),
        ("kept=f64", r"kept has dtype torch.float64; expected float32"),
        ("kept=shape", r"kept has shape \(3, 2\); expected \[2, R\] = \[2, 2\]"),
        ("kept=columns", r"kept has stride \(1, 2\); its rows must be contiguous"),
    ],
)
def test_bad_inputs_raise_naming_the_argument_and_value(case: str, message: str) -> None:
    """Each bad argument raises a ValueError naming it and its value, before anything is launched."""
    with pytest.raises(ValueError, match=message):
        filter_thresholds(**_bad_call(case))  # type: ignore[arg-type]


def test_bad_tile_width_and_unchecked_values() -> None:
    """A tile width that is no power of two >= 16, a search width that is no power of two >= 2, no
    pass, no chunk, no program for top-p's passes, a negative capacity or an unknown plan is refused,
    and so is an argument of the split plan given to the rows plan; with values unchecked,
    out-of-range parameters still keep the max in either plan: ``k < 0`` is off, ``min_p >= 1`` and
    ``top_p <= 0`` keep its ties."""
    logits = torch.tensor([[3.0, 1.0, 3.0, 2.0]] * 3, device=DEVICE)
    ones = torch.ones(3, device=DEVICE)
    refused = {
        r"block_v is 24; expected a power of two >= 16": {"block_v": 24},
        r"search_ways is 12; expected a power of two >= 2": {"search_ways": 12, "plan": "split"},
        r"search_passes is 0; expected an int >= 1": {"search_passes": 0, "plan": "split"},
        r"capacity is -1; expected an int in \[0, 16384\]": {"capacity": -1, "plan": "split"},
        r"chunks is 0; expected an int >= 1": {"chunks": 0, "plan": "split"},
        r"mass_programs is 0; expected an int >= 1": {"mass_programs": 0, "plan": "split"},
        r"mass_programs is 2; it shapes the split plan": {"mass_programs": 2, "plan": "rows"},
        r"plan is 'diagonal'; expected one of split, rows": {"plan": "diagonal"},
        r"capacity is 8; it shapes the split plan, and the plan is 'rows'": {"capacity": 8, "plan": "rows"},
    }
    for message, bad in refused.items():
        with pytest.raises(ValueError, match=message):
            filter_thresholds(logits, ones, top_k=torch.ones(3, dtype=torch.int32, device=DEVICE), **bad)  # type: ignore[arg-type]
    for plan in ("split", "rows"):
        t = filter_thresholds(
            logits,
            ones,
            torch.tensor([-2, 0, 0], device=DEVICE),
            torch.tensor([1.0, 1.0, 0.0], device=DEVICE),
            torch.tensor([0.0, 1.5, 0.0], device=DEVICE),
            check_values=False,
            plan=plan,
        )
        np.testing.assert_array_equal(t.cpu().numpy(), [-INF, 3.0, 3.0])


# Compiles the rows plan's kernel and the masking kernel for sm_90 in a process of its own (this one
# runs the interpreter, which neither type-checks nor compiles): `triton.compile` needs no GPU. Each
# launch is intercepted and compiled with the argument types of a real call, the GPU's tile sizes.
_COMPILE = """
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specsample.kernels import filters

TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "i32",
         torch.int64: "i64"}
filters.ROWS_TILE_ELEMENTS["cpu"], filters.ROWS_MAX_BLOCK_V["cpu"] = 2**10, 256


class Compile:
    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            values = {**dict(zip(self.kernel.arg_names, args)), **kwargs}
            signature, constexprs = {}, {}
            for index, name in enumerate(self.kernel.arg_names):
                value = values[name]
                if index in self.kernel.constexprs:
                    signature[name], constexprs[(index,)] = "constexpr", value
                elif isinstance(value, torch.Tensor):
                    signature[name] = "*" + TYPES[value.dtype]
                else:
                    signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            source = ASTSource(fn=self.kernel, signature=signature, constexprs=constexprs)
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
            assert "cubin" in compiled.asm, self.kernel.__name__
            print(self.kernel.__name__, "compiled")
        return launch


filters.filter_rows_kernel = Compile(filters.filter_rows_kernel)
filters.apply_threshold_kernel = Compile(filters.apply_threshold_kernel)
ones = torch.ones(3)
for vocab_size, dtype in [(200, torch.float32), (1000, torch.bfloat16)]:
    logits = torch.zeros(3, vocab_size, dtype=dtype)
    filters.filter_thresholds(logits, ones, torch.full((3,), 5, dtype=torch.int32), ones * 0.9, ones * 0.1,
                              plan="rows", check_values=False)
    filters.apply_thresholds(logits, ones)
"""


def test_the_rows_plan_and_the_masking_compile_for_the_gpu_without_one(tmp_path: pathlib.Path) -> None:
    """The rows plan's kernel (its vocabulary in one tile and in several) and the masking kernel compile
    to sm_90 cubins: the interpreter runs code a compiler refuses."""
    environment = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", _COMPILE], env=environment, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("compiled") == 4, result.stdout


def _skipped(
    monkeypatch: pytest.MonkeyPatch, rows: Rows, capacity: int
) -> tuple[list[int], npt.NDArray[np.float32]]:
    """Which rows' top-p second pass was skipped (``STATE_SKIP``, read from the call's workspace), and
    the thresholds, of a split-plan call."""
    views: list[dict[str, torch.Tensor]] = []
    original = filters.FilterPlan.views

    def recorded(plan: filters.FilterPlan, work: torch.Tensor) -> dict[str, torch.Tensor]:
        views.append(original(plan, work))
        return views[-1]

    monkeypatch.setattr(filters.FilterPlan, "views", recorded)
    monkeypatch.setattr(filters, "_plans", launch.PlanCache(8))
    thresholds = _thresholds(rows, capacity=capacity)
    state = views[-1]["row_state_ptr"].cpu()
    return state[:, filters.STATE_SKIP.value].tolist(), thresholds


def test_top_p_skips_its_second_pass_where_the_first_leaves_few_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Top-p's first chunked pass places its cuts between two values that bound the pivot
    (`_first_placement`); where the interval it leaves holds at most the capacity, the second
    pass is skipped (`_few_left`) and the compaction gathers that interval. Thresholds are the same
    either way: a search's by passes alone, the specification's. Rows (V = 3,000): Gaussian logits
    at a scale of 3 (a few tokens carry the mass), the same at scale 0.3 (the mass spread over
    most of the vocabulary), and scale 3 with min-p."""
    rng = np.random.default_rng(21)
    logits = rng.normal(size=(3, 3000)) * np.array([[3.0], [0.3], [3.0]])
    rows = _rows(logits, 1.0, top_p=[0.9, 0.9, 0.9], min_p=[0.0, 0.0, 0.01])
    expected = _cut_short(rows, SEARCH_PASSES)
    _check(rows, expected)
    for capacity, skips in ((300, [1, 1, 1]), (100, [1, 0, 1]), (16, [0, 0, 1]), (0, [0, 0, 0])):
        skipped, thresholds = _skipped(monkeypatch, rows, capacity)
        assert skipped == skips, capacity
        np.testing.assert_array_equal(thresholds, expected)


def test_top_p_narrows_many_candidates_before_it_sorts() -> None:
    """Candidates past `SMALL_SORT` that fit the capacity are narrowed on themselves
    (`_narrow_candidates`: passes by value, then by key) before their sort, and the pivot is a
    search's by passes alone. Rows (V = 3,000): 1,000 logits within 1e-3 of 5 (no pass over the row
    by value parts them), a max of 8 and Gaussian logits; top-p puts the pivot among the 1,000, or
    (0.999) below them. The same rows with ties: the 1,000 take 4 values, which no pass parts."""
    rng = np.random.default_rng(13)
    logits = rng.normal(size=(4, 3000))
    logits[:, 0] = 8.0
    logits[:2, 1:1001] = 5.0 + rng.uniform(0.0, 1e-3, size=(2, 1000))
    logits[2:, 1:1001] = 5.0 + rng.integers(0, 4, size=(2, 1000)) * 1e-4
    rows = _rows(logits, 1.0, top_p=[0.5, 0.999, 0.5, 0.9])
    expected = _cut_short(rows, SEARCH_PASSES)
    comparison = _check(rows, expected)
    assert int(comparison.reference[0].sum()) > SMALL_SORT.value
    np.testing.assert_array_equal(_thresholds(rows, capacity=2048), expected)


def test_the_select_kernel_finds_each_rows_kept_sum() -> None:
    """The split plan's kept statistics (``kept``, `filter_select_kernel`): each row's max, and the sum
    of ``exp((z - max) / T)`` over the tokens its threshold keeps, within 1e-5 of float64's
    (relative), where the candidates sorted hold every kept token (top-k; top-k then top-p and
    min-p; top-p after its search, at T = 1 and 0.7) or every token is kept (filters off);
    `UNKNOWN_MASS` for min-p alone, a search by passes alone (capacity 0) and greedy rows. Rows:
    Gaussian logits at a scale of 3 over V = 3,000."""
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(7, 3000)) * 3.0
    rows = _rows(
        logits,
        [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.7],
        top_k=[50, 50, 0, 0, 0, 50, 0],
        top_p=[1.0, 0.9, 0.9, 1.0, 1.0, 1.0, 0.5],
        min_p=[0.0, 0.05, 0.0, 0.05, 0.0, 0.0, 0.0],
    )
    temperature, top_k, top_p, min_p = rows.tensors()
    assert temperature is not None
    known = [True, True, True, False, True, False, True]
    searched = [True, True, True, False, False, False, True]
    for capacity in (2048, 0):
        kept = torch.full((2, 7), np.nan, device=DEVICE)
        t = filter_thresholds(rows.logits, temperature, top_k, top_p, min_p, capacity=capacity, plan="split",
                              kept=kept)  # fmt: skip
        _check(rows, t.cpu().numpy())
        z = rows.float64()
        np.testing.assert_array_equal(kept[0].cpu().numpy(), z.max(axis=1).astype(np.float32))
        sums = kept[1].cpu().numpy()
        for row, found in enumerate(known):
            if not found or (capacity == 0 and searched[row]):
                assert sums[row] == filters.UNKNOWN_MASS.value, (capacity, row)
                continue
            scale = 1.0 / float(rows.temperature[row])
            kept_z = z[row][z[row] >= float(t[row])]
            expected = np.exp((kept_z - z[row].max()) * scale).sum()
            assert abs(sums[row] / expected - 1.0) < 1e-5, (row, sums[row], expected)


def test_the_kept_sets_and_sums_do_not_depend_on_the_chunks() -> None:
    """The split plan's thresholds and kept sums are bit for bit the same however many chunks a row is
    cut into (on a GPU the chunks follow the batch's size, `default_chunks`), and however many
    programs share its chunks in top-p's passes (``mass_programs``): every float32 sum is
    made by segments of `SEGMENT_TILES` tiles and added in segment order. Rows: top-p at 0.5, 0.9 and
    0.99 alone (its target and the mass above its interval come from the passes' sums), top-p with
    min-p, top-k with top-p, and a row that keeps every token (its kept sum is the row's sum);
    Gaussian logits at a scale of 3 over V = 3,000 in tiles of 64 (16 segments)."""
    rng = np.random.default_rng(11)
    rows = _rows(
        rng.normal(size=(6, 3000)) * 3.0,
        [1.0, 1.0, 0.7, 1.0, 1.0, 1.0],
        top_k=[0, 0, 0, 0, 50, 0],
        top_p=[0.5, 0.9, 0.99, 0.9, 0.9, 1.0],
        min_p=[0.0, 0.0, 0.0, 0.05, 0.0, 0.0],
    )
    temperature, top_k, top_p, min_p = rows.tensors()
    assert temperature is not None
    assert filters.segments_of(3000, 64) == 16

    def run(chunks: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        kept = torch.full((2, 6), np.nan, device=DEVICE)
        t = filter_thresholds(rows.logits, temperature, top_k, top_p, min_p, block_v=64, chunks=chunks,
                              capacity=2048, plan="split", kept=kept)  # fmt: skip
        return t.cpu().numpy(), kept.cpu().numpy()

    thresholds, kept = run(1)
    _check(rows, thresholds)
    assert (kept[1] != filters.UNKNOWN_MASS.value).all(), kept[1]
    for chunks in (2, 5, 16):
        other_thresholds, other_kept = run(chunks)
        np.testing.assert_array_equal(other_thresholds, thresholds, err_msg=f"chunks={chunks}")
        np.testing.assert_array_equal(other_kept, kept, err_msg=f"chunks={chunks}")
    # Top-p's passes with fewer programs than chunks (on a GPU, `default_mass_programs`), each taking
    # every G-th chunk of its row: the same masses, so the same sets and sums.
    for programs in (1, 3, 5):
        kept_g = torch.full((2, 6), np.nan, device=DEVICE)
        t = filter_thresholds(rows.logits, temperature, top_k, top_p, min_p, block_v=64, chunks=16,
                              capacity=2048, plan="split", kept=kept_g, mass_programs=programs)  # fmt: skip
        np.testing.assert_array_equal(t.cpu().numpy(), thresholds, err_msg=f"mass_programs={programs}")
        np.testing.assert_array_equal(kept_g.cpu().numpy(), kept, err_msg=f"mass_programs={programs}")


@triton.jit
def _candidate_masses_of(logits_ptr, cand_ptr, n, cut_values_ptr, masses_ptr, counts_ptr, row_max,
                         BLOCK: tl.constexpr, WAYS: tl.constexpr):  # fmt: skip
    """One program: the keys of ``n`` logits written as candidates, then `_candidate_masses` over them."""
    lanes = tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + lanes, mask=lanes < n, other=0.0)
    tl.store(cand_ptr + lanes, order_key(x), mask=lanes < n)
    tl.debug_barrier()
    ways = tl.arange(0, WAYS)
    masses, counts = _candidate_masses(
        cand_ptr, n, order_key(tl.load(cut_values_ptr + ways)), row_max, 1.0, WAYS
    )
    tl.store(masses_ptr + ways, masses)
    tl.store(counts_ptr + ways, counts)


def test_the_candidates_masses_do_not_depend_on_their_order() -> None:
    """Top-p's candidates reach the select kernel in the order of the chunks' atomic adds, which
    changes from run to run on a GPU: their masses above each cut (`_candidate_masses`) must be the
    same bit for bit in any order, and within float32 rounding of the float64 sums. 1,500 candidates
    (three of its tiles) in five orders; a float32 sum in the candidates' order fails this."""
    generator = torch.Generator().manual_seed(11)
    logits = torch.randn(1500, generator=generator, dtype=torch.float64) * 3.0
    row_max = float(logits.max())
    cut_values = torch.linspace(row_max - 12.0, row_max - 0.5, WAYS, dtype=torch.float64)
    cut_values[0] = float("-inf")
    exact = [
        float(torch.exp(logits[logits > c] - row_max).sum()) for c in cut_values.to(torch.float32).double()
    ]
    runs = []
    for seed in range(5):
        order = torch.randperm(1500, generator=torch.Generator().manual_seed(seed))
        x = logits[order].to(torch.float32).to(DEVICE)
        cand = torch.empty(2048, dtype=torch.int32, device=DEVICE)
        masses = torch.empty(WAYS, dtype=torch.float32, device=DEVICE)
        counts = torch.empty(WAYS, dtype=torch.int32, device=DEVICE)
        _candidate_masses_of[(1,)](x, cand, 1500, cut_values.to(torch.float32).to(DEVICE), masses, counts,
                                   float(np.float32(row_max)), BLOCK=2048, WAYS=WAYS)  # fmt: skip
        runs.append((masses.cpu(), counts.cpu()))
    for masses, counts in runs[1:]:
        assert torch.equal(masses, runs[0][0]), (masses - runs[0][0]).abs().max()
        assert torch.equal(counts, runs[0][1])
    np.testing.assert_allclose(runs[0][0].double().numpy(), exact, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU: the interpreter runs atomics in one order")
def test_a_gpu_rows_thresholds_and_kept_sums_repeat_bit_for_bit() -> None:
    """The same call five times on 1,280 rows of V = 128256 (B = 256's target rows) with top-p 0.9 and
    0.99 alone, where the select kernel narrows top-p's interval on candidates that the chunks
    compacted in the order of their atomic adds: thresholds and kept sums bit for bit the same each
    time."""
    generator = torch.Generator(device=DEVICE).manual_seed(5)
    logits = torch.randn(1280, 128256, generator=generator, device=DEVICE) * 3.0
    temperature = torch.ones(1280, device=DEVICE)
    top_p = torch.where(torch.arange(1280, device=DEVICE) % 2 == 0, 0.9, 0.99).to(torch.float32)

    def run() -> torch.Tensor:
        kept = torch.empty((2, 1280), device=DEVICE)
        t = filter_thresholds(logits, temperature, top_p=top_p, kept=kept)
        return torch.cat([t[None], kept])

    first = run()
    assert (first[2] != filters.UNKNOWN_MASS.value).all()
    for _ in range(4):
        again = run()
        assert torch.equal(again, first), (again != first).nonzero().tolist()[:10]


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU: a GPU's 42-segment rows")
def test_a_gpu_rows_kept_set_and_sum_do_not_depend_on_the_chunks() -> None:
    """As above at a GPU's sizes: 60 rows of V = 128256 in its default tiles (42 segments), cut into 1,
    3, 14 (B = 64's) and 42 (B = 1's) chunks, with top-p 0.9 alone, top-p 0.9 with min-p 0.05, top-k 50
    with top-p 0.9 and min-p 0.05, and no filter, 15 rows each: thresholds and kept sums bit for bit
    the same."""
    generator = torch.Generator(device=DEVICE).manual_seed(3)
    logits = torch.randn(60, 128256, generator=generator, device=DEVICE) * 3.0
    group = torch.arange(60, device=DEVICE) % 4
    temperature = torch.ones(60, device=DEVICE)
    top_k = torch.where(group == 2, 50, 0).to(torch.int32)
    top_p = torch.where(group < 3, 0.9, 1.0).to(torch.float32)
    min_p = torch.where((group == 1) | (group == 2), 0.05, 0.0).to(torch.float32)
    assert filters.segments_of(128256, default_block_v(128256)) == 42

    def run(chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
        kept = torch.empty((2, 60), device=DEVICE)
        t = filter_thresholds(logits, temperature, top_k, top_p, min_p, chunks=chunks, kept=kept)
        return t, kept

    thresholds, kept = run(1)
    assert (kept[1] != filters.UNKNOWN_MASS.value).all(), kept[1]
    for chunks in (3, 14, 42):
        other_thresholds, other_kept = run(chunks)
        assert torch.equal(other_thresholds, thresholds), chunks
        assert torch.equal(other_kept, kept), chunks
