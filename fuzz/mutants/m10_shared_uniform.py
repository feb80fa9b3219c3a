"""M10: one acceptance uniform is shared by every position of a request.

The MRV2 block-mode multi-round bug: positions are no longer independent, so the law of m changes.
"""

import torch

from fuzz.mutants.base import CanonicalSampler, Noise


class SharedUniform(CanonicalSampler):
    """Uses position 0's uniform at every position."""

    name = "M10"

    def accept_uniforms(self, noise: Noise) -> torch.Tensor:
        """The planted bug: `u_0` everywhere."""
        return noise.accept[:, :1].expand_as(noise.accept)
