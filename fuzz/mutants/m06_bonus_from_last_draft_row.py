"""M06: the bonus token is drawn from the last draft row instead of the bonus row.

The V0 #9730 family of off-by-one row offsets.
"""

import numpy as np

from specsample.reference.walk import I64Array, WalkSampler


class BonusFromLastDraftRow(WalkSampler):
    """Samples the bonus token from row `n - 1`."""

    name = "M06"

    def bonus_row(self, counts: I64Array) -> I64Array:
        """The planted bug: `n - 1` instead of `n`."""
        return np.maximum(counts - 1, 0)
