"""The Triton sampler on filtered batches, on a GPU where there is one and under the interpreter
otherwise: coupled with the walk (near pivots excused), every invariant kept, for every method, draft
layout and draft_filter, unfiltered and greedy requests beside filtered ones, in both launch plans.
Small grids: the split plan's filtered row costs 0.2 to 0.5 s under the interpreter."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specsample.kernels import rejection
from specsample.kernels.filters import row_parameters
from specsample.kernels.rejection import TritonRejectionSampler, filter_batch, rejection_sample
from specsample.properties.batching import select_requests
from specsample.properties.checks.coupled import agreement
from specsample.properties.checks.invariants import violations
from specsample.reference.contract import RequestData, SpecBatch, make_batch
from specsample.reference.filters import FILTER_FLAGS
from specsample.reference.law import BatchRows

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"

# (method, draft layout, draft_filter, dtype)
CASES = [
    ("probabilistic", "flat", True, torch.float32),
    ("probabilistic", "slotted", True, torch.float32),
    ("probabilistic", "flat", False, torch.bfloat16),
    ("strict", "one-hot", False, torch.float32),
    ("block", "flat", True, torch.float32),
    ("synthetic", "slotted", False, torch.float16),
]


def _batch(method: str, layout: str, draft_filter: bool, dtype: torch.dtype, seed: int) -> SpecBatch:
    """Four requests: top-k and top-p, min-p alone, greedy with every filter, unfiltered."""
    rng = np.random.default_rng(seed)
    vocab_size = 37
    settings = [
        dict(temperature=1.0, top_k=5, top_p=0.8),
        dict(temperature=0.7, min_p=0.2),
        dict(temperature=0.0, top_k=1, top_p=0.1, min_p=0.9),
        dict(temperature=1.3),
    ]
    requests = []
    for b, extra in enumerate(settings):
        n = 2 if b != 3 else 1
        target = rng.normal(size=(n + 1, vocab_size)) * 2.0
        draft = rng.normal(size=(n, vocab_size)) * 2.0
        requests.append(
            RequestData(
                target,
                rng.integers(0, vocab_size, size=n),
                None if layout == "one-hot" else draft,
                seed=int(rng.integers(2**62)),
                **extra,  # type: ignore[arg-type]
            )
        )
    slots = [3, 0, 4, 1] if layout == "slotted" else None
    return make_batch(
        requests,
        method=method,  # type: ignore[arg-type]
        dtype=dtype,
        synthetic_rates=[0.7, 0.4],
        slots=slots,
        num_slots=6 if slots else None,
        draft_filter=draft_filter,
        device=DEVICE,
    )


@pytest.mark.parametrize("plan", ["split", "rows"])
@pytest.mark.parametrize(("method", "layout", "draft_filter", "dtype"), CASES)
def test_filtered_sampling_is_coupled_with_the_walk(
    method: str, layout: str, draft_filter: bool, dtype: torch.dtype, plan: str
) -> None:
    """Each request's output equals the walk's on the same streams (or differs first at a near tie)
    and keeps every invariant, the emitted tokens inside their rows' kept sets, in either launch plan
    (the sampler's and the filters' alike)."""
    batch = _batch(method, layout, draft_filter, dtype, seed=len(method) + len(layout))
    output = rejection_sample(batch, plan=plan)
    found = agreement(batch, output)
    assert not found.unexplained, found.unexplained
    assert found.excused <= 1
    assert violations(batch, output) == []


def _wide_batch(
    method: str, layout: str, draft_filter: bool, dtype: torch.dtype, seed: int, vocab_size: int
) -> SpecBatch:
    """Five requests of three drafts over ``vocab_size`` tokens (several noise blocks) where filtering
    q moves the acceptance ratios, the residuals and block verification's masses: top-k 50 and top-p
    0.9, and min-p 0.05, with draft rows the target's plus noise and drafts their argmax; top-p 0.5
    at T = 0.7, and top-k 50, with flat draft rows (top-k keeps a few percent of q's mass, so an
    unfiltered q weighs as much as p' off q's kept set) and drafts partly off it; unfiltered; and two
    of top-k 2 where q's third token is p's second: off q's kept set, an unfiltered q would take
    about half of p's mass there, in the acceptance ratio and in the residual alike (p's two kept
    tokens in the first and the last noise block), and the dropped tokens, the rest of both rows,
    would weigh tens of times the kept ones."""
    rng = np.random.default_rng(seed)
    settings = [
        (dict(temperature=1.0, top_k=50, top_p=0.9), False),
        (dict(temperature=1.0, min_p=0.05), False),
        (dict(temperature=0.7, top_p=0.5), True),
        (dict(temperature=1.0, top_k=50), True),
        (dict(temperature=1.0), False),
    ]
    requests = []
    a, b, c, d = 10, vocab_size - 5, 30, 40
    for extra, flat in settings + [(dict(temperature=1.0, top_k=2), None)] * 2:
        target = rng.normal(size=(4, vocab_size)) * 2.0
        if flat is None:
            target = np.full((4, vocab_size), 1.0)
            target[:, [a, b]] = [4.0, 5.0]
            draft = np.full((3, vocab_size), 1.0)
            draft[:, [c, d, a]] = [5.0, 5.0, 4.99]
            ids = np.asarray([a, c, b])
        elif flat:
            draft = rng.normal(size=(3, vocab_size)) * 0.3
            ids = np.concatenate([draft[:1].argmax(axis=1), rng.integers(0, vocab_size, size=2)])
        else:
            draft = target[:3] + rng.normal(size=(3, vocab_size))
            ids = draft.argmax(axis=1)
        requests.append(
            RequestData(
                target,
                ids,
                None if layout == "one-hot" else draft,
                seed=int(rng.integers(2**62)),
                **extra,  # type: ignore[arg-type]
            )
        )
    slots = [3, 0, 4, 1, 5, 7, 6] if layout == "slotted" else None
    return make_batch(
        requests,
        method=method,  # type: ignore[arg-type]
        dtype=dtype,
        synthetic_rates=[0.7, 0.4, 0.5],
        slots=slots,
        num_slots=8 if slots else None,
        draft_filter=draft_filter,
        device=DEVICE,
    )


@pytest.mark.parametrize(("method", "layout", "draft_filter", "dtype"), CASES)
@pytest.mark.parametrize(("seed", "vocab_size"), [(0, 37), (1, 2048), (2, 2500)])
def test_the_split_plan_reads_the_rows_as_their_masked_copy(
    method: str, layout: str, draft_filter: bool, dtype: torch.dtype, seed: int, vocab_size: int
) -> None:
    """The split plan reads a filtered batch's rows through their thresholds (`rules.kept_logit`):
    token for token and count for count what it emits on the masked copy of the rows
    (`filter_batch`), every method, layout, dtype and draft_filter, and logprobs within 1e-5. The
    statistics pass takes a row's kept sum from the filters where they found it (the same terms added
    in another order: at most 4.8e-7 apart on these batches) and reads the masked copy for it. V =
    37: `_batch`; V = 2,048 and 2,500: `_wide_batch`, whose sampling pass reads its two blocks the
    fast way (`_fast_row`) at 2,048 and its three the general way at 2,500."""
    if vocab_size == 37:
        batch = _batch(method, layout, draft_filter, dtype, seed=seed)
    else:
        batch = _wide_batch(method, layout, draft_filter, dtype, seed, vocab_size)
    through = rejection_sample(batch, plan="split")
    masked = rejection_sample(filter_batch(batch, "split"), plan="split")
    assert torch.equal(through.token_ids, masked.token_ids)
    assert torch.equal(through.num_emitted, masked.num_emitted)
    assert through.logprobs is not None and masked.logprobs is not None
    assert torch.equal(through.logprobs.isnan(), masked.logprobs.isnan())
    torch.testing.assert_close(through.logprobs.nan_to_num(), masked.logprobs.nan_to_num(), rtol=0, atol=1e-5)


def _crossed_batch(vocab_size: int, seed: int, count: int) -> SpecBatch:
    """``count`` requests of three drafts, each the same token ``a``, under top-k 2 with draft_filter,
    where the draft filter drops a token the target keeps: p' is ``{a: 0.38, b: 0.62}`` and q' is
    ``{a: 0.52, c: 0.48}``, while the unfiltered draft row, over q''s normaliser, gives ``b`` 0.43.
    Block verification's first weight is then 0.72 and its residual mass ``S = w p'(b) = 0.45``
    (keep probability 0.62); read unfiltered, ``S = 0.02`` (0.06). ``a``, ``b`` and ``c`` lie in
    different noise blocks."""
    rng = np.random.default_rng(seed)
    a, b, c = 10, vocab_size - 5, 1030
    requests = []
    for _ in range(count):
        target = np.full((4, vocab_size), 1.0)
        target[:, [a, b]] = [5.0, 5.5]
        draft = np.full((3, vocab_size), 1.0)
        draft[:, [a, c, b]] = [5.0, 4.9, 4.8]
        requests.append(
            RequestData(target, np.full(3, a), draft, seed=int(rng.integers(2**62)), temperature=1.0, top_k=2)
        )
    return make_batch(requests, method="block", draft_filter=True, device=DEVICE)


def test_block_verification_reads_the_draft_rows_through_their_thresholds() -> None:
    """Block verification's residual masses read the draft rows through their thresholds: on batches
    whose draft filter drops a token the target keeps (`_crossed_batch`), the split plan emits what
    it emits on the masked copy, and what the walk emits. Reading those rows unfiltered moves the
    keep probability at each request's first draft from 0.62 to 0.06 (later drafts' weights are the
    first's powers), which changes the emitted tokens of this batch."""
    batch = _crossed_batch(2500, seed=5, count=8)
    through = rejection_sample(batch, plan="split")
    masked = rejection_sample(filter_batch(batch, "split"), plan="split")
    assert torch.equal(through.token_ids, masked.token_ids)
    assert torch.equal(through.num_emitted, masked.num_emitted)
    found = agreement(batch, through)
    assert not found.unexplained, found.unexplained
    assert violations(batch, through) == []


