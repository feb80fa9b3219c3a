"""M34: min-p is applied to the bonus row only, not to the verified positions.

vLLM #42744 (fix proposed in #42802): the rejection sampler applies only the logit processors that
change the argmax, and min-p does not, so it never reaches the target rows that verify the drafts;
only the bonus token, drawn by the regular sampler, honours it. Top-k and top-p still apply at every
row. Drafts of tokens min-p drops are accepted, and the residual after a rejection is built from the
law without min-p.
"""

import dataclasses

import numpy as np
import numpy.typing as npt

from specsample.reference.contract import Capabilities, SpecBatch
from specsample.reference.filters import FILTER_FLAGS
from specsample.reference.law import BatchRows, F64Array, I64Array
from specsample.reference.walk import WalkSampler


@dataclasses.dataclass(frozen=True)
class _MinPAtBonusRows(BatchRows):
    """Rows whose verified positions are filtered without min-p."""

    def target_rows(self, requests: I64Array, position: npt.ArrayLike) -> F64Array:
        """The planted bug: min-p off at every row but the bonus row."""
        filtered = super().target_rows(requests, position)
        verified = np.broadcast_to(np.asarray(position), requests.shape) < self.counts[requests]
        if self.filters is None or not verified.any():
            return filtered
        no_min_p = dataclasses.replace(self.filters, min_p=np.zeros_like(self.filters.min_p))
        raw = self.raw_target_rows(requests, position)
        without = dataclasses.replace(self, filters=no_min_p).filter(raw, requests)
        return np.asarray(np.where(verified[:, None], without, filtered), dtype=np.float64)


class MinPAtBonusOnly(WalkSampler):
    """Applies min-p to the bonus row alone."""

    name = "M34"
    capabilities = Capabilities(filters=FILTER_FLAGS)

    def read(self, batch: SpecBatch) -> BatchRows:
        """The planted bug: the verified target rows skip min-p."""
        return _MinPAtBonusRows(**vars(super().read(batch)))
