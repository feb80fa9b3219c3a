"""A correct canonical-stream PyTorch sampler, written as small overridable steps.

It is the host of the planted bugs: each mutant in this package overrides one step with the smallest
change that reproduces a bug that shipped elsewhere. The sampler itself is exact: it draws the same
canonical uniforms as the kernels and `reference.sampler.reference_sample`, vectorised over the
batch in float64, so it also serves as a fast correct variant for campaigns.

Shapes below: ``B`` requests, ``N = max(n_b)`` draft positions (padded), ``V`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from reference import philox
from reference.contract import SpecBatch, SpecOutput
from reference.sampler import ACCEPT_PURPOSE, SAMPLE_PURPOSE, stream_offsets


@dataclass(frozen=True)
class Rows:
    """A batch gathered per request, padded to ``N`` positions.

    Attributes:
        target: ``[B, N + 1, V]`` float64 target logits (padding rows repeat the bonus row).
        draft: ``[B, N, V]`` float64 draft logits, or ``None`` for one-hot drafts.
        draft_ids: ``[B, N]`` int64 drafts, ``-1`` for placeholders, out-of-range ids and padding.
        counts: ``[B]`` int64 draft counts ``n_b``.
        temperature: ``[B]`` float64.
        seed, step: ``[B]`` int64.
    """

    target: torch.Tensor
    draft: torch.Tensor | None
    draft_ids: torch.Tensor
    counts: torch.Tensor
    temperature: torch.Tensor
    seed: torch.Tensor
    step: torch.Tensor

    @property
    def greedy(self) -> torch.Tensor:
        """``[B]`` bool: requests with ``T == 0``."""
        return self.temperature == 0


@dataclass(frozen=True)
class Noise:
    """The canonical uniforms: ``accept [B, N]`` (purpose 0) and ``sample [B, N + 1, V]`` (purpose 1)."""

    accept: torch.Tensor
    sample: torch.Tensor


def _row_law(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """``softmax(logits / T)`` per row with the reference's odd-value rules; ``T == 0`` gives the argmax."""
    clean = torch.nan_to_num(logits, nan=-torch.inf, posinf=torch.inf, neginf=-torch.inf)
    t = temperature.reshape(-1, *([1] * (logits.dim() - 1)))
    top = clean.amax(dim=-1, keepdim=True)
    scaled = torch.where(torch.isneginf(clean), -torch.inf, (clean - top) / torch.where(t > 0, t, 1.0))
    law = torch.softmax(torch.where(torch.isneginf(top), torch.zeros_like(scaled), scaled), dim=-1)
    posinf = torch.isposinf(clean)
    law = torch.where(posinf.any(-1, keepdim=True), posinf / posinf.sum(-1, keepdim=True).clamp(min=1), law)
    argmax = torch.nn.functional.one_hot(clean.argmax(dim=-1), clean.shape[-1]).to(law.dtype)
    return torch.where(t == 0, argmax, law)


