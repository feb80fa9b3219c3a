"""A planted slowdown for proving the gate: a variant wrapper that adds one extra pass over the logits.

``SPECSAMPLE_BENCH_EXTRA_PASS=triton python3 -m benchmarks.gate`` wraps the ``triton`` variant in
`ExtraLogitPass` under its own name, so the benchmark ids match the baseline and the gate must
report the regression. Nothing in ``kernels/`` changes.
"""

from __future__ import annotations

import os

import torch

from specsample.reference.contract import SpecBatch, SpecOutput, Variant

EXTRA_PASS_ENV = "SPECSAMPLE_BENCH_EXTRA_PASS"


class ExtraLogitPass:
    """``variant`` preceded by one full read of the target and draft logits (a max reduction each).

    The outputs are the wrapped variant's, unchanged: only the time grows, by about one pass over the
    vocabulary of every row, the slowdown a kernel change that re-reads the logits would cause.
    """

    def __init__(self, variant: Variant) -> None:
        self.variant = variant
        self.name = variant.name
        self.streams = variant.streams

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Read every logit once more, then run the wrapped variant."""
        torch.amax(batch.target_logits)
        if batch.draft_logits is not None:
            torch.amax(batch.draft_logits)
        return self.variant(batch)


def with_planted_slowdown(name: str, variant: Variant) -> Variant:
    """``variant`` (registered as ``name``) wrapped in `ExtraLogitPass` if ``SPECSAMPLE_BENCH_EXTRA_PASS``
    lists ``name`` (comma-separated), else ``variant`` itself."""
    slowed = {entry.strip() for entry in os.environ.get(EXTRA_PASS_ENV, "").split(",")}
    return ExtraLogitPass(variant) if name in slowed else variant
