"""M07: the bonus token is emitted even after a rejection.

The vLLM #8320 family: the output holds the accepted drafts, the recovered token, then a bonus token.
"""

import torch

from fuzz.mutants.base import CanonicalSampler, Rows
from reference.contract import SpecOutput


class BonusAfterRejection(CanonicalSampler):
    """Appends a bonus token after the recovered token."""

    name = "M07"

    def pack(self, rows: Rows, num_accepted: torch.Tensor, emitted: torch.Tensor) -> SpecOutput:
        """The planted bug: a rejected request also gets the bonus token (its argmax) appended."""
        output = super().pack(rows, num_accepted, emitted)
        rejected = num_accepted < rows.counts
        b = torch.arange(rows.counts.shape[0], device=emitted.device)
        slot = (num_accepted + 1).clamp(max=output.token_ids.shape[1] - 1)
        bonus = rows.target[b, rows.counts].argmax(dim=-1)
        tokens = output.token_ids.clone()
        tokens[b[rejected], slot[rejected]] = bonus[rejected]
        emitted_count = torch.where(rejected, num_accepted + 2, num_accepted + 1).to(torch.int32)
        return SpecOutput(token_ids=tokens, num_emitted=emitted_count, logprobs=output.logprobs)
