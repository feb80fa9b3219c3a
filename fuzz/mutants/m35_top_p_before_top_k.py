"""M35: top-p is applied before top-k, over the mass top-k has not yet cut.

SGLang #36173: with ``p = [0.35, 0.25, 0.20, 0.05, 0.03, ...]``, ``top_k = 4`` and ``top_p = 0.82``,
top-k first keeps four tokens (mass 0.85) and top-p over that renormalised law keeps three (the mass
above the fourth is 0.80 / 0.85 = 0.94); top-p first, over the raw law, keeps four (0.80 < 0.82) and
top-k leaves them. The fourth token is then drafted, accepted and emitted where ``p'`` gives it 0.
Min-p still comes first.
"""

import dataclasses

import numpy as np

from specsample.reference.contract import Capabilities, SpecBatch
from specsample.reference.filters import FILTER_FLAGS, filter_logits
from specsample.reference.law import BatchRows, F64Array, I64Array
from specsample.reference.walk import WalkSampler


@dataclasses.dataclass(frozen=True)
class _TopPFirstRows(BatchRows):
    """Rows filtered by min-p, then top-p, then top-k."""

    def filter(self, logits: F64Array, requests: I64Array) -> F64Array:
        """The planted bug: top-p over the law before top-k, then top-k on what top-p kept."""
        if self.filters is None:
            return logits
        params, temperature = self.filters.take(requests), self.temperature[requests]
        top_p_first = dataclasses.replace(params, top_k=np.zeros_like(params.top_k))
        top_k_last = dataclasses.replace(
            params, top_p=np.ones_like(params.top_p), min_p=np.zeros_like(params.min_p)
        )
        return filter_logits(filter_logits(logits, temperature, top_p_first), temperature, top_k_last)


class TopPBeforeTopK(WalkSampler):
    """Applies top-p before top-k."""

    name = "M35"
    capabilities = Capabilities(filters=FILTER_FLAGS)

    def read(self, batch: SpecBatch) -> BatchRows:
        """The planted bug: the filters run in the other order, on target and draft rows alike."""
        return _TopPFirstRows(**vars(super().read(batch)))
