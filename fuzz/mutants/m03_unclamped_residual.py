"""M03: the residual is `p - q` without `max(., 0)`.

A common slip: the residual's mass is computed right (`1 - sum(min(p, q))`), but the inverse CDF is
built from the unclamped difference, so it dips where `p < q` and the search lands on wrong tokens.
"""

import torch

from fuzz.mutants.base import CanonicalSampler


class UnclampedResidual(CanonicalSampler):
    """Samples the residual by inverse CDF over `p - q` unclamped."""

    name = "M03"

    def residual(self, p: torch.Tensor, q: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The planted bug: no `relu`."""
        return p - q

    def sample_residual(
        self,
        weights: torch.Tensor,
        p: torch.Tensor,
        sample_uniforms: torch.Tensor,
        accept_uniforms: torch.Tensor,
    ) -> torch.Tensor:
        """Inverse CDF over the residual, normalised by its true mass `1 - sum(min(p, q))`."""
        mass = weights.clamp(min=0).sum(dim=-1, keepdim=True)
        cdf = torch.cumsum(torch.where(mass > 0, weights / mass.clamp(min=1e-300), p), dim=-1)
        u = sample_uniforms[..., :1]
        token = torch.searchsorted(cdf.contiguous(), u.contiguous(), right=True).squeeze(-1)
        return token.clamp(max=weights.shape[-1] - 1)
