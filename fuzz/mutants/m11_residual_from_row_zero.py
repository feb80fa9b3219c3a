"""M11: the residual is read from row 0 instead of the rejected position.

Seen in FlashInfer #425.
"""

import numpy as np

from specsample.reference.walk import I64Array, WalkSampler


class ResidualFromRowZero(WalkSampler):
    """Builds the residual from `p_0` and `q_0` whatever the rejected position."""

    name = "M11"

    def rejection_row(self, accepted: I64Array) -> I64Array:
        """The planted bug: row 0."""
        return np.zeros_like(accepted)
