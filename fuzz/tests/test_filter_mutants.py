"""The planted filtered-verification bugs (M33-M40): their targeted cases kill each one, the walk passes."""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt
import pytest
import torch

from specsample.fuzz.mutants import MUTANTS
from specsample.fuzz.selftest import Blind
from specsample.fuzz.targeted import targeted_batches, targeted_cases
from specsample.properties.batching import select_requests
from specsample.properties.checks import check
from specsample.reference.contract import Capabilities, RequestData, SpecBatch, make_batch
from specsample.reference.filters import FILTER_FLAGS, FilterParams, kept_tokens, near_pivot, pivot_band
from specsample.reference.law import BatchRows, F64Array, I64Array, row_probs
from specsample.reference.methods import CHAIN_METHODS
from specsample.reference.walk import WalkSampler

FILTER_MUTANTS = [f"M{i}" for i in range(33, 41)]
WALK = WalkSampler()
# The chain methods' cases (the walk takes trees too, which no filter case is built for).
CASES = dict(targeted_batches(CHAIN_METHODS, WALK.capabilities))
FILTERED = [name for name, batch in CASES.items() if batch.filtered]
UNFILTERED = [name for name, batch in CASES.items() if not batch.filtered]

# Each mutant, the targeted case built for it, the check expected to kill it there and the trials per
# request. Every statistical verdict has false-failure rate 1e-6 (Holm over its tests); at 2,000 trials
# the law of m detects a shift of 0.07-0.1 in any P(m = j), the law of y a total variation of about 0.1
# (power 0.999), and the bugs here move them far past that (their p-values fall below 1e-60). An exact
# check fails only on an impossible output, which the walk never gives.
KILLS = [
    # Request 1 accepts its draft with probability 0.67 under q', always under the raw q.
    ("M33", "probabilistic: filtered drafts", "law_of_m", 2000),
    ("M33", "block: filtered drafts", "law_of_m", 2000),
    # Drafts and residual tokens min-p drops are accepted and emitted at the verified rows.
    ("M34", "probabilistic: min-p near 1", "invariants", 200),
    # SGLang #36173's vector: token 3, outside p', is accepted and emitted.
    ("M35", "probabilistic: filter order", "invariants", 200),
    ("M35", "strict: filter order", "invariants", 200),
    # Request 0's drafts lie outside both filtered laws: u q'(d) = 0, so `>=` accepts them every time.
    ("M36", "probabilistic: filtered drafts", "invariants", 200),
    # The boundary token carries 7.3% of p' and is never emitted or accepted.
    ("M37", "probabilistic: top-p boundary", "law_of_y", 2000),
    ("M37", "strict: top-p boundary", "law_of_y", 2000),
    # Every draw is the argmax of its law.
    ("M38", "probabilistic: mixed filters", "law_of_y", 2000),
    ("M38", "strict: filter order", "law_of_y", 2000),
    # Tokens 3-8 of SGLang #36173's vector, outside p', are emitted.
    ("M39", "probabilistic: filter order", "invariants", 200),
    ("M39", "probabilistic: mixed filters", "invariants", 200),
    # 12 plateau tokens past the top-p pivot (7.6% of p') are emitted.
    ("M40", "probabilistic: top-p pivot", "invariants", 200),
]


def test_every_filter_mutant_is_registered_with_its_killers() -> None:
    """M33-M40 are registered, declare every filter (so the harness sends them filtered batches), and
    each check that kills one below is among its expected killers."""
    assert all(MUTANTS[m].load().capabilities.filters == FILTER_FLAGS for m in FILTER_MUTANTS)
    assert {m for m, *_ in KILLS} == set(FILTER_MUTANTS)
    assert all(name in MUTANTS[m].expected for m, _, name, _ in KILLS)


def test_filtered_cases_lie_inside_only_the_capabilities_that_declare_filters() -> None:
    """The filtered targeted cases lie outside a sampler that declares no filter (the reason names the
    parameter), inside the walk's capabilities, and each sampler without filters gets exactly the
    unfiltered cases it got before."""
    plain = targeted_cases(capabilities=Capabilities())
    reasons = {name: reason for name, batch, reason in plain if batch.filtered}
    assert set(reasons) == set(FILTERED) and len(FILTERED) == 9
    assert all(reason is not None and "(not declared in filters)" in reason for reason in reasons.values())
    assert [name for name, batch, reason in plain if reason is None] == UNFILTERED
    only_top_k = Capabilities(filters=("top_k",))
    inside = [name for name, _, reason in targeted_cases(capabilities=only_top_k) if reason is None]
    assert inside == UNFILTERED  # every filtered case needs top_p, min_p or draft_filter too


