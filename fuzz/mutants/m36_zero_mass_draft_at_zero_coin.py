"""M36: a draft of zero filtered mass is accepted when its coin is exactly 0.

SGLang #35771 (fix proposed in #35788): the target-only sampler that verifies under sampling
parameters accepts on ``coin <= prob``, so a draft the filters removed (``prob = 0``) is accepted
when the float32 coin is exactly 0; drafters legitimately propose such tokens, since they cannot see
the target's filters. In the contract's terms the sampler's filtered path (a batch with sampling
parameters) tests ``p'(d) >= u q'(d)``, the unfiltered path the strict ``p(d) > u q(d)``. The coin
``u q'(d)`` is exactly 0 at every ``u`` when the draft lies outside the filtered draft law too
(``draft_filter`` on, a draft outside both kept sets): those drafts are always accepted, and the
invariants see an accepted draft of target probability 0. Where ``q'(d) > 0`` the coin is 0 only at
``u = 0``, which the canonical uniforms hit with probability ``2**-31`` a test: never seen.
"""

from specsample.reference.contract import Capabilities, SpecBatch
from specsample.reference.filters import FILTER_FLAGS
from specsample.reference.methods import Method
from specsample.reference.walk import BoolArray, F64Array, WalkResult, WalkSampler


class ZeroMassDraftAtZeroCoin(WalkSampler):
    """Accepts on ``p'(d) >= u q'(d)`` in a batch with sampling parameters."""

    name = "M36"
    capabilities = Capabilities(filters=FILTER_FLAGS)
    filtered_path = False

    def run(self, batch: SpecBatch) -> WalkResult:
        """Take the filtered path for a batch with sampling parameters."""
        self.filtered_path = batch.filtered
        return super().run(batch)

    def decide(
        self, method: Method, p_draft: F64Array, q_draft: F64Array, u: F64Array, rate: float
    ) -> BoolArray:
        """The planted bug: the filtered path's test is non-strict, so a coin of 0 accepts ``p' = 0``."""
        if not self.filtered_path or method.name != "probabilistic":
            return super().decide(method, p_draft, q_draft, u, rate)
        return p_draft >= u * q_draft
