"""The planted tree-verification bugs (M41-M46): the checks kill each one on its targeted tree case,
blind, and the walk and the SGLang-layout example pass the same cases."""

from __future__ import annotations

import pytest

from specsample.examples.sglang_tree_adapter import SglangKernelAsShipped, SglangTreeAdapter
from specsample.fuzz.mutants import MUTANTS
from specsample.fuzz.selftest import Blind
from specsample.fuzz.targeted import targeted_batches
from specsample.properties.checks import run_checks
from specsample.reference.contract import Capabilities, SpecBatch
from specsample.reference.walk import WalkSampler

# Every statistical verdict below holds alpha 1e-6 (Holm over its tests) and states the total
# variation it detects with power 0.999 (about 0.14 on the joint law at 2000 trials).
TRIALS = 2000
# (mutant, the targeted tree case built for it, the checks expected to fail it).
KILLS = [
    ("M41", "tree", {"law_of_y"}),
    ("M42", "wide tree", {"invariants", "law_of_m"}),
    ("M43", "tree", {"invariants", "law_of_m"}),
    ("M44", "ragged trees", {"invariants", "law_of_m"}),
    ("M45", "tree", {"law_of_m", "law_of_y"}),
    ("M46", "tree", {"law_of_m"}),
]


def _case(name: str) -> SpecBatch:
    """The targeted tree case ``name``."""
    return dict(targeted_batches(("tree",), Capabilities(methods=("tree",))))[f"tree: {name}"]


@pytest.mark.parametrize(("mutant", "case", "expected"), KILLS)
def test_each_tree_bug_fails_its_targeted_case(mutant: str, case: str, expected: set[str]) -> None:
    """Each planted tree bug fails its expected checks on the tree case built for it, blind (no
    coupled check), at 2000 trials."""
    verdicts = run_checks(Blind(MUTANTS[mutant].load()), _case(case), num_samples=TRIALS, seed=6)
    failed = {v.check for v in verdicts if v.failed}
    assert expected <= failed, [v.message for v in verdicts]


@pytest.mark.parametrize("case", ["tree", "wide tree", "ragged trees"])
def test_correct_tree_samplers_pass_the_tree_cases(case: str) -> None:
    """The walk (coupled included) and the SGLang-layout adapter pass every check on each tree case
    (1000 trials: no false failure at alpha 1e-6 a verdict)."""
    batch = _case(case)
    for sampler in (WalkSampler(), SglangTreeAdapter()):
        verdicts = run_checks(sampler, batch, num_samples=1000, seed=6)
        assert verdicts and not any(v.failed for v in verdicts), [v.message for v in verdicts if v.failed]


def test_sglangs_kernel_as_shipped_fails_on_repeated_sibling_tokens() -> None:
    """SGLang's kernel counts a repeated sibling token once per copy (and accepts at a zero coin): on the
    tree case, whose node 1 has two children of one token, it over-accepts that token, which the
    invariants (the second copy accepted) and the law of the stop node see."""
    verdicts = run_checks(SglangKernelAsShipped(), _case("tree"), num_samples=TRIALS, seed=6)
    failed = {v.check for v in verdicts if v.failed}
    assert {"invariants", "law_of_m"} <= failed, [v.message for v in verdicts]
    invariants = next(v for v in verdicts if v.check == "invariants")
    assert "not the first of its siblings with its token" in invariants.message
