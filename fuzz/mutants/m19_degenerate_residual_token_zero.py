"""M19: a residual with no mass falls back to token 0 instead of sampling `p`.

Latent in vLLM and seen in SGLang #22643: token 0 may have probability 0.
"""

import torch

from fuzz.mutants.base import CanonicalSampler


class DegenerateResidualTokenZero(CanonicalSampler):
    """Emits token 0 when the residual is empty."""

    name = "M19"

    def sample_residual(
        self,
        weights: torch.Tensor,
        p: torch.Tensor,
        sample_uniforms: torch.Tensor,
        accept_uniforms: torch.Tensor,
    ) -> torch.Tensor:
        """The planted bug: the fallback index 0 instead of a sample of `p`."""
        token = super().sample_residual(weights, p, sample_uniforms, accept_uniforms)
        return torch.where(weights.sum(dim=-1) <= 0, 0, token)
