"""M07: the bonus token is emitted even after a rejection.

The vLLM #8320 family: the output holds the accepted drafts, the recovered token, then a bonus token.
"""

import numpy as np
import numpy.typing as npt

from specsample.reference.contract import SpecOutput
from specsample.reference.law import greedy_token
from specsample.reference.walk import BatchRows, I64Array, WalkSampler


class BonusAfterRejection(WalkSampler):
    """Appends a bonus token after the recovered token."""

    name = "M07"

    def pack(
        self, rows: BatchRows, tokens: I64Array, emitted: I64Array, logprobs: npt.NDArray[np.float32]
    ) -> SpecOutput:
        """The planted bug: a rejected request also gets the bonus token (its argmax) appended."""
        requests = np.arange(emitted.size)
        rejected = np.nonzero(emitted - 1 < rows.counts)[0]
        bonus = greedy_token(rows.target_rows(requests, rows.counts))
        slot = np.minimum(emitted, tokens.shape[1] - 1)
        tokens, emitted = tokens.copy(), emitted.copy()
        tokens[rejected, slot[rejected]] = bonus[rejected]
        emitted[rejected] += 1
        return super().pack(rows, tokens, emitted, logprobs)
