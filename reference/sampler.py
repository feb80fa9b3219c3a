"""The reference sampler: the kernels' algorithm in float64, fed the canonical random streams.

Canonical streams (shared with every canonical-stream kernel, so outputs compare sample by sample):
a uniform is ``tl.rand(seed, offset)`` with
``offset = (((step * 128 + i) * 4 + purpose) << 22) + token``. Purpose 0 is the acceptance
uniform of position ``i`` (token 0); purpose 1 is the Gumbel noise for sampling row ``i`` (the
residual, the strict target sample, the synthetic or bonus sample). Sampling is Gumbel-max:
``argmax_x(log w(x) - log(-log(u_x)))`` over unnormalised weights ``w``, ties to the lowest index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

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

ACCEPT_PURPOSE = 0
SAMPLE_PURPOSE = 1

F32Array = npt.NDArray[np.float32]


def stream_offsets(
    step: int, position: int | npt.ArrayLike, purpose: int, token: int | npt.ArrayLike
) -> npt.NDArray[np.uint64]:
    """The canonical Philox offsets, computed modulo 2**64 as the kernels' int64 arithmetic does."""
    row = (np.uint64(step) * np.uint64(128) + np.asarray(position, dtype=np.uint64)) * np.uint64(4)
    return ((row + np.uint64(purpose)) << np.uint64(22)) + np.asarray(token, dtype=np.uint64)


@dataclass(frozen=True)
class RequestNoise:
    """The uniforms one request consumes.

    Attributes:
        accept_uniforms: ``[n]`` float32, purpose 0: the acceptance uniform of each position.
        sample_uniforms: ``[n + 1, V]`` float32, purpose 1: Gumbel noise for sampling each row.
    """

    accept_uniforms: F32Array
    sample_uniforms: F32Array


def request_noise(seed: int, step: int, num_drafts: int, vocab_size: int) -> RequestNoise:
    """The canonical uniforms of one request."""
    positions = np.arange(num_drafts)
    tokens = np.arange(vocab_size)
    return RequestNoise(
        accept_uniforms=philox.rand(seed, stream_offsets(step, positions, ACCEPT_PURPOSE, 0)),
        sample_uniforms=philox.rand(
            seed, stream_offsets(step, np.arange(num_drafts + 1)[:, None], SAMPLE_PURPOSE, tokens[None, :])
        ),
    )


def canonical_noise(batch: SpecBatch) -> list[RequestNoise]:
    """The canonical uniforms of every request of ``batch``."""
    seeds = batch.seed.detach().cpu().tolist()
    steps = batch.step.detach().cpu().tolist()
    return [
        request_noise(seed, step, n, batch.vocab_size)
        for seed, step, n in zip(seeds, steps, batch.num_drafts(), strict=True)
    ]


def gumbel_argmax(weights: F64Array, uniforms: F32Array) -> int:
    """Gumbel-max: ``argmax(log w - log(-log u))``, ties to the lowest index.

    A uniform of exactly 0 gives a score of ``-inf``; a weight of 0 is never chosen unless every
    score is ``-inf``.
    """
    with np.errstate(divide="ignore"):
        scores = np.log(weights) - np.log(-np.log(uniforms.astype(np.float64)))
    return int(np.argmax(scores))


@dataclass(frozen=True)
class RequestSample:
    """One request's emitted tokens: the accepted drafts, then one sampled token."""

    token_ids: list[int]
    logprobs: list[float]


def sample_request(method: str, inputs: RequestInputs, noise: RequestNoise) -> RequestSample:
    """Run the rejection sampler on one request with the given uniforms."""
    n = inputs.num_drafts
    targets = [row_probs(row, inputs.temperature) for row in inputs.target_logits]
    drafts = draft_probs(inputs)
    tokens: list[int] = []
    for i in range(n):
        token = int(inputs.draft_token_ids[i])
        u = float(noise.accept_uniforms[i])
        target = targets[i]
        emitted: int | None = None
        if method == "synthetic":
            assert inputs.synthetic_rates is not None
            accept = token >= 0 and u < inputs.synthetic_rates[i]
        elif inputs.greedy:
            accept = token >= 0 and token == greedy_token(inputs.target_logits[i])
        elif method == "strict":
            emitted = gumbel_argmax(target, noise.sample_uniforms[i])
            accept = emitted == token
        else:
            # Strict `>`: a token with p = 0 must never be accepted, even at u = 0.
            accept = token >= 0 and target[token] > u * drafts[i][token]
        if accept:
            tokens.append(token)
            continue
        if emitted is None:
            if inputs.greedy:
                emitted = greedy_token(inputs.target_logits[i])
            elif method == "probabilistic" and token >= 0:
                emitted = gumbel_argmax(residual_law(target, drafts[i]), noise.sample_uniforms[i])
            else:
                emitted = gumbel_argmax(target, noise.sample_uniforms[i])
        tokens.append(emitted)
        break
    else:
        if inputs.greedy:
            tokens.append(greedy_token(inputs.target_logits[n]))
        else:
            tokens.append(gumbel_argmax(targets[n], noise.sample_uniforms[n]))
    logprob_temperature = inputs.temperature if not inputs.greedy else 1.0
    with np.errstate(divide="ignore"):
        logprobs = [
            float(np.log(row_probs(inputs.target_logits[i], logprob_temperature)[token]))
            for i, token in enumerate(tokens)
        ]
    return RequestSample(token_ids=tokens, logprobs=logprobs)


def pack_output(samples: Sequence[RequestSample], max_num_drafts: int) -> SpecOutput:
    """Lay per-request samples out as a `SpecOutput`: left-aligned, ``-1`` (and NaN) after them."""
    width = max_num_drafts + 1
    token_ids = torch.full((len(samples), width), -1, dtype=torch.int64)
    logprobs = torch.full((len(samples), width), float("nan"), dtype=torch.float32)
    for b, sample in enumerate(samples):
        count = len(sample.token_ids)
        token_ids[b, :count] = torch.tensor(sample.token_ids, dtype=torch.int64)
        logprobs[b, :count] = torch.tensor(sample.logprobs, dtype=torch.float32)
    num_emitted = torch.tensor([len(s.token_ids) for s in samples], dtype=torch.int32)
    return SpecOutput(token_ids=token_ids, num_emitted=num_emitted, logprobs=logprobs)


def reference_sample(batch: SpecBatch, noise: Sequence[RequestNoise] | None = None) -> SpecOutput:
    """Sample ``batch`` in float64 with ``noise`` (default: the canonical streams); output on the CPU."""
    inputs = request_inputs(batch)
    if noise is None:
        noise = canonical_noise(batch)
    if len(noise) != len(inputs):
        raise ValueError(f"noise has {len(noise)} entries; expected one per request ({len(inputs)})")
    samples = [sample_request(batch.method, x, z) for x, z in zip(inputs, noise, strict=True)]
    return pack_output(samples, batch.resolved_max_num_drafts())


class ReferenceSampler:
    """`reference_sample` as a `Variant`: the float64 twin of every canonical-stream kernel."""

    name = "reference"
    canonical_rng = True

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample ``batch`` on the CPU with the canonical streams."""
        return reference_sample(batch)
