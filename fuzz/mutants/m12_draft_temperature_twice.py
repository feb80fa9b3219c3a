"""M12: temperature is applied twice to the draft logits (cached after temperature, divided again).

The vLLM #50910 convention flip.
"""

import numpy as np

from specsample.reference.law import row_probs
from specsample.reference.walk import F64Array, I64Array, WalkSampler


class DraftTemperatureTwice(WalkSampler):
    """Divides the draft logits by `T` before the law divides them again."""

    name = "M12"

    def draft_law(self, logits: F64Array | None, temperature: F64Array, ids: I64Array) -> F64Array | None:
        """The planted bug: `softmax(draft / T / T)`."""
        if logits is None:
            return None
        return row_probs(logits / np.where(temperature > 0, temperature, 1.0)[:, None], temperature)
