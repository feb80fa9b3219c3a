"""M17: NaN logits make the sampler emit an id `>= V`.

Seen in vLLM #20531 and #50183: a running argmax starts at the sentinel index `V` and moves only on a
strictly larger score; NaN is never larger, so a NaN row leaves the sentinel in place.
"""

import numpy as np

from specsample.reference.schemes import Noise
from specsample.reference.walk import F64Array, I64Array, WalkSampler


class NanGivesOutOfRange(WalkSampler):
    """Does not map NaN to `-inf`, and takes the argmax with a sentinel start."""

    name = "M17"

    def target_law(self, logits: F64Array, temperature: F64Array) -> F64Array:
        """The planted bug: a NaN anywhere in a row makes the whole row NaN (softmax propagates it)."""
        law = super().target_law(logits, temperature)
        return np.where(np.isnan(logits).any(axis=-1, keepdims=True), np.nan, law)

    def sample(self, weights: F64Array, noise: Noise) -> I64Array:
        """A running argmax from the sentinel `V`: NaN scores never beat `-inf`, so the sentinel stays."""
        with np.errstate(divide="ignore", invalid="ignore"):
            scores = np.log(weights) + noise.gumbel
        best = np.argmax(np.where(np.isnan(scores), -np.inf, scores), axis=-1)
        return np.where(~(scores > -np.inf).any(axis=-1), weights.shape[-1], best)
