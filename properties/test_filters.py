"""Filtered verification in the specification: the processed law `reference.filters` gives, its
conventions, the theorem on it by exact enumeration, the walk and the reference sampler on it, the
contract's sampling parameters and their validation."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specsample.kernels.torch_sampler import filter_probs
from specsample.reference.contract import Capabilities, RequestData, make_batch
from specsample.reference.filters import (
    FilterParams,
    kept_bounds,
    kept_tokens,
    near_pivot,
    pivot_band,
    processed_probs,
)
from specsample.reference.law import exact_law, row_probs
from specsample.reference.sampler import reference_sample
from specsample.reference.walk import walk


def _params(top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, rows: int = 1) -> FilterParams:
    return FilterParams(np.full(rows, top_k), np.full(rows, top_p), np.full(rows, min_p))


def _kept(probs: list[float], **params: float) -> list[int]:
    logits = np.log(np.asarray(probs, dtype=np.float64))
    return np.nonzero(kept_tokens(logits[None], np.ones(1), _params(**params))[0])[0].tolist()  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# The conventions, one public case each


def test_top_k_then_top_p_over_the_renormalised_mass() -> None:
    """SGLang #36173's regression vector: top-k 4 keeps [.35, .25, .20, .05] (mass .85); top-p .82
    over that renormalised law keeps three (the mass above the fourth is .80/.85 = .94). Top-p first,
    on the raw law, would keep four (.80 < .82): the order is part of the law."""
    p = [0.35, 0.25, 0.20, 0.05, 0.03, 0.03, 0.03, 0.03, 0.03]
    assert _kept(p, top_k=4, top_p=0.82) == [0, 1, 2]
    assert _kept(p, top_p=0.82) == [0, 1, 2, 3]  # top-p first: the mass above 0.05 is .80 < .82
    law = processed_probs(np.log(p)[None], np.ones(1), _params(top_k=4, top_p=0.82))[0]
    np.testing.assert_allclose(law[:3], np.array([0.35, 0.25, 0.20]) / 0.80, rtol=1e-12)
    assert law[3:].sum() == 0.0


def test_top_p_keeps_the_token_that_crosses_it() -> None:
    """FlashInfer #2202: the token whose mass crosses ``top_p`` is kept (the mass above it is below
    top_p), so the kept mass is at least top_p, never 0.89999 against 0.9."""
    p = [0.5, 0.3, 0.1, 0.06, 0.04]
    assert _kept(p, top_p=0.85) == [0, 1, 2]  # the mass above 0.1 is 0.8 < 0.85: 0.1 crosses it
    assert _kept(p, top_p=0.8 + 1e-9) == [0, 1, 2]
    assert _kept(p, top_p=0.8 - 1e-9) == [0, 1]
    assert _kept(p, top_p=1e-9) == [0]  # the largest is always kept


def test_min_p_is_relative_to_the_largest_probability_after_temperature() -> None:
    """min-p keeps ``p_T(x) >= min_p * max p_T``, with ``p_T`` after temperature."""
    logits = np.log(np.array([0.5, 0.2, 0.1, 0.05, 0.15]))[None]
    params = _params(min_p=0.35)
    assert np.nonzero(kept_tokens(logits, np.ones(1), params)[0])[0].tolist() == [0, 1]
    # At T = 2 the law flattens, p_T proportional to sqrt(p): 0.1 ** 0.5 >= 0.35 * 0.5 ** 0.5 > 0.05 ** 0.5.
    assert np.nonzero(kept_tokens(logits, np.full(1, 2.0), params)[0])[0].tolist() == [0, 1, 2, 4]


def test_top_k_keeps_every_token_tied_with_the_kth() -> None:
    """A value pivot: top-k 2 over [.4, .2, .2, .2] keeps all four; over [.4, .3, .2, .1] two."""
    assert _kept([0.4, 0.2, 0.2, 0.2], top_k=2) == [0, 1, 2, 3]
    assert _kept([0.4, 0.3, 0.2, 0.1], top_k=2) == [0, 1]
    assert _kept([0.4, 0.3, 0.2, 0.1], top_k=4) == [0, 1, 2, 3]  # k >= V is off
    assert _kept([0.4, 0.3, 0.2, 0.1], top_k=0) == [0, 1, 2, 3]


def test_top_p_keeps_ties_whole() -> None:
    """The mass above a token counts only larger probabilities: tied tokens share it."""
    assert _kept([0.4, 0.2, 0.2, 0.2], top_p=0.5) == [0, 1, 2, 3]
    assert _kept([0.4, 0.2, 0.2, 0.1, 0.1], top_p=0.75) == [0, 1, 2]


def test_greedy_and_degenerate_rows_are_unaffected() -> None:
    """A greedy row stays one-hot at its argmax; a row with +inf logits stays uniform over them; a
    row with no finite logit stays uniform; the largest token is kept in every row."""
    params = _params(top_k=1, top_p=0.01, min_p=0.99, rows=4)
    logits = np.array([[0.0, 3.0, 1.0], [np.inf, 1.0, np.inf], [-np.inf, np.nan, -np.inf], [2.0, 2.0, -1.0]])
    temperature = np.array([0.0, 1.0, 1.0, 1.0])
    law = processed_probs(logits, temperature, params)
    np.testing.assert_array_equal(law[0], [0, 1, 0])
    np.testing.assert_array_equal(law[1], [0.5, 0, 0.5])
    np.testing.assert_allclose(law[2], [1 / 3] * 3)
    np.testing.assert_array_equal(law[3], [0.5, 0.5, 0])  # top-1 keeps both tied maxima


@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 12),
    st.integers(0, 14),
    st.sampled_from([1.0, 0.95, 0.6, 0.05]),
    st.sampled_from([0.0, 0.05, 0.5, 0.95]),
    st.sampled_from([1e-3, 0.7, 1.0, 4.0]),
)
def test_the_kept_set_is_a_value_prefix_holding_the_largest(
    seed: int, vocab_size: int, top_k: int, top_p: float, min_p: float, temperature: float
) -> None:
    """Each filter keeps the tokens at or above a probability: the kept set is ``{x: z_x >= t}``,
    it holds the largest token, and the processed law is ``p_T`` on it renormalised."""
    rng = np.random.default_rng(seed)
    logits = np.round(rng.normal(size=(1, vocab_size)) * 3, 1)  # ties on purpose
    params = _params(top_k, top_p, min_p)
    kept = kept_tokens(logits, np.full(1, temperature), params)[0]
    assert kept[np.argmax(logits[0])]
    assert logits[0][kept].min() > logits[0][~kept].max(initial=-np.inf)
    p = row_probs(logits, np.full(1, temperature))[0]
    law = processed_probs(logits, np.full(1, temperature), params)[0]
    np.testing.assert_allclose(law, np.where(kept, p, 0) / p[kept].sum(), rtol=1e-12, atol=1e-300)


# ---------------------------------------------------------------------------------------------
# The theorem on the processed law, by exact enumeration


def _marginals(
    method: str, request: RequestData, draft_law: np.ndarray, draft_filter: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The law of the token emitted at each position given it is reached, over every draft sequence
    drawn from ``draft_law`` (``[n, V]``); and the processed target laws."""
    n, vocab_size = draft_law.shape
    reach_and_token = np.zeros((n + 1, vocab_size))
    reach = np.zeros(n + 1)
    for drafts in itertools.product(range(vocab_size), repeat=n):
        weight = float(np.prod([draft_law[i, d] for i, d in enumerate(drafts)]))
        if weight == 0.0:
            continue
        batch = make_batch(
            [dataclasses.replace(request, draft_token_ids=list(drafts))],
            method=method,  # type: ignore[arg-type]
            draft_filter=draft_filter,
        )
        law = exact_law(batch)[0]
        tail = np.cumsum(law.stop_probs[::-1])[::-1]
        for k in range(n + 1):
            reach[k] += weight * tail[k]
            reach_and_token[k] += weight * law.stop_probs[k] * law.token_probs[k]
            if k < n:
                reach_and_token[k, drafts[k]] += weight * tail[k + 1]
        target = law.target_probs
    with np.errstate(invalid="ignore", divide="ignore"):
        return reach_and_token / reach[:, None], target


