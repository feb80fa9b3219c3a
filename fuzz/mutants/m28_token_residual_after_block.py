"""M28: block verification emits from the token-wise residual ``max(p - q, 0)`` after a stop at ``m``.

A block verifier grafted onto a token-wise kernel: the keep decision is block verification's, but
the token after a stop at ``m < n`` comes from the residual branch the kernel already had,
``max(p_m - q_m, 0)``, instead of the weighted ``max(w_m p_m - q_m, 0)``. At ``m = 0`` (``w_0 = 1``)
the two agree, so single-draft tests pass; after a stop past a draft with ``p(d) < q(d)`` the token
is drawn from the wrong law and the output is no longer the target's.
"""

import numpy as np

from specsample.reference.walk import F64Array, WalkSampler


class TokenResidualAfterBlock(WalkSampler):
    """Drops the weight from block verification's residual."""

    name = "M28"

    def block_residual(self, weight: F64Array, p: F64Array, q: F64Array) -> F64Array:
        """The planted bug: ``max(p - q, 0)``, the token-wise residual, whatever ``w_m``."""
        return super().block_residual(np.ones_like(weight), p, q)
