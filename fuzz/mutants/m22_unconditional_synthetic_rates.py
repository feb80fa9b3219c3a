"""M22: synthetic sampling uses unconditional rates as conditional ones.

The vLLM #38045 to #41035 saga: `P(first i + 1 accepted)` used as `P(accept i | first i accepted)`
compounds the decay, so the realised acceptance falls short of the target.
"""

import torch

from fuzz.mutants.base import CanonicalSampler
from reference.contract import SpecBatch


class UnconditionalSyntheticRates(CanonicalSampler):
    """Converts the given conditional rates to joint ones and uses those as conditional."""

    name = "M22"

    def synthetic_rates(self, batch: SpecBatch, width: int) -> torch.Tensor:
        """The planted bug: `cumprod(c)` where `c` belongs."""
        return torch.cumprod(super().synthetic_rates(batch, width), dim=0)
