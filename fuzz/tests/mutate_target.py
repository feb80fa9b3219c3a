"""A small sampler with one small ``@triton.jit`` kernel: the target of ``fuzz mutate``'s tests.

`PaddedReference` samples with the float64 reference sampler (the canonical scheme, so the coupled
check applies) and writes its output through `pad_kernel`, which keeps each request's emitted tokens
and log-probabilities and pads the rest (``-1`` and NaN). The kernel is a few lines, so a mutant of it
runs in seconds under the interpreter; its mutants include ones the checks kill (a strictness
change), ones that change no output (a masked lane's ``other=``) and ones that cannot run under the
interpreter (bfloat16 arithmetic).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specsample.reference.contract import Capabilities, SpecBatch, SpecOutput
from specsample.reference.sampler import ReferenceSampler


@triton.jit
def pad_kernel(
    tokens_ptr, logprobs_ptr, emitted_ptr, out_tokens_ptr, out_logprobs_ptr, width, WIDTH: tl.constexpr
):
    """Copy each request's emitted tokens and log-probabilities; ``-1`` and NaN after them.

    Args:
        tokens_ptr, out_tokens_ptr: ``[B, width]`` int64 tokens.
        logprobs_ptr, out_logprobs_ptr: ``[B, width]`` fp32 log-probabilities.
        emitted_ptr: ``[B]`` int32 tokens emitted per request.
    """
    # Grid (B,): one program per request, one tile over its columns.
    request = tl.program_id(0)
    columns = tl.arange(0, WIDTH)
    inside = columns < width
    emitted = tl.load(emitted_ptr + request)
    tokens = tl.load(tokens_ptr + request * width + columns, mask=inside, other=0)
    logprobs = tl.load(logprobs_ptr + request * width + columns, mask=inside, other=0.0).to(tl.float32)
    kept = columns < emitted
    tl.store(out_tokens_ptr + request * width + columns, tl.where(kept, tokens, -1), mask=inside)
    tl.store(
        out_logprobs_ptr + request * width + columns, tl.where(kept, logprobs, float("nan")), mask=inside
    )


class PaddedReference:
    """The reference sampler's output, padded again by `pad_kernel`: probabilistic method only."""

    name = "padded-reference"
    capabilities = Capabilities(methods=("probabilistic",))

    def __init__(self) -> None:
        self.reference = ReferenceSampler()
        self.streams = self.reference.streams

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample ``batch`` with the reference sampler, then pad its output with `pad_kernel`."""
        output = self.reference(batch)
        num_requests, width = output.token_ids.shape
        logprobs = output.logprobs
        if logprobs is None:
            logprobs = torch.zeros(num_requests, width, dtype=torch.float32)
        # The kernel's input holds a token and a finite value in every column, so that the padding
        # it writes is its own.
        tokens = output.token_ids.clamp(min=0).contiguous()
        logprobs = torch.nan_to_num(logprobs.to(torch.float32), nan=0.0).contiguous()
        emitted = output.num_emitted.to(torch.int32).contiguous()
        out_tokens = torch.empty_like(tokens)
        out_logprobs = torch.empty_like(logprobs)
        pad_kernel[(num_requests,)](
            tokens, logprobs, emitted, out_tokens, out_logprobs, width, WIDTH=triton.next_power_of_2(width)
        )
        return SpecOutput(
            token_ids=out_tokens,
            num_emitted=output.num_emitted,
            logprobs=None if output.logprobs is None else out_logprobs,
        )
