"""M31 (streams repeated across steps) and M32 (a degenerate draft row misread): what kills them."""

from __future__ import annotations

import numpy as np
import torch

from specsample.fuzz.mutants import MUTANTS
from specsample.fuzz.selftest import Blind
from specsample.fuzz.targeted import targeted_batches
from specsample.properties.checks import run_checks
from specsample.reference.contract import RequestData, make_batch
from specsample.reference.walk import WalkSampler

# Every verdict below has false-failure rate 1e-6. At 2,000 trials per request the law of m detects a
# shift of 0.07-0.1 in any P(m = j) and step_pairs a total variation of 0.10-0.15 on a request's coarse
# pair law (power 0.999); the bugs here move them far more than that.
TRIALS = 2000


def test_m31_passes_every_check_but_step_pairs() -> None:
    """M31 (FastDeploy #5568's class) draws every step from the exact law: the law checks and steps pass
    it on the synthetic targeted case, and step_pairs kills it there."""
    batch = dict(targeted_batches(("synthetic",)))["synthetic: synthetic"]
    verdicts = {
        v.check: v for v in run_checks(Blind(MUTANTS["M31"].load()), batch, num_samples=TRIALS, seed=1)
    }
    assert verdicts["step_pairs"].failed, verdicts["step_pairs"].message
    survivors = [v for name, v in verdicts.items() if name != "step_pairs"]
    assert all(v.passed for v in survivors), [v.message for v in survivors if not v.passed]


def test_m32_is_the_walk_on_batches_without_a_mixed_request() -> None:
    """Without a request that holds a draft row equal to its target row beside an ordinary one, M32
    emits what the walk emits, draw for draw (so even the coupled check passes it): here every row of
    one request equals its target row, and no row of the other does."""
    rng = np.random.default_rng(4)
    same = rng.normal(size=(3, 16))
    batch = make_batch(
        [RequestData(same, [3, 5], same[:2].copy(), temperature=0.8, seed=s) for s in range(200)]
        + [
            RequestData(rng.normal(size=(3, 16)), [7, 2], rng.normal(size=(2, 16)), 1.0, seed=s)
            for s in range(200)
        ]
    )
    mutant, walk = MUTANTS["M32"].load()(batch), WalkSampler()(batch)
    assert torch.equal(mutant.token_ids, walk.token_ids) and torch.equal(mutant.num_emitted, walk.num_emitted)


def test_m32_dies_on_a_degenerate_row_beside_ordinary_ones() -> None:
    """On the targeted batch whose request holds a row equal to its target row beside ordinary ones,
    M32 accepts the ordinary first draft every time: the law of m kills it blind, and the coupled
    check kills it where it declares the canonical scheme."""
    batch = dict(targeted_batches(("probabilistic",)))["probabilistic: zero-mass drafts"]
    blind = {v.check: v for v in run_checks(Blind(MUTANTS["M32"].load()), batch, num_samples=TRIALS, seed=2)}
    assert blind["law_of_m"].failed and blind["law_of_m"].request == 2, blind["law_of_m"].message
    coupled = run_checks(MUTANTS["M32"].load(), batch, checks=("coupled",), num_samples=50, seed=2)
    assert coupled[0].failed, coupled[0].message
