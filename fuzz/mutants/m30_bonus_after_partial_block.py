"""M30: the bonus row is sampled after a partial block that stops one draft short of the end.

An off-by-one in the block branch's bonus test: the kernel takes the bonus path when ``m + 1 >= n``
(the index of the last draft, where the token-wise branch's loop ends) instead of ``m >= n``. A
block that keeps all but the last draft then emits a token drawn from the bonus row ``p_n`` at
position ``n - 1``, where the weighted residual of row ``n - 1`` belongs.
"""

import numpy as np

from specsample.reference.walk import BoolArray, I64Array, WalkSampler


class BonusAfterPartialBlock(WalkSampler):
    """Takes the bonus path when the block stops at ``n - 1``."""

    name = "M30"

    def block_bonus(self, kept: I64Array, counts: I64Array) -> BoolArray:
        """The planted bug: ``m + 1 >= n`` instead of ``m >= n``."""
        return np.asarray(kept + 1 >= counts)
