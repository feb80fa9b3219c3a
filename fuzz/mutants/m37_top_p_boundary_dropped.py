"""M37: top-p drops its boundary token: the kept mass ends below ``top_p``.

FlashInfer #2202: ``top_p_renorm_probs`` dropped the token whose mass crosses ``top_p`` (its kept
mass summed to 0.89999 against ``top_p = 0.9``, the boundary token, of probability 1.3e-3, never
sampled). The specification keeps a token while the mass above it is below ``top_p``, so the token
that crosses ``top_p`` is kept; this sampler keeps a token only while the mass up to and including it
is below ``top_p`` (ties whole), and always the largest.
"""

import dataclasses

import numpy as np

from specsample.reference.contract import Capabilities, SpecBatch
from specsample.reference.filters import FILTER_FLAGS, kept_tokens
from specsample.reference.law import BatchRows, F64Array, I64Array, clean
from specsample.reference.walk import WalkSampler


@dataclasses.dataclass(frozen=True)
class _BoundaryDroppedRows(BatchRows):
    """Rows whose top-p cut leaves out the token that crosses ``top_p``."""

    def filter(self, logits: F64Array, requests: I64Array) -> F64Array:
        """The planted bug: the smallest tokens of the exact kept set (the ones whose mass reaches
        ``top_p``) are dropped on every sampled row that filters by top-p, unless they are the largest."""
        if self.filters is None:
            return logits
        params, temperature = self.filters.take(requests), self.temperature[requests]
        kept = kept_tokens(logits, temperature, params)
        z = clean(logits)
        smallest = np.where(kept, z, np.inf).min(axis=-1, keepdims=True)
        by_top_p = ((params.top_p < 1.0) & (temperature > 0))[:, None]
        boundary = by_top_p & kept & (z == smallest) & (z < z.max(axis=-1, keepdims=True))
        return np.asarray(np.where(kept & ~boundary, logits, -np.inf), dtype=np.float64)


class TopPBoundaryDropped(WalkSampler):
    """Drops the top-p boundary token."""

    name = "M37"
    capabilities = Capabilities(filters=FILTER_FLAGS)

    def read(self, batch: SpecBatch) -> BatchRows:
        """The planted bug: top-p keeps less than ``top_p``, on target and draft rows alike."""
        return _BoundaryDroppedRows(**vars(super().read(batch)))
