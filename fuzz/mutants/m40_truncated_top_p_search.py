"""M40: top-p by a threshold search cut after a fixed number of halvings.

vLLM 0.33.0's Triton top-k/top-p kernel (``topk_topp_triton.py``) finds the top-p cut by bisecting a
threshold a fixed number of times instead of sorting, then keeps every token above the last
interval's lower end. This sampler bisects the log-probability range of the row 18 times (a range of
about 43 for a row with a token near ``e**-40`` below its largest: a last interval of 1.6e-4 in
log-probability, 1,300 to 2,700 float32 ulps of a probability). The kept set then holds the tokens
just below the pivot that the interval could not separate from it (measured in vLLM: up to 1.6e-3 of
mass per row at top-p 0.9), each far outside the rounding a float32 sort and cumulative sum makes.
Min-p and top-k stay exact; the largest token is always kept.
"""

import dataclasses

import numpy as np

from specsample.reference.contract import Capabilities, SpecBatch
from specsample.reference.filters import FILTER_FLAGS, kept_tokens
from specsample.reference.law import BatchRows, F64Array, I64Array, row_probs
from specsample.reference.walk import WalkSampler

HALVINGS = 18


@dataclasses.dataclass(frozen=True)
class _TruncatedSearchRows(BatchRows):
    """Rows whose top-p cut comes from a bisection stopped after `HALVINGS` halvings."""

    def filter(self, logits: F64Array, requests: I64Array) -> F64Array:
        """The planted bug: keep the tokens above the last interval's lower end, not above the pivot."""
        if self.filters is None:
            return logits
        params, temperature = self.filters.take(requests), self.temperature[requests]
        kept = kept_tokens(logits, temperature, dataclasses.replace(params, top_p=np.ones_like(params.top_p)))
        searched = np.nonzero((params.top_p < 1.0) & (temperature > 0))[0]
        if searched.size:
            law = row_probs(np.where(kept, logits, -np.inf)[searched], temperature[searched])
            with np.errstate(divide="ignore"):
                log_law = np.log(law)
            finite = np.isfinite(log_law)
            lo = np.where(finite, log_law, np.inf).min(axis=-1)
            hi = np.where(finite, log_law, -np.inf).max(axis=-1)
            top_p = params.top_p[searched]
            for _ in range(HALVINGS):
                mid = (lo + hi) / 2
                enough = np.where(log_law > mid[:, None], law, 0.0).sum(axis=-1) >= top_p
                lo, hi = np.where(enough, mid, lo), np.where(enough, hi, mid)
            largest = log_law == log_law.max(axis=-1, keepdims=True)
            kept[searched] &= (log_law > lo[:, None]) | largest
        return np.asarray(np.where(kept, logits, -np.inf), dtype=np.float64)


class TruncatedTopPSearch(WalkSampler):
    """Cuts top-p where a bisection of 18 halvings lands."""

    name = "M40"
    capabilities = Capabilities(filters=FILTER_FLAGS)

    def read(self, batch: SpecBatch) -> BatchRows:
        """The planted bug: an approximate top-p cut, on target and draft rows alike."""
        return _TruncatedSearchRows(**vars(super().read(batch)))
