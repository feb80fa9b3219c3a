"""Coupled agreement: a sampler on a scheme the walk replays emits what the float64 walk emits.

The walk (`reference.walk`) is fed the same uniforms as the sampler (the variant's ``streams``), so
every sample must equal the walk's, except where the first difference sits on a near tie (a
decision float32 rounding could flip). Near ties are counted, and the differences they excuse may
not exceed a share of the samples; logprobs of agreeing samples match the float64 ones within
float32 tolerance. No statistics.

A bug on the bound of a call (the batch's last draft id read as a placeholder, its last request's
rows) touches only the sample at its edge: in the replicated trials, one replica of thousands, and
the last one. The check compares the trials' last replica besides the first trials of each request.

`agreement` compares one output of a batch (the kernel tests and the GPU tier use it); `CHECK`
checks a variant on repeated trials.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specsample.properties.batching import select_requests
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
from specsample.properties.checks.invariants import logprob_ok
from specsample.reference.contract import SpecBatch, SpecOutput, Variant, capabilities
from specsample.reference.filters import PivotBand, explain_token, pivot_band, pivot_slack
from specsample.reference.near_ties import log_law
from specsample.reference.sampler import reference_sample
from specsample.reference.schemes import CANONICAL, RandomScheme
from specsample.reference.walk import BatchRows, WalkResult, walk

# Coupled agreement replays at most this many logits in float64 (the first trials of each request).
DEFAULT_COUPLED_ELEMENTS = 1 << 24
# Near-tie flips may excuse this share of samples (at least MIN_EXCUSED).
MAX_EXCUSED_FRACTION = 0.05
MIN_EXCUSED = 3


@dataclass
class Agreement:
    """An output compared with the walk, sample by sample (one sample per request of the batch).

    ``num_decisions`` counts the acceptance decisions and samples made along the walk, ``near_ties``
    those float32 rounding could flip, ``mismatches`` the samples that differ from the walk, and
    ``excused`` the mismatches whose first difference is a near tie. ``unexplained`` has a line for
    each other mismatch and each logprob out of tolerance (empty when the output agrees); ``first``
    is the ``(sample, position)`` of the first unexplained difference and ``first_difference`` that
    difference in words (``"position 1: output token 5 where the walk, fed the same random numbers,
    emits 3"``).
    """

    num_samples: int = 0
    num_decisions: int = 0
    near_ties: int = 0
    mismatches: int = 0
    excused: int = 0
    unexplained: list[str] = field(default_factory=list)
    first: tuple[int, int] | None = None
    first_difference: str | None = None


def agreement(
    batch: SpecBatch, output: SpecOutput, scheme: RandomScheme = CANONICAL, filter_ulps: float = 4.0
) -> Agreement:
    """Compare ``output`` with the walk of ``batch`` on ``scheme``, request by request; in a filtered
    batch a difference that starts where the walk's decision depends on a near pivot (within the
    sampler's ``filter_ulps``, `reference.walk.pivot_sensitive`) is a near tie."""
    band = pivot_band(filter_ulps)
    walked = walk(batch, scheme, band=band)
    width = walked.near.shape[1]
    mine = output.token_ids.detach().cpu().numpy()[:, :width]
    mine_emitted = output.num_emitted.detach().cpu().numpy().astype(np.int64)
    ref = walked.output.token_ids.numpy()
    ref_emitted = walked.output.num_emitted.numpy().astype(np.int64)
    differs = (mine != ref) & (np.arange(width)[None, :] < ref_emitted[:, None])
    if walked.output.accepted_nodes is not None:
        # A tree's accepted nodes too: a sampler may emit the walk's tokens through other nodes.
        ref_nodes = walked.output.accepted_nodes.numpy()
        if output.accepted_nodes is None:
            mine_nodes = np.full_like(ref_nodes, -2)
        else:
            mine_nodes = output.accepted_nodes.detach().cpu().numpy()[:, : width - 1]
        node_differs = (mine_nodes != ref_nodes) & (np.arange(width - 1)[None, :] < ref_emitted[:, None] - 1)
        differs[:, : width - 1] |= node_differs
    mismatched = np.nonzero((mine_emitted != ref_emitted) | differs.any(axis=1))[0]
    result = Agreement(batch.num_requests, walked.num_decisions, walked.near_ties, int(mismatched.size))
    unexcused = []
    for r in mismatched:
        diff = np.nonzero(differs[r])[0]
        first = int(min(diff[0] if diff.size else ref_emitted[r] - 1, ref_emitted[r] - 1))
        if walked.near[r, first]:
            result.excused += 1
            continue
        unexcused.append(int(r))
        got = mine[r, : max(0, min(int(mine_emitted[r]), width))].tolist()
        result.unexplained.append(
            f"sample {r}: emits {got}, walk {ref[r, : ref_emitted[r]].tolist()}; "
            f"first difference at position {first}, no near tie"
        )
        if result.first is None:
            result.first = (int(r), first)
            result.first_difference = _difference(
                mine[r], int(mine_emitted[r]), ref[r], int(ref_emitted[r]), first
            ) + _outside_kept(batch, int(r), first, mine[r], int(mine_emitted[r]), band)
    if unexcused:
        _confirm_with_reference(batch, unexcused, walked, scheme)
    if output.logprobs is not None:
        agree = np.ones(batch.num_requests, dtype=bool)
        agree[mismatched] = False
        logprobs = output.logprobs.detach().cpu().numpy()
        result.unexplained += _logprob_problems(batch, walked, logprobs, agree, band)
    return result


def _outside_kept(
    batch: SpecBatch, request: int, position: int, mine: np.ndarray, emitted: int, band: PivotBand
) -> str:
    """In a filtered batch, where the sampler's token at ``position`` lies outside the kept set of
    its row: which filter drops it, how far from the cut-off and with how much mass (empty otherwise)."""
    if not batch.filtered or position >= emitted or position >= mine.shape[0]:
        return ""
    rows = BatchRows.of(batch)
    assert rows.filters is not None
    at = np.array([request])
    logits = rows.raw_target_rows(at, position)
    note = explain_token(
        logits[0], float(rows.temperature[request]), rows.filters.take(at), int(mine[position])
    )
    return f"; {note}" if note else ""


def _difference(mine: np.ndarray, mine_emitted: int, ref: np.ndarray, ref_emitted: int, position: int) -> str:
    """The first difference of one sample from the walk, in words."""
    walk = "the walk, fed the same random numbers,"
    if position >= mine_emitted:
        return (
            f"the output stops after {mine_emitted} tokens where {walk} emits token {ref[position]} "
            f"at position {position}"
        )
    if mine[position] != ref[position]:
        return f"position {position}: output token {mine[position]} where {walk} emits {ref[position]}"
    return f"the output emits {mine_emitted} tokens where {walk} stops after {ref_emitted}"


def _confirm_with_reference(
    batch: SpecBatch, rows: list[int], walked: WalkResult, scheme: RandomScheme
) -> None:
    """Re-derive the output of ``rows`` with the scalar reference; a disagreement is a harness bug."""
    chosen = rows[:64]
    expected = reference_sample(select_requests(batch, chosen), scheme=scheme)
    tokens, emitted = walked.output.token_ids, walked.output.num_emitted
    for j, r in enumerate(chosen):
        count = int(expected.num_emitted[j])
        if count != int(emitted[r]) or expected.token_ids[j, :count].tolist() != tokens[r, :count].tolist():
            raise AssertionError(
                f"reference.walk disagrees with reference_sample on sample {r}: "
                f"{tokens[r, : int(emitted[r])].tolist()} != {expected.token_ids[j, :count].tolist()}"
            )


def _logprob_problems(
    batch: SpecBatch, walked: WalkResult, mine: np.ndarray, agree: np.ndarray, band: PivotBand
) -> list[str]:
    """Logprobs of the samples that agree with the walk, against the float64 log-probabilities (in a
    filtered batch within the slack its near pivots leave the log-normaliser)."""
    rows = BatchRows.of(batch)
    tokens = walked.output.token_ids.numpy()
    emitted = walked.output.num_emitted.numpy()
    temperature = np.where(rows.temperature > 0, rows.temperature, 1.0)
    # The row each position's token was drawn from: position k's own, or on a tree its path's k-th.
    drawn = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
    if walked.output.accepted_nodes is not None:
        nodes = walked.output.accepted_nodes.numpy().astype(np.int64)
        drawn = np.concatenate(
            [np.zeros((tokens.shape[0], 1), dtype=np.int64), np.maximum(nodes, -1) + 1], axis=1
        )
    problems = []
    for k in range(tokens.shape[1]):
        r = np.nonzero(agree & (emitted > k))[0]
        if r.size == 0:
            continue
        row = drawn[r, k]
        law = log_law(rows.target_rows(r, row), temperature[r])
        token, index = tokens[r, k], np.arange(r.size)
        slack = 0.0
        if rows.filters is not None:
            slack = pivot_slack(rows.raw_target_rows(r, row), rows.temperature[r], rows.filters.take(r), band)
        ok = logprob_ok(mine[r, k], law.log_probs[index, token], law.tolerance[index, token] + slack)
        for j in np.nonzero(~ok)[0]:
            got, expected = mine[r[j], k], law.log_probs[j, token[j]]
            problems.append(f"sample {r[j]} position {k}: logprob {got:.6g}, expected {expected:.6g}")
    return problems


class Coupled(Check):
    """A variant on a scheme the walk replays emits what the walk emits from the same uniforms.

    The float64 replay costs about ``V`` draws per sample and sampled row, so it compares the first
    trials of each request up to `DEFAULT_COUPLED_ELEMENTS` logits in all.
    """

    name = "coupled"
    counts_trials = False

    def __init__(
        self,
        max_excused_fraction: float = MAX_EXCUSED_FRACTION,
        max_elements: int = DEFAULT_COUPLED_ELEMENTS,
    ) -> None:
        self.max_excused_fraction = max_excused_fraction
        self.max_elements = max_elements

    def applies(self, variant: Variant, batch: SpecBatch) -> bool:
        """Only a variant that declares its random scheme can be replayed."""
        return getattr(variant, "streams", None) is not None

    def verdict(
        self, variant: Variant, checked: CheckedBatch, settings: Settings, trials: Trials | None
    ) -> Verdict:
        """Compare the first trials of each request and the trials' last replica; ``alpha`` is
        unused; ``detectable``: the per-sample disagreement rate seen with probability 0.999."""
        batch = checked.batch
        trials = trials or draw_trials(variant, batch, settings.num_samples, settings.seed)
        logits_per_trial = batch.num_requests * batch.vocab_size * (batch.resolved_max_num_drafts() + 1)
        per_request = max(1, min(trials.num_trials, self.max_elements // logits_per_trial))
        starts = np.arange(batch.num_requests) * trials.num_trials
        firsts = (starts[:, None] + np.arange(per_request)[None, :]).reshape(-1)
        last = batch.num_requests * trials.num_trials - 1  # the trials' last replica, at their edge
        rows = np.unique(np.append(firsts, last))
        compared = trials.replicas(rows)
        output = SpecOutput(
            token_ids=trials.output.token_ids[rows],
            num_emitted=trials.output.num_emitted[rows],
            logprobs=None if trials.output.logprobs is None else trials.output.logprobs[rows],
            accepted_nodes=None
            if trials.output.accepted_nodes is None
            else trials.output.accepted_nodes[rows],
        )
        scheme = variant.streams
        assert scheme is not None
        ulps = capabilities(variant).filter_ulps
        found = agreement(compared, output, scheme, ulps)
        total = found.num_samples
        bound = max(MIN_EXCUSED, int(self.max_excused_fraction * total))
        summary = (
            f"{total} samples, {found.num_decisions} decisions, {found.near_ties} near ties, "
            f"{found.excused} near-tie differences (at most {bound})"
        )
        first = found.first or (0, None)
        request, trial = divmod(int(rows[first[0]]), trials.num_trials)
        finding = found.unexplained[0] if found.unexplained else None
        subject = None
        if found.first is not None:
            finding = f"Trial {trial}: {found.first_difference}"
            seed = int(compared.seed[first[0]])
            subject = f"{describe_request(checked, request)}; its trial {trial} with seed {seed}"
        return exact_verdict(
            self.name,
            variant,
            failures=len(found.unexplained) or int(found.excused > bound) * found.excused,
            total=total,
            passed=f"{summary}, on scheme {scheme.name}",
            failed=f"{len(found.unexplained)} differences ({summary}); first: {found.unexplained[0]}"
            if found.unexplained
            else f"too many near-tie differences: {summary}",
            request=request,
            position=first[1],
            subject=subject,
            finding=finding,
        )


CHECK = Coupled()
