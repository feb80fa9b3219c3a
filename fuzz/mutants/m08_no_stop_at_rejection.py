"""M08: no stop at the first rejection: the accepted count is the number of accepts anywhere.

Seen in vLLM #2658 and HF #28508.
"""

import torch

from fuzz.mutants.base import CanonicalSampler


class NoStopAtRejection(CanonicalSampler):
    """Counts every accepted position, not only the accepted prefix."""

    name = "M08"

    def first_rejection(self, accepted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The planted bug: `sum(accepted)` instead of the first rejection."""
        positions = torch.arange(accepted.shape[1], device=accepted.device)
        return (accepted & (positions[None, :] < counts[:, None])).sum(dim=1)
