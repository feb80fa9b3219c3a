"""M42: a node's children past the 32nd are never accepted.

TensorRT-LLM #15098: the verification kept a fixed table of 32 siblings per node, so a tree with
more children at a node read past it or dropped the rest. This walk drops them: a token drawn at a
node accepts only one of its first 32 children; a draw of a later child's token is emitted instead.
"""

from specsample.reference.contract import Capabilities
from specsample.reference.walk import BatchRows, WalkSampler

SIBLING_TABLE = 32


class SiblingsPast32Dropped(WalkSampler):
    """Accepts only a node's first 32 children."""

    name = "M42"
    capabilities = Capabilities(methods=("tree",))

    def tree_children(self, rows: BatchRows, request: int) -> dict[tuple[int, int], int]:
        """The planted bug: the children table holds 32 siblings a node."""
        parents = rows.tree_parents(request)
        rank = {}
        seen: dict[int, int] = {}
        for node, parent in enumerate(parents.tolist()):
            rank[node] = seen.get(parent, 0)
            seen[parent] = rank[node] + 1
        table = super().tree_children(rows, request)
        return {key: node for key, node in table.items() if rank[node] < SIBLING_TABLE}
