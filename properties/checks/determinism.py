"""Determinism: the same batch (a few trials of every request) gives the same output twice.

Every variant call runs with ``torch.empty`` (and ``empty_like``, ``empty_strided``,
``Tensor.new_empty``) poisoned (`properties.checks.poison`); this check's second call uses the
other pattern, so an output or workspace that a sampler reads before writing (an accumulator never
zeroed, padding never written) differs between the two calls instead of holding whatever the
allocator happened to leave, which on a quiet machine is often the right value.
"""

from __future__ import annotations

import numpy as np

from specsample.properties.checks.base import I64Array, InvarianceCheck, call_variant
from specsample.properties.checks.poison import poison_pattern
from specsample.reference.contract import SpecBatch, SpecOutput, Variant


class Determinism(InvarianceCheck):
    """Two calls on the same batch give the same tokens, counts and logprobs. No statistics."""

    name = "determinism"
    change = "between two calls"
    shown = "{}, then {}"

    def outputs(
        self, variant: Variant, subject: SpecBatch, seed: int
    ) -> tuple[SpecOutput, SpecOutput, I64Array, str]:
        """Two calls on ``subject``, the first poisoned with pattern 0, the second with pattern 1."""
        first, _ = call_variant(variant, subject, self.max_elements)
        with poison_pattern(1):
            second, _ = call_variant(variant, subject, self.max_elements)
        return first, second, np.arange(subject.num_requests), "twice"


CHECK = Determinism()
