"""M14: greedy rows (`T = 0`) are sent through the probabilistic path at `T = 1`.

Seen in early MRV2.
"""

import dataclasses

import numpy as np

from specsample.reference.contract import SpecBatch
from specsample.reference.walk import BatchRows, WalkSampler


class GreedyAsRandom(WalkSampler):
    """Replaces `T = 0` with `T = 1` before sampling."""

    name = "M14"

    def read(self, batch: SpecBatch) -> BatchRows:
        """The planted bug: greedy rows lose their greedy flag."""
        rows = super().read(batch)
        return dataclasses.replace(rows, temperature=np.where(rows.temperature == 0, 1.0, rows.temperature))
