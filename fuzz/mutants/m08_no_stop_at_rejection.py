"""M08: no stop at the first rejection: the accepted count is the number of accepts anywhere.

Seen in vLLM #2658 and HF #28508.
"""

import numpy as np

from specsample.reference.walk import BoolArray, WalkSampler


class NoStopAtRejection(WalkSampler):
    """Counts every accepted position, not only the accepted prefix."""

    name = "M08"

    def keep_walking(self, accept: BoolArray) -> BoolArray:
        """The planted bug: every request decides every draft, and the count is `sum(accepted)`."""
        return np.ones_like(accept)
