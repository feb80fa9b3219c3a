"""M16: the last vocabulary tile is dropped when the vocabulary is not a multiple of the tile.

The vLLM GHSA-8wr5-jm2h-8r4f family: a tiled loop `range(0, V // BLOCK * BLOCK, BLOCK)` never visits
the tail, so its tokens get no mass (and a vocabulary smaller than one tile is empty: token 0 wins).
"""

import dataclasses

import torch

from fuzz.mutants.base import CanonicalSampler, Rows
from reference.contract import SpecBatch

BLOCK = 16


class DroppedLastTile(CanonicalSampler):
    """Reads only the first `V // BLOCK * BLOCK` logits of every row."""

    name = "M16"

    def gather(self, batch: SpecBatch) -> Rows:
        """The planted bug: the tail tile reads as `-inf` in every target and draft row."""
        rows = super().gather(batch)
        vocab_size = rows.target.shape[-1]
        visible = torch.arange(vocab_size, device=rows.target.device) < vocab_size // BLOCK * BLOCK

        def drop(logits: torch.Tensor | None) -> torch.Tensor | None:
            return None if logits is None else torch.where(visible, logits, -torch.inf)

        return dataclasses.replace(rows, target=drop(rows.target), draft=drop(rows.draft))
