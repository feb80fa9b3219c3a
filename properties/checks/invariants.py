"""The hard invariants: what every sample of a correct sampler keeps, with no statistics.

Checked per sample: the output's shapes and dtypes; ``1 <= num_emitted <= n_b + 1``; emitted ids in
``[0, V)`` and ``-1`` exactly after them; logprobs NaN exactly after them and equal to the target
log-probability within float32 tolerance; the accepted prefix equal to the drafts; no emitted id of
target probability 0 and no accepted draft of probability 0 (unless the method accepts any draft);
a method that decides by sampling never emits the draft it rejected; greedy rows emit the argmax
and, where the method accepts greedy drafts by argmax, stop at the first draft that is not it.

`violations` checks one output of a batch (the kernel tests and the GPU tier use it); `CHECK`
checks a variant on repeated trials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from properties.checks.base import Check, Settings, Trials, Verdict, draw_trials, exact_verdict
from reference.contract import SpecBatch, SpecOutput, Variant
from reference.law import RequestInputs, RequestLaw, exact_law, greedy_token, request_inputs
from reference.methods import METHODS, Method
from reference.walk import LOG_SUBNORMAL, LogLaw, log_law

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


def logprob_laws(inputs: RequestInputs) -> LogLaw:
    """``[n + 1, V]`` the log-domain target laws the logprobs follow (``T = 1`` for greedy rows)."""
    n = inputs.num_drafts
    return log_law(inputs.target_logits, np.full(n + 1, 1.0 if inputs.greedy else inputs.temperature))


@dataclass(frozen=True)
class _RequestFacts:
    """What the invariants need of one request, computed once for all its trials."""

    n: int
    drafts: I64Array  # [n]
    greedy_stop: int  # where a greedy chain stops (n when every draft is the argmax)
    argmax: I64Array  # [n + 1]
    zero_draft: BoolArray  # [n] whether draft i has target probability 0
    laws: LogLaw


def _facts(inputs: RequestInputs, law: RequestLaw) -> _RequestFacts:
    n = inputs.num_drafts
    argmax = greedy_token(inputs.target_logits).reshape(n + 1)
    drafts = inputs.draft_token_ids
    mismatch = np.nonzero(drafts != argmax[:n])[0]
    zero = np.array([drafts[i] >= 0 and law.target_probs[i, drafts[i]] == 0.0 for i in range(n)], dtype=bool)
    return _RequestFacts(
        n, drafts, int(mismatch[0]) if mismatch.size else n, argmax, zero, logprob_laws(inputs)
    )


def violating_samples(
    method: Method,
    vocab_size: int,
    inputs: RequestInputs,
    law: RequestLaw,
    tokens: I64Array,
    emitted: I64Array,
    logprobs: npt.NDArray[np.float32] | None,
) -> BoolArray:
    """``[N]`` whether each sample of one request breaks an invariant (vectorised over samples)."""
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
        if method.greedy_accepts_argmax:
            bad |= m != facts.greedy_stop
    else:
        bad |= law.target_probs[m, y] == 0.0
        if not method.accepts_any_draft and facts.zero_draft.any():
            bad |= m > int(np.argmax(facts.zero_draft))
        if method.decides_by_sampling:
            bad |= (m < n) & (y == drafts[np.minimum(m, width - 1)])
    if logprobs is not None:
        lp = logprobs[:, :width]
        bad |= (inside & np.isnan(lp)).any(axis=1) | (~inside & ~np.isnan(lp)).any(axis=1)
        k = np.minimum(position, n).repeat(tokens.shape[0], axis=0)
        token = np.clip(tokens, 0, vocab_size - 1)
        ok = logprob_ok(lp, facts.laws.log_probs[k, token], facts.laws.tolerance[k, token])
        bad |= (inside & ~ok).any(axis=1)
    return np.asarray(bad)


def describe_violation(
    method: Method,
    vocab_size: int,
    inputs: RequestInputs,
    law: RequestLaw,
    row: I64Array,
    count: int,
    logprobs: npt.NDArray[np.float32] | None,
) -> tuple[int | None, str]:
    """``(position, description)`` of the first invariant one sample breaks."""
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
        if method.greedy_accepts_argmax and m != facts.greedy_stop:
            return m, f"greedy chain stops at {m}, expected {facts.greedy_stop}"
    else:
        if law.target_probs[m, y] == 0.0:
            return m, f"emitted id {y} has target probability 0 at position {m}"
        zero = np.nonzero(facts.zero_draft[:m])[0]
        if not method.accepts_any_draft and zero.size:
            return int(zero[0]), f"accepted draft {facts.drafts[zero[0]]} of target probability 0"
        if method.decides_by_sampling and m < n and y == facts.drafts[m]:
            return m, f"{method.name} sampling rejected draft {y} yet emitted it"
    if logprobs is not None:
        if np.isnan(logprobs[:count]).any() or not np.isnan(logprobs[count:width]).all():
            return None, f"logprobs {logprobs.tolist()} are not NaN exactly after {count}"
        for k in range(count):
            expected = float(facts.laws.log_probs[k, out[k]])
            if not logprob_ok(np.float32(logprobs[k]), expected, float(facts.laws.tolerance[k, out[k]])):
                return k, f"logprob {logprobs[k]:.6g} at position {k}; expected {expected:.6g}"
    return None, "no violation"


@dataclass(frozen=True)
class Violations:
    """The samples of an output that break an invariant.

    Attributes:
        count: how many samples break one.
        first: ``(request, position, description)`` of the first of them, or ``None``.
        descriptions: one line per violating sample (at most `limit` of them).
    """

    count: int
    first: tuple[int | None, int | None, str] | None
    descriptions: list[str]


def find_violations(
    batch: SpecBatch,
    output: SpecOutput,
    num_trials: int = 1,
    problems: list[str] | None = None,
    limit: int = 20,
) -> Violations:
    """The invariants ``output`` breaks; its rows are ``num_trials`` samples of each request of ``batch``."""
    method = METHODS[batch.method]
    descriptions = list(problems or [])
    first = (None, None, descriptions[0]) if descriptions else None
    count = len(descriptions)
    tokens_all = output.token_ids.detach().cpu().numpy().astype(np.int64)
    emitted_all = output.num_emitted.detach().cpu().numpy().astype(np.int64)
    logprobs = None if output.logprobs is None else output.logprobs.detach().cpu().numpy()
    for b, (inputs, law) in enumerate(zip(request_inputs(batch), exact_law(batch), strict=True)):
        rows = slice(b * num_trials, (b + 1) * num_trials)
        tokens, emitted, lp = (
            tokens_all[rows],
            emitted_all[rows],
            None if logprobs is None else logprobs[rows],
        )
        bad = violating_samples(method, batch.vocab_size, inputs, law, tokens, emitted, lp)
        count += int(bad.sum())
        for t in np.nonzero(bad)[0][: max(0, limit - len(descriptions))]:
            position, text = describe_violation(
                method,
                batch.vocab_size,
                inputs,
                law,
                tokens[t],
                int(emitted[t]),
                None if lp is None else lp[t],
            )
            descriptions.append(f"request {b} trial {t}: {text}")
            if first is None:
                first = (b, position, descriptions[-1])
    return Violations(count, first, descriptions)


def violations(batch: SpecBatch, output: SpecOutput) -> list[str]:
    """Every invariant ``output`` (one sample of each request of ``batch``) breaks; empty when none."""
    return find_violations(batch, output).descriptions


class Invariants(Check):
    """Every sample keeps the hard invariants (the module docstring lists them); no statistics.

    ``detectable`` is the per-sample violation rate seen with probability 0.999 in a request's trials.
    """

    name = "invariants"

    def verdict(
        self, variant: Variant, batch: SpecBatch, settings: Settings, trials: Trials | None
    ) -> Verdict:
        """Check every trial; ``alpha`` is unused."""
        trials = trials or draw_trials(variant, batch, settings.num_samples, settings.seed)
        found = find_violations(batch, trials.output, trials.num_trials, trials.problems, limit=1)
        total = batch.num_requests * trials.num_trials
        request, position, text = found.first or (None, None, "")
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
        )


CHECK = Invariants()
