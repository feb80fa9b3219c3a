"""M18: the per-request seed is ignored: every request draws from `seed[0]`.

Seen in FlashInfer #4861: a request's output then depends on which request sits first in the batch.
"""

import dataclasses

from fuzz.mutants.base import CanonicalSampler, Rows
from reference.contract import SpecBatch


class SeedOfFirstRequest(CanonicalSampler):
    """Broadcasts the first request's seed."""

    name = "M18"

    def gather(self, batch: SpecBatch) -> Rows:
        """The planted bug: `seed[0]` for every request."""
        rows = super().gather(batch)
        return dataclasses.replace(rows, seed=rows.seed[:1].expand_as(rows.seed))
