"""M14: greedy rows (`T = 0`) are sent through the probabilistic path at `T = 1`.

Seen in early MRV2.
"""

import dataclasses

import torch

from fuzz.mutants.base import CanonicalSampler, Rows
from reference.contract import SpecBatch


class GreedyAsRandom(CanonicalSampler):
    """Replaces `T = 0` with `T = 1` before sampling."""

    name = "M14"

    def gather(self, batch: SpecBatch) -> Rows:
        """The planted bug: greedy rows lose their greedy flag."""
        rows = super().gather(batch)
        return dataclasses.replace(
            rows, temperature=torch.where(rows.temperature == 0, 1.0, rows.temperature)
        )
