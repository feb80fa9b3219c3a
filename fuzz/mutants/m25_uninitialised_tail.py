"""M25: the output buffer comes from `torch.empty` and only the emitted prefix is written.

A kernel that writes each request's emitted tokens and leaves the `-1` padding to an allocation
assumed zeroed (or to a fill that a refactor dropped) returns whatever the allocator left after
`num_emitted`: often a stale `-1` from the previous step, so the bug passes on a quiet test machine.
The harness poisons `torch.empty` in every call it makes (and with another pattern in the
determinism check's second call), so the tail holds the poison, not a lucky `-1`.
"""

import numpy as np
import numpy.typing as npt
import torch

from specsample.reference.contract import SpecOutput
from specsample.reference.walk import BatchRows, I64Array, WalkSampler


class UninitialisedTail(WalkSampler):
    """Copies the emitted tokens into an uninitialised buffer."""

    name = "M25"

    def pack(
        self, rows: BatchRows, tokens: I64Array, emitted: I64Array, logprobs: npt.NDArray[np.float32]
    ) -> SpecOutput:
        """The planted bug: the padding after ``num_emitted`` is never written."""
        output = super().pack(rows, tokens, emitted, logprobs)
        token_ids = torch.empty(tokens.shape, dtype=torch.int64)
        written = torch.arange(tokens.shape[1])[None, :] < torch.from_numpy(emitted)[:, None]
        token_ids[written] = output.token_ids[written]
        return SpecOutput(token_ids=token_ids, num_emitted=output.num_emitted, logprobs=output.logprobs)
