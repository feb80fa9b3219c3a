"""How a tree verifier in SGLang's layout plugs into the harness (method ``"tree"``).

`sglang_tree_verify` stands for SGLang's target-only tree verification (`TreeSpeculativeSamplingTargetOnly`
with thresholds 1): per request, ``num_draft_tokens`` nodes, node 0 the root (the last verified
token, whose probability row is the root's), ``retrive_next_token[j]`` node ``j``'s first child and
``retrive_next_sibling[j]`` its next sibling (``-1``: none), the target probabilities of every node's
row, and two uniforms per node. At node ``v`` the first uniform is compared with the running sum of
``p_v`` over its children's tokens in sibling-chain order: the first child whose running sum exceeds
it is accepted, and the walk goes on from it. Otherwise the emitted token is drawn with the second
uniform from ``p_v`` with every child's token removed (a leaf's: from ``p_v``).

`SglangTreeAdapter` is the whole adapter: it renumbers a `SpecBatch`'s tree into that layout (the root
node 0, our node ``i`` node ``1 + i``, sibling chains in our sibling order), calls the verifier, and
maps the accepted nodes back. Its ``capabilities`` declare method ``"tree"`` alone. Certify it with::

    python -m specsample.fuzz certify --variant examples/sglang_tree_adapter.py:SglangTreeAdapter

SGLang's kernel differs from target-only verification in two ways, which `SglangKernelAsShipped`
reproduces and the harness fails (``fuzz/tests/test_examples.py``): a token repeated among a node's
children adds its probability once per copy to the running sum (accepted with ``c p(t)`` for ``c``
copies, where the specification accepts its first copy with ``p(t)``), and a uniform of exactly 0
accepts the first child even where ``p(t) = 0`` (its test is ``u <= sum``). The adapter's verifier
counts each token once and compares strictly.
"""

from __future__ import annotations

import torch

from specsample.reference.contract import Capabilities, SpecBatch, SpecOutput


def sglang_tree_verify(
    candidates: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    count_repeats: bool = False,
    accept_at_zero: bool = False,
) -> tuple[list[list[int]], list[int]]:
    """Target-only tree verification of a batch in SGLang's layout (its own uniforms).

    Args:
        candidates: ``[B, N]`` int64 node tokens, node 0 the root (its token unused), ``-1`` for a
            placeholder.
        retrive_next_token: ``[B, N]`` int64 each node's first child, ``-1`` for none.
        retrive_next_sibling: ``[B, N]`` int64 each node's next sibling, ``-1`` for none.
        target_probs: ``[B, N, V]`` float64 the law of each node's row.
        uniforms: ``[B, N, 2]`` float64 uniforms of each node: the coin, then the draw.
        count_repeats: add a repeated sibling token's probability once per copy (SGLang's kernel).
        accept_at_zero: accept a child at ``coin <= running sum`` (SGLang's kernel), not ``<``.

    Returns:
        Per request, the accepted nodes (their indices in the layout) and the emitted token.
    """
    accepted_nodes, emitted = [], []
    for b in range(candidates.shape[0]):
        node, path = 0, []
        while True:
            p = target_probs[b, node]
            coin, draw = float(uniforms[b, node, 0]), float(uniforms[b, node, 1])
            running, child, seen, taken = 0.0, int(retrive_next_token[b, node]), set(), []
            chosen = -1
            while child >= 0:
                token = int(candidates[b, child])
                if token >= 0:
                    taken.append(token)
                    if count_repeats or token not in seen:
                        running += float(p[token])
                    seen.add(token)
                    if coin < running or (accept_at_zero and coin <= running):
                        chosen = child
                        break
                child = int(retrive_next_sibling[b, child])
            if chosen < 0:
                rest = p.clone()
                rest[taken] = 0.0
                law = rest if float(rest.sum()) > 0.0 else p
                # The first token whose cumulative mass passes the draw: never one of mass 0.
                cumulative = torch.cumsum(law / law.sum(), 0)
                at = torch.searchsorted(cumulative, torch.tensor([draw], dtype=law.dtype), right=True)
                token = int(at.clamp(max=law.shape[0] - 1))
                accepted_nodes.append(path)
                emitted.append(token)
                break
            path.append(chosen)
            node = chosen
    return accepted_nodes, emitted


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``softmax(logits / T)`` of one request's rows; a greedy request (``T = 0``) gets its argmax."""
    clean = torch.nan_to_num(logits.double(), nan=-torch.inf)
    if temperature == 0.0:
        return torch.nn.functional.one_hot(clean.argmax(-1), logits.shape[-1]).double()
    return torch.softmax((clean - clean.amax(-1, keepdim=True)) / temperature, dim=-1)


