"""M43: a tree verified as a chain: only each node's first child is tried.

TensorRT-LLM #18210 (review): a two-model dynamic tree was verified as a linear chain, its first
child at each level, instead of failing. This walk keeps each node's first child only: a token drawn
at a node accepts its first child if it holds the token, and is emitted otherwise.
"""

from specsample.reference.contract import Capabilities
from specsample.reference.walk import BatchRows, WalkSampler


class TreeAsChain(WalkSampler):
    """Tries each node's first child only."""

    name = "M43"
    capabilities = Capabilities(methods=("tree",))

    def tree_children(self, rows: BatchRows, request: int) -> dict[tuple[int, int], int]:
        """The planted bug: one child a node, the first in sibling order."""
        parents = rows.tree_parents(request)
        first_child = {}
        for node, parent in enumerate(parents.tolist()):
            first_child.setdefault(parent, node)
        chain = set(first_child.values())
        return {key: node for key, node in super().tree_children(rows, request).items() if node in chain}
