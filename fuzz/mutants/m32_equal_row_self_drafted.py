"""M32: one draft row equal to its target row makes the sampler read its request as self-drafted.

Where the draft model is the target itself (self-drafting, a draft head that hands back the target's
logits) the draft logits of a request are its target logits, and a sampler may then read the target
rows in their place. Deciding that from a row, not from how the request was drafted, is wrong as soon
as one row equal to its target row sits beside ordinary ones: every row of the request is then read
with ``q = p``, so each draft of positive mass is accepted (``min(1, p / p) = 1``). On requests whose
rows are all equal to their target rows, or none are, the sampler is the walk, draw for draw: the
coupled check passes it on every batch without such a mix, and so do the blind checks.
"""

import dataclasses

import numpy as np

from specsample.reference.contract import SpecBatch
from specsample.reference.law import BatchRows
from specsample.reference.walk import WalkSampler


class EqualRowSelfDrafted(WalkSampler):
    """Reads the target rows as the draft rows of a request that has one draft row equal to its target row."""

    name = "M32"

    def read(self, batch: SpecBatch) -> BatchRows:
        """The planted bug: a request with a draft row equal to its target row drafts with its target rows."""
        rows = super().read(batch)
        if rows.draft is None or rows.ids.size == 0:
            return rows
        request = np.repeat(np.arange(rows.counts.size), rows.counts)
        position = np.arange(request.size) - rows.starts[request]
        target = rows.target_rows(request, position)
        draft = rows.draft_rows(request, position)
        equal = np.all((target == draft) | (np.isnan(target) & np.isnan(draft)), axis=1)
        flagged = np.bincount(request[equal], minlength=rows.counts.size) > 0
        chosen = flagged[request]
        if not chosen.any():
            return rows
        logits = rows.draft.copy()
        if rows.slot is None:
            logits[np.nonzero(chosen)[0]] = target[chosen]
        else:
            logits[rows.slot[request[chosen]], position[chosen]] = target[chosen]
        return dataclasses.replace(rows, draft=logits)
