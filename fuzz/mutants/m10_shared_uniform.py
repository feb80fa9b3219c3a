"""M10: one acceptance uniform is shared by every position of a request.

The MRV2 block-mode multi-round bug: positions are no longer independent, so the law of m changes.
"""

from specsample.reference.walk import F64Array, I64Array, WalkSampler


class SharedUniform(WalkSampler):
    """Uses position 0's uniform at every position."""

    name = "M10"

    def accept_uniforms(self, seed: I64Array, step: I64Array, position: int) -> F64Array:
        """The planted bug: `u_0` everywhere."""
        return super().accept_uniforms(seed, step, 0)
