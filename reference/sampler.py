"""The reference sampler: the rules of `reference.methods`, one request and one position at a time.

It is the readable form of the sampling algorithm every exact sampler of the harness shares:
fed a random scheme's uniforms (`reference.schemes`, the canonical streams by default), it decides
each draft in order and emits one token after the accepted ones, sampling by the scheme's draw
(`reference.schemes.draw`: Gumbel-max ``argmax(log w + g)``, ties to the lowest index, within the
block the row's block uniform picks; strict rows by Gumbel-max over the whole row). Block
verification decides from all the drafts at once: ``eta_i`` is the acceptance uniform of position
``i - 1``, ``m`` the largest ``i`` with ``eta_i < h_i``, and the token is drawn from row ``m``'s
weighted residual with row ``m``'s noise (`reference.block`). Tree verification walks the tree
from the root (`reference.tree.verify`), drawing each node's row by Gumbel-max over the whole row
with that row's noise, as strict rows draw. `reference.walk` is the same algorithm vectorised over a
batch; the two agree token for token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from . import block, tree
from .contract import Capabilities, SpecBatch, SpecOutput
from .law import F64Array, RequestInputs, greedy_token, request_inputs, token_logprobs
from .methods import METHODS
from .schemes import CANONICAL, Noise, RandomScheme, draw


@dataclass(frozen=True)
class RequestNoise:
    """The random numbers one request consumes.

    Attributes:
        accept_uniforms: ``[n]`` the acceptance uniform of each position.
        rows: the noise for sampling each row (``[n + 1, V]`` Gumbel noise, and the block uniforms).
    """

    accept_uniforms: F64Array
    rows: Noise


def scheme_noise(batch: SpecBatch, scheme: RandomScheme = CANONICAL) -> list[RequestNoise]:
    """The random numbers of every request of ``batch`` under ``scheme``."""
    noise = []
    for seed, step, n in zip(batch.seed.tolist(), batch.step.tolist(), batch.num_drafts(), strict=True):
        positions = np.arange(n + 1)
        seed_rows, step_rows = np.full(n + 1, seed, dtype=np.int64), np.full(n + 1, step, dtype=np.int64)
        accept_uniforms = scheme.accept_uniforms(seed_rows[:n], step_rows[:n], positions[:n])
        rows = scheme.gumbel_noise(seed_rows, step_rows, positions, batch.vocab_size)
        noise.append(RequestNoise(accept_uniforms, rows))
    return noise


def draw_row(weights: F64Array, noise: RequestNoise, row: int, whole_row: bool = False) -> int:
    """The scheme's draw from ``weights`` with row ``row``'s noise (`reference.schemes.draw`; by
    Gumbel-max over the whole row if ``whole_row``); a weight of 0 is never chosen unless every
    score is ``-inf``."""
    uniform = noise.rows.block_uniform
    one = Noise(
        noise.rows.uniforms[row : row + 1],
        noise.rows.gumbel[row : row + 1],
        noise.rows.tolerance[row : row + 1],
        None if whole_row or uniform is None else uniform[row : row + 1],
    )
    return int(draw(weights[None, :], one)[0])


def _draw(
    inputs: RequestInputs, law: F64Array, noise: RequestNoise, row: int, whole_row: bool = False
) -> int:
    """The token drawn at ``row``: a greedy request's argmax there, else the scheme's draw from ``law``."""
    if inputs.greedy:
        return int(greedy_token(inputs.target_logits[row]))
    return draw_row(law, noise, row, whole_row)


def _decide(
    method: str, inputs: RequestInputs, targets: F64Array, drafts: F64Array, noise: RequestNoise, i: int
) -> tuple[bool, int]:
    """Whether draft ``i`` is accepted, and the token emitted if it is not."""
    rules = METHODS[method]
    target, draft = targets[i], drafts[i]
    token = int(inputs.draft_token_ids[i])
    argmax = int(greedy_token(inputs.target_logits[i]))
    if inputs.greedy and rules.greedy_accepts_argmax:
        return token >= 0 and token == argmax, argmax
    if rules.decides_by_sampling:
        sample = draw_row(target, noise, i, whole_row=True)
        return token >= 0 and sample == token, sample
    rate = float(inputs.synthetic_rates[i]) if inputs.synthetic_rates is not None else 0.0
    u = noise.accept_uniforms[i : i + 1]
    if token >= 0 and bool(rules.decide(target[[token]], draft[[token]], u, np.array([rate]))[0]):
        return True, token
    law = rules.rejection_law(target, draft, token) if token >= 0 else target
    return False, _draw(inputs, law, noise, i)


def _verify_block(
    inputs: RequestInputs, targets: F64Array, drafts: F64Array, noise: RequestNoise
) -> list[int]:
    """Block verification (`reference.block`): ``m`` from the keep probabilities and the acceptance
    uniforms ``eta_i`` (position ``i - 1``'s), then the drafts kept and one token drawn at row ``m``."""
    n, ids = inputs.num_drafts, inputs.draft_token_ids
    drafts = block.draft_laws(drafts, ids)
    weights = block.block_weights(targets, drafts, ids)
    kept = block.kept_drafts(block.keep_probabilities(targets, drafts, weights), noise.accept_uniforms)
    law = targets[n] if kept == n else block.residual(weights[kept], targets[kept], drafts[kept])
    return [*(int(d) for d in ids[:kept]), _draw(inputs, law, noise, kept)]


def _verify_in_order(
    method: str, inputs: RequestInputs, targets: F64Array, drafts: F64Array, noise: RequestNoise
) -> list[int]:
    """The per-position rules: each draft decided in order up to the first rejection, then one token."""
    n = inputs.num_drafts
    tokens: list[int] = []
    for i in range(n):
        accepted, emitted = _decide(method, inputs, targets, drafts, noise, i)
        if not accepted:
            return [*tokens, emitted]
        tokens.append(int(inputs.draft_token_ids[i]))
    return [*tokens, _draw(inputs, targets[n], noise, n, whole_row=METHODS[method].decides_by_sampling)]


def sample_tree(inputs: RequestInputs, noise: RequestNoise) -> tuple[list[int], list[int]]:
    """Tree verification of one request with the given random numbers (`reference.tree.verify`): the
    accepted nodes, and the emitted sequence (their tokens, then the token drawn where the walk
    stopped). Each node's row is drawn by Gumbel-max over the whole row (a greedy request: its argmax)."""
    assert inputs.tree_parent is not None
    targets = inputs.target_probs()
    return tree.verify(
        inputs.tree_parent, inputs.draft_token_ids, lambda row: _draw(inputs, targets[row], noise, row, True)
    )


def sample_request(method: str, inputs: RequestInputs, noise: RequestNoise) -> list[int]:
    """Run the rejection sampler on one request with the given random numbers: the accepted drafts,
    then one sampled token."""
    if METHODS[method].verifies_tree:
        return sample_tree(inputs, noise)[1]
    targets, drafts = inputs.target_probs(), inputs.draft_probs()
    verify = _verify_block if METHODS[method].verifies_jointly else partial(_verify_in_order, method)
    return verify(inputs, targets, drafts, noise)


def reference_sample(
    batch: SpecBatch, noise: Sequence[RequestNoise] | None = None, scheme: RandomScheme = CANONICAL
) -> SpecOutput:
    """Sample ``batch`` in float64 with ``noise`` (default: ``scheme``'s); the output is on the CPU,
    each row's tokens left-aligned, ``-1`` (and NaN logprobs) after them."""
    inputs = request_inputs(batch)
    if noise is None:
        noise = scheme_noise(batch, scheme)
    if len(noise) != len(inputs):
        raise ValueError(f"noise has {len(noise)} entries; expected one per request ({len(inputs)})")
    shape = (len(inputs), batch.resolved_max_num_drafts() + 1)
    token_ids = torch.full(shape, -1, dtype=torch.int64)
    logprobs = torch.full(shape, float("nan"), dtype=torch.float32)
    num_emitted = torch.zeros(len(inputs), dtype=torch.int32)
    is_tree = METHODS[batch.method].verifies_tree
    accepted_nodes = torch.full((shape[0], shape[1] - 1), -1, dtype=torch.int32) if is_tree else None
    for b, (x, z) in enumerate(zip(inputs, noise, strict=True)):
        if accepted_nodes is not None:
            nodes, sequence = sample_tree(x, z)
            accepted_nodes[b, : len(nodes)] = torch.tensor(nodes, dtype=torch.int32)
            rows = np.array([0, *(node + 1 for node in nodes)], dtype=np.int64)
        else:
            sequence = sample_request(batch.method, x, z)
            rows = np.arange(len(sequence))
        tokens = np.array(sequence, dtype=np.int64)
        count = tokens.size
        num_emitted[b] = count
        token_ids[b, :count] = torch.from_numpy(tokens)
        temperature = np.full(count, x.temperature)
        logprobs[b, :count] = torch.from_numpy(token_logprobs(x.target_logits[rows], temperature, tokens))
    return SpecOutput(
        token_ids=token_ids, num_emitted=num_emitted, logprobs=logprobs, accepted_nodes=accepted_nodes
    )


class ReferenceSampler:
    """`reference_sample` as a `Variant`: the float64 twin of every sampler on ``scheme``."""

    name = "reference"
    # Every method, trees included.
    capabilities = Capabilities(methods=tuple(METHODS))

    def __init__(self, scheme: RandomScheme = CANONICAL) -> None:
        self.streams = scheme
        if scheme is not CANONICAL:
            self.name = f"reference-{scheme.name}"

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample ``batch`` on the CPU with the scheme's uniforms."""
        return reference_sample(batch, scheme=self.streams)
