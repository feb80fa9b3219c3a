"""M17: NaN logits make the sampler emit an id `>= V`.

Seen in vLLM #20531 and #50183: a running argmax starts at the sentinel index `V` and moves only on a
strictly larger score; NaN is never larger, so a NaN row leaves the sentinel in place.
"""

import torch

from fuzz.mutants.base import CanonicalSampler, Rows


class NanGivesOutOfRange(CanonicalSampler):
    """Does not map NaN to `-inf`, and takes the argmax with a sentinel start."""

    name = "M17"

    def target_law(self, rows: Rows) -> torch.Tensor:
        """The planted bug: a NaN anywhere in a row makes the whole row NaN (softmax propagates it)."""
        law = super().target_law(rows)
        has_nan = torch.isnan(rows.target).any(dim=-1, keepdim=True)
        return torch.where(has_nan, torch.nan, law)

    def gumbel_argmax(self, weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
        """A running argmax from the sentinel `V`: NaN scores never beat `-inf`, so the sentinel stays."""
        scores = torch.log(weights) - torch.log(-torch.log(uniforms))
        best = torch.nan_to_num(scores, nan=-torch.inf).argmax(dim=-1)
        nothing_larger = ~(scores > -torch.inf).any(dim=-1)
        return torch.where(nothing_larger, weights.shape[-1], best)
