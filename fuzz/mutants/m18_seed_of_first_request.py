"""M18: the per-request seed is ignored: every request draws from `seed[0]`.

Seen in FlashInfer #4861: a request's output then depends on which request sits first in the batch.
"""

import dataclasses

import numpy as np

from specsample.reference.contract import SpecBatch
from specsample.reference.walk import BatchRows, WalkSampler


class SeedOfFirstRequest(WalkSampler):
    """Broadcasts the first request's seed."""

    name = "M18"

    def read(self, batch: SpecBatch) -> BatchRows:
        """The planted bug: `seed[0]` for every request."""
        rows = super().read(batch)
        return dataclasses.replace(rows, seed=np.full_like(rows.seed, rows.seed[0]))
