"""M27: probabilities in float32 while the sampler declares log-space arithmetic.

A sampler fed fp32 probabilities (the FlashInfer-style interface, vLLM V1) loses every probability
below the float32 normal range (about 1.2e-38): a draft with `p(d) = 2e-84` and `q(d) = 3e-86` has
acceptance ratio 81 and must always be accepted, but `0 > u * 0` is false and it is always rejected.
That is a legitimate sampler if it declares `fp32-probs` (the harness then holds it to that law);
this one declares nothing, so it claims the exact log-space law.
"""

from specsample.reference.law import flush_to_fp32
from specsample.reference.walk import F64Array, I64Array, WalkSampler


class Fp32ProbsDeclaredLog(WalkSampler):
    """Flushes both laws to float32's normal range, and declares no capabilities."""

    name = "M27"

    def target_law(self, logits: F64Array, temperature: F64Array) -> F64Array:
        """``p`` flushed to float32's normal range."""
        return flush_to_fp32(super().target_law(logits, temperature))

    def draft_law(self, logits: F64Array | None, temperature: F64Array, ids: I64Array) -> F64Array | None:
        """``q`` flushed likewise."""
        q = super().draft_law(logits, temperature, ids)
        return None if q is None else flush_to_fp32(q)
