"""M44: a tree's parents read one entry past the request's own, into the next request's.

SGLang #36201: the lookup of a node's ancestors scanned past its request's span of the flattened
tree into the next request's. This walk reads request ``b``'s parents from the batch's
``tree_parent`` one entry late (the last node of a request takes the next request's first node's
parent), keeping only the entries that still name an earlier node; a request's walk then follows
another request's shape.
"""

import numpy as np

from specsample.reference.contract import Capabilities
from specsample.reference.walk import BatchRows, I64Array, WalkSampler


class AncestorsPastRequest(WalkSampler):
    """Reads each request's parents one entry late."""

    name = "M44"
    capabilities = Capabilities(methods=("tree",))

    def read(self, batch: object) -> BatchRows:
        """The planted bug: the rows' parents shifted by one entry across requests."""
        rows = super().read(batch)  # type: ignore[arg-type]
        if rows.parents is None or rows.parents.size == 0:
            return rows
        return _ShiftedParents(**{f: getattr(rows, f) for f in rows.__dataclass_fields__})


class _ShiftedParents(BatchRows):
    def tree_parents(self, request: int) -> I64Array:
        assert self.parents is not None
        start, count = int(self.starts[request]) + 1, int(self.counts[request])
        shifted = np.append(self.parents, -1)[start : start + count]
        shifted = np.pad(shifted, (0, count - shifted.size), constant_values=-1)
        return np.where(shifted < np.arange(count), shifted, -1).astype(np.int64)
