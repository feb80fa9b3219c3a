"""M31: a sampler with its own generator keys its streams by ``step + i``: they repeat shifted.

The draw of position ``i`` at step ``s`` is keyed by the sequence position ``s + i`` (vLLM's
convention for its ``pos``) while the contract's step advances by one every decoding step, so the
uniforms and the noise of ``(s + 1, i)`` are those of ``(s, i + 1)``: what a seed draws at one step
is drawn again, one position over, at the next. FastDeploy #5568 shipped the like: one seed per
batch, advanced once a step, while a speculative step draws several tokens. Every step's law is
exact, so the law checks and `steps` (distinct steps far apart) pass; only the outputs of one seed
at adjacent steps, which are dependent, show it (`step_pairs`).
"""

import numpy as np
import numpy.typing as npt

from specsample.reference.schemes import CANONICAL, Noise
from specsample.reference.walk import F64Array, I64Array, WalkSampler


class PositionKeyedStreams:
    """The planted bug: the canonical streams read at row ``(step + i, 0)`` instead of ``(step, i)``."""

    name = "step-plus-position"

    def accept_uniforms(self, seed: I64Array, step: I64Array, position: npt.ArrayLike) -> F64Array:
        """The canonical acceptance uniform of row ``(step + i, 0)``."""
        shifted = np.asarray(step, dtype=np.int64) + np.asarray(position, dtype=np.int64)
        return CANONICAL.accept_uniforms(seed, shifted, np.zeros_like(shifted))

    def gumbel_noise(self, seed: I64Array, step: I64Array, position: npt.ArrayLike, vocab_size: int) -> Noise:
        """The canonical noise of row ``(step + i, 0)``."""
        shifted = np.asarray(step, dtype=np.int64) + np.asarray(position, dtype=np.int64)
        return CANONICAL.gumbel_noise(seed, shifted, np.zeros_like(shifted), vocab_size)


class StreamsKeyedByStepPlusPosition(WalkSampler):
    """The walk on streams keyed by ``step + i``, presented as a sampler with its own generator."""

    name = "M31"

    def __init__(self) -> None:
        super().__init__(PositionKeyedStreams())
        self.name = "M31"
        self.streams = None  # its own generator: no scheme the harness replays