def test_the_filter_masks_what_the_specification_drops() -> None:
    """`filter_batch` masks exactly the tokens the specification's kept sets drop (no near pivot in
    this batch), draft rows too with draft_filter, and leaves greedy rows as they are."""
    batch = _batch("probabilistic", "flat", True, torch.float32, seed=9)
    filtered = filter_batch(batch)
    assert not filtered.filtered and not filtered.draft_filter
    split = filter_batch(batch, "split")
    assert torch.equal(split.target_logits, filtered.target_logits)
    assert split.draft_logits is not None and filtered.draft_logits is not None
    assert torch.equal(split.draft_logits, filtered.draft_logits)
    rows = BatchRows.of(batch)
    counts = rows.counts.tolist()
    requests = np.repeat(np.arange(len(counts)), np.asarray(counts) + 1)
    positions = np.concatenate([np.arange(n + 1) for n in counts])
    expected = np.isfinite(rows.target_rows(requests, positions))
    np.testing.assert_array_equal(torch.isfinite(filtered.target_logits).cpu().numpy(), expected)
    draft_requests = np.repeat(np.arange(len(counts)), counts)
    draft_positions = np.concatenate([np.arange(n) for n in counts])
    expected_draft = np.isfinite(rows.draft_rows(draft_requests, draft_positions))
    assert filtered.draft_logits is not None
    np.testing.assert_array_equal(torch.isfinite(filtered.draft_logits).cpu().numpy(), expected_draft)
    greedy = slice(int(batch.cu_num_drafts[2]) + 2, int(batch.cu_num_drafts[3]) + 3)
    assert torch.equal(filtered.target_logits[greedy], batch.target_logits[greedy])


