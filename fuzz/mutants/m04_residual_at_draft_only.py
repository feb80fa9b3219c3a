"""M04: the residual subtracts draft mass only at the drafted token: `p - q(d) * onehot(d)`.

Seen in xLLM #2175 and EAGLE #20.
"""

import torch

from fuzz.mutants.base import CanonicalSampler


class ResidualAtDraftOnly(CanonicalSampler):
    """Subtracts `q(d)` at the draft token only."""

    name = "M04"

    def residual(self, p: torch.Tensor, q: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The planted bug: `(p - q(d) * onehot(d))+` instead of `(p - q)+`."""
        onehot = torch.nn.functional.one_hot(ids.clamp(min=0), p.shape[-1]).to(p.dtype)
        q_draft = q.gather(-1, ids.clamp(min=0).unsqueeze(-1))
        return torch.clamp(p - q_draft * onehot, min=0.0)
