"""M01: the acceptance test is `p >= u * q`, so a draft with `p = 0` is accepted when `u = 0`.

Seen in vLLM #23803 and SGLang #35798.
"""

import torch

from fuzz.mutants.base import CanonicalSampler


class NonStrictAccept(CanonicalSampler):
    """Accepts on `p >= u * q` instead of the strict `>`."""

    name = "M01"

    def accept_test(self, p_draft: torch.Tensor, q_draft: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The planted bug: `>=` lets `p = 0` through at `u = 0`."""
        return p_draft >= u * q_draft
