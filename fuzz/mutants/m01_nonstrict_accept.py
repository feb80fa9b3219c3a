"""M01: the acceptance test is `p >= u * q`, so a draft with `p = 0` is accepted when `u = 0`.

Seen in vLLM #23803 and SGLang #35798.
"""

from specsample.reference.methods import Method
from specsample.reference.walk import BoolArray, F64Array, WalkSampler


class NonStrictAccept(WalkSampler):
    """Accepts on `p >= u * q` instead of the strict `>`."""

    name = "M01"

    def decide(
        self, method: Method, p_draft: F64Array, q_draft: F64Array, u: F64Array, rate: float
    ) -> BoolArray:
        """The planted bug: `>=` lets `p = 0` through at `u = 0`."""
        if method.name != "probabilistic":
            return super().decide(method, p_draft, q_draft, u, rate)
        return p_draft >= u * q_draft
