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

The walk stops at a target row (the root's, 0, or node ``v``'s, ``1 + v``): that row determines the
accepted path, so the law of the emitted sequence is the law of the stop row and of ``y`` given it
(`tree_law`), which the exact law of a batch (`reference.law.exact_law`) gives in the arrays a chain
has, indexed by row: on a chain, the stop row is the number of drafts accepted.

This module holds the rules of one request: the parent array checked (`check_parents`), the
children in sibling order (`children`), the verification with given draws (`verify`), the exact
law of the emitted sequence (`sequence_law`) and of the stop row and the emitted token (`tree_law`).
The reference sampler (`reference.sampler`) and the walk (`reference.walk`) draw with them. ``p`` is
the processed law of each row (temperature and filters applied), as for the chain methods; a greedy
row's is one-hot at its argmax.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

F64Array = npt.NDArray[np.float64]
I64Array = npt.NDArray[np.int64]

# The deepest path of drafts a tree may hold (the root's children are at depth 1).
MAX_DEPTH = 64
ROOT = -1


def check_parents(
    tree_parent: Sequence[int] | npt.ArrayLike,
    name: str = "tree_parent",
    first: int = 0,
    request: int | None = None,
) -> I64Array:
    """``tree_parent`` of one request as int64, checked: every parent is ``-1`` or a node before
    its child (so no cycle, and no parent outside the request), and no path is deeper than
    `MAX_DEPTH`. ``first`` is the request's first entry in a batch's ``tree_parent`` and ``request``
    its index there: an error names the batch's entry (``tree_parent[first + node]``) and, given
    ``request``, the node of the request.

    Raises:
        ValueError: naming ``name``, the node and the value.
    """
    parents = np.asarray(tree_parent)
    if parents.ndim != 1 or (parents.size and not np.issubdtype(parents.dtype, np.integer)):
        raise ValueError(f"{name} is {parents.tolist()!r}; expected a 1-D list of integer node indices")
    parents = parents.astype(np.int64)
    where = "" if request is None else f" (node {{node}} of request {request})"
    for node, parent in enumerate(parents.tolist()):
        if parent < ROOT or parent >= node:
            whose = "outside the request" if parent < ROOT or parent >= parents.size else "at or after it"
            raise ValueError(
                f"{name}[{first + node}] is {parent}{where.format(node=node)}: a parent {whose}; expected "
                f"-1 (the root) or a node index in [0, {node})"
            )
    deepest = depths(parents)
    if deepest.size and int(deepest.max()) > MAX_DEPTH:
        node = int(np.argmax(deepest))
        raise ValueError(
            f"{name}[{first + node}]{where.format(node=node)} puts its node at depth {int(deepest[node])}; "
            f"a tree is at most {MAX_DEPTH} deep"
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


def first_siblings(parents: I64Array, tokens: I64Array) -> npt.NDArray[np.bool_]:
    """``[n]`` which nodes the walk can accept: a real token, the first among its siblings."""
    seen: set[tuple[int, int]] = set()
    first = np.zeros(parents.size, dtype=bool)
    for node, (parent, token) in enumerate(zip(parents.tolist(), tokens.tolist(), strict=True)):
        if token >= 0 and (parent, token) not in seen:
            seen.add((parent, token))
            first[node] = True
    return first


def tree_law(
    target_probs: F64Array, parents: I64Array, tokens: I64Array
) -> tuple[F64Array, F64Array, F64Array]:
    """The exact law of one request's walk, by target row (0 the root's, ``1 + v`` node ``v``'s), from
    its ``[n + 1, V]`` target laws: ``(accept_probs [n], stop_probs [n + 1], token_probs [n + 1, V])``.

    ``accept_probs[v]`` is the probability that the walk, at ``v``'s parent, accepts ``v``: the
    parent's probability of ``v``'s token, 0 for a placeholder or a later sibling of the same token.
    ``stop_probs[r]`` is the probability that the walk stops at row ``r`` (its path is then the root
    path of ``r``'s node), ``token_probs[r]`` the law of the emitted token there: row ``r``'s law
    without its children's tokens, renormalised (a leaf's whole law; the whole law where the children
    hold all of it, whose stop then has probability 0). Summed over the rows these are
    `sequence_law`."""
    n = parents.size
    vocab_size = target_probs.shape[1]
    acceptable = first_siblings(parents, tokens)
    accept_probs = np.where(acceptable, target_probs[parents + 1, np.maximum(tokens, 0)], 0.0)
    reach = np.ones(n + 1)
    for node in range(n):  # parents come before their children
        reach[node + 1] = reach[parents[node] + 1] * accept_probs[node]
    taken = np.zeros((n + 1, vocab_size), dtype=bool)
    taken[parents[acceptable] + 1, tokens[acceptable]] = True
    kept = np.where(taken, 0.0, target_probs)
    left = kept.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        token_probs = np.where(left[:, None] > 0.0, kept / left[:, None], target_probs)
    stop_probs = reach * np.where(taken.any(axis=1), left, 1.0)
    return accept_probs, stop_probs, np.asarray(token_probs, dtype=np.float64)