class CanonicalSampler:
    """Exact rejection sampling on the canonical streams, in float64 torch, one step per method."""

    name = "canonical-torch"
    canonical_rng = True

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample ``batch``; the output lives on the batch's device."""
        batch.validate()
        rows = self.gather(batch)
        noise = self.noise(rows, batch.vocab_size)
        p = self.target_law(rows)
        q = self.draft_law(rows, p)
        accepted = self.accept(batch, rows, p, q, noise)
        num_accepted = self.first_rejection(accepted, rows.counts)
        emitted = self.emit(batch, rows, p, q, noise, num_accepted)
        return self.pack(rows, num_accepted, emitted)

    # -- inputs -----------------------------------------------------------------------------

    def gather(self, batch: SpecBatch) -> Rows:
        """Gather each request's target and draft rows, reading slotted drafts through ``draft_slot``."""
        device = batch.device
        cu = batch.cu_num_drafts.to(torch.int64)
        counts = cu[1:] - cu[:-1]
        width = batch.resolved_max_num_drafts()
        positions = torch.arange(width + 1, device=device)
        row = cu[:-1, None] + torch.arange(batch.num_requests, device=device)[:, None]
        target_rows = row + torch.minimum(positions[None, :], counts[:, None])
        target = batch.target_logits.double()[target_rows]
        draft_index = (cu[:-1, None] + positions[None, :width]).clamp(
            max=max(batch.draft_token_ids.shape[0] - 1, 0)
        )
        in_range = positions[None, :width] < counts[:, None]
        ids = (
            batch.draft_token_ids[draft_index]
            if width
            else torch.zeros((batch.num_requests, 0), dtype=torch.int64)
        )
        ids = torch.where(in_range & (ids >= 0) & (ids < batch.vocab_size), ids, -1)
        draft = None
        if batch.draft_logits is not None and batch.draft_slot is not None:
            draft = self.slotted_draft_rows(batch, width)
        elif batch.draft_logits is not None:
            draft = batch.draft_logits.double()[draft_index]
        return Rows(target, draft, ids, counts, batch.temperature.double(), batch.seed, batch.step)

    def slotted_draft_rows(self, batch: SpecBatch, width: int) -> torch.Tensor:
        """``[B, N, V]`` draft rows of slotted drafts: request ``b`` reads slot ``draft_slot[b]``."""
        assert batch.draft_logits is not None and batch.draft_slot is not None
        capacity = batch.draft_logits.shape[1]
        positions = torch.arange(width, device=batch.device).clamp(max=capacity - 1)
        return batch.draft_logits.double()[batch.draft_slot.to(torch.int64)[:, None], positions[None, :]]

    def noise(self, rows: Rows, vocab_size: int) -> Noise:
        """The canonical uniforms of every request (Philox, the layout of `reference.sampler`)."""
        width = rows.draft_ids.shape[1]
        seeds = rows.seed.cpu().numpy()[:, None, None]
        steps = rows.step.cpu().numpy().astype(np.uint64)[:, None, None]
        positions = np.arange(width + 1, dtype=np.uint64)[None, :, None]
        tokens = np.arange(vocab_size, dtype=np.uint64)[None, None, :]
        sample = philox.rand(seeds, stream_offsets(steps, positions, SAMPLE_PURPOSE, tokens))
        accept = philox.rand(
            seeds[:, :, 0], stream_offsets(steps[:, :, 0], positions[:, :width, 0], ACCEPT_PURPOSE, 0)
        )
        device = rows.target.device
        return Noise(
            torch.from_numpy(accept).double().to(device), torch.from_numpy(sample).double().to(device)
        )

    # -- laws -------------------------------------------------------------------------------

    def target_law(self, rows: Rows) -> torch.Tensor:
        """``[B, N + 1, V]`` target laws ``p_i = softmax(target / T)``; greedy rows one-hot."""
        return _row_law(rows.target, rows.temperature)

    def draft_law(self, rows: Rows, p: torch.Tensor) -> torch.Tensor:
        """``[B, N, V]`` draft laws ``q_i = softmax(draft / T)``, or one-hot on the drafts."""
        if rows.draft is not None:
            return _row_law(rows.draft, rows.temperature)
        vocab_size = p.shape[-1]
        return torch.nn.functional.one_hot(rows.draft_ids.clamp(min=0), vocab_size).double() * (
            rows.draft_ids >= 0
        ).unsqueeze(-1)

    # -- decisions ----------------------------------------------------------------------------

    def accept_uniforms(self, noise: Noise) -> torch.Tensor:
        """``[B, N]`` the acceptance uniform of each position."""
        return noise.accept

    def accept_test(self, p_draft: torch.Tensor, q_draft: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Strict ``>``: a token with ``p = 0`` must never be accepted, even at ``u = 0``."""
        return p_draft > u * q_draft

    def probabilistic_accept(
        self, rows: Rows, p: torch.Tensor, q: torch.Tensor, noise: Noise
    ) -> torch.Tensor:
        """``[B, N]`` the probabilistic decisions ``p(d) > u * q(d)``."""
        ids = rows.draft_ids.clamp(min=0).unsqueeze(-1)
        p_draft = p[:, :-1].gather(-1, ids).squeeze(-1)
        q_draft = q.gather(-1, ids).squeeze(-1)
        return self.accept_test(p_draft, q_draft, self.accept_uniforms(noise)) & (rows.draft_ids >= 0)

    def strict_samples(self, p: torch.Tensor, noise: Noise) -> torch.Tensor:
        """``[B, N + 1]`` a Gumbel-max sample of each target row."""
        return self.gumbel_argmax(p, noise.sample)

    def accept(
        self, batch: SpecBatch, rows: Rows, p: torch.Tensor, q: torch.Tensor, noise: Noise
    ) -> torch.Tensor:
        """``[B, N]`` whether each position's draft passes its test (before the first-rejection stop)."""
        ids = rows.draft_ids
        placed = ids >= 0
        if batch.method == "synthetic":
            assert batch.synthetic_rates is not None
            rates = self.synthetic_rates(batch, ids.shape[1])
            return placed & (self.accept_uniforms(noise) < rates[None, :])
        argmax = p[:, :-1].argmax(dim=-1)
        greedy = rows.greedy[:, None] & placed & (ids == argmax)
        if batch.method == "strict":
            sampled = placed & (self.strict_samples(p, noise)[:, :-1] == ids)
        else:
            sampled = self.probabilistic_accept(rows, p, q, noise)
        return torch.where(rows.greedy[:, None], greedy, sampled)

    def synthetic_rates(self, batch: SpecBatch, width: int) -> torch.Tensor:
        """``[N]`` conditional acceptance rates of synthetic sampling."""
        assert batch.synthetic_rates is not None
        return batch.synthetic_rates.to(batch.device)[:width]

    def first_rejection(self, accepted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """``[B]`` the number of drafts accepted: the position of the first rejection, or ``n_b``."""
        width = accepted.shape[1]
        positions = torch.arange(width, device=accepted.device)
        stopped = ~accepted | (positions[None, :] >= counts[:, None])
        first = torch.where(stopped, positions[None, :], width).amin(dim=1) if width else counts * 0
        return torch.minimum(first, counts)

    # -- the emitted token --------------------------------------------------------------------

    def gumbel_argmax(self, weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
        """Gumbel-max over the last dimension: ``argmax(log w - log(-log u))``, ties to the lowest index."""
        scores = torch.log(weights) - torch.log(-torch.log(uniforms))
        return torch.nan_to_num(scores, nan=-torch.inf).argmax(dim=-1)

    def residual(self, p: torch.Tensor, q: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """``(p - q)+``: the residual weights of the rejected positions (unnormalised)."""
        return torch.clamp(p - q, min=0.0)

    def sample_residual(
        self,
        weights: torch.Tensor,
        p: torch.Tensor,
        sample_uniforms: torch.Tensor,
        accept_uniforms: torch.Tensor,
    ) -> torch.Tensor:
        """Sample the residual; an empty residual falls back to ``p``."""
        empty = weights.sum(dim=-1, keepdim=True) <= 0
        return self.gumbel_argmax(torch.where(empty, p, weights), sample_uniforms)

    def rejection_rows(self, num_accepted: torch.Tensor) -> torch.Tensor:
        """``[B]`` the row whose residual is sampled on rejection: the rejected position."""
        return num_accepted

    def bonus_row(self, rows: Rows) -> torch.Tensor:
        """``[B]`` the row of the bonus sample: the last row, ``n_b``."""
        return rows.counts

    def emit(
        self,
        batch: SpecBatch,
        rows: Rows,
        p: torch.Tensor,
        q: torch.Tensor,
        noise: Noise,
        num_accepted: torch.Tensor,
    ) -> torch.Tensor:
        """``[B]`` the token emitted after the accepted drafts."""
        b = torch.arange(p.shape[0], device=p.device)
        bonus = num_accepted == rows.counts
        bonus_row = self.bonus_row(rows)
        bonus_token = self.gumbel_argmax(p[b, bonus_row], noise.sample[b, bonus_row])
        bonus_token = torch.where(rows.greedy, p[b, bonus_row].argmax(dim=-1), bonus_token)
        j = self.rejection_rows(num_accepted).clamp(max=max(q.shape[1] - 1, 0))
        target_token = self.gumbel_argmax(p[b, num_accepted], noise.sample[b, num_accepted])
        if q.shape[1] == 0:
            return bonus_token
        rejected_id = rows.draft_ids[b, num_accepted.clamp(max=q.shape[1] - 1)]
        if batch.method == "probabilistic":
            weights = self.residual(p[b, j], q[b, j], rejected_id)
            u_accept = self.accept_uniforms(noise)[b, num_accepted.clamp(max=q.shape[1] - 1)]
            residual_token = self.sample_residual(weights, p[b, j], noise.sample[b, num_accepted], u_accept)
            rejected = torch.where(rejected_id >= 0, residual_token, target_token)
        else:
            rejected = target_token  # strict: the target sample itself; synthetic: a fresh target sample
        rejected = torch.where(rows.greedy, p[b, num_accepted].argmax(dim=-1), rejected)
        return torch.where(bonus, bonus_token, rejected)

    # -- output -------------------------------------------------------------------------------

    def pack(self, rows: Rows, num_accepted: torch.Tensor, emitted: torch.Tensor) -> SpecOutput:
        """Lay out the accepted drafts and the emitted token; ``-1`` and NaN after them."""
        batch_size, width = rows.draft_ids.shape
        positions = torch.arange(width + 1, device=emitted.device)[None, :]
        drafts = torch.cat([rows.draft_ids, rows.draft_ids.new_full((batch_size, 1), -1)], dim=1)
        tokens = torch.where(positions < num_accepted[:, None], drafts, -1)
        tokens = torch.where(positions == num_accepted[:, None], emitted[:, None], tokens)
        logprob_temperature = torch.where(rows.greedy, 1.0, rows.temperature)
        law = _row_law(rows.target, logprob_temperature)
        vocab_size = law.shape[-1]
        picked = law.gather(-1, tokens.clamp(0, vocab_size - 1).unsqueeze(-1)).squeeze(-1)
        logprobs = torch.where((tokens >= 0) & (tokens < vocab_size), torch.log(picked), torch.nan).float()
        return SpecOutput(token_ids=tokens, num_emitted=(num_accepted + 1).to(torch.int32), logprobs=logprobs)
