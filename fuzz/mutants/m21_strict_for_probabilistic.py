"""M21: strict verification runs when probabilistic was asked (lossless, but a lower acceptance rate).

Seen in vLLM #40551.
"""

import dataclasses

import torch

from fuzz.mutants.base import CanonicalSampler, Noise, Rows
from reference.contract import SpecBatch


class StrictForProbabilistic(CanonicalSampler):
    """Runs the strict method whatever `method` says."""

    name = "M21"

    def accept(
        self, batch: SpecBatch, rows: Rows, p: torch.Tensor, q: torch.Tensor, noise: Noise
    ) -> torch.Tensor:
        """The planted bug: probabilistic batches take the strict path."""
        if batch.method == "probabilistic":
            batch = dataclasses.replace(batch, method="strict")
        return super().accept(batch, rows, p, q, noise)

    def emit(
        self,
        batch: SpecBatch,
        rows: Rows,
        p: torch.Tensor,
        q: torch.Tensor,
        noise: Noise,
        num_accepted: torch.Tensor,
    ) -> torch.Tensor:
        """Emits the strict path's target sample on rejection."""
        if batch.method == "probabilistic":
            batch = dataclasses.replace(batch, method="strict")
        return super().emit(batch, rows, p, q, noise, num_accepted)
