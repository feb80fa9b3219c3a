"""M45: every node of a tree verified by argmax, whatever the temperature.

SGLang #32922: on one platform the tree verify silently took the argmax at every node, which
accuracy suites run at ``T = 0`` never notice. This walk draws each node's token as its row's argmax
at every temperature.
"""

import numpy as np

from specsample.reference.contract import Capabilities
from specsample.reference.law import greedy_token
from specsample.reference.walk import BatchRows, I64Array, WalkSampler, _Chunk


class TreeArgmaxAtTemperature(WalkSampler):
    """Takes each node's argmax at every temperature."""

    name = "M45"
    capabilities = Capabilities(methods=("tree",))

    def tree_draw(
        self, rows: BatchRows, chunk: _Chunk, local: I64Array, row: I64Array, level: int
    ) -> I64Array:
        """The planted bug: the argmax of the node's row instead of a draw."""
        return np.asarray(greedy_token(rows.target_rows(chunk.requests[local], row)), dtype=np.int64)
