"""M21: strict verification runs when probabilistic was asked (lossless, but a lower acceptance rate).

Seen in vLLM #40551.
"""

from specsample.reference.methods import Method
from specsample.reference.walk import WalkSampler


class StrictForProbabilistic(WalkSampler):
    """Runs the strict method whatever `method` says."""

    name = "M21"

    def method(self, name: str) -> Method:
        """The planted bug: probabilistic batches take the strict path."""
        return super().method("strict" if name == "probabilistic" else name)
