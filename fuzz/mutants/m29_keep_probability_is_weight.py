"""M29: block verification keeps index ``i`` with probability ``w_i``, the prefix product, not ``h_i``.

``h_n = w_n`` at the last draft, and ``w_i = min(1, prod p(d) / q(d))`` reads like "the probability
that the first ``i`` drafts survive", so a kernel author writes ``h_i = w_i`` at every index and
skips the residual mass ``S_i`` (one reduction over the vocabulary fewer). The law of ``m`` moves
(fewer drafts kept wherever ``w_i < 1``), and the weighted residual no longer pays it back.
"""

from specsample.reference.walk import F64Array, WalkSampler


class KeepProbabilityIsWeight(WalkSampler):
    """Keeps index ``i`` with probability ``w_i``."""

    name = "M29"

    def keep_probability(self, weight: F64Array, p: F64Array, q: F64Array) -> F64Array:
        """The planted bug: ``h_i = w_i`` instead of ``S_i / (S_i + 1 - w_i)``."""
        return weight
