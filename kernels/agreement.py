"""The checks a canonical-stream kernel is held to: hard invariants and coupled agreement with float64.

`coupled_agreement` replays every request along the float64 reference walk
(`reference.sampler.sample_request`: same decisions, same uniforms, drawn lazily row by row so it
scales to large vocabularies) and, for each decision, asks whether it is a *near tie*: whether
float32 arithmetic could flip it. A kernel output may differ from the reference only where the
first difference sits on a near tie.

The tolerance model, in the log domain the kernels compute in (``eps = 2**-23``, times
`TOL_ULPS`): ``e(x) = (x - max) / T`` carries ``|e| + 4 + log2(V)`` ulps (its rounding, the
row's log-sum-exp), a Gumbel key ``g = -log(-log u)`` carries ``|g| + 2`` ulps, ``log u`` carries
``|log u| + 1``. A residual weight ``p - q`` is known to ``tol_p p + tol_q q``. A probability within
tolerance of ``2**-1075`` (where float64 rounds to zero) may round either way, and the float64
subnormal range below ``e**-700`` is imprecise in the reference itself; both count as near.

`hard_invariants` lists violations that no rounding excuses: ids outside ``[0, V)``, the layout
(``-1`` and NaN exactly after ``num_emitted``), the accepted prefix equal to the drafts, an
emitted id of float64 probability 0 (accepted synthetic drafts excepted), and greedy chains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from reference import philox
from reference.contract import SpecBatch, SpecOutput
from reference.law import (
    F64Array,
    RequestInputs,
    draft_probs,
    greedy_token,
    request_inputs,
    residual_law,
    row_probs,
)
from reference.sampler import ACCEPT_PURPOSE, SAMPLE_PURPOSE, gumbel_argmax, stream_offsets

EPS32 = 2.0**-23
TOL_ULPS = 8.0
LOG_ZERO = -1075 * math.log(2.0)
LOG_SUBNORMAL = -700.0


@dataclass(frozen=True)
class LogLaw:
    """One row's law in the log domain, with the float32 tolerance of each log-probability."""

    log_probs: F64Array
    tolerance: F64Array


def log_law(logits: F64Array, temperature: float) -> LogLaw:
    """``log softmax(logits / T)`` with `reference.law.row_probs`'s odd-value rules, never underflowing."""
    clean = np.where(np.isnan(logits), -np.inf, logits)
    vocab_size = clean.shape[0]
    row_max = clean.max()
    if np.isposinf(row_max):
        top = np.isposinf(clean)
        scaled = np.where(top, 0.0, -np.inf)
    elif np.isneginf(row_max):
        scaled = np.zeros_like(clean)
    else:
        with np.errstate(invalid="ignore"):
            scaled = np.where(clean == row_max, 0.0, (clean - row_max) / temperature)
    log_probs = scaled - math.log(float(np.exp(scaled).sum()))
    finite = np.isfinite(scaled)
    tolerance = np.where(
        finite, TOL_ULPS * EPS32 * (np.abs(np.where(finite, scaled, 0.0)) + 4 + math.log2(vocab_size)), 0.0
    )
    return LogLaw(log_probs, tolerance)


def _zero_ambiguous(log_prob: F64Array | float, tolerance: F64Array | float) -> F64Array | bool:
    """Whether a probability sits where float32 or float64 may round it to zero or not."""
    return (np.asarray(log_prob) >= LOG_ZERO - np.asarray(tolerance) - 1e-9) & (
        np.asarray(log_prob) <= LOG_SUBNORMAL
    )


def _gumbel(uniforms: F64Array) -> tuple[F64Array, F64Array]:
    with np.errstate(divide="ignore"):
        noise = -np.log(-np.log(uniforms))
    finite = np.isfinite(noise)
    return noise, np.where(finite, TOL_ULPS * EPS32 * (np.abs(np.where(finite, noise, 0.0)) + 2), 0.0)


def _near_argmax(winner: int, low: F64Array, high: F64Array) -> bool:
    """Whether any other key's upper bound reaches the winner's lower bound."""
    if high.shape[0] < 2:
        return False
    return bool(low[winner] <= np.delete(high, winner).max())


