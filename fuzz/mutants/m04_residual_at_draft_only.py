"""M04: the residual subtracts draft mass only at the drafted token: `p - q(d) * onehot(d)`.

Seen in xLLM #2175 and EAGLE #20.
"""

import numpy as np

from specsample.reference.methods import Method
from specsample.reference.schemes import Noise
from specsample.reference.walk import F64Array, I64Array, WalkSampler


class ResidualAtDraftOnly(WalkSampler):
    """Subtracts `q(d)` at the draft token only."""

    name = "M04"

    def rejection_token(
        self, method: Method, p: F64Array, q: F64Array, ids: I64Array, noise: Noise, u: F64Array
    ) -> I64Array:
        """The planted bug: `(p - q(d) * onehot(d))+` instead of `(p - q)+`."""
        rows = np.arange(ids.size)
        at_draft = np.zeros_like(q)
        at_draft[rows, ids] = q[rows, ids]
        return super().rejection_token(method, p, at_draft, ids, noise, u)
