"""M13: temperature is missing on the draft side.

Seen in lattice #388 and dflash #74.
"""

import torch

from fuzz.mutants.base import CanonicalSampler, Rows, _row_law


class DraftTemperatureMissing(CanonicalSampler):
    """Uses `softmax(draft)` whatever the request's temperature."""

    name = "M13"

    def draft_law(self, rows: Rows, p: torch.Tensor) -> torch.Tensor:
        """The planted bug: `T = 1` on the draft side (greedy rows keep their argmax)."""
        if rows.draft is None:
            return super().draft_law(rows, p)
        return _row_law(rows.draft, torch.where(rows.temperature > 0, 1.0, 0.0).to(rows.temperature.dtype))
