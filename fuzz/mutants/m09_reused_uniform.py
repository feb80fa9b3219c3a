"""M09: the acceptance uniform is reused for the residual draw.

Seen in FlashInfer #424 and SGLang #7207: after a rejection `u` is biased high, and so is the token.
"""

import numpy as np

from specsample.fuzz.mutants.inverse_cdf import inverse_cdf
from specsample.reference.methods import Method
from specsample.reference.schemes import Noise
from specsample.reference.walk import F64Array, I64Array, WalkSampler


class ReusedUniform(WalkSampler):
    """Samples the residual by inverse CDF with the acceptance uniform."""

    name = "M09"

    def rejection_token(
        self, method: Method, p: F64Array, q: F64Array, ids: I64Array, noise: Noise, u: F64Array
    ) -> I64Array:
        """The planted bug: the uniform that decided the rejection also picks the token."""
        return inverse_cdf(np.cumsum(method.rejection_law(p, q, ids), axis=-1), u)