def test_the_sampler_declares_filters_unless_told_not_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default the sampler declares every filter, on a GPU and under the interpreter alike;
    ``SPECSAMPLE_FILTERS=0`` (or the argument) declares none."""
    monkeypatch.delenv("SPECSAMPLE_FILTERS", raising=False)
    for interpreted in ("1", "0"):
        monkeypatch.setenv("TRITON_INTERPRET", interpreted)
        assert TritonRejectionSampler().capabilities.filters == FILTER_FLAGS
    monkeypatch.setenv("SPECSAMPLE_FILTERS", "0")
    assert TritonRejectionSampler().capabilities.filters == ()
    monkeypatch.setenv("SPECSAMPLE_FILTERS", "1")
    assert TritonRejectionSampler().capabilities.filters == FILTER_FLAGS
    assert TritonRejectionSampler(filters=()).capabilities.filters == ()
    assert TritonRejectionSampler(filters=("top_k",)).capabilities.filters == ("top_k",)


@given(
    counts=st.lists(st.integers(0, 5), min_size=1, max_size=300),
    extra=st.sampled_from([0, 1]),
    top_k=st.booleans(),
    min_p=st.booleans(),
    kernel=st.booleans(),
)
def test_each_row_gets_its_requests_parameters(
    counts: list[int], extra: int, top_k: bool, min_p: bool, kernel: bool
) -> None:
    """`row_parameters` gives each row its request's temperature and sampling parameters, as
    ``repeat_interleave`` over the requests' row counts does (``n_b + 1`` target rows, ``n_b`` draft
    rows; requests without drafts among them), for every parameter given or not, in one launch
    without a host synchronisation. A request's values are unique, so a row given a neighbour's
    fails. Both ways: the kernel's (a GPU's) and PyTorch's (the interpreter's)."""
    b = len(counts)
    n = torch.tensor(counts, dtype=torch.int64)
    cu = torch.cat((torch.zeros(1, dtype=torch.int64), n.cumsum(0))).to(torch.int32).to(DEVICE)
    rows = int(n.sum()) + extra * b
    ids = torch.arange(b, device=DEVICE)
    temperature = ids.to(torch.float32) / 7
    params = {
        "top_k": ids.to(torch.int64) * 3 if top_k else None,
        "top_p": 1 - ids.to(torch.float32) / 1000,
        "min_p": ids.to(torch.float32) / 2000 if min_p else None,
    }
    owner = torch.repeat_interleave(ids, (n + extra).to(DEVICE), output_size=rows)
    gathered = row_parameters(cu, rows, extra, temperature, *params.values(), kernel=kernel)
    assert torch.equal(gathered[0], temperature[owner])
    for value, param in zip(gathered[1:], params.values(), strict=True):
        assert (value is None) == (param is None)
        if param is not None:
            assert value is not None
            assert torch.equal(value, param[owner])


def test_the_statistics_pass_takes_the_kept_sums_the_filters_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the filters found a row's kept sum (`filter_select_kernel`), the split plan's statistics
    pass takes it and does not read the row; elsewhere it reads the row. With every kept sum the
    filters found doubled, each token of the top-k and top-p request and of the unfiltered one
    (whose kept sum is the row's) has its logprob moved by ``-log 2`` and the min-p request's and
    the greedy one's none; synthetic verification's decisions and Gumbel-max draws do not depend on
    the sum, so the tokens stay the same."""
    batch = _batch("synthetic", "flat", False, torch.float32, seed=3)
    plain = rejection_sample(batch, plan="split")
    original = rejection.filter_thresholds

    def doubled(*args: object, **kwargs: object) -> torch.Tensor:
        thresholds = original(*args, **kwargs)  # type: ignore[arg-type]
        kept = kwargs.get("kept")
        assert isinstance(kept, torch.Tensor)
        kept[1] = torch.where(kept[1] >= 0, 2 * kept[1], kept[1])
        return thresholds

    monkeypatch.setattr(rejection, "filter_thresholds", doubled)
    moved = rejection_sample(batch, plan="split")
    assert torch.equal(moved.token_ids, plain.token_ids)
    assert moved.logprobs is not None and plain.logprobs is not None
    # An accepted synthetic draft may have probability 0: its logprob is -inf either way.
    assert torch.equal(torch.isfinite(moved.logprobs), torch.isfinite(plain.logprobs))
    emitted = torch.arange(moved.token_ids.shape[1], device=DEVICE)[None, :] < moved.num_emitted[:, None]
    emitted &= torch.isfinite(plain.logprobs)
    shift = torch.where(emitted, moved.logprobs - plain.logprobs, 0.0).cpu()
    expected = torch.tensor([1.0, 0.0, 0.0, 1.0])[:, None] * emitted.cpu() * -float(np.log(2.0))
    assert emitted[0].any() and emitted[3].any()
    torch.testing.assert_close(shift, expected, rtol=0, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="only a GPU's filters cut rows into chunks by the batch's size")
