"""A plain PyTorch rejection sampler: the textbook algorithm with its own random streams.

Softmax of every row, the ratio test ``p(d) > u q(d)``, the residual ``(p - q)+`` and an
inverse-CDF multinomial draw, all on materialised ``[rows, V]`` tensors. It is a second,
independent implementation of the specification (`reference.law`), a latency baseline, and the
example of a variant whose random numbers are not the canonical streams: each request draws its
uniforms from a CPU ``torch.Generator`` seeded from its own ``(seed, step)``, so its output depends
on nothing else in the batch. It reads the draft counts back to the host.

Its arithmetic is fp32 probabilities, declared as such (``fp32-probs``): a probability below
float32's smallest normal is zero to it, explicitly (the law it is held to flushes them too), so a
draft whose ``p`` and ``q`` both underflow is never accepted.

It takes every sampling parameter (`reference.filters`): min-p, top-k and top-p on the fp32
probabilities by a sort and a float32 cumulative sum (`filter_probs`), value pivots, on the target
rows and, with ``draft_filter``, on the draft rows.
"""

from __future__ import annotations

import dataclasses
import os

import torch
from torch.nn import functional as F

from specsample.reference.contract import FP32_TINY, Capabilities, SpecBatch, SpecOutput, validate_batch
from specsample.reference.filters import FILTER_FLAGS
from specsample.reference.law import MAX_TEMPERATURE

_MASK64 = (1 << 64) - 1

# Bytes `torch_sample` holds at its peak per target logit beyond the batch's own logits, on its widest
# path (probabilistic, draft logits given): four fp32 [rows, V] tensors it keeps (the argmax copy,
# target probabilities, sampling law, draft probabilities: 16), plus either the final rows' weights
# and residual (8) with `_inverse_cdf`'s float64 copy and CDF (16) when every row is final, 40; or,
# before the draft probabilities exist, `row_probs` on the draft rows (a gathered copy and five
# temporaries, 25 on 12), 37. The CPU's peak resident memory gives 32 to 36; 64 leaves room for the
# CUDA caching allocator's rounding and fragmentation.
BYTES_PER_LOGIT = 64