def _target_intervals(law: LogLaw, noise: F64Array, noise_tol: F64Array) -> tuple[F64Array, F64Array]:
    ambiguous = _zero_ambiguous(law.log_probs, law.tolerance)
    alive = law.log_probs > LOG_ZERO + law.tolerance
    high = np.where(alive | ambiguous, law.log_probs + law.tolerance + noise + noise_tol, -np.inf)
    low = np.where(alive & ~ambiguous, law.log_probs - law.tolerance + noise - noise_tol, -np.inf)
    return low, high


@dataclass
class RequestWalk:
    """The reference walk of one request: emitted tokens, logprobs, and near ties per position."""

    token_ids: list[int]
    logprobs: list[float]
    near: list[bool] = field(default_factory=list)
    num_decisions: int = 0


def _sample_decision(
    kind: str,
    target: F64Array,
    draft: F64Array | None,
    target_law: LogLaw,
    draft_law: LogLaw | None,
    token: int,
    uniforms: F64Array,
    identical_rows: bool,
) -> tuple[int, bool]:
    """The reference's sampled token of a row and whether the choice is a near tie.

    ``kind`` is ``"target"`` (``y ~ p``), ``"without"`` (``p`` without ``token``) or ``"residual"``.
    """
    noise, noise_tol = _gumbel(uniforms)
    low, high = _target_intervals(target_law, noise, noise_tol)
    if kind == "target":
        choice = gumbel_argmax(target, uniforms.astype(np.float32))
        return choice, _near_argmax(choice, low, high)
    if kind == "without":
        weights = residual_law(target, np.eye(1, target.shape[0], token)[0])
        low[token] = high[token] = -np.inf
        choice = gumbel_argmax(weights, uniforms.astype(np.float32))
        if not np.isfinite(high).any():
            return choice, _near_argmax(choice, *_target_intervals(target_law, noise, noise_tol))
        return choice, _near_argmax(choice, low, high)
    assert draft is not None and draft_law is not None
    weights = residual_law(target, draft)
    choice = gumbel_argmax(weights, uniforms.astype(np.float32))
    p, q = np.exp(target_law.log_probs), np.exp(draft_law.log_probs)
    spread = 0.0 if identical_rows else 1e-320
    error = target_law.tolerance * p + draft_law.tolerance * q + spread
    residual = p - q
    with np.errstate(divide="ignore", invalid="ignore"):
        res_high = np.where(
            residual + error > 0, np.log(np.maximum(residual + error, 0)) + noise + noise_tol, -np.inf
        )
        res_low = np.where(
            residual - error > 0, np.log(np.maximum(residual - error, 0)) + noise - noise_tol, -np.inf
        )
    has_mass = bool(np.maximum(target - draft, 0.0).sum() > 0.0)
    if not has_mass:
        # The reference falls back to p; the kernel might still see a sliver of residual.
        return choice, bool(np.isfinite(res_high).any()) or _near_argmax(choice, low, high)
    return choice, _near_argmax(choice, res_low, res_high)


