"""M20: a placeholder `-1` draft is used as an index, so it wraps to the last token and can be accepted.

Seen in vLLM #46533 and FlashInfer #879.
"""

import numpy as np

from specsample.reference.walk import BoolArray, F64Array, I64Array, WalkSampler


class PlaceholderAsIndex(WalkSampler):
    """Reads `p[-1]` and `q[-1]` for a `-1` draft, with no placeholder mask."""

    name = "M20"

    def draft_probs(
        self, p: F64Array, q: F64Array | None, ids: I64Array
    ) -> tuple[F64Array, F64Array, BoolArray]:
        """The planted bug: `d = -1` indexes the last token, and nothing rejects it."""
        p_draft, q_draft, real = super().draft_probs(p, q, ids % p.shape[-1])
        return p_draft, q_draft, np.ones_like(real)
