"""M02: the acceptance uniform is hard-coded to 0, so every draft with `p > 0` is accepted.

Seen in vllm-ascend #13730.
"""

import numpy as np

from specsample.reference.walk import F64Array, I64Array, WalkSampler


class ZeroUniform(WalkSampler):
    """Uses `u = 0` for every acceptance test."""

    name = "M02"

    def accept_uniforms(self, seed: I64Array, step: I64Array, position: int) -> F64Array:
        """The planted bug: the uniform is a constant 0."""
        return np.zeros(seed.shape)
