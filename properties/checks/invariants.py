"""The hard invariants: what every sample of a correct sampler keeps, with no statistics.

Checked per sample: the output's shapes and dtypes; ``1 <= num_emitted <= n_b + 1``; emitted ids in
``[0, V)`` and ``-1`` exactly after them; logprobs NaN exactly after them and equal to the target
log-probability within float32 tolerance; the accepted prefix equal to the drafts; no emitted id of
target probability 0 and no accepted draft of probability 0 (unless the method accepts any draft);
a method that decides by sampling never emits the draft it rejected; greedy rows emit the argmax
and, where the method accepts greedy drafts by argmax, stop at the first draft that is not it.
On a tree (`broken_tree_invariants`): the accepted nodes form a root path (each a child of the one
before, the first of the root, ``-1`` after them), each the first of its siblings with its token, their
tokens emitted in order; the emitted token is none of its node's children's tokens; no token of
probability 0 at the row it was drawn from; greedy rows take every row's argmax; logprobs those of the
rows the tokens were drawn from.

`violations` checks one output of a batch (the kernel tests and the GPU tier use it); `CHECK`
checks a variant on repeated trials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specsample.properties.checks.base import (
    Check,
    CheckedBatch,
    Settings,
    Trials,
    Verdict,
    describe_request,
    draw_trials,
    exact_verdict,
)
from specsample.reference import tree
from specsample.reference.contract import Arithmetic, SpecBatch, SpecOutput, Variant
from specsample.reference.law import RequestInputs, RequestLaw, greedy_token
from specsample.reference.methods import METHODS, Method
from specsample.reference.near_ties import LOG_SUBNORMAL, log_law

I64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
# Probabilities below float32's normal range (about e**-87.3) may lose every digit in float32.
LOG_FLOAT32_TINY = math.log(float(np.finfo(np.float32).tiny))


def logprob_ok(got: npt.ArrayLike, expected: npt.ArrayLike, tolerance: npt.ArrayLike) -> BoolArray:
    """Whether reported logprobs match the float64 ones within float32 tolerance (elementwise).

    Below float32's normal range any value at or under that range (or ``-inf``) is accepted.
    """
    got_, expected_, tolerance_ = (np.asarray(x, dtype=np.float64) for x in (got, expected, tolerance))
    tiny = (expected_ < LOG_FLOAT32_TINY + 1.0) | (expected_ < LOG_SUBNORMAL)
    with np.errstate(invalid="ignore"):
        close = np.abs(got_ - expected_) <= tolerance_ + 1e-6 * (1 + np.abs(expected_))
        small = got_ < LOG_FLOAT32_TINY + 1.0 + 1e-3 * np.abs(expected_)
    return np.asarray(np.where(tiny, small, close))


def broken_invariants(
    method: Method,
    vocab_size: int,
    inputs: RequestInputs,
    law: RequestLaw,
    tokens: I64Array,
    emitted: I64Array,
    logprobs: npt.NDArray[np.float32] | None,
    slack: npt.NDArray[np.float64] | None = None,
) -> dict[str, BoolArray]:
    """Each invariant, in the order they are reported, and ``[N]`` which samples of one request break it.

    ``slack`` (``[n + 1]``, filtered batches) widens each row's logprob tolerance by how far its
    near pivots may move the log-normaliser (`reference.filters.pivot_slack`)."""
    n, width, ids = inputs.num_drafts, tokens.shape[1], inputs.draft_token_ids
    argmax = greedy_token(inputs.target_logits).reshape(n + 1)
    mismatch = np.nonzero(ids != argmax[:n])[0]
    greedy_stop = int(mismatch[0]) if mismatch.size else n  # n when every draft is the argmax
    count = np.clip(emitted, 1, n + 1)
    position = np.arange(width)[None, :]
    inside = position < count[:, None]
    drafts = np.full(width, -2, dtype=np.int64)
    drafts[:n] = ids
    m = count - 1
    y = np.clip(tokens[np.arange(tokens.shape[0]), m], 0, vocab_size - 1)
    broken = {
        f"num_emitted outside [1, {n + 1}]": (emitted < 1) | (emitted > n + 1),
        f"an emitted id outside [0, {vocab_size})": (inside & ((tokens < 0) | (tokens >= vocab_size))).any(
            axis=1
        ),
        "token_ids not -1 after the emitted tokens": (~inside & (tokens != -1)).any(axis=1),
        f"accepted tokens differ from the drafts {ids.tolist()}": (
            (position < m[:, None]) & (tokens != drafts[None, :])
        ).any(axis=1),
    }
    if inputs.greedy:
        broken[f"a greedy row emits another token than its argmax ({argmax.tolist()})"] = y != argmax[m]
        if method.greedy_accepts_argmax:
            broken[f"the greedy chain does not stop at position {greedy_stop}"] = m != greedy_stop
    else:
        broken["the emitted id has target probability 0"] = law.target_probs[m, y] == 0.0
        zero_draft = (ids >= 0) & (law.target_probs[np.arange(n), np.maximum(ids, 0)] == 0.0)
        if not method.accepts_any_draft and zero_draft.any():
            broken["a draft of target probability 0 is accepted"] = m > int(np.argmax(zero_draft))
        if method.decides_by_sampling:
            rejected = drafts[np.minimum(m, width - 1)]
            broken[f"{method.name} sampling emits the draft it rejected"] = (m < n) & (y == rejected)
    if logprobs is not None:
        lp = logprobs[:, :width]
        broken["logprobs not NaN exactly after the emitted tokens"] = (inside == np.isnan(lp)).any(axis=1)
        k = np.minimum(position, n).repeat(tokens.shape[0], axis=0)
        token = np.clip(tokens, 0, vocab_size - 1)
        # The log-domain target laws the logprobs follow (T = 1 for greedy rows).
        laws = log_law(inputs.target_logits, np.full(n + 1, 1.0 if inputs.greedy else inputs.temperature))
        tolerance = laws.tolerance[k, token] + (0.0 if slack is None else slack[k])
        ok = logprob_ok(lp, laws.log_probs[k, token], tolerance)
        broken["a logprob off the target log-probability"] = (inside & ~ok).any(axis=1)
    return broken


def broken_tree_invariants(
    vocab_size: int,
    inputs: RequestInputs,
    law: RequestLaw,
    tokens: I64Array,
    emitted: I64Array,
    logprobs: npt.NDArray[np.float32] | None,
    nodes: I64Array | None,
    slack: npt.NDArray[np.float64] | None = None,
) -> dict[str, BoolArray]:
    """`broken_invariants` for a tree request (``nodes``: its samples' accepted nodes, ``None`` where
    the output has none): each invariant, and ``[N]`` which samples break it."""
    assert inputs.tree_parent is not None
    n, width, ids, parents = inputs.num_drafts, tokens.shape[1], inputs.draft_token_ids, inputs.tree_parent
    count = np.clip(emitted, 1, n + 1)
    m = count - 1
    samples = np.arange(tokens.shape[0])
    position = np.arange(width)[None, :]
    inside = position < count[:, None]
    broken = {
        f"num_emitted outside [1, {n + 1}]": (emitted < 1) | (emitted > n + 1),
        f"an emitted id outside [0, {vocab_size})": (inside & ((tokens < 0) | (tokens >= vocab_size))).any(
            axis=1
        ),
        "token_ids not -1 after the emitted tokens": (~inside & (tokens != -1)).any(axis=1),
    }
    if nodes is None:
        broken["no accepted_nodes in the output of a tree"] = np.ones(tokens.shape[0], dtype=bool)
        return broken
    nodes = nodes[:, : max(width - 1, 0)]
    accepted = position[:, : nodes.shape[1]] < m[:, None]
    valid = (nodes >= 0) & (nodes < n)
    broken["accepted_nodes not n nodes then -1"] = (accepted & ~valid).any(axis=1) | (
        ~accepted & (nodes != -1)
    ).any(axis=1)
    # Node n stands for none: a sentinel with no parent, token or sibling rank.
    node = np.where(accepted & valid, nodes, n)
    first = tree.first_siblings(parents, ids)
    parents_of, ids_of, first_of = np.append(parents, -2), np.append(ids, -1), np.append(first, False)
    before = np.concatenate([np.full((nodes.shape[0], 1), tree.ROOT), node[:, :-1]], axis=1)
    broken["the accepted nodes are no root path"] = (accepted & valid & (parents_of[node] != before)).any(
        axis=1
    )
    broken["an accepted node is not the first of its siblings with its token"] = (
        accepted & valid & ~first_of[node]
    ).any(axis=1)
    broken["accepted tokens differ from their nodes' tokens"] = (
        accepted & valid & (tokens[:, : nodes.shape[1]] != ids_of[node])
    ).any(axis=1)
    # The row each emitted token was drawn from: the root's, then each accepted node's.
    rows = np.concatenate([np.zeros((nodes.shape[0], 1), dtype=np.int64), np.minimum(node + 1, n)], axis=1)
    rows = rows[:, :width]
    drawn_rows = np.where(inside[:, : rows.shape[1]], rows, 0)
    stop_row = drawn_rows[samples, np.minimum(m, rows.shape[1] - 1)]
    y = np.clip(tokens[samples, m], 0, vocab_size - 1)
    children_tokens = np.zeros((n + 1, vocab_size), dtype=bool)
    children_tokens[parents[first] + 1, ids[first]] = True
    broken["the emitted token is a child's token of the node it stopped at"] = children_tokens[stop_row, y]
    clipped = np.clip(tokens[:, : rows.shape[1]], 0, vocab_size - 1)
    if inputs.greedy:
        argmax = greedy_token(inputs.target_logits).reshape(n + 1)
        broken[f"a greedy row emits another token than its argmax ({argmax.tolist()})"] = (
            inside[:, : rows.shape[1]] & (clipped != argmax[drawn_rows])
        ).any(axis=1)
    else:
        broken["an emitted or accepted token has target probability 0 at its row"] = (
            inside[:, : rows.shape[1]] & (law.target_probs[drawn_rows, clipped] == 0.0)
        ).any(axis=1)
    if logprobs is not None:
        lp = logprobs[:, :width]
        broken["logprobs not NaN exactly after the emitted tokens"] = (inside == np.isnan(lp)).any(axis=1)
        laws = log_law(inputs.target_logits, np.full(n + 1, 1.0 if inputs.greedy else inputs.temperature))
        k = drawn_rows
        tolerance = laws.tolerance[k, clipped] + (0.0 if slack is None else slack[k])
        ok = logprob_ok(lp[:, : rows.shape[1]], laws.log_probs[k, clipped], tolerance)
        broken["a logprob off the target log-probability"] = (inside[:, : rows.shape[1]] & ~ok).any(axis=1)
    return broken


@dataclass(frozen=True)
class Violations:
    """How many samples of an output break an invariant, ``(request, position, description)`` of the
    first of them (or ``None``), one line per violating sample (at most `limit` of them), and the
    output row of the first violating sample (``None`` when none, or when the output's shapes are
    at fault)."""

    count: int
    first: tuple[int | None, int | None, str] | None
    descriptions: list[str]
    first_row: int | None = None


def find_violations(
    batch: SpecBatch | CheckedBatch,
    output: SpecOutput,
    num_trials: int = 1,
    problems: list[str] | None = None,
    limit: int = 20,
    arithmetic: Arithmetic = "log",
) -> Violations:
    """The invariants ``output`` breaks; its rows are ``num_trials`` samples of each request of ``batch``
    (whose law is the one in ``arithmetic``, or the one a `CheckedBatch` holds)."""
    checked = CheckedBatch.of(batch, arithmetic)
    method = METHODS[checked.batch.method]
    descriptions = list(problems or [])
    first: tuple[int | None, int | None, str] | None = (None, None, descriptions[0]) if descriptions else None
    first_row = None
    count = len(descriptions)
    tokens_all = output.token_ids.detach().cpu().numpy().astype(np.int64)
    emitted_all = output.num_emitted.detach().cpu().numpy().astype(np.int64)
    logprobs = None if output.logprobs is None else output.logprobs.detach().cpu().numpy()
    nodes_all = None if output.accepted_nodes is None else output.accepted_nodes.detach().cpu().numpy()
    for b, (inputs, law) in enumerate(zip(checked.inputs, checked.laws, strict=True)):
        rows = slice(b * num_trials, (b + 1) * num_trials)
        tokens, emitted = tokens_all[rows], emitted_all[rows]
        lp = None if logprobs is None else logprobs[rows]
        slack = checked.pivot_slack[b]
        vocab_size = checked.batch.vocab_size
        if method.verifies_tree:
            nodes = None if nodes_all is None else nodes_all[rows].astype(np.int64)
            broken = broken_tree_invariants(vocab_size, inputs, law, tokens, emitted, lp, nodes, slack)
        else:
            broken = broken_invariants(method, vocab_size, inputs, law, tokens, emitted, lp, slack)
        bad = np.logical_or.reduce(list(broken.values()))
        count += int(bad.sum())
        for t in np.nonzero(bad)[0][: max(0, limit - len(descriptions))]:
            invariant = next(name for name, mask in broken.items() if mask[t])
            shown = tokens[t, : max(0, min(int(emitted[t]), tokens.shape[1]))].tolist()
            logprob = "" if lp is None else f", logprobs {lp[t].tolist()}"
            descriptions.append(
                f"request {b} trial {t}: {invariant}: emits {shown} (num_emitted {int(emitted[t])}){logprob}"
            )
            if first is None:
                first = (b, int(np.clip(emitted[t], 1, None)) - 1, descriptions[-1])
                first_row = b * num_trials + int(t)
    return Violations(count, first, descriptions, first_row)


def violations(batch: SpecBatch, output: SpecOutput) -> list[str]:
    """Every invariant ``output`` (one sample of each request of ``batch``) breaks; empty when none."""
    return find_violations(batch, output).descriptions


class Invariants(Check):
    """Every sample keeps the hard invariants (the module docstring lists them); no statistics.

    ``detectable`` is the per-sample violation rate seen with probability 0.999 in a request's trials.
    """

    name = "invariants"

    def verdict(
        self, variant: Variant, checked: CheckedBatch, settings: Settings, trials: Trials | None
    ) -> Verdict:
        """Check every trial; ``alpha`` is unused."""
        trials = trials or draw_trials(variant, checked.batch, settings.num_samples, settings.seed)
        found = find_violations(checked, trials.output, trials.num_trials, trials.problems, limit=1)
        total = checked.batch.num_requests * trials.num_trials
        request, position, text = found.first or (None, None, "")
        subject = None
        if request is not None and found.first_row is not None:
            trial, seed = found.first_row % trials.num_trials, int(trials.seeds[found.first_row])
            subject = f"{describe_request(checked, request)}; its trial {trial} with seed {seed}"
        return exact_verdict(
            self.name,
            variant,
            failures=found.count,
            total=total,
            passed=f"{total} samples keep every invariant",
            failed=f"{found.count} violating samples of {total}; first: {text}",
            request=request,
            position=position,
            samples_per_case=trials.num_trials,
            trials=trials.num_trials,
            subject=subject,
        )


CHECK = Invariants()
