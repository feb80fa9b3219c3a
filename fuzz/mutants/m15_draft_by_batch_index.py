"""M15: slotted draft rows are read by batch index instead of through `draft_slot`.

Seen in early MRV2 and vLLM #40269.
"""

import dataclasses

import numpy as np

from specsample.reference.contract import SpecBatch
from specsample.reference.walk import BatchRows, WalkSampler


class DraftByBatchIndex(WalkSampler):
    """Reads slot `b` for request `b`."""

    name = "M15"

    def read(self, batch: SpecBatch) -> BatchRows:
        """The planted bug: `draft_logits[b]` instead of `draft_logits[draft_slot[b]]`."""
        rows = super().read(batch)
        if rows.slot is None or rows.draft is None:
            return rows
        return dataclasses.replace(rows, slot=np.minimum(np.arange(rows.slot.size), rows.draft.shape[0] - 1))
