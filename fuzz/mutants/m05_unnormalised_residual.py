"""M05: the residual is sampled by inverse CDF without renormalising it first.

A common slip: `u` in `[0, 1)` is compared with the cumulative sum of `(p - q)+`, whose total is below
1, so every `u` past the total falls through to the last token.
"""

import torch

from fuzz.mutants.base import CanonicalSampler


class UnnormalisedResidual(CanonicalSampler):
    """Inverse-CDF residual sampling against the unnormalised cumulative sum."""

    name = "M05"

    def sample_residual(
        self,
        weights: torch.Tensor,
        p: torch.Tensor,
        sample_uniforms: torch.Tensor,
        accept_uniforms: torch.Tensor,
    ) -> torch.Tensor:
        """The planted bug: no division by the residual's mass before the search."""
        cdf = torch.cumsum(weights, dim=-1)
        u = sample_uniforms[..., :1]
        token = torch.searchsorted(cdf.contiguous(), u.contiguous(), right=True).squeeze(-1)
        return token.clamp(max=weights.shape[-1] - 1)
