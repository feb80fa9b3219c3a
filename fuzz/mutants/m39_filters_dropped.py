"""M39: the sampling parameters are silently dropped on the speculative path.

TensorRT-LLM #17955 ("reject sampling params the one-model speculative path cannot honor"): before
it, the one-model speculative path accepted requests whose sampling parameters it did not apply, and
verified against the unfiltered law. This sampler reads every batch as if it had no ``top_k``,
``top_p`` or ``min_p``: it verifies and emits from ``p`` and ``q`` instead of ``p'`` and ``q'``.
"""

import dataclasses

from specsample.reference.contract import Capabilities, SpecBatch
from specsample.reference.filters import FILTER_FLAGS
from specsample.reference.law import BatchRows
from specsample.reference.walk import WalkSampler


class FiltersDropped(WalkSampler):
    """Ignores ``top_k``, ``top_p`` and ``min_p``."""

    name = "M39"
    capabilities = Capabilities(filters=FILTER_FLAGS)

    def read(self, batch: SpecBatch) -> BatchRows:
        """The planted bug: the batch's sampling parameters never reach the rows."""
        return dataclasses.replace(super().read(batch), filters=None)
