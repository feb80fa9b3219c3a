"""M19: a residual with no mass falls back to token 0 instead of sampling `p`.

Latent in vLLM and seen in SGLang #22643: token 0 may have probability 0.
"""

import numpy as np

from specsample.reference.methods import Method
from specsample.reference.schemes import Noise
from specsample.reference.walk import F64Array, I64Array, WalkSampler


class DegenerateResidualTokenZero(WalkSampler):
    """Emits token 0 when the residual is empty."""

    name = "M19"

    def rejection_token(
        self, method: Method, p: F64Array, q: F64Array, ids: I64Array, noise: Noise, u: F64Array
    ) -> I64Array:
        """The planted bug: the fallback index 0 instead of a sample of `p`."""
        token = super().rejection_token(method, p, q, ids, noise, u)
        return np.where(np.maximum(p - q, 0.0).sum(axis=-1) <= 0, 0, token)
