"""The checks, as plain functions of any `Variant`: each returns a structured `Verdict`.

A check runs the variant on repeated trials of a batch: every request is replicated ``N`` times
with fresh seeds (its step and inputs unchanged), so one variant call gives ``N`` independent samples
of each request. From cheapest to strongest:

- ``invariants``: every sample keeps the hard invariants (ids in range, layout, accepted prefix,
  no id of target probability 0, greedy argmax chains, logprobs).
- ``coupled``: a canonical-stream variant emits exactly what the float64 reference emits from the
  same uniforms, except where the first difference is a near tie (`properties.canonical`).
- ``law_of_m``: the number accepted follows `reference.law.exact_law` (exact binomial tests on each
  cell and on each position's conditional acceptance rate, Holm-combined).
- ``law_of_y``: the joint law of ``(m, y)`` and the law of ``y`` given each ``m`` follow the exact law
  (G-tests on pooled cells; an observation of probability 0 rejects), plus exact binomial tests on
  bug-shaped sets: the first and last ids, the last vocabulary tile, the draft token.
- ``marginal``: with the drafts drawn from ``q`` afresh in every trial, the token at every reached
  position follows ``p`` (the speculative-sampling theorem; not for synthetic sampling, lossy by
  design).
- ``composition``: a request's output does not depend on the rest of the batch, its place in it, or
  the slot permutation that holds its drafts.
- ``determinism``: the same batch gives the same output twice.

Every statistical verdict has false-failure rate ``alpha`` (Holm's procedure splits it across the
check's tests, requests and positions) and states the smallest deviation it detects with power
0.999: total variation for token laws, the absolute deviation of a cell probability for the law of
``m``, the per-sample rate of a violation for the exact checks. ``seed`` derives every random
choice, so a verdict replays exactly.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from properties import stats
from properties.batching import (
    concatenate,
    draft_counts,
    pad_output,
    permute_slots,
    roll_vocab,
    select_requests,
)
from properties.canonical import LOG_SUBNORMAL, LogLaw, canonical_sample, log_law
from reference.contract import SpecBatch, SpecOutput, Variant, validate_output
from reference.law import RequestInputs, RequestLaw, draft_probs, exact_law, greedy_token, request_inputs
from reference.sampler import reference_sample

CHECKS = ("invariants", "coupled", "law_of_m", "law_of_y", "marginal", "composition", "determinism")
DEFAULT_NUM_SAMPLES = 2000
DEFAULT_ALPHA = stats.DEFAULT_ALPHA
DEFAULT_BETA = stats.DEFAULT_BETA
DEFAULT_BLOCK_SIZE = 4096
# Logits gathered per variant call: requests are split into calls of at most this many.
DEFAULT_MAX_ELEMENTS = 1 << 26
# Requests compared by composition and determinism: the first trials of each request.
INVARIANCE_TRIALS = 8
# Coupled agreement replays at most this many logits in float64 (the first trials of each request).
DEFAULT_COUPLED_ELEMENTS = 1 << 24
# Coupled agreement may excuse this share of samples (at least MIN_EXCUSED) as near-tie flips.
MAX_EXCUSED_FRACTION = 0.05
MIN_EXCUSED = 3
FAILED_EXACT_DISCREPANCY = 1000.0

I64Array = npt.NDArray[np.int64]
F64Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check of one variant on one batch.

    Attributes:
        check: one of `CHECKS`.
        passed: whether the variant passed.
        variant: the variant's name.
        request: the request (index in the checked batch) where a failure is localised.
        position: the position (draft index; ``n_b`` is the bonus) where a failure is localised.
        statistic: the statistic of the decisive test (a count of violations for exact checks).
        pvalue: the Holm-adjusted p-value of the decisive test (``None`` for exact checks).
        alpha: the false-failure rate of the verdict (``None`` for exact checks).
        detectable: the smallest deviation detected with power 0.999: total variation for token
            laws, the absolute deviation of a cell probability for the law of m, the per-sample
            violation rate for exact checks.
        num_samples: samples (variant outputs) the verdict rests on.
        seconds: wall time of the check, variant calls included.
        message: one line a person can read.
    """

    check: str
    passed: bool
    variant: str
    request: int | None
    position: int | None
    statistic: float | None
    pvalue: float | None
    alpha: float | None
    detectable: float | None
    num_samples: int
    seconds: float
    message: str


class VariantError(Exception):
    """The variant raised on a valid batch; the check that called it fails."""


def trial_seeds(seed: int, purpose: str, count: int) -> I64Array:
    """``count`` int64 request seeds in ``[0, 2**63)`` derived from ``(seed, purpose)``."""
    words = np.random.SeedSequence([seed & (2**64 - 1), *purpose.encode()]).generate_state(count, np.uint64)
    return np.asarray(words >> np.uint64(1), dtype=np.int64)


def _rng(seed: int, purpose: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed & (2**64 - 1), *purpose.encode()]))


# ---------------------------------------------------------------------------------------------
# Repeated trials


@dataclass(frozen=True)
class Trials:
    """``N`` independent samples of every request of a batch.

    Attributes:
        batch: the checked batch.
        replicated: the batch the variant ran on: request ``b``'s trial ``t`` is request
            ``b * N + t``, with its own seed and, for the marginal check, its own drafts.
        output: the variant's output for ``replicated``, on the CPU, padded to the full width.
        num_trials: ``N``.
        seconds: wall time of the variant calls.
        problems: shape and dtype violations of the raw outputs.
    """

    batch: SpecBatch
    replicated: SpecBatch
    output: SpecOutput
    num_trials: int
    seconds: float
    problems: list[str] = field(default_factory=list)

    def rows(self, request: int) -> slice:
        """The rows of ``output`` that hold ``request``'s trials."""
        return slice(request * self.num_trials, (request + 1) * self.num_trials)


