"""M02: the acceptance uniform is hard-coded to 0, so every draft with `p > 0` is accepted.

Seen in vllm-ascend #13730.
"""

import torch

from fuzz.mutants.base import CanonicalSampler, Noise


class ZeroUniform(CanonicalSampler):
    """Uses `u = 0` for every acceptance test."""

    name = "M02"

    def accept_uniforms(self, noise: Noise) -> torch.Tensor:
        """The planted bug: the uniform is a constant 0."""
        return torch.zeros_like(noise.accept)
