"""M46: a tree's children accepted one by one with ``min(1, p / q)``, as a chain's drafts are.

hipfire #483: the ``min(1, p / q)`` rule of chain verification applied to the children of a tree
node (taken from the draft's top-k) over-accepts: target-only verification accepts child ``c`` with
``p(c)``, one draw for all of them. This walk tries a node's children in sibling order, accepting
each with ``min(1, p(c) / q(c))`` against its own acceptance uniform (``q`` the draft law of the
child's draft row; one-hot drafts: 1), and after every child rejected emits the target's draw with
the children's tokens removed.
"""

import numpy as np

from specsample.reference.contract import Capabilities
from specsample.reference.law import greedy_token, row_probs
from specsample.reference.walk import BatchRows, I64Array, WalkSampler, _Chunk


class ChildrenByRatio(WalkSampler):
    """Accepts each child with ``min(1, p / q)``, one after another."""

    name = "M46"
    capabilities = Capabilities(methods=("tree",))

    def tree_step(
        self,
        rows: BatchRows,
        chunk: _Chunk,
        local: I64Array,
        row: I64Array,
        level: int,
        children: list[dict[tuple[int, int], int]],
    ) -> tuple[I64Array, I64Array]:
        """The planted bug: the chain's ratio test on each child in turn."""
        a = chunk.requests[local]
        temperature = rows.temperature[a]
        p = row_probs(rows.target_rows(a, row), temperature)
        drawn = greedy_token(rows.target_rows(a, row))
        child = np.full(local.size, -1, dtype=np.int64)
        for i, (request, r, table) in enumerate(zip(a, row, children, strict=True)):
            kids = sorted((node, token) for (at, token), node in table.items() if at == r)
            if temperature[i] == 0.0:
                child[i] = table.get((int(r), int(drawn[i])), -1)
                continue
            for node, token in kids:
                draft = rows.draft_rows(np.array([request]), np.array([node]))
                q = 1.0 if draft is None else float(row_probs(draft, temperature[i : i + 1])[0, token])
                u = float(self.accept_uniforms(rows.seed[[request]], rows.step[[request]], node)[0])
                if q == 0.0 or u * q < p[i, token]:
                    child[i] = node
                    drawn[i] = token
                    break
            if child[i] < 0:
                law = p[i].copy()
                law[[token for _, token in kids]] = 0.0
                if law.sum() > 0:
                    noise = self._noise(rows, np.array([request]), np.array([r])).whole_row()
                    drawn[i] = self.sample(law[None, :] / law.sum(), noise)[0]
        return drawn, child