class SglangTreeAdapter:
    """The adapter: a `SpecBatch` of trees in, SGLang's layout, the verifier, a `SpecOutput` out."""

    name = "sglang-tree-adapter"
    streams = None
    # Tree verification alone, no logprobs; +inf logits make its softmax NaN, so its callers never
    # send them.
    capabilities = Capabilities(methods=("tree",), logprobs=False, infinite_logits=False)
    count_repeats = False
    accept_at_zero = False

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Verify ``batch``'s trees with the SGLang-layout verifier."""
        if batch.method != "tree" or batch.tree_parent is None:
            raise ValueError(f"method is {batch.method!r}; this verifier takes trees only")
        counts = batch.num_drafts()
        starts = batch.cu_num_drafts.tolist()
        size = max(counts) + 1
        candidates = torch.full((len(counts), size), -1, dtype=torch.int64)
        next_token = torch.full((len(counts), size), -1, dtype=torch.int64)
        next_sibling = torch.full((len(counts), size), -1, dtype=torch.int64)
        target = torch.zeros(len(counts), size, batch.vocab_size, dtype=torch.float64)
        for b, n in enumerate(counts):
            first = starts[b]
            ids = batch.draft_token_ids[first : first + n]
            candidates[b, 1 : n + 1] = torch.where(ids < batch.vocab_size, ids.clamp(min=-1), -1)
            rows = batch.target_logits[first + b : first + b + n + 1]
            target[b, : n + 1] = _probs(rows, float(batch.temperature[b]))
            # Sibling chains in node order: a parent's children, each linked to the next.
            last_child: dict[int, int] = {}
            for i, parent in enumerate(batch.tree_parent[first : first + n].tolist()):
                node, above = i + 1, parent + 1
                if above in last_child:
                    next_sibling[b, last_child[above]] = node
                else:
                    next_token[b, above] = node
                last_child[above] = node
        generators = [
            torch.Generator().manual_seed((int(s) * 1_000_003 + int(t)) % (2**63))
            for s, t in zip(batch.seed.tolist(), batch.step.tolist(), strict=True)
        ]
        uniforms = torch.stack([torch.rand(size, 2, generator=g, dtype=torch.float64) for g in generators])
        paths, emitted = sglang_tree_verify(
            candidates, next_token, next_sibling, target, uniforms,
            count_repeats=self.count_repeats, accept_at_zero=self.accept_at_zero,
        )  # fmt: skip
        width = max(counts)
        token_ids = torch.full((len(counts), width + 1), -1, dtype=torch.int64)
        accepted = torch.full((len(counts), width), -1, dtype=torch.int32)
        num_emitted = torch.zeros(len(counts), dtype=torch.int32)
        for b, (path, token) in enumerate(zip(paths, emitted, strict=True)):
            # Layout node k is our node k - 1; its token is its candidate.
            accepted[b, : len(path)] = torch.tensor([k - 1 for k in path], dtype=torch.int32)
            token_ids[b, : len(path)] = candidates[b, path]
            token_ids[b, len(path)] = token
            num_emitted[b] = len(path) + 1
        return SpecOutput(token_ids=token_ids, num_emitted=num_emitted, accepted_nodes=accepted)


class SglangKernelAsShipped(SglangTreeAdapter):
    """The adapter over the verifier as SGLang's kernel computes: a repeated sibling token's probability
    counted once per copy, and a child accepted at ``coin <= running sum``."""

    name = "sglang-kernel-as-shipped"
    count_repeats = True
    accept_at_zero = True
