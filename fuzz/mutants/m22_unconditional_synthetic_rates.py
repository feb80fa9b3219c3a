"""M22: synthetic sampling uses unconditional rates as conditional ones.

The vLLM #38045 to #41035 saga: `P(first i + 1 accepted)` used as `P(accept i | first i accepted)`
compounds the decay, so the realised acceptance falls short of the target.
"""

import numpy as np

from specsample.reference.walk import F64Array, WalkSampler


class UnconditionalSyntheticRates(WalkSampler):
    """Converts the given conditional rates to joint ones and uses those as conditional."""

    name = "M22"

    def synthetic_rate(self, rates: F64Array | None, position: int) -> float:
        """The planted bug: `cumprod(c)` where `c` belongs."""
        return super().synthetic_rate(None if rates is None else np.cumprod(rates), position)
