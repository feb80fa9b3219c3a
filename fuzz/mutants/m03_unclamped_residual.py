"""M03: the residual is `p - q` without `max(., 0)`.

A common slip: the residual's mass is computed right (`1 - sum(min(p, q))`), but the inverse CDF is
built from the unclamped difference, so it dips where `p < q` and the search lands on wrong tokens.
"""

import numpy as np

from specsample.fuzz.mutants.inverse_cdf import inverse_cdf
from specsample.reference.methods import Method
from specsample.reference.schemes import Noise
from specsample.reference.walk import F64Array, I64Array, WalkSampler


class UnclampedResidual(WalkSampler):
    """Samples the residual by inverse CDF over `p - q` unclamped."""

    name = "M03"

    def rejection_token(
        self, method: Method, p: F64Array, q: F64Array, ids: I64Array, noise: Noise, u: F64Array
    ) -> I64Array:
        """The planted bug: no `relu`; the CDF is normalised by the true mass `1 - sum(min(p, q))`."""
        weights = p - q
        mass = np.maximum(weights, 0).sum(axis=-1, keepdims=True)
        cdf = np.cumsum(np.where(mass > 0, weights / np.maximum(mass, 1e-300), p), axis=-1)
        return inverse_cdf(cdf, noise.uniforms[:, 0])
