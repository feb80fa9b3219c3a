"""The PyTorch sampler run in ranges of requests (a batch too large for free memory) matches one call."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from specsample.kernels import torch_sampler
from specsample.properties import strategies
from specsample.reference.contract import METHODS, RequestData, SpecBatch, SpecOutput, make_batch

# Ragged on purpose: zero-draft requests between, before and after requests with drafts, whose
# families and draft choices give chains of accepted drafts as well as early rejections.
COUNTS = (0, 3, 0, 0, 5, 1, 0, 2, 4, 0)
TEMPERATURES = (1.0, 0.0, 0.7, 1.0, 1.3, 0.0, 0.5, 1.0, 2.0, 0.0)
FAMILIES = ("odd", "equal", "tiny", "sparse", "near_equal", "peaked", "ties", "equal", "zipf", "flat")
# 40000 > PyTorch's CPU grain size (32768): a lone row would be summed in two parts, in parallel.
VOCAB_SIZES = (257, 40000)


def ragged_batch(method: str, draft_kind: str, vocab_size: int) -> SpecBatch:
    """Ten requests of ten families, greedy and sampled, with placeholders among the drafts."""
    rng = np.random.default_rng(METHODS.index(method) * 10 + ("one-hot", "flat", "slotted").index(draft_kind))
    requests = []
    for b, (n, temperature, family) in enumerate(zip(COUNTS, TEMPERATURES, FAMILIES, strict=True)):
        target, draft = strategies.family_logits(rng, family, n, vocab_size)
        choice = "from_q" if temperature > 0 else "argmax"
        ids = strategies.choose_drafts(rng, choice, target, draft, temperature or 1.0, placeholder_rate=0.1)
        draft_logits = None if draft_kind == "one-hot" else draft
        requests.append(RequestData(target, ids, draft_logits, temperature, seed=1000 + b, step=7 * b))
    slots = list(rng.permutation(len(COUNTS) + 3)[: len(COUNTS)]) if draft_kind == "slotted" else None
    return make_batch(
        requests,
        method=method,  # type: ignore[arg-type]
        dtype=torch.bfloat16,
        synthetic_rates=[0.9, 0.7, 0.5, 0.4, 0.2],
        slots=slots,
        num_slots=len(COUNTS) + 3 if slots else None,
        slot_capacity=6 if slots else None,
    )


def _sample_with_free_memory(
    monkeypatch: pytest.MonkeyPatch, batch: SpecBatch, free: int
) -> tuple[SpecOutput, int]:
    """The sampler's output on ``batch`` when ``free`` bytes are free, and the number of calls it made."""
    calls = []
    one_call = torch_sampler._sample

    def counted(part: SpecBatch, counts: list[int]) -> SpecOutput:
        calls.append(part.num_requests)
        return one_call(part, counts)

    monkeypatch.setattr(torch_sampler, "free_memory", lambda device: free)
    monkeypatch.setattr(torch_sampler, "_sample", counted)
    output = torch_sampler.TorchRejectionSampler()(batch)
    assert sum(calls) == batch.num_requests
    return output, len(calls)


@pytest.mark.parametrize("vocab_size", VOCAB_SIZES)
@pytest.mark.parametrize("draft_kind", ["one-hot", "flat", "slotted"])
@pytest.mark.parametrize("method", torch_sampler.TorchRejectionSampler.capabilities.methods)
def test_chunked_output_is_the_one_call_output(
    monkeypatch: pytest.MonkeyPatch, method: str, draft_kind: str, vocab_size: int
) -> None:
    """Whatever the free memory, ranges of requests give the very tokens, counts and logprobs of one call."""
    batch = ragged_batch(method, draft_kind, vocab_size)
    whole, num_calls = _sample_with_free_memory(monkeypatch, batch, 1 << 62)
    assert num_calls == 1
    logit_bytes = torch_sampler.BYTES_PER_LOGIT * vocab_size
    for rows in (1, 2, 4, 7, 12):
        chunked, num_calls = _sample_with_free_memory(monkeypatch, batch, rows * logit_bytes)
        assert num_calls > 1
        assert chunked.token_ids.dtype == torch.int64 and chunked.num_emitted.dtype == torch.int32
        assert chunked.token_ids.shape == whole.token_ids.shape == (len(COUNTS), max(COUNTS) + 1)
        assert torch.equal(chunked.token_ids, whole.token_ids), rows
        assert torch.equal(chunked.num_emitted, whole.num_emitted), rows
        assert chunked.logprobs is not None and whole.logprobs is not None
        assert torch.equal(chunked.logprobs.isnan(), whole.logprobs.isnan()), rows
        assert torch.equal(chunked.logprobs.nan_to_num(), whole.logprobs.nan_to_num()), rows


def test_request_ranges_cover_the_batch_within_the_limit() -> None:
    """Ranges are contiguous, cover every request once, split no request and hold two rows or more."""
    counts = [0, 3, 0, 0, 5, 1, 0, 2, 4, 0, 127, 0, 0, 6, 0]
    vocab_size = 10
    total = sum(n + 1 for n in counts)
    assert torch_sampler.request_chunks(counts, vocab_size, total * vocab_size) == [(0, len(counts))]
    assert torch_sampler.request_chunks([0], vocab_size, 1) == [(0, 1)]
    for max_rows in (0, 1, 2, 3, 5, 8, 40, 150):
        chunks = torch_sampler.request_chunks(counts, vocab_size, max_rows * vocab_size + vocab_size - 1)
        assert len(chunks) > 1
        assert chunks[0][0] == 0 and chunks[-1][1] == len(counts)
        assert all(hi > lo for lo, hi in chunks)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
        for lo, hi in chunks:
            rows = [n + 1 for n in counts[lo:hi]]
            assert 2 <= sum(rows) <= max(max_rows, max(rows)) + 1, (max_rows, chunks)
