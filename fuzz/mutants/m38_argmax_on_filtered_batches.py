"""M38: a batch with sampling parameters takes the argmax where it should sample.

ROCm ATOM #2318 and mistral.rs #2424: the speculative path that applies top-k, top-p and min-p built
the filtered law and then returned its argmax (mistral.rs's ``sample_speculative_top_kp_min_p``), or
fell back to argmax verification where the filtering kernels were missing (SGLang's ROCm verify, as
in SGLang #31214). This sampler routes a batch with sampling parameters to such a path: every draw
(the strict method's row sample, the residual after a rejection, the bonus) is the argmax of its law,
ties to the lowest index; acceptance tests and logprobs are the specification's.
"""

import numpy as np

from specsample.reference.contract import Capabilities, SpecBatch
from specsample.reference.filters import FILTER_FLAGS
from specsample.reference.schemes import Noise
from specsample.reference.walk import F64Array, I64Array, WalkResult, WalkSampler


class ArgmaxOnFilteredBatches(WalkSampler):
    """Takes the argmax instead of a draw in a batch with sampling parameters."""

    name = "M38"
    capabilities = Capabilities(filters=FILTER_FLAGS)
    filtered_path = False

    def run(self, batch: SpecBatch) -> WalkResult:
        """Take the filtered path for a batch with sampling parameters."""
        self.filtered_path = batch.filtered
        return super().run(batch)

    def sample(self, weights: F64Array, noise: Noise) -> I64Array:
        """The planted bug: the filtered path's draw is the argmax of the law."""
        if not self.filtered_path:
            return super().sample(weights, noise)
        return np.asarray(np.argmax(weights, axis=1), dtype=np.int64)
