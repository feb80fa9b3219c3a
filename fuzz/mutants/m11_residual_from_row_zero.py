"""M11: the residual is read from row 0 instead of the rejected position.

Seen in FlashInfer #425.
"""

import torch

from fuzz.mutants.base import CanonicalSampler


class ResidualFromRowZero(CanonicalSampler):
    """Builds the residual from `p_0` and `q_0` whatever the rejected position."""

    name = "M11"

    def rejection_rows(self, num_accepted: torch.Tensor) -> torch.Tensor:
        """The planted bug: row 0."""
        return torch.zeros_like(num_accepted)