def walk_request(method: str, inputs: RequestInputs) -> RequestWalk:
    """Replay `reference.sampler.sample_request` on the canonical streams, marking near ties."""
    n, vocab_size = inputs.num_drafts, inputs.target_logits.shape[1]
    accept_uniforms = philox.rand(inputs.seed, stream_offsets(inputs.step, np.arange(n), ACCEPT_PURPOSE, 0))

    def sample_uniforms(position: int) -> F64Array:
        offsets = stream_offsets(inputs.step, position, SAMPLE_PURPOSE, np.arange(vocab_size))
        return philox.rand(inputs.seed, offsets).astype(np.float64)

    temperature = inputs.temperature
    drafts = draft_probs(inputs) if method == "probabilistic" and not inputs.greedy else None
    walk = RequestWalk([], [])
    for i in range(n + 1):
        logits = inputs.target_logits[i]
        is_draft = i < n
        token = int(inputs.draft_token_ids[i]) if is_draft else -1
        if inputs.greedy:
            argmax = greedy_token(logits)
            if is_draft and method == "synthetic":
                assert inputs.synthetic_rates is not None
                accept = token >= 0 and float(accept_uniforms[i]) < inputs.synthetic_rates[i]
            else:
                accept = is_draft and token == argmax
            walk.num_decisions += int(is_draft)
            walk.near.append(False)
            walk.token_ids.append(token if accept else argmax)
            if not accept:
                break
            continue
        target = row_probs(logits, temperature)
        target_law = log_law(logits, temperature)
        near = False
        if is_draft and method == "synthetic":
            assert inputs.synthetic_rates is not None
            accept = token >= 0 and float(accept_uniforms[i]) < inputs.synthetic_rates[i]
            kind = "target"
        elif is_draft and method == "strict":
            uniforms = sample_uniforms(i)
            sample, near = _sample_decision("target", target, None, target_law, None, -1, uniforms, False)
            accept = sample == token
            walk.num_decisions += 1
            if not accept:
                walk.near.append(near)
                walk.token_ids.append(sample)
                break
            walk.near.append(near)
            walk.token_ids.append(token)
            continue
        elif is_draft and token >= 0:
            assert drafts is not None
            u = float(accept_uniforms[i])
            accept = bool(target[token] > u * drafts[i][token])
            walk.num_decisions += 1
            log_p, tol_p = target_law.log_probs[token], target_law.tolerance[token]
            if inputs.draft_logits is None:
                log_q, tol_q = 0.0, 0.0
                kind = "without"
            else:
                draft_law = log_law(inputs.draft_logits[i], temperature)
                log_q, tol_q = draft_law.log_probs[token], draft_law.tolerance[token]
                kind = "residual"
            log_u = math.log(u) if u > 0 else -math.inf
            tol_u = TOL_ULPS * EPS32 * (1 + abs(log_u)) if u > 0 else 0.0
            if np.isneginf(log_p):
                margin = -math.inf
            elif np.isneginf(log_u + log_q):
                margin = math.inf
            else:
                margin = log_p - (log_u + log_q)
            near = (
                bool(_zero_ambiguous(log_p, tol_p))
                or bool(_zero_ambiguous(log_q, tol_q))
                or bool(np.isfinite(margin) and abs(margin) <= tol_p + tol_q + tol_u)
            )
        else:
            accept = False
            kind = "target"
        if accept:
            walk.near.append(near)
            walk.token_ids.append(token)
            continue
        uniforms = sample_uniforms(i)
        draft_row = drafts[i] if kind == "residual" and drafts is not None else None
        draft_law = log_law(inputs.draft_logits[i], temperature) if kind == "residual" else None
        identical = kind == "residual" and np.array_equal(
            inputs.target_logits[i], inputs.draft_logits[i], equal_nan=True
        )
        sample, sample_near = _sample_decision(
            kind, target, draft_row, target_law, draft_law, token, uniforms, identical
        )
        walk.num_decisions += 1
        walk.near.append(near or sample_near)
        walk.token_ids.append(sample)
        break
    logprob_temperature = 1.0 if inputs.greedy else temperature
    for i, token in enumerate(walk.token_ids):
        walk.logprobs.append(float(log_law(inputs.target_logits[i], logprob_temperature).log_probs[token]))
    return walk


@dataclass
class Agreement:
    """Coupled agreement of one output with the reference walk, over a whole batch.

    Attributes:
        num_decisions: acceptance decisions and samples made along the reference walks.
        near_ties: decisions float32 rounding could flip.
        mismatches: requests whose output differs from the reference.
        unexplained: a description of each mismatch whose first difference is no near tie, and of
            each logprob out of tolerance.
    """

    num_decisions: int = 0
    near_ties: int = 0
    mismatches: int = 0
    unexplained: list[str] = field(default_factory=list)