@pytest.mark.parametrize("method", ["probabilistic", "strict", "block"])
@pytest.mark.parametrize("draft_filter", [False, True])
@given(
    seed=st.integers(0, 2**32 - 1),
    filters=st.sampled_from([(2, 1.0, 0.0), (0, 0.7, 0.0), (0, 1.0, 0.3), (3, 0.8, 0.1)]),
)
def test_every_emitted_position_follows_the_processed_law(
    method: str, draft_filter: bool, seed: int, filters: tuple[int, float, float]
) -> None:
    """With drafts drawn from the law the verification uses as ``q`` (``q'`` when the sampler filters
    the drafts, the given draft law otherwise), every emitted position is distributed as ``p'``:
    exact enumeration over every draft sequence, V = 4, n = 2, to 1e-12."""
    rng = np.random.default_rng(seed)
    vocab_size, n = 4, 2
    top_k, top_p, min_p = filters
    # Logits a float32 batch holds exactly.
    target = (rng.normal(size=(n + 1, vocab_size)) * 1.5).astype(np.float32).astype(np.float64)
    draft = (rng.normal(size=(n, vocab_size)) * 1.5).astype(np.float32).astype(np.float64)
    temperature = float(np.float32(0.8))  # as the batch holds it
    request = RequestData(
        target, [0] * n, draft, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p
    )
    params = _params(top_k, top_p, min_p, rows=n)
    q = (
        processed_probs(draft, np.full(n, temperature), params)
        if draft_filter
        else row_probs(draft, temperature)
    )
    marginals, target_probs = _marginals(method, request, q, draft_filter)
    expected = processed_probs(target, np.full(n + 1, temperature), _params(top_k, top_p, min_p, rows=n + 1))
    np.testing.assert_allclose(target_probs, expected, rtol=0, atol=1e-12)
    reached = ~np.isnan(marginals).any(axis=1)
    np.testing.assert_allclose(marginals[reached], expected[reached], rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# The walk and the reference sampler on filtered batches


@st.composite
def filtered_batches(draw: st.DrawFn) -> object:
    """Small filtered batches over every method, draft kind, filter mix and temperature."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    method = draw(st.sampled_from(["probabilistic", "strict", "synthetic", "block"]))
    vocab_size = draw(st.integers(2, 24))
    one_hot = draw(st.booleans())
    requests = []
    for b in range(draw(st.integers(1, 4))):
        n = draw(st.integers(0, 4))
        requests.append(
            RequestData(
                target_logits=np.round(rng.normal(size=(n + 1, vocab_size)) * 2, 1),
                draft_token_ids=rng.integers(-1, vocab_size, size=n),
                draft_logits=None if one_hot else rng.normal(size=(n, vocab_size)),
                temperature=draw(st.sampled_from([0.0, 0.5, 1.0])),
                seed=b,
                top_k=draw(st.sampled_from([0, 1, 3, 50])),
                top_p=draw(st.sampled_from([1.0, 0.9, 0.3])),
                min_p=draw(st.sampled_from([0.0, 0.1, 0.9])),
            )
        )
    return make_batch(
        requests,
        method=method,
        synthetic_rates=[0.8, 0.6, 0.4, 0.2],
        draft_filter=draw(st.booleans()) and not one_hot,
    )


@given(filtered_batches())
def test_walk_and_reference_sampler_agree_on_filtered_batches(batch: object) -> None:
    """The vectorised walk and the scalar reference sampler emit the same tokens and logprobs, and a
    lossless method never a token outside the kept set of its row (synthetic accepts any draft)."""
    walked = walk(batch).output  # type: ignore[arg-type]
    expected = reference_sample(batch)  # type: ignore[arg-type]
    assert torch.equal(walked.num_emitted, expected.num_emitted)
    assert torch.equal(walked.token_ids, expected.token_ids)
    torch.testing.assert_close(walked.logprobs, expected.logprobs, equal_nan=True)
    if batch.method != "synthetic":  # type: ignore[attr-defined]
        assert bool(torch.isfinite(walked.logprobs[walked.token_ids >= 0]).all())


def test_logprobs_are_those_of_the_processed_law() -> None:
    """The bonus token of a top-k 2 row has logprob ``log p'``, not ``log p``."""
    logits = np.log(np.array([[0.5, 0.3, 0.2]]))
    batch = make_batch([RequestData(logits, [], top_k=2, seed=3)])
    out = walk(batch).output
    token = int(out.token_ids[0, 0])
    assert token in (0, 1)
    assert float(out.logprobs[0, 0]) == pytest.approx(np.log([0.625, 0.375][token]), rel=1e-6)


# ---------------------------------------------------------------------------------------------
# Near pivots


def test_near_pivots_are_the_tokens_rounding_could_move() -> None:
    """A token 1e-9 (relative) below the min-p threshold is a near pivot at 4 ulps, one 1e-3 below is
    not; an exact tie with the k-th value is not (kept whole); the largest never is."""
    p = np.array([0.5, 0.5 * 0.2 * (1 - 1e-9), 0.5 * 0.2 * (1 - 1e-3), 0.15, 0.15])
    logits = np.log(p / p.sum())[None]
    near = near_pivot(logits, np.ones(1), _params(min_p=0.2), pivot_band(4.0))[0]
    assert near.tolist() == [False, True, False, False, False]
    tied = near_pivot(np.log([[0.4, 0.2, 0.2, 0.2]]), np.ones(1), _params(top_k=2), pivot_band(4.0))[0]
    assert not tied.any()
    close = near_pivot(
        np.log([[0.4, 0.2, 0.2 * (1 - 1e-9), 0.2]]), np.ones(1), _params(top_k=2), pivot_band(4.0)
    )
    assert close[0].tolist() == [False, False, True, False]  # only the one below the tied pivot


def test_values_within_rounding_of_the_top_p_pivot_are_near_pivots() -> None:
    """top-p keeps a value prefix, so a token whose log-probability lies within the band of the
    smallest kept value is a near pivot, as at the k-th value. A float32 sort-and-cumsum top-p (the
    PyTorch sampler's) sees a flat row at T = 1e4, 2.2e-8 apart in log-probability, as ties and keeps
    three tokens past the exact cut: inside the 4-ulp bounds, outside the exact ones (0 ulps)."""
    logits = np.concatenate([[0.0], -7.28 + 2.2e-4 * np.arange(3992)]).astype(np.float32).astype(np.float64)
    temperature, params = np.array([1e4]), _params(top_p=0.999)
    probs = torch.softmax(torch.tensor(logits[None], dtype=torch.float32) / 1e4, dim=1)
    fp32 = (
        filter_probs(probs, torch.zeros(1, dtype=torch.int64), torch.tensor([0.999]), torch.zeros(1))[0] > 0
    )
    kept = fp32.numpy()
    assert kept.sum() == kept_tokens(logits[None], temperature, params)[0].sum() + 3
    lower, upper = kept_bounds(logits[None], temperature, params, pivot_band(4.0))
    assert (lower[0] <= kept).all() and (kept <= upper[0]).all()
    _, exact_upper = kept_bounds(logits[None], temperature, params, pivot_band(0.0))
    assert not (kept <= exact_upper[0]).all()


# ---------------------------------------------------------------------------------------------
# The contract


def _batch(**filters: object) -> object:
    rng = np.random.default_rng(0)
    requests = [RequestData(rng.normal(size=(2, 5)), [1], rng.normal(size=(1, 5)), seed=s) for s in (1, 2)]
    return dataclasses.replace(make_batch(requests), **filters)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("top_p", torch.tensor([0.9, 0.0]), r"top_p \[1\] is 0.0; expected a value in \(0, 1\]"),
        ("top_p", torch.tensor([1.5, 0.9]), r"top_p \[0\] is 1.5"),
        ("top_p", torch.tensor([float("nan"), 0.9]), r"top_p \[0\] is nan"),
        ("top_k", torch.tensor([3, -1], dtype=torch.int32), r"top_k \[1\] is -1; expected k >= 0"),
        ("min_p", torch.tensor([0.0, 1.0]), r"min_p \[1\] is 1.0; expected a value in \[0, 1\)"),
        ("top_k", torch.tensor([3.0, 1.0]), r"top_k has dtype torch.float32"),
        ("top_p", torch.tensor([0.9, 0.9], dtype=torch.float64), r"top_p has dtype torch.float64"),
        ("min_p", torch.tensor([0.1]), r"min_p has shape \(1,\); expected \[B\] = \[2\]"),
        ("top_k", [3, 4], r"top_k has type list; expected a torch.Tensor"),
        ("draft_filter", 1, r"draft_filter has type int; expected a bool"),
    ],
)
def test_bad_sampling_parameters_are_named(field: str, value: object, message: str) -> None:
    """A sampling parameter out of range, of the wrong dtype or shape: an error naming it and the value."""
    with pytest.raises(ValueError, match=message):
        _batch(**{field: value}).validate()  # type: ignore[attr-defined]