def generator_seed(seed: int, step: int) -> int:
    """A 64-bit generator seed mixing a request's seed and step (SplitMix64's finaliser)."""
    z = (seed * 0x9E3779B97F4A7C15 + step * 0xD1B54A32D192ED03 + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def row_probs(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """``softmax(logits / T)`` per row with the specification's odd-value rules, in float32.

    NaN counts as ``-inf``; a row with ``+inf`` entries is uniform over them; a row with no finite
    entry is uniform over the vocabulary. ``temperature`` is ``[rows]`` and must be positive.
    """
    clean = torch.nan_to_num(logits.float(), nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    row_max = clean.max(dim=1, keepdim=True).values
    capped = temperature.clamp(max=MAX_TEMPERATURE)[:, None]
    scaled = torch.where(clean == row_max, 0.0, (clean - row_max) / capped)
    weights = torch.exp(scaled)
    probs = weights / weights.sum(dim=1, keepdim=True)
    return torch.where(probs < FP32_TINY, 0.0, probs)


def _inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One draw per row of unnormalised ``weights [rows, V]``: the first index whose CDF exceeds ``u``."""
    cdf = weights.double().cumsum(dim=1)
    targets = (uniforms.double() * cdf[:, -1])[:, None]
    index = torch.searchsorted(cdf, targets, right=True).squeeze(1)
    # Rounding can land past the last positive weight; step back to it.
    last_positive = weights.shape[1] - 1 - torch.argmax((weights.flip(1) > 0).to(torch.int8), dim=1)
    return torch.minimum(index, last_positive)


def filter_probs(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """Rows ``[rows, V]`` of fp32 probabilities restricted to what min-p, then top-k, then top-p keep
    (``[rows]`` parameters, off at 0, ``>= V`` or 0, and 1), renormalised.

    Each filter keeps the tokens at or above a value (ties at a pivot kept whole): min-p
    ``p >= min_p * max p``; top-k the ``k``-th largest kept value; top-p the smallest kept value whose
    kept mass above it, a float32 exclusive cumulative sum over the sorted kept row, is below
    ``top_p`` times the kept mass.
    """
    vocab_size = probs.shape[1]
    keep = probs >= min_p[:, None] * probs.max(dim=1, keepdim=True).values
    ordered = torch.sort(torch.where(keep, probs, -1.0), dim=1, descending=True).values
    k = top_k.to(torch.int64)
    kth = ordered.gather(1, (k.clamp(1, vocab_size) - 1)[:, None])
    keep &= ~((k > 0) & (k < vocab_size))[:, None] | (probs >= kth)
    kept = torch.sort(torch.where(keep, probs, 0.0), dim=1, descending=True).values
    total = kept.sum(dim=1, keepdim=True)
    above = torch.cumsum(kept, dim=1) - kept  # the mass sorted before each entry
    inside = (above < top_p[:, None] * total) & (kept > 0)
    last = inside.sum(dim=1, keepdim=True).clamp(min=1) - 1
    cut = kept.gather(1, last)
    keep &= ~(top_p < 1.0)[:, None] | (probs >= cut)
    filtered = torch.where(keep, probs, 0.0)
    return filtered / filtered.sum(dim=1, keepdim=True)


def _row_parameters(batch: SpecBatch, request_of_row: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """Each row's ``(top_k, top_p, min_p)``, or ``None`` where the batch has no sampling parameter."""
    if not batch.filtered:
        return None
    rows = request_of_row.shape[0]
    ones = torch.ones(rows, device=request_of_row.device)
    top_k = torch.zeros(rows, dtype=torch.int64, device=ones.device) if batch.top_k is None else batch.top_k
    top_p = ones if batch.top_p is None else batch.top_p
    min_p = ones * 0.0 if batch.min_p is None else batch.min_p
    return tuple(p if p.shape[0] == rows else p[request_of_row] for p in (top_k, top_p, min_p))


TORCH_METHODS = ("strict", "probabilistic", "synthetic")


class TorchRejectionSampler:
    """The textbook sampler as a `Variant` (its own RNG: ``streams`` is ``None``)."""

    name = "torch"
    streams = None
    capabilities = Capabilities(methods=TORCH_METHODS, arithmetic="fp32-probs", filters=FILTER_FLAGS)

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample ``batch`` on its device."""
        return torch_sample(batch)


def free_memory(device: torch.device) -> int:
    """Bytes free for intermediates on ``device``: the GPU's free memory plus the blocks PyTorch's
    caching allocator holds unused, or the host's available memory for the CPU."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def request_chunks(counts: list[int], vocab_size: int, max_logits: int) -> list[tuple[int, int]]:
    """Contiguous request ranges ``[lo, hi)`` covering ``counts``, each within ``max_logits`` target logits.

    One range when the whole batch fits. Otherwise the rows are shared out evenly over as few ranges
    as the limit allows, and no request is split (one whose rows alone pass the limit gets a range
    of its own). A range holds at least two rows, one row past the limit if need be: PyTorch's CPU
    sum reduces a lone row in another order than a row among others, and a range must compute what
    the whole batch does.
    """
    rows = [n + 1 for n in counts]
    total = sum(rows)
    if total * vocab_size <= max_logits:
        return [(0, len(counts))]
    max_rows = max(2, max_logits // vocab_size)
    num_chunks = -(-total // max_rows)
    rows_per_chunk = -(-total // num_chunks)
    chunks, lo, taken = [], 0, 0
    for b, r in enumerate(rows):
        if taken >= 2 and taken + r > rows_per_chunk:
            chunks.append((lo, b))
            lo, taken = b, 0
        taken += r
    if taken < 2 and chunks:  # a lone last row joins the range before it
        lo = chunks.pop()[0]
    chunks.append((lo, len(rows)))
    return chunks


def select_request_range(batch: SpecBatch, counts: list[int], lo: int, hi: int) -> SpecBatch:
    """Requests ``lo ... hi - 1`` of ``batch`` as a batch of their own (views of its tensors).

    Target rows, flat draft rows and draft ids are contiguous per request, so each is one slice;
    slotted draft logits are shared whole and read through the requests' own slots.
    """
    draft_lo, draft_hi = sum(counts[:lo]), sum(counts[:hi])
    draft_logits = batch.draft_logits
    if draft_logits is not None and not batch.slotted:
        draft_logits = draft_logits[draft_lo:draft_hi]
    return dataclasses.replace(
        batch,
        target_logits=batch.target_logits[draft_lo + lo : draft_hi + hi],
        draft_logits=draft_logits,
        draft_token_ids=batch.draft_token_ids[draft_lo:draft_hi],
        cu_num_drafts=batch.cu_num_drafts[lo : hi + 1] - batch.cu_num_drafts[lo],
        temperature=batch.temperature[lo:hi],
        seed=batch.seed[lo:hi],
        step=batch.step[lo:hi],
        draft_slot=None if batch.draft_slot is None else batch.draft_slot[lo:hi],
        max_num_drafts=max(counts[lo:hi]),
        top_k=None if batch.top_k is None else batch.top_k[lo:hi],
        top_p=None if batch.top_p is None else batch.top_p[lo:hi],
        min_p=None if batch.min_p is None else batch.min_p[lo:hi],
    )


def torch_sample(batch: SpecBatch) -> SpecOutput:
    """Run the textbook rejection sampler of ``batch.method`` on ``batch``.

    A batch whose intermediates (`BYTES_PER_LOGIT` per target logit) would not fit the device's free
    memory runs in contiguous ranges of requests, one call each. A request's output depends on its own
    rows, seed and step only, so the ranges' outputs, written into outputs of the batch's width
    (``-1`` tokens and ``nan`` logprobs past a range's own), are those of one call: bit for bit on the
    CPU; on a GPU PyTorch chooses a reduction's order by the tensor's shape, so a row's normaliser can
    differ in its last bit.

    Raises:
        ValueError: naming the argument and the value, for anything that breaks the contract
            (`SpecBatch.validate`, every check, values included), whatever its type or device.
    """
    validate_batch(batch, check_values=True)
    if batch.method not in TORCH_METHODS:
        raise ValueError(
            f"method is {batch.method!r}; this sampler implements {', '.join(TORCH_METHODS)} only"
        )
    counts = batch.num_drafts()
    chunks = request_chunks(counts, batch.vocab_size, free_memory(batch.device) // BYTES_PER_LOGIT)
    if len(chunks) == 1:
        return _sample(batch, counts)
    rows, width = batch.num_requests, batch.resolved_max_num_drafts() + 1
    token_ids = torch.full((rows, width), -1, dtype=torch.int64, device=batch.device)
    logprobs = torch.full((rows, width), float("nan"), dtype=torch.float32, device=batch.device)
    num_emitted = torch.empty(rows, dtype=torch.int32, device=batch.device)
    for lo, hi in chunks:
        part = _sample(select_request_range(batch, counts, lo, hi), counts[lo:hi])
        token_ids[lo:hi, : part.token_ids.shape[1]] = part.token_ids
        logprobs[lo:hi, : part.token_ids.shape[1]] = part.logprobs
        num_emitted[lo:hi] = part.num_emitted
    return SpecOutput(token_ids=token_ids, num_emitted=num_emitted, logprobs=logprobs)


def _sample(batch: SpecBatch, counts: list[int]) -> SpecOutput:
    """`torch_sample` in one call: every intermediate materialised for the whole (validated) batch."""
    device = batch.device
    (num_rows, vocab_size), num_requests = batch.target_logits.shape, batch.num_requests
    max_n = batch.resolved_max_num_drafts()
    width = max_n + 1

    # Per-request uniforms from per-request generators: [B, max_n] acceptance, [B, max_n + 1] sampling.
    accept_u = torch.zeros(num_requests, max(max_n, 1))
    sample_u = torch.zeros(num_requests, width)
    for b, (seed, step, n) in enumerate(zip(batch.seed.tolist(), batch.step.tolist(), counts, strict=True)):
        generator = torch.Generator().manual_seed(generator_seed(seed, step))
        accept_u[b, :n] = torch.rand(n, generator=generator)
        sample_u[b, : n + 1] = torch.rand(n + 1, generator=generator)
    accept_u, sample_u = accept_u.to(device), sample_u.to(device)

    counts_t = torch.tensor(counts, device=device)
    request_of_row = torch.repeat_interleave(torch.arange(num_requests, device=device), counts_t + 1)
    starts = torch.cumsum(counts_t + 1, 0) - (counts_t + 1)
    position_of_row = torch.arange(num_rows, device=device) - starts[request_of_row]
    temperature = batch.temperature[request_of_row]
    greedy = ~(temperature > 0)
    clean_target = torch.nan_to_num(batch.target_logits.float(), nan=float("-inf"))
    argmax = torch.argmax(clean_target, dim=1)
    # Greedy rows sample onehot(argmax); their logprobs (and draft laws) use T = 1.
    temperature = torch.where(greedy, 1.0, temperature)
    target = row_probs(batch.target_logits, temperature)
    params = _row_parameters(batch, request_of_row)
    if params is not None:  # greedy rows are unaffected by the filters
        target = torch.where(greedy[:, None], target, filter_probs(target, *params))
    sample_target = torch.where(greedy[:, None], F.one_hot(argmax, vocab_size).float(), target)

    is_draft_row = position_of_row < counts_t[request_of_row]
    ids = batch.draft_token_ids
    # Row r of request b holds draft cu[b] + i = r - b; bonus rows read a placeholder appended to the ids.
    draft_of_row = torch.where(is_draft_row, torch.arange(num_rows, device=device) - request_of_row, len(ids))
    row_ids = F.pad(ids, (0, 1), value=-1)[draft_of_row]
    real = is_draft_row & (row_ids >= 0) & (row_ids < vocab_size)
    safe_ids = torch.where(real, row_ids, 0)

    row_accept_u = accept_u[request_of_row, position_of_row.clamp(max=accept_u.shape[1] - 1)]
    if batch.method == "synthetic":
        assert batch.synthetic_rates is not None
        # A position past the given rates has rate 0, as in the specification.
        rates = F.pad(batch.synthetic_rates, (0, 1))
        accept = real & (row_accept_u.double() < rates[position_of_row.clamp(max=rates.shape[0] - 1)])
    elif batch.method == "strict":
        strict_sample = _inverse_cdf(sample_target, sample_u[request_of_row, position_of_row])
        accept = real & (strict_sample == row_ids)
    else:
        draft = _draft_probs(batch, request_of_row, position_of_row, temperature, safe_ids)
        if params is not None and batch.draft_filter and batch.draft_logits is not None:
            draft = torch.where(greedy[:, None], draft, filter_probs(draft, *params))
        p_draft, q_draft = (law.gather(1, safe_ids[:, None]).squeeze(1) for law in (sample_target, draft))
        accept = real & (p_draft > row_accept_u * q_draft)

    # First rejection per request: count accepts before the first non-accept.
    accept_grid = torch.ones(num_requests, width, dtype=torch.bool, device=device)
    accept_grid[request_of_row, position_of_row] = accept | ~is_draft_row
    num_accepted = torch.cumprod(accept_grid.to(torch.int64), dim=1).sum(dim=1).clamp(max=counts_t)
    final_row = starts + num_accepted
    final_is_draft = num_accepted < counts_t

    weights = sample_target[final_row]
    if batch.method == "probabilistic":
        residual = torch.clamp(weights - draft[final_row], min=0.0)
        has_mass = residual.sum(dim=1) > 0
        use_residual = (final_is_draft & real[final_row] & has_mass & ~greedy[final_row])[:, None]
        weights = torch.where(use_residual, residual, weights)
    final_token = _inverse_cdf(weights, sample_u[torch.arange(num_requests, device=device), num_accepted])
    if batch.method == "strict":
        final_token = torch.where(final_is_draft & ~greedy[final_row], strict_sample[final_row], final_token)

    columns = torch.arange(width, device=device)[None, :]
    # Past a request's last row the index runs into the next request's: those cells are masked.
    grid_rows = (starts[:, None] + columns).clamp(max=num_rows - 1)
    grid_ids = torch.where(columns < num_accepted[:, None], row_ids[grid_rows], -1)
    token_ids = torch.where(columns == num_accepted[:, None], final_token[:, None], grid_ids)
    with torch.no_grad():
        probs = target[grid_rows, token_ids.clamp(min=0)]
    logprobs = torch.where(columns <= num_accepted[:, None], torch.log(probs), float("nan"))
    return SpecOutput(
        token_ids=token_ids.to(torch.int64),
        num_emitted=(num_accepted + 1).to(torch.int32),
        logprobs=logprobs.to(torch.float32),
    )


def _draft_probs(
    batch: SpecBatch,
    request_of_row: torch.Tensor,
    position_of_row: torch.Tensor,
    temperature: torch.Tensor,
    safe_ids: torch.Tensor,
) -> torch.Tensor:
    """``[R, V]`` draft laws aligned with the target rows; a row without a real draft (a bonus row, a
    placeholder) gets whatever law its index reaches, as `_sample` masks its acceptance and residual."""
    num_rows, vocab_size = batch.target_logits.shape
    draft_logits = batch.draft_logits
    if draft_logits is None or len(batch.draft_token_ids) == 0:  # one-hot drafts, or none to read
        return F.one_hot(safe_ids, vocab_size).float()
    if batch.slotted:
        assert batch.draft_slot is not None
        slots = batch.draft_slot.to(torch.int64)[request_of_row]
        gathered = draft_logits[slots, position_of_row.clamp(max=draft_logits.shape[1] - 1)]
    else:
        draft_of_row = torch.arange(num_rows, device=batch.device) - request_of_row  # cu[b] + i
        gathered = draft_logits[draft_of_row.clamp(max=draft_logits.shape[0] - 1)]
    return row_probs(gathered, temperature)
