"""M16: the last vocabulary tile is dropped when the vocabulary is not a multiple of the tile.

The vLLM GHSA-8wr5-jm2h-8r4f family: a tiled loop `range(0, V // BLOCK * BLOCK, BLOCK)` never visits
the tail, so its tokens get no mass (and a vocabulary smaller than one tile is empty: token 0 wins).
"""

import dataclasses

import numpy as np

from specsample.reference.contract import SpecBatch
from specsample.reference.walk import BatchRows, WalkSampler

BLOCK = 16


class DroppedLastTile(WalkSampler):
    """Reads only the first `V // BLOCK * BLOCK` logits of every row."""

    name = "M16"

    def read(self, batch: SpecBatch) -> BatchRows:
        """The planted bug: the tail tile reads as `-inf` in every target and draft row."""
        rows = super().read(batch)
        vocab_size = rows.target.shape[-1]
        visible = np.arange(vocab_size) < vocab_size // BLOCK * BLOCK
        draft = None if rows.draft is None else np.where(visible, rows.draft, -np.inf)
        return dataclasses.replace(rows, target=np.where(visible, rows.target, -np.inf), draft=draft)
