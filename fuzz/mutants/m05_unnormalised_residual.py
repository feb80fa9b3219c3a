"""M05: the residual is sampled by inverse CDF without renormalising it first.

A common slip: `u` in `[0, 1)` is compared with the cumulative sum of `(p - q)+`, whose total is below
1, so every `u` past the total falls through to the last token.
"""

import numpy as np

from specsample.fuzz.mutants.inverse_cdf import inverse_cdf
from specsample.reference.methods import Method
from specsample.reference.schemes import Noise
from specsample.reference.walk import F64Array, I64Array, WalkSampler


class UnnormalisedResidual(WalkSampler):
    """Inverse-CDF residual sampling against the unnormalised cumulative sum."""

    name = "M05"

    def rejection_token(
        self, method: Method, p: F64Array, q: F64Array, ids: I64Array, noise: Noise, u: F64Array
    ) -> I64Array:
        """The planted bug: no division by the residual's mass before the search."""
        return inverse_cdf(np.cumsum(np.maximum(p - q, 0.0), axis=-1), noise.uniforms[:, 0])
