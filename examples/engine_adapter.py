"""How to plug a sampler that was not written against our contract into the harness.

`engine_rejection_sample` stands for an inference engine's sampler: it takes probabilities (not
logits), drafts padded to ``[B, K]``, and a ``torch.Generator`` per request. `EngineAdapter` is the
whole adapter: it turns a `SpecBatch` into the engine's arguments and the engine's output into a
`SpecOutput`, and ``capabilities`` says what the engine implements, so the harness checks it there
and reports the rest as not checked. Like a serving engine, it verifies against the *processed*
target law: `engine_filter` applies a request's min-p, top-k and top-p to the target probabilities
(sort and cumulative sum, in float64) before the engine sees them, and the drafts come from the law
the engine already filtered (``draft_filter`` stays off). Certify it with::

    python -m specsample.fuzz certify --variant examples/engine_adapter.py:EngineAdapter
"""

from __future__ import annotations

import torch

from specsample.reference.contract import Capabilities, SpecBatch, SpecOutput


def engine_rejection_sample(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generators: list[torch.Generator],
) -> torch.Tensor:
    """An engine-style probabilistic rejection sampler (textbook; its own RNG).

    Args:
        draft_token_ids: ``[B, K]`` int64 drafts, ``-1`` padded.
        num_draft_tokens: ``B`` draft counts.
        draft_probs: ``[B, K, V]`` draft probabilities, or ``None`` for one-hot drafts.
        target_probs: ``[B, K + 1, V]`` target probabilities.
        generators: one generator per request.

    Returns:
        ``[B, K + 1]`` int64 output tokens, ``-1`` padded.
    """
    batch_size, width = draft_token_ids.shape
    out = torch.full((batch_size, width + 1), -1, dtype=torch.int64)
    for b, n in enumerate(num_draft_tokens):
        generator = generators[b]
        for i in range(n + 1):
            p = target_probs[b, i]
            if i == n:
                out[b, i] = torch.multinomial(p, 1, generator=generator).item()
                break
            d = int(draft_token_ids[b, i])
            q = (
                draft_probs[b, i]
                if draft_probs is not None
                else torch.nn.functional.one_hot(torch.tensor(max(d, 0)), p.shape[0]).to(p.dtype) * (d >= 0)
            )
            u = torch.rand((), generator=generator, dtype=p.dtype)
            if d >= 0 and p[d] > u * q[d]:
                out[b, i] = d
                continue
            residual = torch.clamp(p - q, min=0) if d >= 0 else p
            law = residual if residual.sum() > 0 else p
            out[b, i] = torch.multinomial(law, 1, generator=generator).item()
            break
    return out


def engine_filter(probs: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Rows of probabilities restricted to what min-p, then top-k, then top-p keep, renormalised: the
    engine's sampling parameters (each keeps the tokens at or above a value; ties at a cut kept).

    A row that keeps every token is returned as it is. Renormalised, it would move by float64
    rounding alone, and where the target row equals its draft row (``p == q``) the residual
    ``max(p - q, 0)`` would then be rounding noise, not empty: the engine would draw from the
    noise where the law says ``p``."""
    keep = probs >= min_p * probs.amax(-1, keepdim=True)
    if 0 < top_k < probs.shape[-1]:
        kth = torch.where(keep, probs, -1.0).sort(-1, descending=True).values[..., top_k - 1 : top_k]
        keep &= probs >= kth
    if top_p < 1.0:
        kept = torch.where(keep, probs, 0.0).sort(-1, descending=True).values
        above = (kept.cumsum(-1) - kept) / kept.sum(-1, keepdim=True)
        last = ((above < top_p) & (kept > 0)).sum(-1, keepdim=True).clamp(min=1) - 1
        keep &= probs >= kept.gather(-1, last)
    filtered = torch.where(keep, probs, 0.0)
    return torch.where(keep.all(-1, keepdim=True), probs, filtered / filtered.sum(-1, keepdim=True))


def _probs(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """``softmax(logits / T)`` of one request's rows; a greedy request (``T = 0``) gets its argmax."""
    clean = torch.nan_to_num(logits.double(), nan=-torch.inf)
    t = temperature.double()
    probs = torch.softmax((clean - clean.amax(-1, keepdim=True)) / torch.where(t > 0, t, 1.0), dim=-1)
    greedy = torch.nn.functional.one_hot(clean.argmax(-1), logits.shape[-1]).double()
    return torch.where(t == 0, greedy, probs)


def _parameters(batch: SpecBatch, b: int) -> tuple[int, float, float]:
    """Request ``b``'s ``(top_k, top_p, min_p)``, off where the batch does not set them."""
    top_k = 0 if batch.top_k is None else int(batch.top_k[b])
    top_p = 1.0 if batch.top_p is None else float(batch.top_p[b])
    min_p = 0.0 if batch.min_p is None else float(batch.min_p[b])
    return top_k, top_p, min_p


class EngineAdapter:
    """The adapter: `SpecBatch` in, engine call, `SpecOutput` out (flat or one-hot drafts)."""

    name = "engine-adapter"
    streams = None
    # Probabilistic sampling of flat or one-hot drafts, no logprobs; +inf logits and rows with no
    # finite logit make the engine's softmax NaN, so its callers never send them. It takes min-p,
    # top-k and top-p on the target (its filters in float64: rounding at a cut-off within 1 ulp).
    capabilities = Capabilities(
        methods=("probabilistic",),
        draft_kinds=("one-hot", "flat"),
        logprobs=False,
        infinite_logits=False,
        filters=("top_k", "top_p", "min_p"),
        filter_ulps=1.0,
    )

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample ``batch`` with the engine's sampler."""
        if batch.method != "probabilistic" or batch.draft_slot is not None:
            raise ValueError(f"method is {batch.method!r}; this engine does flat probabilistic sampling only")
        if batch.draft_filter:
            raise ValueError(
                "draft_filter is True; this engine takes drafts from the law it already filtered"
            )
        counts = batch.num_drafts()
        width = max(counts)
        starts = batch.cu_num_drafts.tolist()
        ids = torch.full((len(counts), width), -1, dtype=torch.int64)
        target = torch.zeros(len(counts), width + 1, batch.vocab_size, dtype=torch.float64)
        draft: torch.Tensor | None = None
        if batch.draft_logits is not None:
            draft = torch.zeros(len(counts), width, batch.vocab_size, dtype=torch.float64)
        for b, n in enumerate(counts):
            first, temperature = starts[b], batch.temperature[b]
            drafts = batch.draft_token_ids[first : first + n]
            # Drafts outside [-1, V) become placeholders.
            ids[b, :n] = torch.where(drafts < batch.vocab_size, drafts.clamp(min=-1), -1)
            target[b, : n + 1] = _probs(batch.target_logits[first + b : first + b + n + 1], temperature)
            if temperature > 0:  # greedy rows are unaffected by the filters
                target[b, : n + 1] = engine_filter(target[b, : n + 1], *_parameters(batch, b))
            if draft is not None and batch.draft_logits is not None:
                draft[b, :n] = _probs(batch.draft_logits[first : first + n], temperature)
        generators = [
            torch.Generator().manual_seed((int(s) * 1_000_003 + int(t)) % (2**63))
            for s, t in zip(batch.seed.tolist(), batch.step.tolist(), strict=True)
        ]
        tokens = engine_rejection_sample(ids, counts, draft, target, generators)
        emitted = (tokens >= 0).sum(dim=1).to(torch.int32)
        return SpecOutput(token_ids=tokens, num_emitted=emitted)
