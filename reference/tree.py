"""Tree verification (method ``"tree"``): the drafts of a request form a tree, verified against the
target alone.

One request: ``n`` draft nodes. ``tree_parent[i]`` is node ``i``'s parent within the request (``-1``:
a child of the root), always a smaller index than ``i``; siblings are ordered by node index.
``draft_token_ids[i]`` is node ``i``'s token (``-1``: a placeholder). Target rows: row 0 is the
root's next-token law, row ``1 + i`` node ``i``'s (the law after node ``i``'s token), so a request
has ``n + 1`` rows, as a chain does; a tree is at most `MAX_DEPTH` nodes deep.

Target-only verification (SGLang's tree kernel, EAGLE's reference code): from the root, at node
``v`` draw ``x ~ p_v`` with ``v``'s row noise; if ``x`` is the token of a child of ``v`` (the first
such child in sibling order when tokens repeat; a placeholder never matches), accept that child and
go on from it; otherwise emit ``x`` and stop. At a node without children, emit the bonus ``x ~ p_v``.
Draft logits are not read.

The exact law of the emitted sequence: accepting the path ``c_1 .. c_k`` and then emitting ``y`` has
probability ``prod_j p_{c_(j-1)}(tok c_j) * p_{c_k}(y)`` (``c_0`` the root), where ``y`` is not the
token of a child of ``c_k`` unless ``c_k`` has none. So each token of the sequence is distributed
as ``p`` at its node, and on a chain the law is the strict method's.

This module holds the rules of one request: the parent array checked (`check_parents`), the
children in sibling order (`children`), the verification with given draws (`verify`), the reference
sampler on a random scheme's row noise (`sample_request`) and the exact law of the emitted sequence
(`sequence_law`). ``p`` is the processed law of each row (temperature and filters
applied), as for the chain methods; a greedy row's is one-hot at its argmax.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from .sampler import RequestNoise, draw_row

F64Array = npt.NDArray[np.float64]
I64Array = npt.NDArray[np.int64]

# The deepest path of drafts a tree may hold (the root's children are at depth 1).
MAX_DEPTH = 64
ROOT = -1


def check_parents(tree_parent: Sequence[int] | npt.ArrayLike, name: str = "tree_parent") -> I64Array:
    """``tree_parent`` of one request as int64, checked: every parent is ``-1`` or a node before
    its child (so no cycle, and no parent outside the request), and no path is deeper than
    `MAX_DEPTH`.

    Raises:
        ValueError: naming ``name``, the node and the value.
    """
    parents = np.asarray(tree_parent)
    if parents.ndim != 1 or (parents.size and not np.issubdtype(parents.dtype, np.integer)):
        raise ValueError(f"{name} is {parents.tolist()!r}; expected a 1-D list of integer node indices")
    parents = parents.astype(np.int64)
    for node, parent in enumerate(parents.tolist()):
        if parent < ROOT or parent >= node:
            where = "outside the request" if parent < ROOT or parent >= parents.size else "at or after it"
            raise ValueError(
                f"{name}[{node}] is {parent}: a parent {where}; expected -1 (the root) or a node index "
                f"in [0, {node})"
            )
    deepest = depths(parents)
    if deepest.size and int(deepest.max()) > MAX_DEPTH:
        node = int(np.argmax(deepest))
        raise ValueError(
            f"{name} puts node {node} at depth {int(deepest[node])}; a tree is at most {MAX_DEPTH} deep"
        )
    return parents


def depths(parents: I64Array) -> I64Array:
    """``[n]`` each node's depth (a child of the root is at depth 1), for a checked parent array."""
    depth = np.zeros(parents.size, dtype=np.int64)
    for node, parent in enumerate(parents.tolist()):
        depth[node] = 1 if parent == ROOT else depth[parent] + 1
    return depth


def children(parents: I64Array) -> list[list[int]]:
    """``[n + 1]`` lists: entry 0 the root's children, entry ``1 + v`` node ``v``'s, each in sibling
    (node index) order."""
    kids: list[list[int]] = [[] for _ in range(parents.size + 1)]
    for node, parent in enumerate(parents.tolist()):
        kids[parent + 1].append(node)
    return kids


def matching_child(kids: Sequence[int], tokens: I64Array, token: int) -> int | None:
    """The first of ``kids`` whose token is ``token``, or ``None`` (a placeholder matches nothing)."""
    if token < 0:
        return None
    return next((k for k in kids if int(tokens[k]) == token), None)


def verify(parents: I64Array, tokens: I64Array, draw: Callable[[int], int]) -> tuple[list[int], list[int]]:
    """Verify one request's tree with the draws ``draw(row)`` (the token drawn at target row
    ``row``: 0 the root's, ``1 + v`` node ``v``'s): the accepted nodes, and the emitted sequence
    (their tokens, then the token drawn where the walk stopped)."""
    kids = children(parents)
    node, accepted, sequence = ROOT, list[int](), list[int]()
    while True:
        token = draw(node + 1)
        sequence.append(token)
        child = matching_child(kids[node + 1], tokens, token)
        if child is None:  # no child drew it, or a node without children: its bonus
            return accepted, sequence
        accepted.append(child)
        node = child


def sample_request(
    targets: F64Array,
    parents: I64Array,
    tokens: I64Array,
    noise: RequestNoise,
    greedy_tokens: I64Array | None = None,
) -> tuple[list[int], list[int]]:
    """`verify` with each row drawn from ``targets`` by the scheme's row noise, Gumbel-max over the
    whole row as strict verification draws (or each row's argmax, ``greedy_tokens``, for a greedy
    request): the accepted nodes and the emitted sequence."""

    def draw(row: int) -> int:
        if greedy_tokens is not None:
            return int(greedy_tokens[row])
        return draw_row(targets[row], noise, row, whole_row=True)

    return verify(parents, tokens, draw)


def sequence_law(target_probs: F64Array, parents: I64Array, tokens: I64Array) -> dict[tuple[int, ...], float]:
    """The exact law of one request's emitted sequence, from its ``[n + 1, V]`` target laws: a dict
    from each sequence of positive probability (the accepted tokens, then the emitted one) to that
    probability."""
    kids = children(parents)
    law: dict[tuple[int, ...], float] = {}

    def visit(node: int, prefix: tuple[int, ...], reach: float) -> None:
        row = target_probs[node + 1]
        for token in np.nonzero(row > 0.0)[0].tolist():
            here = reach * float(row[token])
            child = matching_child(kids[node + 1], tokens, token)
            if child is None:
                law[(*prefix, token)] = law.get((*prefix, token), 0.0) + here
            else:
                visit(child, (*prefix, token), here)

    visit(ROOT, (), 1.0)
    return law
