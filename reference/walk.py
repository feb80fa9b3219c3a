"""The walk: every exact Python sampler of the harness, vectorised over a batch, and its decisions.

`Walk` samples a batch in float64 from a random scheme's uniforms (`reference.schemes`), position
by position over all requests at once, with the rules of `reference.methods`. It is what the
coupled check compares a kernel with, what calibration runs sample from, and the host of the
planted mutants: each stage below is a method a mutant overrides. Its tokens, counts and logprobs
equal the scalar `reference.sampler.reference_sample`'s on the same scheme.

Stages, in the order a position meets them: `Walk.read`, `Walk.target_law` and `Walk.draft_law`,
`Walk.accept_uniforms`, `Walk.draft_probs`, `Walk.decide`, `Walk.keep_walking`; then, at the final
row, `Walk.rejection_row` or `Walk.bonus_row`, `Walk.sample` or `Walk.rejection_token`, and
`Walk.pack`. Block verification reads every row of a request before it decides: `Walk.block_weight`,
`Walk.keep_probability`, `Walk.keeps` (``eta_i < h_i``, ``eta_i`` the acceptance uniform of position
``i - 1``; ``m`` is the largest ``i`` kept); then `Walk.block_bonus` and `Walk.bonus_row`, or
`Walk.block_residual` at row ``m``, and `Walk.sample`. Tree verification (`reference.tree`) walks
each request's tree from the root: `Walk.tree_children` (which child a drawn token accepts at a row),
then at each node `Walk.tree_step` (`Walk.tree_draw`, the row's draw by Gumbel-max over the whole
row as strict rows draw, and the child it accepts), until a step accepts no child; `Walk.pack` adds
the accepted nodes.

Beside the output, the walk records every decision it makes (`reference.near_ties.Decision`: the
acceptance tests, the draws with their noise, block verification's keep decisions, the comparisons of
exact values). After each chunk of requests the near-tie model reads that record in one pass
(`reference.near_ties.judge`) and marks every emitted position whose decision float32 arithmetic
could flip: a *near tie*. In a filtered batch (`reference.filters`) a decision that changes when the
near pivots of its rows are dropped from the kept sets, or added to them, is a near tie too: the walk
runs twice more, once each way (`pivot_sensitive`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from . import block, tree
from .contract import Capabilities, SpecBatch, SpecOutput
from .filters import FILTER_FLAGS, PivotBand, pivot_band
from .law import BatchRows, F64Array, I64Array, Pivots, greedy_token, one_hot, row_probs, token_logprobs
from .methods import METHODS, Method
from .near_ties import AcceptanceTest, BoolArray, Decision, Draw, ExactDecision, Keep, judge
from .schemes import CANONICAL, Noise, RandomScheme, draw

DEFAULT_MAX_ELEMENTS = 1 << 22
# The filter rounding the walk allows when the sampler declares none (`Capabilities.filter_ulps`).
DEFAULT_BAND = pivot_band(4.0)


@dataclass(frozen=True)
class WalkResult:
    """The walk's output for a batch and where its decisions are near ties.

    Attributes:
        output: tokens, counts and logprobs, on the CPU.
        near: ``[B, max_n + 1]`` whether a decision made at each emitted position (the acceptance
            test, and the sample drawn there) could flip under float32 rounding.
        num_decisions: acceptance decisions and samples made over the batch.
    """

    output: SpecOutput
    near: BoolArray
    num_decisions: int

    @property
    def near_ties(self) -> int:
        """The number of positions with a near-tie decision."""
        return int(self.near.sum())


@dataclass
class _Chunk:
    """The state of a walk over some requests: what each one emitted so far, and the decisions made."""

    requests: I64Array
    tokens: I64Array
    logprobs: npt.NDArray[np.float32]
    accepted: I64Array
    walking: BoolArray
    sampled: I64Array  # [A, W] the row samples drawn to decide (strict), -1 elsewhere
    accept_u: F64Array  # [A, W] the acceptance uniforms of the positions decided
    weights: F64Array  # [A, W] block verification's weights w_i (1 for the other methods)
    nodes: I64Array  # [A, W - 1] the accepted nodes of a tree, -1 after them (and for the other methods)
    record: list[Decision] = field(default_factory=list)


class Walk:
    """Sampling in float64 from ``scheme``'s uniforms, with overridable stages (see the module
    docstring), in chunks of requests of at most ``max_elements`` logits per position (in all, for
    a method that samples every row: a chunk's record holds the noise of every row it drew from)."""

    def __init__(
        self,
        scheme: RandomScheme = CANONICAL,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
        pivots: Pivots = "exact",
        band: PivotBand = DEFAULT_BAND,
    ) -> None:
        self.scheme = scheme
        self.max_elements = max_elements
        self.pivots: Pivots = pivots
        self.band = band

    def run(self, batch: SpecBatch) -> WalkResult:
        """Sample ``batch``; return the output and its near ties, judged from each chunk's record."""
        rows = self.read(batch)
        method = self.method(rows.method)
        num_requests, vocab_size = batch.num_requests, batch.vocab_size
        width = batch.resolved_max_num_drafts() + 1
        tokens = np.full((num_requests, width), -1, dtype=np.int64)
        logprobs = np.full((num_requests, width), np.nan, dtype=np.float32)
        accepted = np.zeros(num_requests, dtype=np.int64)
        nodes = np.full((num_requests, width - 1), -1, dtype=np.int64)
        near = np.zeros((num_requests, width), dtype=bool)
        # A chunk's record holds the noise of each row drawn from until the chunk is judged, and a
        # method that decides by sampling draws from every row it reaches.
        held_rows = width if method.decides_by_sampling else 1
        size = max(1, self.max_elements // max(vocab_size * held_rows, 1))
        decisions = 0
        for start in range(0, num_requests, size):
            part = slice(start, start + size)  # the chunk writes its requests' share of the output
            requests = np.arange(num_requests)[part]
            chunk = _Chunk(
                requests=requests,
                tokens=tokens[part],
                logprobs=logprobs[part],
                accepted=accepted[part],
                walking=np.ones(requests.size, dtype=bool),
                sampled=np.full((requests.size, width), -1, dtype=np.int64),
                accept_u=np.zeros((requests.size, width)),
                weights=np.ones((requests.size, width)),
                nodes=nodes[part],
            )
            if method.verifies_tree:
                self._walk_tree(rows, chunk)
            elif method.verifies_jointly:
                self._verify_block(rows, chunk)
                self._emit_block(rows, chunk)
            else:
                self._decide_drafts(rows, method, chunk)
                self._emit(rows, method, chunk)
            judged = judge(rows, chunk.record, width)
            near |= judged.near
            decisions += judged.num_decisions
        output = self.pack(rows, tokens, accepted + 1, logprobs, nodes if method.verifies_tree else None)
        return WalkResult(output=output, near=near, num_decisions=decisions)

    # -- stages ---------------------------------------------------------------------------------

    def read(self, batch: SpecBatch) -> BatchRows:
        """The batch as float64 rows (filtered as ``pivots`` says)."""
        return BatchRows.of(batch, self.pivots, self.band)

    def method(self, name: str) -> Method:
        """The rules of the batch's method."""
        return METHODS[name]

    def target_law(self, logits: F64Array, temperature: F64Array) -> F64Array:
        """``[A, V]`` target laws ``p = softmax(logits / T)``; greedy rows one-hot."""
        return row_probs(logits, temperature)

    def draft_law(self, logits: F64Array | None, temperature: F64Array, ids: I64Array) -> F64Array | None:
        """``[A, V]`` draft laws ``q = softmax(draft / T)``, or ``None`` for one-hot drafts."""
        return None if logits is None else row_probs(logits, temperature)

    def accept_uniforms(self, seed: I64Array, step: I64Array, position: int) -> F64Array:
        """``[A]`` the acceptance uniforms of ``position``."""
        return self.scheme.accept_uniforms(seed, step, np.full(seed.shape, position))

    def synthetic_rate(self, rates: F64Array | None, position: int) -> float:
        """The conditional acceptance rate of ``position`` (0 past the given rates)."""
        return float(rates[position]) if rates is not None and position < rates.size else 0.0

    def draft_probs(
        self, p: F64Array, q: F64Array | None, ids: I64Array
    ) -> tuple[F64Array, F64Array, BoolArray]:
        """``(p(d), q(d), real)``: the laws at each draft, and which drafts are real ids (not ``-1``)."""
        rows, safe = np.arange(ids.size), np.maximum(ids, 0)
        q_draft = np.ones(ids.size) if q is None else q[rows, safe]
        return p[rows, safe], q_draft, ids >= 0

    def decide(
        self, method: Method, p_draft: F64Array, q_draft: F64Array, u: F64Array, rate: float
    ) -> BoolArray:
        """Whether each real draft at a sampled row is accepted."""
        return method.decide(p_draft, q_draft, u, np.full(u.shape, rate))

    def keep_walking(self, accept: BoolArray) -> BoolArray:
        """Which requests decide their next draft: those that accepted this one."""
        return accept

    def sample(self, weights: F64Array, noise: Noise) -> I64Array:
        """The scheme's draw (`reference.schemes.draw`): Gumbel-max ``argmax(log w + g)`` per row,
        within the block the row's block uniform picks where the noise has one; ties to the lowest
        index."""
        return draw(weights, noise)

    def rejection_token(
        self, method: Method, p: F64Array, q: F64Array, ids: I64Array, noise: Noise, u: F64Array
    ) -> I64Array:
        """The token emitted after a real draft is rejected at a sampled row: a draw from the method's law."""
        return self.sample(method.rejection_law(p, q, ids), noise)

    def rejection_row(self, accepted: I64Array) -> I64Array:
        """The row whose laws the rejection draw uses: the rejected position."""
        return accepted

    def bonus_row(self, counts: I64Array) -> I64Array:
        """The row of the bonus draw: ``n``."""
        return counts

    def block_weight(
        self, weight: F64Array, p_draft: F64Array, q_draft: F64Array, real: BoolArray
    ) -> F64Array:
        """Block verification: ``w_{i+1} = min(1, w_i p(d) / q(d))``; 0 after a placeholder."""
        return np.where(real, block.next_weight(weight, p_draft, q_draft), 0.0)

    def keep_probability(self, weight: F64Array, p: F64Array, q: F64Array) -> F64Array:
        """Block verification: ``h_i = S_i / (S_i + 1 - w_i)`` at a row ``1 <= i < n``."""
        return block.keep_probability(weight, p, q)

    def keeps(self, keep: F64Array, eta: F64Array) -> BoolArray:
        """Block verification: whether index ``i`` is kept, ``eta_i < h_i``."""
        return np.asarray(eta < keep)

    def block_bonus(self, kept: I64Array, counts: I64Array) -> BoolArray:
        """Block verification: which requests emit the bonus, those that kept every draft."""
        return np.asarray(kept >= counts)

    def block_residual(self, weight: F64Array, p: F64Array, q: F64Array) -> F64Array:
        """Block verification: the law of the token after a stop at ``m < n``, the weighted residual."""
        return block.residual(weight, p, q)

    def tree_children(self, rows: BatchRows, request: int) -> dict[tuple[int, int], int]:
        """Tree verification: which node a token drawn at a row accepts, ``(row, token) -> node``: the
        first child of the row's node (in sibling order) holding the token; a placeholder none."""
        parents = rows.tree_parents(request)
        tokens = rows.draft_ids(np.full(parents.size, request), np.arange(parents.size))
        first = tree.first_siblings(parents, tokens)
        return {
            (int(parent) + 1, int(token)): node
            for node, (parent, token) in enumerate(zip(parents, tokens, strict=True))
            if first[node]
        }

    def tree_step(
        self,
        rows: BatchRows,
        chunk: _Chunk,
        local: I64Array,
        row: I64Array,
        level: int,
        children: list[dict[tuple[int, int], int]],
    ) -> tuple[I64Array, I64Array]:
        """Tree verification at one node of each request ``local`` of ``chunk``: the token drawn at its
        row ``row`` (`tree_draw`; a greedy request's argmax) and the child it accepts (``children``,
        the requests' `tree_children`), ``-1`` where it accepts none and is emitted."""
        a = chunk.requests[local]
        drawn = greedy_token(rows.target_rows(a, row))
        sampled = rows.temperature[a] > 0.0
        chunk.record.append(ExactDecision(a[~sampled], level))
        if sampled.any():
            s = np.nonzero(sampled)[0]
            drawn[s] = self.tree_draw(rows, chunk, local[s], row[s], level)
        child = [table.get((int(r), int(x)), -1) for table, r, x in zip(children, row, drawn, strict=True)]
        return drawn, np.asarray(child, dtype=np.int64)

    def tree_draw(
        self, rows: BatchRows, chunk: _Chunk, local: I64Array, row: I64Array, level: int
    ) -> I64Array:
        """Tree verification: the tokens drawn at target row ``row`` (0 the root's, ``1 + v`` node
        ``v``'s) of the sampled requests ``local`` of ``chunk``, emitted at position ``level``: the
        target law's, by Gumbel-max over the whole row."""
        return self._draw(rows, chunk, local, row, np.full(local.size, level), whole_row=True)

    def pack(
        self,
        rows: BatchRows,
        tokens: I64Array,
        emitted: I64Array,
        logprobs: npt.NDArray[np.float32],
        nodes: I64Array | None = None,
    ) -> SpecOutput:
        """The output: ``emitted`` tokens per request, ``-1`` (and NaN) after them; a tree's accepted
        nodes."""
        return SpecOutput(
            token_ids=torch.from_numpy(tokens),
            num_emitted=torch.from_numpy(emitted.astype(np.int32)),
            logprobs=torch.from_numpy(logprobs),
            accepted_nodes=None if nodes is None else torch.from_numpy(nodes.astype(np.int32)),
        )

    # -- the walk -----------------------------------------------------------------------------

    def _noise(self, rows: BatchRows, requests: I64Array, position: npt.ArrayLike) -> Noise:
        """The scheme's Gumbel noise at row ``position`` of each request."""
        vocab_size = rows.target.shape[1]
        return self.scheme.gumbel_noise(rows.seed[requests], rows.step[requests], position, vocab_size)

    def _draw(
        self,
        rows: BatchRows,
        chunk: _Chunk,
        local: I64Array,
        row: I64Array,
        position: I64Array,
        whole_row: bool,
    ) -> I64Array:
        """Draws from the target law at ``row`` of the requests ``local`` of ``chunk``, emitted at
        ``position`` (over the whole row by Gumbel-max if ``whole_row``, as strict rows draw)."""
        requests = chunk.requests[local]
        noise = self._noise(rows, requests, row)
        noise = noise.whole_row() if whole_row else noise
        law = self.target_law(rows.target_rows(requests, row), rows.temperature[requests])
        tokens = self.sample(law, noise)
        chunk.record.append(Draw(requests, position, row, tokens, noise))
        return tokens

    def _decide_drafts(self, rows: BatchRows, method: Method, chunk: _Chunk) -> None:
        """Decide each request's drafts in order until it stops walking."""
        counts = rows.counts[chunk.requests]
        for position in range(int(counts.max(initial=0))):
            local = np.nonzero(chunk.walking & (position < counts))[0]
            if local.size == 0:
                break
            a = chunk.requests[local]
            temperature = rows.temperature[a]
            logits = rows.target_rows(a, position)
            p = self.target_law(logits, temperature)
            ids = rows.draft_ids(a, position)
            q = self.draft_law(rows.draft_rows(a, position), temperature, ids)
            u = self.accept_uniforms(rows.seed[a], rows.step[a], position)
            chunk.accept_u[local, position] = u
            p_draft, q_draft, real = self.draft_probs(p, q, ids)
            by_argmax = (temperature == 0.0) & method.greedy_accepts_argmax
            accept = by_argmax & real & (ids == greedy_token(logits))
            chunk.record.append(ExactDecision(a[by_argmax], position))
            if method.decides_by_sampling:
                s = np.nonzero(~by_argmax)[0]
                noise = self._noise(rows, a[s], position).whole_row()
                sampled = self.sample(p[s], noise)
                chunk.sampled[local[s], position] = sampled
                accept[s] = real[s] & (sampled == ids[s])
                chunk.record.append(Draw(a[s], position, position, sampled, noise))
            else:
                # A placeholder is rejected untested, except by a method that decides every row
                # (synthetic sampling), so only the rows tested are recorded as decisions.
                s = np.nonzero(~by_argmax & (real | (not method.greedy_accepts_argmax)))[0]
                rate = self.synthetic_rate(rows.rates, position)
                accept[s] = real[s] & self.decide(method, p_draft[s], q_draft[s], u[s], rate)
                tested = AcceptanceTest(a[s], position, ids[s], u[s])
                chunk.record.append(ExactDecision(a[s], position) if method.exact_decision else tested)
            chunk.tokens[local[accept], position] = ids[accept]
            chunk.logprobs[local[accept], position] = token_logprobs(
                logits[accept], temperature[accept], ids[accept]
            )
            chunk.accepted[local] += accept
            chunk.walking[local] = self.keep_walking(accept)

    def _emit(self, rows: BatchRows, method: Method, chunk: _Chunk) -> None:
        """Draw the token emitted after each request's accepted drafts, at row ``m``."""
        requests, m = chunk.requests, chunk.accepted
        counts = rows.counts[requests]
        temperature = rows.temperature[requests]
        logits = rows.target_rows(requests, m)
        ids = rows.draft_ids(requests, m)
        bonus = m >= counts
        final = greedy_token(logits)
        drawn = temperature > 0.0
        by_sample = drawn & ~bonus & method.decides_by_sampling
        final[by_sample] = chunk.sampled[np.nonzero(by_sample)[0], m[by_sample]]
        rejected = drawn & ~bonus & (ids >= 0) & (not method.decides_by_sampling)
        plain = drawn & ~by_sample & ~rejected
        if plain.any():
            s = np.nonzero(plain)[0]
            row = np.where(bonus[s], self.bonus_row(counts[s]), m[s])
            final[s] = self._draw(rows, chunk, s, row, m[s], method.decides_by_sampling)
        if rejected.any():
            s = np.nonzero(rejected)[0]
            row = self.rejection_row(m[s])
            noise = self._noise(rows, requests[s], m[s])
            p = self.target_law(rows.target_rows(requests[s], row), temperature[s])
            q = self.draft_law(rows.draft_rows(requests[s], row), temperature[s], ids[s])
            q_full = q if q is not None else one_hot(ids[s], p.shape[1])
            final[s] = self.rejection_token(method, p, q_full, ids[s], noise, chunk.accept_u[s, m[s]])
            residual_of = ids[s] if method.uses_draft_law else None
            chunk.record.append(Draw(requests[s], m[s], row, final[s], noise, residual_of))
        index = np.arange(requests.size)
        chunk.tokens[index, m] = final
        chunk.logprobs[index, m] = token_logprobs(logits, temperature, final)

    def _walk_tree(self, rows: BatchRows, chunk: _Chunk) -> None:
        """Tree verification: every request takes a step at its node's row (`tree_step`) and descends
        into the child the drawn token accepts, until a step accepts none; that token is emitted."""
        requests = chunk.requests
        children = [self.tree_children(rows, int(b)) for b in requests]
        row = np.zeros(requests.size, dtype=np.int64)
        walking = np.ones(requests.size, dtype=bool)
        level = 0
        while walking.any():
            local = np.nonzero(walking)[0]
            a = requests[local]
            drawn, child = self.tree_step(rows, chunk, local, row[local], level, [children[i] for i in local])
            chunk.tokens[local, level] = drawn
            logits = rows.target_rows(a, row[local])
            chunk.logprobs[local, level] = token_logprobs(logits, rows.temperature[a], drawn)
            accept = child >= 0
            if accept.any():  # (a batch without drafts has no column of nodes to write)
                chunk.nodes[local[accept], level] = child[accept]
            chunk.accepted[local[accept]] += 1
            row[local[accept]] = child[accept] + 1
            walking[local[~accept]] = False
            level += 1

    def _block_rows(
        self, rows: BatchRows, requests: I64Array, position: npt.ArrayLike
    ) -> tuple[F64Array, F64Array, F64Array, I64Array]:
        """Row ``position`` of each request: target logits, ``p``, block verification's ``q``, drafts."""
        temperature = rows.temperature[requests]
        logits = rows.target_rows(requests, position)
        ids = rows.draft_ids(requests, position)
        q = self.draft_law(rows.draft_rows(requests, position), temperature, ids)
        q_block = block.draft_laws(one_hot(ids, logits.shape[1]) if q is None else q, ids)
        return logits, self.target_law(logits, temperature), q_block, ids

    def _verify_block(self, rows: BatchRows, chunk: _Chunk) -> None:
        """Block verification: every request's weights and keep decisions, then ``m`` and its drafts."""
        requests = chunk.requests
        counts = rows.counts[requests]
        width = chunk.tokens.shape[1]
        weight = np.ones(requests.size)
        drafts = np.full((requests.size, width), -1, dtype=np.int64)
        draft_logprobs = np.full((requests.size, width), np.nan, dtype=np.float32)
        for position in range(int(counts.max(initial=0))):
            local = np.nonzero(position < counts)[0]
            temperature = rows.temperature[requests[local]]
            logits, p, q, ids = self._block_rows(rows, requests[local], position)
            chunk.weights[local, position] = weight[local]
            drafts[local, position] = ids
            draft_logprobs[local, position] = token_logprobs(logits, temperature, ids)
            if position:
                self._keep_decision(rows, chunk, local, position, self.keep_probability(weight[local], p, q))
            p_draft, q_draft, real = self.draft_probs(p, q, ids)
            weight[local] = self.block_weight(weight[local], p_draft, q_draft, real)
            last = local[position + 1 == counts[local]]  # h_n = w_n
            if last.size:
                self._keep_decision(rows, chunk, last, position + 1, weight[last])
        column = np.arange(width)[None, :]
        inside = column < chunk.accepted[:, None]
        chunk.tokens[inside] = drafts[inside]
        chunk.logprobs[inside] = draft_logprobs[inside]

    def _keep_decision(
        self, rows: BatchRows, chunk: _Chunk, local: I64Array, index: int, keep: F64Array
    ) -> None:
        """Decide index ``index`` of the requests ``local`` (``eta_i < h_i``)."""
        a = chunk.requests[local]
        eta = self.accept_uniforms(rows.seed[a], rows.step[a], index - 1)
        kept = self.keeps(keep, eta)
        chunk.accepted[local[kept]] = index
        chunk.record.append(Keep(a, index, eta, kept))

    def _emit_block(self, rows: BatchRows, chunk: _Chunk) -> None:
        """Block verification's token after the ``m`` kept drafts: the bonus, or the weighted residual."""
        requests, m = chunk.requests, chunk.accepted
        counts = rows.counts[requests]
        temperature = rows.temperature[requests]
        bonus = self.block_bonus(m, counts)
        row = np.where(bonus, self.bonus_row(counts), m)
        final = greedy_token(rows.target_rows(requests, row))
        drawn = temperature > 0.0
        if (drawn & bonus).any():
            s = np.nonzero(drawn & bonus)[0]
            final[s] = self._draw(rows, chunk, s, row[s], m[s], whole_row=False)
        if (drawn & ~bonus).any():
            s = np.nonzero(drawn & ~bonus)[0]
            _, p, q, ids = self._block_rows(rows, requests[s], row[s])
            noise = self._noise(rows, requests[s], row[s])
            weight = chunk.weights[s, row[s]]
            final[s] = self.sample(self.block_residual(weight, p, q), noise)
            chunk.record.append(Draw(requests[s], m[s], row[s], final[s], noise, ids, weight))
        index = np.arange(requests.size)
        chunk.tokens[index, m] = final
        chunk.logprobs[index, m] = token_logprobs(rows.target_rows(requests, m), temperature, final)


class WalkSampler(Walk):
    """The walk as a `Variant`: the float64 sampler of a scheme, fast enough for calibration runs;
    the planted mutants of `fuzz.mutants` subclass it."""

    name = "walk"
    # Exact on every method and input, trees and filtered batches included.
    capabilities = Capabilities(methods=tuple(METHODS), filters=FILTER_FLAGS)

    def __init__(self, scheme: RandomScheme = CANONICAL) -> None:
        super().__init__(scheme)
        self.streams = scheme
        if scheme is not CANONICAL:
            self.name = f"walk-{scheme.name}"

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample ``batch`` on the CPU with the scheme's uniforms."""
        return self.run(batch).output


def pivot_sensitive(
    batch: SpecBatch, exact: SpecOutput, scheme: RandomScheme, max_elements: int, band: PivotBand
) -> BoolArray:
    """``[B, max_n + 1]`` the positions from which the walk's output changes when every near pivot of
    ``band`` is dropped from the kept sets, or added to them (all ``False`` in an unfiltered batch)."""
    width = exact.token_ids.shape[1]
    near = np.zeros((batch.num_requests, width), dtype=bool)
    if not batch.filtered:
        return near
    tokens, emitted = exact.token_ids.numpy(), exact.num_emitted.numpy().astype(np.int64)
    for pivots in ("lower", "upper"):
        other = Walk(scheme, max_elements, pivots, band).run(batch).output
        differs = other.token_ids.numpy() != tokens
        differs |= (
            np.arange(width)[None, :] >= np.minimum(emitted, other.num_emitted.numpy())[:, None] - 1
        ) & (other.num_emitted.numpy() != emitted)[:, None]
        near |= np.logical_or.accumulate(differs, axis=1)
    return near


def walk(
    batch: SpecBatch,
    scheme: RandomScheme = CANONICAL,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    band: PivotBand = DEFAULT_BAND,
) -> WalkResult:
    """`Walk` on ``batch``: the output and its near ties (`pivot_sensitive` ones included)."""
    result = Walk(scheme, max_elements, band=band).run(batch)
    if not batch.filtered:
        return result
    near = result.near | pivot_sensitive(batch, result.output, scheme, max_elements, band)
    return WalkResult(output=result.output, near=near, num_decisions=result.num_decisions)