@pytest.mark.parametrize("mixed", [False, True], ids=["top-p alone", "half the requests, three filters"])
def test_a_filtered_request_is_the_same_alone_and_in_a_large_batch(mixed: bool) -> None:
    """A filtered request emits the same tokens, counts and logprobs alone and among 63 others at
    V = 128256, where the filters cut its row into other chunks (the composition invariant: the
    filters make every sum by segments, whatever the chunks, and the sampler's splits follow V
    alone). Gaussian logits at a scale of 3, each draft its draft row's argmax."""
    num_requests, n, vocab_size = 64, 4, 128256
    generator = torch.Generator(device=DEVICE).manual_seed(5)
    target = torch.randn(num_requests * (n + 1), vocab_size, generator=generator, device=DEVICE) * 3
    draft = torch.randn(num_requests * n, vocab_size, generator=generator, device=DEVICE) * 3
    on = (
        torch.arange(num_requests, device=DEVICE) % 2 == 0
        if mixed
        else torch.ones(num_requests, dtype=torch.bool)
    )
    on = on.to(DEVICE)
    batch = SpecBatch(
        target_logits=target,
        draft_logits=draft,
        draft_token_ids=draft.argmax(dim=1),
        cu_num_drafts=torch.arange(0, num_requests * n + 1, n, dtype=torch.int32, device=DEVICE),
        temperature=torch.ones(num_requests, device=DEVICE),
        seed=torch.arange(num_requests, device=DEVICE),
        step=torch.zeros(num_requests, dtype=torch.int64, device=DEVICE),
        max_num_drafts=n,
        top_k=torch.where(on, 50, 0).to(torch.int32) if mixed else None,
        top_p=torch.where(on, 0.9, 1.0).to(torch.float32),
        min_p=torch.where(on, 0.05, 0.0).to(torch.float32) if mixed else None,
    )
    crowd = rejection_sample(batch)
    assert crowd.logprobs is not None
    for b in range(0, num_requests, 3):
        alone = rejection_sample(select_requests(batch, [b]))
        assert alone.logprobs is not None
        assert torch.equal(alone.token_ids[0], crowd.token_ids[b]), b
        assert torch.equal(alone.num_emitted[0], crowd.num_emitted[b]), b
        assert torch.equal(alone.logprobs[0].nan_to_num(7.0), crowd.logprobs[b].nan_to_num(7.0)), b
