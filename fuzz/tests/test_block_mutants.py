"""The planted block-verification bugs (M28-M30): the checks kill each one, and the walk passes them."""

from __future__ import annotations

import numpy as np
import pytest

from specsample.fuzz.mutants import MUTANTS
from specsample.fuzz.selftest import Blind
from specsample.fuzz.targeted import targeted_batches
from specsample.properties import stats
from specsample.properties.checks import CHECKS, run_checks
from specsample.reference.contract import RequestData, make_batch
from specsample.reference.law import exact_law
from specsample.reference.walk import WalkSampler

# alpha per statistical assertion; each states the deviation it detects with power 0.999.
ALPHA = 1e-6

# Three tokens, two drafts: M28 (the token-wise residual after a stop) moves the law of the token at
# position 1, given that the output continued by the target starts with d_0, 0.19 in total variation
# away from p_1 (exact enumeration over the drafts), on the 17% of trials that start with d_0.
M28_TARGET = [[-0.1811, -1.8062, -6.5753], [-0.8971, -3.3185, -0.5869], [-2.892, -1.661, -0.2816]]
M28_DRAFT = [[-14.3405, -0.0137, -4.294], [-7.1547, -0.0889, -2.4735]]


def test_the_block_marginal_catches_the_token_wise_residual() -> None:
    """M28 fails the marginal check at position 1 and the walk passes it, at 4000 trials and alpha 1e-6
    (Holm over 3 positions): there about 650 trials detect a total variation below 0.19 with power 0.999."""
    batch = make_batch([RequestData(np.array(M28_TARGET), [0, 0], np.array(M28_DRAFT), 1.0)], method="block")
    reached = int(0.15 * 4000)
    p_1 = exact_law(batch)[0].target_probs[1]
    assert stats.GoodnessOfFit(p_1, reached, alpha=ALPHA / 3).detectable_tv < 0.19
    verdict = CHECKS["marginal"].run(Blind(MUTANTS["M28"].load()), batch, num_samples=4000, seed=2)
    assert verdict.failed and verdict.position == 1, verdict.message
    assert CHECKS["marginal"].run(WalkSampler(), batch, num_samples=4000, seed=2).passed


@pytest.mark.parametrize("mutant", ["M28", "M29", "M30"])
def test_block_mutants_fail_on_the_block_targeted_case(mutant: str) -> None:
    """Each planted block bug fails a check on the targeted block case at 2000 trials (alpha 1e-6 per
    statistical verdict), where the walk passes every check."""
    batch = dict(targeted_batches(("block",)))["block: block"]
    verdicts = run_checks(Blind(MUTANTS[mutant].load()), batch, num_samples=2000, seed=4)
    assert any(v.failed for v in verdicts), [v.message for v in verdicts]
    assert not any(v.failed for v in run_checks(WalkSampler(), batch, num_samples=2000, seed=4))