def coupled_agreement(batch: SpecBatch, output: SpecOutput) -> Agreement:
    """Compare ``output`` with the float64 reference walk of ``batch``, request by request."""
    result = Agreement()
    tokens = output.token_ids.detach().cpu().numpy()
    emitted = output.num_emitted.detach().cpu().numpy()
    logprobs = None if output.logprobs is None else output.logprobs.detach().cpu().numpy()
    for b, inputs in enumerate(request_inputs(batch)):
        walk = walk_request(batch.method, inputs)
        result.num_decisions += walk.num_decisions
        result.near_ties += int(sum(walk.near))
        mine = tokens[b, : max(int(emitted[b]), 0)].tolist()
        if mine != walk.token_ids:
            result.mismatches += 1
            differ = [k for k, (x, y) in enumerate(zip(mine, walk.token_ids, strict=False)) if x != y]
            first = min(differ[0] if differ else len(walk.token_ids) - 1, len(walk.token_ids) - 1)
            if not walk.near[first]:
                result.unexplained.append(
                    f"request {b}: kernel {mine} != reference {walk.token_ids}; "
                    f"position {first} is no near tie"
                )
            continue
        if logprobs is None:
            continue
        for k, (got, expected) in enumerate(zip(logprobs[b, : len(mine)], walk.logprobs, strict=True)):
            law = log_law(inputs.target_logits[k], 1.0 if inputs.greedy else inputs.temperature)
            if np.isneginf(expected) or expected < LOG_SUBNORMAL:
                ok = np.isneginf(got) or got < LOG_SUBNORMAL
            else:
                ok = abs(float(got) - expected) <= float(law.tolerance[mine[k]]) + 1e-6 * (1 + abs(expected))
            if not ok:
                result.unexplained.append(f"request {b}: logprob {k} is {got}; reference {expected}")
    return result


def hard_invariants(batch: SpecBatch, output: SpecOutput) -> list[str]:
    """Every violation of the hard invariants by ``output`` (empty when there is none)."""
    problems: list[str] = []
    width = batch.resolved_max_num_drafts() + 1
    shape = (batch.num_requests, width)
    if tuple(output.token_ids.shape) != shape or output.token_ids.dtype.is_floating_point:
        return [f"token_ids has shape {tuple(output.token_ids.shape)}; expected {shape}"]
    tokens = output.token_ids.detach().cpu().numpy()
    emitted = output.num_emitted.detach().cpu().numpy()
    logprobs = None if output.logprobs is None else output.logprobs.detach().cpu().numpy()
    vocab_size = batch.vocab_size
    for b, inputs in enumerate(request_inputs(batch)):
        n = inputs.num_drafts
        count = int(emitted[b])
        if not 1 <= count <= n + 1:
            problems.append(f"request {b}: num_emitted {count} outside [1, {n + 1}]")
            continue
        row = tokens[b]
        if not ((row[:count] >= 0) & (row[:count] < vocab_size)).all():
            problems.append(f"request {b}: emitted ids {row[:count].tolist()} outside [0, {vocab_size})")
            continue
        if not (row[count:] == -1).all():
            problems.append(f"request {b}: {row.tolist()} is not -1 after {count} tokens")
        if logprobs is not None and (
            np.isnan(logprobs[b, :count]).any() or not np.isnan(logprobs[b, count:]).all()
        ):
            problems.append(f"request {b}: logprobs {logprobs[b].tolist()} not NaN exactly after {count}")
        accepted = row[: count - 1].tolist()
        if accepted != inputs.draft_token_ids[: count - 1].tolist():
            problems.append(f"request {b}: accepted {accepted} != drafts {inputs.draft_token_ids.tolist()}")
            continue
        final = count - 1
        if inputs.greedy:
            argmaxes = [greedy_token(inputs.target_logits[i]) for i in range(count)]
            if int(row[final]) != argmaxes[final]:
                problems.append(f"request {b}: greedy row emits {int(row[final])}, argmax {argmaxes[final]}")
            if batch.method != "synthetic":
                expected = next((i for i in range(n) if inputs.draft_token_ids[i] != argmaxes[i]), n)
                if final != expected:
                    problems.append(f"request {b}: greedy chain stops at {final}, expected {expected}")
            continue
        probs = [row_probs(inputs.target_logits[i], inputs.temperature) for i in range(count)]
        if probs[final][int(row[final])] == 0.0:
            problems.append(
                f"request {b}: emitted id {int(row[final])} has probability 0 at position {final}"
            )
        if batch.method != "synthetic":
            for i, token in enumerate(accepted):
                if probs[i][token] == 0.0:
                    problems.append(f"request {b}: accepted draft {token} has probability 0 at position {i}")
    return problems
