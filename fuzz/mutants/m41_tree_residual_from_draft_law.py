"""M41: a tree's token after a miss drawn from the draft law instead of the target without the children.

TensorRT-LLM #15098: when a node's draw matched none of its children, the token emitted there was
drawn from a residual built from the draft model's law at the node, where target-only verification
emits the target's draw (the target law with the tried children's tokens removed). This walk, at a
node with children whose draw accepts none, draws the emitted token from the draft law of the node's
row (draft row ``v`` for node ``v``; the root has none and keeps the target's), the children's tokens
removed, with the row's noise.
"""

import numpy as np

from specsample.reference.contract import Capabilities
from specsample.reference.law import row_probs
from specsample.reference.walk import BatchRows, I64Array, WalkSampler, _Chunk


class TreeResidualFromDraftLaw(WalkSampler):
    """Emits from the draft law at a node whose children its draw missed."""

    name = "M41"
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
        """The planted bug: a miss at a node with children emits a draw from the node's draft law."""
        drawn, child = super().tree_step(rows, chunk, local, row, level, children)
        if rows.draft is None:
            return drawn, child
        a = chunk.requests[local]
        has_children = np.array(
            [any(r == row_ for r, _ in table) for table, row_ in zip(children, row, strict=True)]
        )
        missed = np.nonzero((child < 0) & has_children & (row > 0) & (rows.temperature[a] > 0))[0]
        if missed.size:
            requests = a[missed]
            draft = rows.draft_rows(requests, row[missed] - 1)
            assert draft is not None
            law = row_probs(draft, rows.temperature[requests])
            for i, j in enumerate(missed):
                for r, token in children[j]:
                    if r == row[j]:
                        law[i, token] = 0.0
            law /= np.maximum(law.sum(axis=1, keepdims=True), 1e-300)
            noise = self._noise(rows, requests, row[missed]).whole_row()
            drawn[missed] = self.sample(law, noise)
        return drawn, child
