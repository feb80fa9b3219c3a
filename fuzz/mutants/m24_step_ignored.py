"""M24: the random stream is keyed by the seed alone; the step is never mixed in.

A serving engine keeps one seed per request and advances the step every decoding step. A sampler
that derives its uniforms from the seed (and the position) but not the step draws the same uniforms
at every step of a seeded request, so its accept/reject pattern repeats step after step. Every
check that varies the seed sees the right law; only outputs over the steps of one seed show it.
"""

import dataclasses

import numpy as np

from specsample.reference.contract import SpecBatch
from specsample.reference.walk import BatchRows, WalkSampler


class StepIgnored(WalkSampler):
    """Reads every request's step as 0."""

    name = "M24"

    def read(self, batch: SpecBatch) -> BatchRows:
        """The planted bug: the step never reaches the random stream."""
        rows = super().read(batch)
        return dataclasses.replace(rows, step=np.zeros_like(rows.step))
