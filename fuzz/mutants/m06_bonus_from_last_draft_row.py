"""M06: the bonus token is drawn from the last draft row instead of the bonus row.

The V0 #9730 family of off-by-one row offsets.
"""

import torch

from fuzz.mutants.base import CanonicalSampler, Rows


class BonusFromLastDraftRow(CanonicalSampler):
    """Samples the bonus token from row `n - 1`."""

    name = "M06"

    def bonus_row(self, rows: Rows) -> torch.Tensor:
        """The planted bug: `n - 1` instead of `n`."""
        return (rows.counts - 1).clamp(min=0)
