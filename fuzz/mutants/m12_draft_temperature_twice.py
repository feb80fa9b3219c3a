"""M12: temperature is applied twice to the draft logits (cached after temperature, divided again).

The vLLM #50910 convention flip.
"""

import torch

from fuzz.mutants.base import CanonicalSampler, Rows, _row_law


class DraftTemperatureTwice(CanonicalSampler):
    """Divides the draft logits by `T` before the law divides them again."""

    name = "M12"

    def draft_law(self, rows: Rows, p: torch.Tensor) -> torch.Tensor:
        """The planted bug: `softmax(draft / T / T)`."""
        if rows.draft is None:
            return super().draft_law(rows, p)
        t = torch.where(rows.temperature > 0, rows.temperature, 1.0)[:, None, None]
        return _row_law(rows.draft / t, rows.temperature)
