"""M15: slotted draft rows are read by batch index instead of through `draft_slot`.

Seen in early MRV2 and vLLM #40269.
"""

import torch

from fuzz.mutants.base import CanonicalSampler
from reference.contract import SpecBatch


class DraftByBatchIndex(CanonicalSampler):
    """Reads slot `b` for request `b`."""

    name = "M15"

    def slotted_draft_rows(self, batch: SpecBatch, width: int) -> torch.Tensor:
        """The planted bug: `draft_logits[b]` instead of `draft_logits[draft_slot[b]]`."""
        assert batch.draft_logits is not None
        capacity = batch.draft_logits.shape[1]
        positions = torch.arange(width, device=batch.device).clamp(max=capacity - 1)
        slots = torch.arange(batch.num_requests, device=batch.device).clamp(
            max=batch.draft_logits.shape[0] - 1
        )
        return batch.draft_logits.double()[slots[:, None], positions[None, :]]
