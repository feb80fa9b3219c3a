"""M13: temperature is missing on the draft side.

Seen in lattice #388 and dflash #74.
"""

import numpy as np

from specsample.reference.law import row_probs
from specsample.reference.walk import F64Array, I64Array, WalkSampler


class DraftTemperatureMissing(WalkSampler):
    """Uses `softmax(draft)` whatever the request's temperature."""

    name = "M13"

    def draft_law(self, logits: F64Array | None, temperature: F64Array, ids: I64Array) -> F64Array | None:
        """The planted bug: `T = 1` on the draft side (greedy rows keep their argmax)."""
        return None if logits is None else row_probs(logits, np.where(temperature > 0, 1.0, 0.0))