@pytest.mark.parametrize("case", FILTERED)
def test_filtered_cases_hold_no_near_pivot(case: str) -> None:
    """No token of a filtered targeted case lies near a pivot at the default band (4 float32 ulps): a
    difference from the exact law there is a bug, never rounding."""
    rows = BatchRows.of(CASES[case])
    assert rows.filters is not None
    band = pivot_band(4.0)
    request = np.repeat(np.arange(rows.counts.size), rows.counts + 1)
    target = near_pivot(rows.target, rows.temperature[request], rows.filters.take(request), band)
    assert not target.any()
    if rows.draft_filter and rows.draft is not None:
        request = np.repeat(np.arange(rows.counts.size), rows.counts)
        assert not near_pivot(rows.draft, rows.temperature[request], rows.filters.take(request), band).any()


@pytest.mark.parametrize("mutant", FILTER_MUTANTS)
def test_filter_mutants_are_the_walk_on_unfiltered_batches(mutant: str) -> None:
    """On every unfiltered targeted case a filter mutant draws what the walk draws, token for token:
    only a batch with sampling parameters reaches its bug."""
    variant = MUTANTS[mutant].load()
    for name in UNFILTERED:
        batch = CASES[name]
        mine, walk = variant(batch), WALK(batch)
        assert torch.equal(mine.token_ids, walk.token_ids), name
        assert torch.equal(mine.num_emitted, walk.num_emitted), name


@pytest.mark.parametrize(("mutant", "case", "name", "trials"), KILLS, ids=[f"{m}-{c}" for m, c, *_ in KILLS])
def test_filter_mutant_dies_on_its_targeted_case(mutant: str, case: str, name: str, trials: int) -> None:
    """The planted bug fails its expected check, blind (coupling off), on the case built for it; the
    walk passes the same check on the same case at the same trials."""
    batch = CASES[case]
    verdict = check(name, Blind(MUTANTS[mutant].load()), batch, num_samples=trials, seed=3)
    assert verdict is not None and verdict.failed, None if verdict is None else verdict.message
    walk = check(name, Blind(WALK), batch, num_samples=trials, seed=3)
    assert walk is not None and walk.passed, None if walk is None else walk.message


def test_m36_accepts_drafts_of_zero_filtered_mass() -> None:
    """M36's violation is the accepted draft of target probability 0 (its coin ``u q'(d)`` is 0): the
    walk, on the same case, never accepts one."""
    batch = CASES["probabilistic: filtered drafts"]
    verdict = check("invariants", Blind(MUTANTS["M36"].load()), batch, num_samples=200, seed=3)
    assert verdict is not None and verdict.request == 0
    assert "a draft of target probability 0 is accepted" in verdict.message, verdict.message


@dataclasses.dataclass(frozen=True)
class _UnfilteredBonusRows(BatchRows):
    """Rows whose bonus row (every draft accepted) is read without the sampling parameters: the mirror
    of M34, a sampler that filters the rows it verifies but draws the bonus token from the raw law."""

    def target_rows(self, requests: I64Array, position: npt.ArrayLike) -> F64Array:
        filtered = super().target_rows(requests, position)
        bonus = np.broadcast_to(np.asarray(position), requests.shape) == self.counts[requests]
        raw = self.raw_target_rows(requests, position)
        return np.asarray(np.where(bonus[:, None], raw, filtered), dtype=np.float64)


class UnfilteredBonus(WalkSampler):
    """The walk with its bonus row unfiltered."""

    name = "unfiltered bonus"
    capabilities = Capabilities(filters=FILTER_FLAGS)

    def read(self, batch: SpecBatch) -> BatchRows:
        return _UnfilteredBonusRows(**vars(super().read(batch)))


def test_the_bonus_row_and_the_verified_rows_answer_to_the_same_filters() -> None:
    """Each row of a request is checked against its own processed law, the bonus row included: M34
    (min-p missing at the verified rows) and its mirror (no filter at the bonus row, killed on 7 of the
    8 filtered targeted cases) both fail the invariants, blind, at 200 trials, where the walk passes
    the same check on the same cases."""
    for variant, case in (
        (MUTANTS["M34"].load(), "probabilistic: min-p near 1"),
        (UnfilteredBonus(), "probabilistic: top-p boundary"),
    ):
        verdict = check("invariants", Blind(variant), CASES[case], num_samples=200, seed=3)
        assert verdict is not None and verdict.failed, (variant.name, verdict)
        walk = check("invariants", Blind(WALK), CASES[case], num_samples=200, seed=3)
        assert walk is not None and walk.passed, None if walk is None else walk.message


# ---------------------------------------------------------------------------------------------
# M40 against a legitimate float32 top-p


