"""M26: softmax without subtracting the row maximum.

`exp(logits / T) / sum(exp(logits / T))` overflows once a scaled logit passes the float range (about
88 in float32, 709 in float64): at a small temperature or an extreme logit the row becomes
`inf / inf = NaN`, and the sampler emits whatever its argmax makes of NaN. Fine at T = 1 with
ordinary logits, which is where most tests sit.
"""

import numpy as np

from specsample.reference.law import clean, greedy_token
from specsample.reference.walk import F64Array, I64Array, WalkSampler


def naive_softmax(logits: F64Array, temperature: F64Array) -> F64Array:
    """The planted bug: no max subtraction (greedy rows stay one-hot, as the argmax path is separate)."""
    x = clean(logits)
    t = np.asarray(temperature, dtype=np.float64)[..., None]
    with np.errstate(over="ignore", invalid="ignore"):
        weights = np.exp(x / np.where(t > 0, t, 1.0))
        weights = weights / weights.sum(axis=-1, keepdims=True)
    onehot = np.arange(x.shape[-1]) == greedy_token(x)[..., None]
    return np.asarray(np.where(t == 0.0, onehot, weights), dtype=np.float64)


class SoftmaxWithoutMax(WalkSampler):
    """Both laws by the textbook softmax formula."""

    name = "M26"

    def target_law(self, logits: F64Array, temperature: F64Array) -> F64Array:
        """``p`` without max subtraction."""
        return naive_softmax(logits, temperature)

    def draft_law(self, logits: F64Array | None, temperature: F64Array, ids: I64Array) -> F64Array | None:
        """``q`` without max subtraction."""
        return None if logits is None else naive_softmax(logits, temperature)
