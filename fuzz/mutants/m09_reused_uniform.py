"""M09: the acceptance uniform is reused for the residual draw.

Seen in FlashInfer #424 and SGLang #7207: after a rejection `u` is biased high, and so is the token.
"""

import torch

from fuzz.mutants.base import CanonicalSampler


class ReusedUniform(CanonicalSampler):
    """Samples the residual by inverse CDF with the acceptance uniform."""

    name = "M09"

    def sample_residual(
        self,
        weights: torch.Tensor,
        p: torch.Tensor,
        sample_uniforms: torch.Tensor,
        accept_uniforms: torch.Tensor,
    ) -> torch.Tensor:
        """The planted bug: the uniform that decided the rejection also picks the token."""
        mass = weights.sum(dim=-1, keepdim=True)
        law = torch.where(mass > 0, weights / mass.clamp(min=1e-300), p)
        cdf = torch.cumsum(law, dim=-1)
        u = accept_uniforms.unsqueeze(-1).to(cdf.dtype).contiguous()
        token = torch.searchsorted(cdf.contiguous(), u, right=True).squeeze(-1)
        return token.clamp(max=weights.shape[-1] - 1)