@dataclasses.dataclass(frozen=True)
class _Float32TopPRows(BatchRows):
    """Rows filtered as a float32 sampler does it: min-p and top-k exact, top-p by a float32 softmax, a
    descending sort and a float32 cumulative sum (a token is kept while the mass sorted before it is
    below ``top_p``; every token tied with the last kept one is kept too)."""

    def filter(self, logits: F64Array, requests: I64Array) -> F64Array:
        if self.filters is None:
            return logits
        params, temperature = self.filters.take(requests), self.temperature[requests]
        kept = kept_tokens(logits, temperature, dataclasses.replace(params, top_p=np.ones_like(params.top_p)))
        cut = np.nonzero((params.top_p < 1.0) & (temperature > 0))[0]
        if cut.size:
            law = row_probs(np.where(kept, logits, -np.inf)[cut], temperature[cut]).astype(np.float32)
            ordered = -np.sort(-law, axis=-1)
            before = np.cumsum(ordered, axis=-1, dtype=np.float32) - ordered
            inside = before < params.top_p[cut, None].astype(np.float32)
            last = np.where(inside, ordered, np.inf).min(axis=-1, keepdims=True)
            kept[cut] &= law >= last
        return np.asarray(np.where(kept, logits, -np.inf), dtype=np.float64)


class Float32TopP(WalkSampler):
    """The walk with a legitimate float32 sort-and-cumsum top-p (4 ulps declared, the default)."""

    name = "float32 top-p"
    capabilities = Capabilities(filters=FILTER_FLAGS)

    def read(self, batch: SpecBatch) -> BatchRows:
        return _Float32TopPRows(**vars(super().read(batch)))


def _near_pivot_batch() -> tuple[SpecBatch, int]:
    """The top-p pivot row with ``top_p`` the float32 rounding of the mass above a plateau token
    whose membership the float32 top-p decides otherwise than the float64 specification; that token."""
    row = CASES["probabilistic: top-p pivot"].target_logits[0].double().numpy()
    probs = row_probs(row[None], np.ones(1))[0]
    above = np.cumsum(probs) - probs  # the row decreases
    for token in range(int(np.searchsorted(above, 0.5)), row.size - 8):
        top_p = float(np.float32(above[token]))
        batch = make_batch([RequestData(np.tile(row, (2, 1)), [4], row[None], 1.0, seed=7, top_p=top_p)])
        first = np.zeros(1, dtype=np.int64)
        mine = Float32TopP().read(batch).target_rows(first, 0)[0]
        if np.isfinite(mine[token]) != np.isfinite(BatchRows.of(batch).target_rows(first, 0)[0, token]):
            return batch, token
    raise AssertionError("no plateau token where float32 rounding moves the top-p cut")


def test_a_float32_top_p_matches_the_exact_cut_where_m40_does_not() -> None:
    """On the top-p pivot case the float32 sort-and-cumsum top-p keeps the exact set and passes the
    coupled check and the invariants; M40 keeps 12 more tokens and fails both."""
    batch = CASES["probabilistic: top-p pivot"]
    request = np.zeros(1, dtype=np.int64)
    exact = np.isfinite(BatchRows.of(batch).target_rows(request, 0))
    assert np.array_equal(np.isfinite(Float32TopP().read(batch).target_rows(request, 0)), exact)
    assert (np.isfinite(MUTANTS["M40"].load().read(batch).target_rows(request, 0)) & ~exact).sum() == 12
    for name in ("coupled", "invariants"):
        legit = check(name, Float32TopP(), batch, num_samples=300, seed=5)
        assert legit is not None and legit.passed, legit.message if legit else name
        planted = check(name, MUTANTS["M40"].load(), batch, num_samples=300, seed=5)
        assert planted is not None and planted.failed, planted.message if planted else name


def test_near_pivot_differences_are_excused_and_m40s_are_not() -> None:
    """Where ``top_p`` sits within float32 rounding of the mass above a plateau token, the float32
    top-p decides that token otherwise than the specification and emits differently from the walk on
    a few samples: a near pivot, so the coupled check excuses them. M40 on the same batch fails it."""
    batch, token = _near_pivot_batch()
    rows = BatchRows.of(batch)
    assert rows.filters is not None
    params = FilterParams(rows.filters.top_k[:1], rows.filters.top_p[:1], rows.filters.min_p[:1])
    assert near_pivot(rows.target[:1], np.ones(1), params, pivot_band(4.0))[0, token]
    copies = select_requests(batch, [0] * 1000, seed=np.arange(1000))
    differ = int((Float32TopP()(copies).token_ids != WALK(copies).token_ids).any(dim=1).sum())
    assert 0 < differ <= 50  # the token carries 0.6% of p' at each of two rows
    legit = check("coupled", Float32TopP(), batch, num_samples=1000, seed=5)
    assert legit is not None and legit.passed, legit.message if legit else "coupled"
    planted = check("coupled", MUTANTS["M40"].load(), batch, num_samples=300, seed=5)
    assert planted is not None and planted.failed, planted.message if planted else "coupled"