def test_make_batch_sends_only_the_parameters_some_request_sets() -> None:
    """``make_batch`` leaves a parameter ``None`` where no request sets it: an unfiltered batch is
    what it always was."""
    rng = np.random.default_rng(0)
    plain = make_batch([RequestData(rng.normal(size=(1, 4)), [])])
    assert plain.top_k is None and plain.top_p is None and plain.min_p is None and not plain.filtered
    some = make_batch(
        [RequestData(rng.normal(size=(1, 4)), [], top_p=0.9), RequestData(rng.normal(size=(1, 4)), [])]
    )
    assert some.top_k is None and some.top_p is not None and some.top_p.tolist() == pytest.approx([0.9, 1.0])


def test_capabilities_keep_undeclared_filters_away() -> None:
    """A sampler that declares no filter is never sent one, and the report says what was left out."""
    filtered = _batch(top_p=torch.tensor([0.9, 1.0]))
    assert Capabilities().admits(filtered) == "top_p (not declared in filters)"  # type: ignore[arg-type]
    assert Capabilities(filters=("top_p",)).admits(filtered) is None  # type: ignore[arg-type]
    assert "draft_filter (the sampler does not take it)" in Capabilities(filters=("top_p",)).not_checked()
    with pytest.raises(ValueError, match=r"capabilities.filters is \('top_q',\)"):
        Capabilities(filters=("top_q",)).validate()


def test_a_near_pivot_counts_only_where_the_later_filters_keep_it() -> None:
    """A token within rounding of the k-th value that top-p drops either way is no near pivot (a
    sampler keeps or drops it at top-k, and top-p then drops it): the kept sets without and with the
    near pivots are both the exact one. Without top-p it is one."""
    logits = np.log(np.array([[0.3, 0.25, 0.2, 0.2 * (1 - 1e-9), 0.05]]))
    both = _params(top_k=3, top_p=0.5)
    lower, upper = kept_bounds(logits, np.ones(1), both, pivot_band(4.0))
    exact = kept_tokens(logits, np.ones(1), both)
    assert exact[0].tolist() == [True, True, False, False, False]
    assert np.array_equal(lower, exact) and np.array_equal(upper, exact)
    only_k = near_pivot(logits, np.ones(1), _params(top_k=3), pivot_band(4.0))
    assert only_k[0].tolist() == [False, False, False, True, False]
