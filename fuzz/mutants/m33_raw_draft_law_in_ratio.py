"""M33: the acceptance ratio and the residual use the raw draft law while the drafts were drawn from
the filtered one.

Hugging Face transformers #47932 (fixed by #47961): candidate generators sampled the drafts from the
processor-applied (top-k filtered) logits but returned the raw logits as ``q``, so ``p'(d) / q(d)`` is
inflated by ``1 / Z`` (``Z`` the raw draft mass the filters keep: a median total variation of 0.049
from the target, the worst 0.31) and the residual ``(p' - q)+`` is built from mass the drafter never
proposes. In the contract's terms: with ``draft_filter`` set, the sampler reads the unfiltered draft
rows.
"""

import dataclasses

from specsample.reference.contract import Capabilities, SpecBatch
from specsample.reference.filters import FILTER_FLAGS
from specsample.reference.law import BatchRows
from specsample.reference.walk import WalkSampler


class RawDraftLawInRatio(WalkSampler):
    """Verifies with the raw draft law ``q`` where ``draft_filter`` says the drafts came from ``q'``."""

    name = "M33"
    capabilities = Capabilities(filters=FILTER_FLAGS)

    def read(self, batch: SpecBatch) -> BatchRows:
        """The planted bug: the draft rows are read unfiltered."""
        return dataclasses.replace(super().read(batch), draft_filter=False)