def call_variant(
    variant: Variant, batch: SpecBatch, max_elements: int = DEFAULT_MAX_ELEMENTS
) -> tuple[SpecOutput, list[str]]:
    """Run ``variant`` on ``batch`` in calls of at most ``max_elements`` logits; stack the outputs on the CPU.

    Returns the output padded to ``max_n + 1`` columns and the shape violations of each raw output.

    Raises:
        VariantError: the variant raised.
    """
    counts = draft_counts(batch)
    rows = counts + 1 + (counts if batch.draft_logits is not None and not batch.slotted else 0)
    per_call = max(1, max_elements // max(batch.vocab_size, 1))
    chunks: list[list[int]] = [[]]
    load = 0
    for b, r in enumerate(rows.tolist()):
        if chunks[-1] and load + r > per_call:
            chunks.append([])
            load = 0
        chunks[-1].append(b)
        load += r
    outputs, problems = [], []
    for chunk in chunks:
        part = batch if len(chunks) == 1 else select_requests(batch, chunk)
        try:
            output = variant(part)
        except Exception as error:
            raise VariantError(f"{type(error).__name__}: {error}") from error
        try:
            validate_output(output, part)
        except ValueError as error:
            problems.append(str(error))
            output = _coerce(output, part)
        outputs.append(output)
    return pad_output(outputs, int(counts.max(initial=0)) + 1), problems


def _coerce(output: SpecOutput, batch: SpecBatch) -> SpecOutput:
    """A malformed output forced into the contract's shapes, so the invariants can point at it."""
    width = batch.resolved_max_num_drafts() + 1
    tokens = torch.full((batch.num_requests, width), -1, dtype=torch.int64)
    raw = output.token_ids.detach().cpu().reshape(batch.num_requests, -1)[:, :width].to(torch.int64)
    tokens[:, : raw.shape[1]] = raw
    emitted = output.num_emitted.detach().cpu().reshape(-1)[: batch.num_requests].to(torch.int32)
    return SpecOutput(token_ids=tokens, num_emitted=emitted, logprobs=None)


def draw_trials(
    variant: Variant,
    batch: SpecBatch,
    num_trials: int,
    seed: int,
    *,
    draft_token_ids: I64Array | None = None,
    purpose: str = "trials",
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> Trials:
    """Run ``variant`` on ``num_trials`` replicas of every request of ``batch`` with fresh seeds.

    Args:
        variant: the sampler under test.
        batch: the checked batch.
        num_trials: ``N``, the replicas of each request.
        seed: derives the replicas' seeds (with ``purpose``).
        draft_token_ids: optional ``[B * N * ...]`` draft ids of the replicated batch, request-major
            (the marginal check draws them from ``q``).
        purpose: separates the seed streams of different uses.
        max_elements: the most logits per variant call.
    """
    if num_trials < 1:
        raise ValueError(f"num_trials is {num_trials}; expected at least 1")
    index = np.repeat(np.arange(batch.num_requests), num_trials)
    ids = None if draft_token_ids is None else torch.as_tensor(draft_token_ids, dtype=torch.int64)
    replicated = select_requests(
        batch, index, seed=trial_seeds(seed, purpose, index.size), draft_token_ids=ids
    )
    start = time.perf_counter()
    output, problems = call_variant(variant, replicated, max_elements)
    return Trials(batch, replicated, output, num_trials, time.perf_counter() - start, problems)


# ---------------------------------------------------------------------------------------------
# Shared pieces of the verdicts


@dataclass(frozen=True)
class Component:
    """One statistical test inside a check: where it looks and what it found.

    Attributes:
        request: the request of the checked batch it tests.
        position: the position it tests (``None`` for a whole-request test).
        pvalue: its p-value, before Holm's adjustment.
        statistic: its statistic (G, or an observed proportion for a binomial test).
        what: a short description.
    """

    request: int
    position: int | None
    pvalue: float
    statistic: float
    what: str


def _holm_verdict(
    check: str,
    variant: Variant,
    tests: Sequence[Component],
    alpha: float,
    detectable: float,
    num_samples: int,
    seconds: float,
    summary: str,
) -> Verdict:
    """Combine a check's tests by Holm: the verdict fails iff the smallest adjusted p-value is below alpha."""
    if not tests:
        return Verdict(
            check,
            True,
            variant.name,
            None,
            None,
            None,
            1.0,
            alpha,
            detectable,
            num_samples,
            seconds,
            f"{summary}; nothing to test",
        )
    adjusted = stats.holm_adjusted([t.pvalue for t in tests])
    worst = int(np.argmin(adjusted))
    test, pvalue = tests[worst], float(adjusted[worst])
    passed = pvalue >= alpha
    where = f"request {test.request}" + ("" if test.position is None else f" position {test.position}")
    verdict = "passes" if passed else "FAILS"
    message = (
        f"{check} {verdict}: {summary}; decisive test at {where}: {test.what}, Holm p={pvalue:.3g} over "
        f"{len(tests)} tests, alpha={alpha:g}; detects {detectable:.4g} with power 0.999"
    )
    return Verdict(
        check,
        passed,
        variant.name,
        test.request,
        test.position,
        test.statistic,
        pvalue,
        alpha,
        detectable,
        num_samples,
        seconds,
        message,
    )


def _statistical_verdict(
    check: str,
    variant: Variant,
    batch: SpecBatch,
    alpha: float,
    draw: Callable[[], Trials],
    components: Callable[[Trials], tuple[list[Component], float]],
    summary_suffix: str = "",
) -> Verdict:
    """Draw the trials, run a check's tests on them and combine them by Holm (`_holm_verdict`)."""
    start = time.perf_counter()
    try:
        trials = draw()
    except VariantError as error:
        return _failed_call(check, variant, error, time.perf_counter() - start)
    tests, detectable = components(trials)
    summary = f"{batch.num_requests} requests x {trials.num_trials} trials{summary_suffix}"
    total = batch.num_requests * trials.num_trials
    return _holm_verdict(
        check, variant, tests, alpha, detectable, total, time.perf_counter() - start, summary
    )


def _failed_call(check: str, variant: Variant, error: VariantError, seconds: float) -> Verdict:
    return Verdict(
        check,
        False,
        variant.name,
        None,
        None,
        None,
        None,
        None,
        None,
        0,
        seconds,
        f"{check} FAILS: the variant raised on a valid batch: {error}",
    )


def _request_rows(trials: Trials, request: int) -> tuple[I64Array, I64Array]:
    """``(tokens [N, W], emitted [N])`` of one request's trials."""
    rows = trials.rows(request)
    tokens = trials.output.token_ids[rows].numpy().astype(np.int64)
    emitted = trials.output.num_emitted[rows].numpy().astype(np.int64)
    return tokens, emitted


# ---------------------------------------------------------------------------------------------
# Hard invariants


def check_invariants(
    variant: Variant,
    batch: SpecBatch,
    *,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    trials: Trials | None = None,
) -> Verdict:
    """Every sample keeps the hard invariants; no statistics, so ``alpha`` is unused.

    Checked per sample: the output's shapes and dtypes; ``1 <= num_emitted <= n_b + 1``; emitted ids
    in ``[0, V)`` and ``-1`` exactly after them; logprobs NaN exactly after them and equal to the
    target log-probability within float32 tolerance; the accepted prefix equal to the drafts; no
    emitted id of target probability 0 (accepted synthetic drafts excepted); strict sampling never
    emits the draft it rejected; greedy rows emit the argmax and, unless synthetic, stop at the first
    draft that is not the argmax. ``detectable`` is the per-sample violation rate seen at least
    once with probability 0.999.
    """
    start = time.perf_counter()
    try:
        trials = trials or draw_trials(variant, batch, num_samples, seed)
    except VariantError as error:
        return _failed_call("invariants", variant, error, time.perf_counter() - start)
    first: tuple[int | None, int | None, str] | None = None
    count = len(trials.problems)
    if trials.problems:
        first = (None, None, trials.problems[0])
    logprobs = None if trials.output.logprobs is None else trials.output.logprobs.numpy()
    for b, (inputs, law) in enumerate(zip(request_inputs(batch), exact_law(batch), strict=True)):
        tokens, emitted = _request_rows(trials, b)
        lp = None if logprobs is None else logprobs[trials.rows(b)]
        bad = _violating_trials(batch.method, batch.vocab_size, inputs, law, tokens, emitted, lp)
        count += int(bad.sum())
        if first is None and bad.any():
            t = int(np.argmax(bad))
            position, text = _describe_violation(
                batch.method,
                batch.vocab_size,
                inputs,
                law,
                tokens[t],
                int(emitted[t]),
                None if lp is None else lp[t],
            )
            first = (b, position, f"request {b} trial {t}: {text}")
    total = batch.num_requests * trials.num_trials
    detectable = stats.zero_cell_detectable(trials.num_trials)
    seconds = time.perf_counter() - start
    if first is None:
        message = (
            f"invariants pass on {total} samples; a violation of rate >= {detectable:.2g} per sample is seen"
        )
        return Verdict(
            "invariants", True, variant.name, None, None, 0.0, None, None, detectable, total, seconds, message
        )
    request, position, text = first
    message = f"invariants FAIL: {count} violating samples of {total}; first: {text}"
    return Verdict(
        "invariants",
        False,
        variant.name,
        request,
        position,
        float(count),
        None,
        None,
        detectable,
        total,
        seconds,
        message,
    )


@dataclass(frozen=True)
class _RequestFacts:
    """What the invariants need of one request, computed once for all its trials."""

    n: int
    drafts: I64Array  # [n]
    greedy_stop: int  # where a greedy chain stops (n when every draft is the argmax)
    argmax: I64Array  # [n + 1]
    zero_draft: npt.NDArray[np.bool_]  # [n] whether draft i has target probability 0
    laws: LogLaw  # the target rows at the logprob temperature


def _facts(inputs: RequestInputs, law: RequestLaw) -> _RequestFacts:
    n = inputs.num_drafts
    argmax = np.array([greedy_token(row) for row in inputs.target_logits], dtype=np.int64)
    drafts = inputs.draft_token_ids
    mismatch = np.nonzero(drafts != argmax[:n])[0]
    zero = np.array([drafts[i] >= 0 and law.target_probs[i, drafts[i]] == 0.0 for i in range(n)], dtype=bool)
    temperature = 1.0 if inputs.greedy else inputs.temperature
    laws = log_law(inputs.target_logits, np.full(n + 1, temperature))
    return _RequestFacts(n, drafts, int(mismatch[0]) if mismatch.size else n, argmax, zero, laws)


def _violating_trials(
    method: str,
    vocab_size: int,
    inputs: RequestInputs,
    law: RequestLaw,
    tokens: I64Array,
    emitted: I64Array,
    logprobs: npt.NDArray[np.float32] | None,
) -> npt.NDArray[np.bool_]:
    """``[N]`` whether each trial of one request breaks an invariant (vectorised over trials)."""
    facts = _facts(inputs, law)
    n, width = facts.n, tokens.shape[1]
    rows = np.arange(tokens.shape[0])
    bad = (emitted < 1) | (emitted > n + 1)
    count = np.clip(emitted, 1, n + 1)
    position = np.arange(width)[None, :]
    inside = position < count[:, None]
    bad |= (inside & ((tokens < 0) | (tokens >= vocab_size))).any(axis=1)
    bad |= (~inside & (tokens != -1)).any(axis=1)
    drafts = np.full(width, -2, dtype=np.int64)
    drafts[:n] = facts.drafts
    bad |= ((position < count[:, None] - 1) & (tokens != drafts[None, :])).any(axis=1)
    m = count - 1
    y = np.clip(tokens[rows, m], 0, vocab_size - 1)
    if inputs.greedy:
        bad |= y != facts.argmax[m]
        if method != "synthetic":
            bad |= m != facts.greedy_stop
    else:
        bad |= law.target_probs[m, y] == 0.0
        if method != "synthetic" and facts.zero_draft.any():
            bad |= m > int(np.argmax(facts.zero_draft))
        if method == "strict":
            bad |= (m < n) & (y == drafts[np.minimum(m, width - 1)])
    if logprobs is not None:
        lp = logprobs[:, :width]
        bad |= (inside & np.isnan(lp)).any(axis=1) | (~inside & ~np.isnan(lp)).any(axis=1)
        laws = facts.laws
        k = np.minimum(position, n).repeat(tokens.shape[0], axis=0)
        token = np.clip(tokens, 0, vocab_size - 1)
        ok = _logprob_ok(lp, laws.log_probs[k, token], laws.tolerance[k, token])
        bad |= (inside & ~ok).any(axis=1)
    return np.asarray(bad)


def _describe_violation(
    method: str,
    vocab_size: int,
    inputs: RequestInputs,
    law: RequestLaw,
    row: I64Array,
    count: int,
    logprobs: npt.NDArray[np.float32] | None,
) -> tuple[int | None, str]:
    """``(position, description)`` of the first invariant one trial breaks."""
    facts = _facts(inputs, law)
    n, width = facts.n, row.shape[0]
    if not 1 <= count <= n + 1:
        return None, f"num_emitted {count} outside [1, {n + 1}]"
    out = row[:count]
    if ((out < 0) | (out >= vocab_size)).any():
        return None, f"emitted ids {out.tolist()} outside [0, {vocab_size})"
    if (row[count:] != -1).any():
        return count, f"token_ids {row.tolist()} are not -1 after {count} tokens"
    m = count - 1
    if (out[:m] != facts.drafts[:m]).any():
        return None, f"accepted {out[:m].tolist()} != drafts {facts.drafts[:m].tolist()}"
    y = int(out[m])
    if inputs.greedy:
        if y != facts.argmax[m]:
            return m, f"greedy row {m} emits {y}, argmax {facts.argmax[m]}"
        if method != "synthetic" and m != facts.greedy_stop:
            return m, f"greedy chain stops at {m}, expected {facts.greedy_stop}"
    else:
        if law.target_probs[m, y] == 0.0:
            return m, f"emitted id {y} has target probability 0 at position {m}"
        zero = np.nonzero(facts.zero_draft[:m])[0]
        if method != "synthetic" and zero.size:
            return int(zero[0]), f"accepted draft {facts.drafts[zero[0]]} of target probability 0"
        if method == "strict" and m < n and y == facts.drafts[m]:
            return m, f"strict sampling rejected draft {y} yet emitted it"
    if logprobs is not None:
        if np.isnan(logprobs[:count]).any() or not np.isnan(logprobs[count:width]).all():
            return None, f"logprobs {logprobs.tolist()} are not NaN exactly after {count}"
        laws = facts.laws
        for k in range(count):
            expected = float(laws.log_probs[k, out[k]])
            if not _logprob_ok(np.float32(logprobs[k]), expected, float(laws.tolerance[k, out[k]])):
                return k, f"logprob {logprobs[k]:.6g} at position {k}; expected {expected:.6g}"
    return None, "no violation"


# Probabilities below float32's normal range (about e**-87.3) may lose every digit in float32.
LOG_FLOAT32_TINY = math.log(float(np.finfo(np.float32).tiny))


def _logprob_ok(
    got: npt.ArrayLike, expected: npt.ArrayLike, tolerance: npt.ArrayLike
) -> npt.NDArray[np.bool_]:
    """Whether reported logprobs match the float64 ones within float32 tolerance (elementwise).

    Below float32's normal range any value at or under that range (or ``-inf``) is accepted.
    """
    got_, expected_, tolerance_ = (np.asarray(x, dtype=np.float64) for x in (got, expected, tolerance))
    tiny = (expected_ < LOG_FLOAT32_TINY + 1.0) | (expected_ < LOG_SUBNORMAL)
    with np.errstate(invalid="ignore"):
        close = np.abs(got_ - expected_) <= tolerance_ + 1e-6 * (1 + np.abs(expected_))
        small = got_ < LOG_FLOAT32_TINY + 1.0 + 1e-3 * np.abs(expected_)
    return np.asarray(np.where(tiny, small, close))


# ---------------------------------------------------------------------------------------------
# Coupled agreement


def check_coupled(
    variant: Variant,
    batch: SpecBatch,
    *,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    trials: Trials | None = None,
    max_excused_fraction: float = MAX_EXCUSED_FRACTION,
    max_elements: int = DEFAULT_COUPLED_ELEMENTS,
) -> Verdict | None:
    """A canonical-stream variant emits what the float64 reference emits from the same uniforms.

    Returns ``None`` for a variant that does not draw from the canonical streams. A sample may differ
    from the reference only where the first difference sits on a near tie (`properties.canonical`);
    near ties are counted, and the differences they excuse may not exceed ``max_excused_fraction`` of
    the samples (at least 3); logprobs of agreeing samples match the float64 ones within float32
    tolerance. The float64 replay costs about ``V`` Philox draws per sample and sampled row, so it
    compares the first trials of each request up to ``max_elements`` logits in all. No statistics:
    ``alpha`` is unused; ``detectable`` is the per-sample disagreement rate seen at least once with
    probability 0.999.
    """
    if not variant.canonical_rng:
        return None
    start = time.perf_counter()
    try:
        trials = trials or draw_trials(variant, batch, num_samples, seed)
    except VariantError as error:
        return _failed_call("coupled", variant, error, time.perf_counter() - start)
    width = batch.resolved_max_num_drafts() + 1
    per_request = max(
        1, min(trials.num_trials, max_elements // (batch.num_requests * batch.vocab_size * width))
    )
    rows = (
        np.arange(batch.num_requests)[:, None] * trials.num_trials + np.arange(per_request)[None, :]
    ).reshape(-1)
    compared = (
        trials.replicated if per_request == trials.num_trials else select_requests(trials.replicated, rows)
    )
    reference = canonical_sample(compared)
    mine_tokens = trials.output.token_ids.numpy()[rows]
    mine_emitted = trials.output.num_emitted.numpy().astype(np.int64)[rows]
    ref_tokens = reference.output.token_ids.numpy()
    ref_emitted = reference.output.num_emitted.numpy().astype(np.int64)
    same_count = mine_emitted == ref_emitted
    position = np.arange(width)[None, :]
    differs = (mine_tokens[:, :width] != ref_tokens) & (position < ref_emitted[:, None])
    mismatched = np.nonzero(~same_count | differs.any(axis=1))[0]
    unexcused, excused = [], 0
    for r in mismatched:
        diff = np.nonzero(differs[r])[0]
        first = int(min(diff[0] if diff.size else ref_emitted[r] - 1, ref_emitted[r] - 1))
        if reference.near[r, first]:
            excused += 1
        else:
            unexcused.append((int(r), first))
    if unexcused:
        _confirm_with_reference(compared, [r for r, _ in unexcused], ref_tokens, ref_emitted)
    mine_logprobs = None if trials.output.logprobs is None else trials.output.logprobs.numpy()[rows]
    logprob_problems = _coupled_logprobs(batch, per_request, mine_logprobs, reference.output, mismatched)
    total = compared.num_requests
    bound = max(MIN_EXCUSED, int(max_excused_fraction * total))
    detectable = stats.zero_cell_detectable(total)
    seconds = time.perf_counter() - start
    summary = (
        f"{total} samples, {reference.num_decisions} decisions, {reference.near_ties} near ties, "
        f"{excused} near-tie differences (at most {bound})"
    )
    failure: tuple[int | None, int | None, float, str] | None = None
    if unexcused:
        r, first = unexcused[0]
        b, t = divmod(r, per_request)
        got = mine_tokens[r, : max(0, min(int(mine_emitted[r]), width))].tolist()
        want = ref_tokens[r, : ref_emitted[r]].tolist()
        text = (
            f"{len(unexcused)} samples differ from the reference with no near tie ({summary}); first: "
            f"request {b} trial {t} emits {got}, reference {want}, first difference at position {first}"
        )
        failure = (b, first, float(len(unexcused)), text)
    elif excused > bound:
        failure = (None, None, float(excused), f"too many near-tie differences: {summary}")
    elif logprob_problems:
        b, k, text = logprob_problems[0]
        failure = (
            b,
            k,
            float(len(logprob_problems)),
            f"{len(logprob_problems)} logprobs out of tolerance ({summary}); first: {text}",
        )
    if failure is None:
        message = f"coupled passes: {summary}; a disagreement rate >= {detectable:.2g} per sample is seen"
        return Verdict(
            "coupled", True, variant.name, None, None, 0.0, None, None, detectable, total, seconds, message
        )
    request, where, statistic, text = failure
    return Verdict(
        "coupled",
        False,
        variant.name,
        request,
        where,
        statistic,
        None,
        None,
        detectable,
        total,
        seconds,
        f"coupled FAILS: {text}",
    )


def _confirm_with_reference(batch: SpecBatch, rows: list[int], tokens: I64Array, emitted: I64Array) -> None:
    """Re-derive the expected output of ``rows`` with `reference_sample`; a disagreement is a harness bug."""
    chosen = rows[:64]
    expected = reference_sample(select_requests(batch, chosen))
    for j, r in enumerate(chosen):
        count = int(expected.num_emitted[j])
        if count != emitted[r] or expected.token_ids[j, :count].tolist() != tokens[r, :count].tolist():
            raise AssertionError(
                f"properties.canonical disagrees with reference_sample on replicated request {r}: "
                f"{tokens[r, : emitted[r]].tolist()} != {expected.token_ids[j, :count].tolist()}"
            )


def _coupled_logprobs(
    batch: SpecBatch,
    per_request: int,
    mine: npt.NDArray[np.float32] | None,
    reference: SpecOutput,
    mismatched: I64Array,
) -> list[tuple[int, int, str]]:
    """Logprobs of the samples that agree with the reference, against its float64 log-probabilities.

    Rows are ``per_request`` samples of each request of ``batch`` in turn.
    """
    if mine is None:
        return []
    problems: list[tuple[int, int, str]] = []
    agree = np.ones(mine.shape[0], dtype=bool)
    agree[mismatched] = False
    tokens = reference.token_ids.numpy()
    emitted = reference.num_emitted.numpy()
    width = tokens.shape[1]
    for b, inputs in enumerate(request_inputs(batch)):
        n = inputs.num_drafts
        laws = log_law(inputs.target_logits, np.full(n + 1, 1.0 if inputs.greedy else inputs.temperature))
        rows = slice(b * per_request, (b + 1) * per_request)
        position = np.minimum(np.arange(width), n)[None, :]
        token = np.clip(tokens[rows], 0, None)
        expected = laws.log_probs[position, token]
        ok = _logprob_ok(mine[rows, :width], expected, laws.tolerance[position, token])
        checked = agree[rows][:, None] & (np.arange(width)[None, :] < emitted[rows][:, None])
        for t, k in zip(*np.nonzero(checked & ~ok), strict=True):
            got = mine[rows][t, k]
            text = f"request {b} trial {t} position {k}: logprob {got:.6g}, expected {expected[t, k]:.6g}"
            problems.append((b, int(k), text))
    return problems


# ---------------------------------------------------------------------------------------------
# The law of m


def law_of_m_components(batch: SpecBatch, trials: Trials, alpha: float) -> tuple[list[Component], float]:
    """The exact binomial tests of the law of m, and the deviation they detect (see `check_law_of_m`)."""
    tests: list[Component] = []
    cells: list[tuple[int, float]] = []
    for b, law in enumerate(exact_law(batch)):
        _, emitted = _request_rows(trials, b)
        n = law.accept_probs.shape[0]
        m = emitted - 1
        size = m.shape[0]
        impossible = int(np.sum((m < 0) | (m > n)))
        if impossible:
            tests.append(
                Component(b, None, 0.0, float(impossible), f"{impossible} trials with m outside [0, {n}]")
            )
        counts = np.bincount(np.clip(m, 0, n), minlength=n + 1)
        for j in range(n + 1):
            p = float(law.stop_probs[j])
            pvalue = float(stats.binomial_pvalues(counts[j], size, p))
            what = f"m={j} in {counts[j]}/{size} trials, P={p:.4g}"
            tests.append(Component(b, j, pvalue, counts[j] / size, what))
            cells.append((size, p))
        for i in range(n):
            reached = int(np.sum(m >= i))
            if reached == 0:
                continue
            accepted = int(np.sum(m >= i + 1))
            a = float(law.accept_probs[i])
            pvalue = float(stats.binomial_pvalues(accepted, reached, a))
            what = f"draft {i} accepted in {accepted}/{reached} trials, rate {a:.4g}"
            tests.append(Component(b, i, pvalue, accepted / reached, what))
    level = alpha / max(len(tests), 1)
    detectable = max((stats.binomial_detectable(size, p, level) for size, p in cells), default=math.inf)
    return tests, detectable


def check_law_of_m(
    variant: Variant,
    batch: SpecBatch,
    *,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    trials: Trials | None = None,
) -> Verdict:
    """The number of accepted drafts follows the exact law, request by request.

    Exact binomial tests: the count of each ``m = j`` against ``Bin(N, P(m = j))``, and at each
    position ``i`` the acceptances among the trials that reached it against ``Bin(reached, a_i)``.
    Holm combines all of them at level ``alpha``. ``detectable``: the absolute deviation of a
    probability ``P(m = j)`` detected with power 0.999 (at Holm's first level ``alpha / k``), the
    largest over cells and requests.
    """
    return _statistical_verdict(
        "law_of_m",
        variant,
        batch,
        alpha,
        lambda: trials or draw_trials(variant, batch, num_samples, seed),
        lambda drawn: law_of_m_components(batch, drawn, alpha),
    )


# ---------------------------------------------------------------------------------------------
# The law of y given m


def bug_shaped_sets(vocab_size: int, draft: int, block_size: int = DEFAULT_BLOCK_SIZE) -> dict[str, I64Array]:
    """Token sets where real bugs put or lose mass: the first and last ids, the last tile, the draft.

    Token 0 and ``V - 1`` are where degenerate residuals fall back (M19); the last tile of
    ``block_size`` tokens is what a dropped tile loses (M16); the draft token is what a residual that
    subtracts ``q`` only at the draft (M04) or an unclamped residual (M03) gets wrong.
    """
    sets: dict[str, I64Array] = {"token 0": np.array([0])}
    if vocab_size > 1:
        sets[f"token {vocab_size - 1}"] = np.array([vocab_size - 1])
    if vocab_size > block_size:
        first = vocab_size - (vocab_size % block_size or block_size)
        sets[f"last tile [{first}, {vocab_size})"] = np.arange(first, vocab_size)
    if 0 <= draft < vocab_size and draft not in (0, vocab_size - 1):
        sets[f"draft token {draft}"] = np.array([draft])
    return sets


def law_of_y_components(
    batch: SpecBatch, trials: Trials, alpha: float, block_size: int = DEFAULT_BLOCK_SIZE
) -> tuple[list[Component], float]:
    """The tests of the law of y given m, and the deviation they detect (see `check_law_of_y`)."""
    vocab_size = batch.vocab_size
    tests: list[Component] = []
    joints: list[F64Array] = []
    for b, law in enumerate(exact_law(batch)):
        tokens, emitted = _request_rows(trials, b)
        n = law.accept_probs.shape[0]
        m = emitted - 1
        ok = (m >= 0) & (m <= n)
        y = np.where(ok, tokens[np.arange(m.shape[0]), np.clip(m, 0, tokens.shape[1] - 1)], -1)
        ok &= (y >= 0) & (y < vocab_size)
        if not ok.all():
            bad = int(np.sum(~ok))
            tests.append(Component(b, None, 0.0, float(bad), f"{bad} trials with m or y out of range"))
        m, y = m[ok], y[ok]
        if m.size == 0:
            continue
        joint_law = law.joint_probs().reshape(-1)
        joints.append(joint_law)
        joint = np.bincount(m * vocab_size + y, minlength=(n + 1) * vocab_size).astype(np.float64)
        fit = stats.GoodnessOfFit(joint_law, m.size)
        what = f"joint law of (m, y): G over {fit.num_groups} pooled cells, N={m.size}"
        tests.append(Component(b, None, float(fit.pvalues(joint)), float(fit.statistics(joint)), what))
        joint = joint.reshape(n + 1, vocab_size)
        for j in range(n + 1):
            reached = int(joint[j].sum())
            if reached == 0:
                continue
            fit_j = stats.GoodnessOfFit(law.token_probs[j], reached)
            what = f"y given m={j}: G over {fit_j.num_groups} pooled cells, N={reached}"
            tests.append(
                Component(b, j, float(fit_j.pvalues(joint[j])), float(fit_j.statistics(joint[j])), what)
            )
            draft = int(law.draft_token_ids[j]) if j < n else -1
            for name, chosen in bug_shaped_sets(vocab_size, draft, block_size).items():
                p = float(law.token_probs[j, chosen].sum())
                hits = int(joint[j, chosen].sum())
                pvalue = float(stats.binomial_pvalues(hits, reached, p))
                what = f"y in {name} given m={j}: {hits}/{reached}, P={p:.4g}"
                tests.append(Component(b, j, pvalue, hits / reached, what))
    level = alpha / max(len(tests), 1)
    detectable = max(
        (stats.GoodnessOfFit(j, trials.num_trials, alpha=level).detectable_tv for j in joints),
        default=math.inf,
    )
    return tests, detectable


def check_law_of_y(
    variant: Variant,
    batch: SpecBatch,
    *,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    trials: Trials | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Verdict:
    """The emitted token follows the exact law given the number accepted, at every position.

    Per request: a G-test of the joint law of ``(m, y)``, a G-test of ``y`` given each ``m = j`` that
    occurred (cells pooled by probability rank, every pooled cell expecting >= 20; one observation of
    probability 0 rejects, which covers the zero-probability tokens), and exact binomial tests of
    `bug_shaped_sets` given each ``m = j``. Holm combines all of them at level ``alpha``.
    ``detectable``: the total variation on the joint law of ``(m, y)`` detected with power 0.999 (at
    Holm's first level ``alpha / k``), the largest over requests.
    """
    return _statistical_verdict(
        "law_of_y",
        variant,
        batch,
        alpha,
        lambda: trials or draw_trials(variant, batch, num_samples, seed),
        lambda drawn: law_of_y_components(batch, drawn, alpha, block_size),
    )


# ---------------------------------------------------------------------------------------------
# The marginal of every position under drafts drawn from q


def drafts_from_q(batch: SpecBatch, num_trials: int, seed: int) -> I64Array:
    """Draft ids for ``num_trials`` replicas of each request, drawn from each position's ``q``.

    Request-major, as `draw_trials` lays replicas out. One-hot drafts have ``q = onehot(d)``, so they
    stay as they are; placeholders stay placeholders (a placeholder rejects and emits ``y ~ p``, so the
    theorem still holds there).
    """
    rng = _rng(seed, "drafts")
    parts = []
    for inputs in request_inputs(batch):
        n = inputs.num_drafts
        ids = np.repeat(inputs.draft_token_ids[None, :], num_trials, axis=0)
        if inputs.draft_logits is not None and n:
            q = draft_probs(inputs)
            cdf = np.cumsum(q, axis=1)
            u = rng.random((num_trials, n)) * cdf[:, -1]
            drawn = np.stack([np.searchsorted(cdf[i], u[:, i], side="right") for i in range(n)], axis=1)
            drawn = np.minimum(drawn, q.shape[1] - 1)
            ids = np.where(inputs.draft_token_ids[None, :] >= 0, drawn, ids)
        parts.append(ids.reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def draw_trials_from_q(
    variant: Variant,
    batch: SpecBatch,
    num_trials: int,
    seed: int,
    *,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> Trials:
    """`draw_trials` with every trial's drafts drawn afresh from ``q`` (`drafts_from_q`)."""
    ids = drafts_from_q(batch, num_trials, seed)
    return draw_trials(
        variant, batch, num_trials, seed, draft_token_ids=ids, purpose="marginal", max_elements=max_elements
    )


def marginal_components(batch: SpecBatch, trials: Trials, alpha: float) -> tuple[list[Component], float]:
    """The tests of every position's marginal, and the deviation they detect (see `check_marginal`)."""
    vocab_size = batch.vocab_size
    tests: list[Component] = []
    first_rows: list[F64Array] = []
    for b, law in enumerate(exact_law(batch)):
        tokens, emitted = _request_rows(trials, b)
        n = law.accept_probs.shape[0]
        emitted = np.clip(emitted, 0, n + 1)
        first_rows.append(law.target_probs[0])
        for k in range(n + 1):
            reached = tokens[emitted > k, k]
            if reached.size == 0:
                continue
            inside = (reached >= 0) & (reached < vocab_size)
            if not inside.all():
                tests.append(
                    Component(b, k, 0.0, float(np.sum(~inside)), f"ids out of range at position {k}")
                )
                continue
            counts = np.bincount(reached, minlength=vocab_size)
            fit = stats.GoodnessOfFit(law.target_probs[k], reached.size)
            what = f"position {k} vs p_{k}: G over {fit.num_groups} pooled cells, N={reached.size}"
            tests.append(Component(b, k, float(fit.pvalues(counts)), float(fit.statistics(counts)), what))
    level = alpha / max(len(tests), 1)
    detectable = max(
        (stats.GoodnessOfFit(p, trials.num_trials, alpha=level).detectable_tv for p in first_rows),
        default=math.inf,
    )
    return tests, detectable


def check_marginal(
    variant: Variant,
    batch: SpecBatch,
    *,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> Verdict | None:
    """With drafts drawn from ``q`` in every trial, the token at each reached position follows ``p``.

    The speculative-sampling theorem; returns ``None`` for synthetic batches (lossy by design). Per
    request and position ``k``: a G-test of the tokens emitted at ``k`` by the trials that reached it
    against ``p_k`` (pooled cells; one observation of probability 0 rejects). Holm combines them at
    level ``alpha``. ``detectable``: the total variation at position 0 (reached by every trial)
    detected with power 0.999 at Holm's first level, the largest over requests.
    """
    if batch.method == "synthetic":
        return None
    return _statistical_verdict(
        "marginal",
        variant,
        batch,
        alpha,
        lambda: draw_trials_from_q(variant, batch, num_samples, seed, max_elements=max_elements),
        lambda drawn: marginal_components(batch, drawn, alpha),
        ", drafts drawn from q",
    )


# ---------------------------------------------------------------------------------------------
# Composition and determinism


def _same_outputs(a: SpecOutput, b: SpecOutput, rows_a: I64Array, rows_b: I64Array) -> list[int]:
    """The indices ``j`` at which row ``rows_a[j]`` of ``a`` and row ``rows_b[j]`` of ``b`` differ."""
    count_a = a.num_emitted.numpy()[rows_a]
    count_b = b.num_emitted.numpy()[rows_b]
    tokens_a, tokens_b = a.token_ids.numpy()[rows_a], b.token_ids.numpy()[rows_b]
    width = min(tokens_a.shape[1], tokens_b.shape[1])
    differ = (count_a != count_b) | (tokens_a[:, :width] != tokens_b[:, :width]).any(axis=1)
    if a.logprobs is not None and b.logprobs is not None:
        lp_a, lp_b = a.logprobs.numpy()[rows_a, :width], b.logprobs.numpy()[rows_b, :width]
        close = np.isclose(lp_a, lp_b, rtol=1e-6, atol=1e-6, equal_nan=True)
        differ |= ~close.all(axis=1)
    return np.nonzero(differ)[0].tolist()


def _invariance_subject(batch: SpecBatch, num_samples: int, seed: int) -> tuple[SpecBatch, int]:
    trials = max(1, min(num_samples, INVARIANCE_TRIALS))
    index = np.repeat(np.arange(batch.num_requests), trials)
    return select_requests(batch, index, seed=trial_seeds(seed, "invariance", index.size)), trials


def check_composition(
    variant: Variant,
    batch: SpecBatch,
    *,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> Verdict:
    """A request's output depends on its own inputs, seed and step only.

    A few trials of every request run alone, then shuffled among as many strangers (the same requests
    with rotated vocabularies and fresh seeds) under a random permutation of the draft slots; every
    request must emit the same tokens, counts and logprobs both times. No statistics.
    """
    start = time.perf_counter()
    subject, per_request = _invariance_subject(batch, num_samples, seed)
    rng = _rng(seed, "composition")
    strangers = roll_vocab(subject, int(rng.integers(1, max(batch.vocab_size, 2))))
    strangers = select_requests(
        strangers,
        rng.permutation(subject.num_requests),
        seed=trial_seeds(seed, "strangers", subject.num_requests),
    )
    together = concatenate([subject, strangers])
    order = rng.permutation(together.num_requests)
    # A stranger leads the crowded batch, so a variant reading batch-level state from request 0 shows.
    lead = int(np.argmax(order >= subject.num_requests))
    order[[0, lead]] = order[[lead, 0]]
    shuffled = select_requests(together, order)
    if shuffled.slotted:
        assert shuffled.draft_logits is not None
        shuffled = permute_slots(shuffled, rng.permutation(shuffled.draft_logits.shape[0]))
    try:
        alone, _ = call_variant(variant, subject, max_elements)
        crowded, _ = call_variant(variant, shuffled, max_elements)
    except VariantError as error:
        return _failed_call("composition", variant, error, time.perf_counter() - start)
    place = np.empty(order.size, dtype=np.int64)
    place[order] = np.arange(order.size)
    rows = np.arange(subject.num_requests)
    differ = _same_outputs(alone, crowded, rows, place[rows])
    seconds = time.perf_counter() - start
    detectable = stats.zero_cell_detectable(subject.num_requests)
    if not differ:
        message = (
            f"composition passes: {subject.num_requests} requests give the same output alone and shuffled "
            f"among {strangers.num_requests} strangers{' under permuted slots' if subject.slotted else ''}"
        )
        return Verdict(
            "composition",
            True,
            variant.name,
            None,
            None,
            0.0,
            None,
            None,
            detectable,
            subject.num_requests,
            seconds,
            message,
        )
    r = differ[0]
    b = r // per_request
    message = (
        f"composition FAILS: {len(differ)} of {subject.num_requests} requests change when shuffled "
        f"among strangers; first: request {b} emits {alone.token_ids[r].tolist()} alone, "
        f"{crowded.token_ids[place[r]].tolist()} shuffled"
    )
    return Verdict(
        "composition",
        False,
        variant.name,
        b,
        None,
        float(len(differ)),
        None,
        None,
        detectable,
        subject.num_requests,
        seconds,
        message,
    )


def check_determinism(
    variant: Variant,
    batch: SpecBatch,
    *,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> Verdict:
    """The same batch (a few trials of every request) gives the same output twice. No statistics."""
    start = time.perf_counter()
    subject, per_request = _invariance_subject(batch, num_samples, seed)
    try:
        first, _ = call_variant(variant, subject, max_elements)
        second, _ = call_variant(variant, subject, max_elements)
    except VariantError as error:
        return _failed_call("determinism", variant, error, time.perf_counter() - start)
    rows = np.arange(subject.num_requests)
    differ = _same_outputs(first, second, rows, rows)
    seconds = time.perf_counter() - start
    detectable = stats.zero_cell_detectable(subject.num_requests)
    if not differ:
        message = f"determinism passes: {subject.num_requests} requests give the same output twice"
        return Verdict(
            "determinism",
            True,
            variant.name,
            None,
            None,
            0.0,
            None,
            None,
            detectable,
            subject.num_requests,
            seconds,
            message,
        )
    r = differ[0]
    message = (
        f"determinism FAILS: {len(differ)} of {subject.num_requests} requests change between two calls; "
        f"first: request {r // per_request} emits {first.token_ids[r].tolist()}, "
        f"then {second.token_ids[r].tolist()}"
    )
    return Verdict(
        "determinism",
        False,
        variant.name,
        r // per_request,
        None,
        float(len(differ)),
        None,
        None,
        detectable,
        subject.num_requests,
        seconds,
        message,
    )


# ---------------------------------------------------------------------------------------------
# All of them


CheckFunction = Callable[..., "Verdict | None"]
_TRIAL_CHECKS: dict[str, CheckFunction] = {
    "invariants": check_invariants,
    "coupled": check_coupled,
    "law_of_m": check_law_of_m,
    "law_of_y": check_law_of_y,
}
_OWN_CALL_CHECKS: dict[str, CheckFunction] = {
    "marginal": check_marginal,
    "composition": check_composition,
    "determinism": check_determinism,
}


def run_checks(
    variant: Variant,
    batch: SpecBatch,
    *,
    checks: Sequence[str] = CHECKS,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
) -> list[Verdict]:
    """Run ``checks`` (names from `CHECKS`, run in that order) of ``variant`` on ``batch``.

    The invariants, coupled, law-of-m and law-of-y checks share one set of ``num_samples`` trials per
    request (their variant time is charged to the first of them); the others make their own calls.
    Checks that do not apply are left out: coupled on a variant off the canonical streams, marginal
    on synthetic batches. Each verdict has false-failure rate ``alpha``; ``seed`` derives every
    random choice.
    """
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise ValueError(f"checks has {unknown}; expected names from {', '.join(CHECKS)}")
    wanted = [c for c in CHECKS if c in checks and not (c == "coupled" and not variant.canonical_rng)]
    verdicts: list[Verdict] = []
    shared: Trials | None = None
    sharing = [c for c in wanted if c in _TRIAL_CHECKS]
    if sharing:
        start = time.perf_counter()
        try:
            shared = draw_trials(variant, batch, num_samples, seed)
        except VariantError as error:
            seconds = time.perf_counter() - start
            verdicts.extend(_failed_call(c, variant, error, seconds) for c in sharing)
            sharing = []
    for name in wanted:
        if name in _TRIAL_CHECKS:
            if name not in sharing:
                continue
            verdict = _TRIAL_CHECKS[name](
                variant, batch, num_samples=num_samples, alpha=alpha, seed=seed, trials=shared
            )
            if verdict is not None and shared is not None and name == sharing[0]:
                verdict = dataclasses.replace(verdict, seconds=verdict.seconds + shared.seconds)
        else:
            verdict = _OWN_CALL_CHECKS[name](variant, batch, num_samples=num_samples, alpha=alpha, seed=seed)
        if verdict is not None:
            verdicts.append(verdict)
    return verdicts


def compare_variants(
    first: Variant,
    second: Variant,
    batch: SpecBatch,
    *,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
) -> stats.TestResult:
    """Whether two variants draw ``(m, y)`` from the same law on ``batch``, with no exact law needed.

    Each variant runs ``num_samples`` trials of every request (their own seeds); per request, the
    two-sample G-test of homogeneity (`properties.stats.two_sample_test`) compares the joint counts of
    ``(m, y)``, and Holm combines the requests at level ``alpha``. The result's ``detectable_tv`` is
    the largest over requests of the total variation between the two joint laws detected with power
    0.999 (at Holm's first level). Useful where the exact law is out of reach or to compare a new
    kernel with a trusted one.
    """
    runs = [
        draw_trials(v, batch, num_samples, seed, purpose=f"compare {i}")
        for i, v in enumerate((first, second))
    ]
    vocab_size = batch.vocab_size
    results = []
    for b, n in enumerate(batch.num_drafts()):
        counts = []
        for trials in runs:
            tokens, emitted = _request_rows(trials, b)
            m = np.clip(emitted - 1, 0, n)
            y = np.clip(tokens[np.arange(m.shape[0]), m], 0, vocab_size - 1)
            counts.append(np.bincount(m * vocab_size + y, minlength=(n + 1) * vocab_size))
        results.append(stats.two_sample_test(counts[0], counts[1], alpha=alpha / batch.num_requests))
    adjusted = stats.holm_adjusted([r.pvalue for r in results])
    worst = int(np.argmin(adjusted))
    pvalue = float(adjusted[worst])
    detectable = max(r.detectable_tv for r in results)
    reject = pvalue < alpha
    reason = (
        f"{first.name} vs {second.name}: request {worst} {results[worst].reason}; Holm p={pvalue:.3g} "
        f"{'<' if reject else '>='} alpha={alpha:g} over {len(results)} requests; "
        f"detects TV>={detectable:.4f}"
    )
    return stats.TestResult(
        results[worst].statistic,
        pvalue,
        results[worst].df,
        reject,
        2 * num_samples * batch.num_requests,
        alpha,
        detectable,
        stats.DEFAULT_BETA,
        reason,
    )


def discrepancy(verdicts: Sequence[Verdict]) -> float:
    """A scalar >= 0 that grows as the verdicts look worse, for `hypothesis.target`.

    The largest ``-log10(pvalue)`` of the statistical verdicts (capped at 300); a failed exact check
    scores 1000. Zero when there is nothing to score.
    """
    score = 0.0
    for v in verdicts:
        if v.pvalue is not None:
            score = max(score, min(300.0, -math.log10(max(v.pvalue, 1e-300))))
        elif not v.passed:
            score = max(score, FAILED_EXACT_DISCREPANCY)
    return score
