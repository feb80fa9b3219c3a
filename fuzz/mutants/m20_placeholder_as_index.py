"""M20: a placeholder `-1` draft is used as an index, so it wraps to the last token and can be accepted.

Seen in vLLM #46533 and FlashInfer #879.
"""

import torch

from fuzz.mutants.base import CanonicalSampler, Noise, Rows


class PlaceholderAsIndex(CanonicalSampler):
    """Reads `p[-1]` and `q[-1]` for a `-1` draft, with no placeholder mask."""

    name = "M20"

    def probabilistic_accept(
        self, rows: Rows, p: torch.Tensor, q: torch.Tensor, noise: Noise
    ) -> torch.Tensor:
        """The planted bug: `d = -1` indexes the last token, and nothing rejects it."""
        ids = rows.draft_ids.unsqueeze(-1) % p.shape[-1]
        p_draft = p[:, :-1].gather(-1, ids).squeeze(-1)
        q_draft = q.gather(-1, ids).squeeze(-1)
        return self.accept_test(p_draft, q_draft, self.accept_uniforms(noise))
