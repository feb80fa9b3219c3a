"""Determinism: the same batch (a few trials of every request) gives the same output twice.

Every variant call runs with ``torch.empty`` (and ``empty_like``, ``empty_strided``,
``Tensor.new_empty``) poisoned (`properties.checks.poison`); this check's second call uses the
other pattern, so an output or workspace that a sampler reads before writing (an accumulator never
zeroed, padding never written) differs between the two calls instead of holding whatever the
allocator happened to leave, which on a quiet machine is often the right value.
"""

from __future__ import annotations

import numpy as np

from specsample.properties.checks.base import (
    Check,
    Settings,
    Trials,
    Verdict,
    call_variant,
    differing_rows,
    exact_verdict,
    invariance_subject,
)
from specsample.properties.checks.poison import poison_pattern
from specsample.reference.contract import SpecBatch, Variant


class Determinism(Check):
    """Two calls on the same batch give the same tokens, counts and logprobs. No statistics."""

    name = "determinism"
    counts_trials = False
    shares_trials = False

    def __init__(self, max_elements: int | None = None) -> None:
        self.max_elements = max_elements

    def verdict(
        self, variant: Variant, batch: SpecBatch, settings: Settings, trials: Trials | None
    ) -> Verdict:
        """No statistics: ``alpha`` and ``trials`` are unused."""
        subject, per_request = invariance_subject(batch, settings.num_samples, settings.seed)
        first, _ = call_variant(variant, subject, self.max_elements)  # poisoned with pattern 0
        with poison_pattern(1):
            second, _ = call_variant(variant, subject, self.max_elements)
        rows = np.arange(subject.num_requests)
        differ = differing_rows(first, second, rows, rows)
        r = differ[0] if differ else 0
        outputs = f"{first.token_ids[r].tolist()}, then {second.token_ids[r].tolist()}"
        return exact_verdict(
            self.name,
            variant,
            failures=len(differ),
            total=subject.num_requests,
            passed=f"{subject.num_requests} requests give the same output twice",
            failed=f"{len(differ)} of {subject.num_requests} requests change between two calls; first: "
            f"request {r // per_request} emits {outputs}",
            request=r // per_request,
        )


CHECK = Determinism()
