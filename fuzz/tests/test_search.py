"""The search: budgets kept, trials where they pay (screen, then confirm on fresh trials), coverage."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from specsample.fuzz import budget
from specsample.fuzz.budget import CostModel
from specsample.fuzz.campaign import (
    CONFIRM_SEED,
    GRACE,
    SCREEN_LEVEL,
    _stages,
    _suspicious,
    run_campaign,
)
from specsample.fuzz.coverage import Coverage, temperature_bucket
from specsample.fuzz.mutants import MUTANTS
from specsample.fuzz.reproducer import load_reproducer
from specsample.fuzz.selftest import Blind
from specsample.properties import profiles
from specsample.properties.checks import CHECKS, discrepancy, run_checks
from specsample.properties.checks.poison import poisoned
from specsample.reference.contract import Capabilities, RequestData, SpecBatch, SpecOutput, make_batch
from specsample.reference.walk import WalkSampler


def _batch(seed: int = 0) -> object:
    rng = np.random.default_rng(seed)
    return make_batch(
        [
            RequestData(rng.normal(size=(3, 12)), [1, 4], rng.normal(size=(2, 12)), temperature=1.0, seed=5),
            RequestData(rng.normal(size=(2, 12)), [7], rng.normal(size=(1, 12)), temperature=0.7, seed=6),
        ]
    )


# ---------------------------------------------------------------------------------------------
# Budgets


@pytest.mark.parametrize("spec", ["walk", "M09"])
def test_a_campaign_ends_within_its_budget_plus_grace(spec: str) -> None:
    """A 6 s campaign (targeted cases, search, and for the mutant, when it finds it, a confirmation
    and shrinking) ends within 6 s plus `GRACE` of it, or one run of the checks past that (the run in
    flight at the deadline, sized to fit but slower than the cost model measured: seen at 1.2 s on a
    loaded 2-core machine), plus half a second for drawing the last example."""
    variant = Blind(MUTANTS[spec].load()) if spec in MUTANTS else Blind(WalkSampler())
    start = time.monotonic()
    result = run_campaign(variant, spec, profile="ci", seconds=6.0, progress=False)
    elapsed = time.monotonic() - start
    in_flight = min(result.longest_run, 6.0 / 2)  # a run longer than half the budget is a failure here
    assert elapsed <= 6.0 * (1 + GRACE) + in_flight + 0.5, (
        f"{spec}: {elapsed:.1f} s ({result.longest_run:.1f} s run)"
    )
    assert result.seconds <= elapsed
    if spec == "walk":  # false-failure rate <= its confirmations x 1e-6
        assert result.failure is None, result.describe()
    # Whether 6 s find M09 depends on the trials the time buys (a suspicious screen may clear at its
    # confirmation; seen once in CI): finding it is the 30 s test's claim below, the budget this one's.


def test_trials_are_sized_to_the_time_left() -> None:
    """The cost model separates the cost that grows with the trials from the cost that does not, and
    gives a larger batch fewer trials for the same time, never more than wanted."""
    cost = CostModel()
    small, large = _batch(), make_batch([RequestData(np.zeros((5, 4000)), [1] * 4, np.zeros((4, 4000)))])
    assert cost.trials_within(1.0, small, 500) == budget.FIRST_SCREEN_TRIALS  # nothing measured yet
    # Runs of 0.2 s fixed plus 0.01 s per trial on the small batch.
    for trials in (10, 50, 100):
        cost.record(0.2 + 0.01 * trials, trials, small)
    assert cost.trials_within(float("inf"), small, 500) == 500
    assert cost.trials_within(10.0, small, 500) == 500
    assert cost.trials_within(1.2, small, 500) == pytest.approx(100, abs=1)
    assert cost.trials_within(0.1, small, 500) == 0  # less than the fixed cost
    assert cost.seconds_for(small, 100) == pytest.approx(1.2)
    assert cost.trials_within(1.2, large, 500) < 2


def test_of_several_probes_the_cheapest_per_unit_of_work_stands() -> None:
    """`CostModel.estimate`: a stalled probe (10x slower) never replaces a cheaper one, a cheaper one
    replaces it, and the cost per unit of work decides between batches of different sizes."""
    small, large = _batch(), make_batch([RequestData(np.zeros((5, 4000)), [1] * 4, np.zeros((4, 4000)))])
    cost = CostModel()
    cost.estimate(1.0, 32, small)
    cost.estimate(10.0, 32, small)  # stalled
    assert cost.seconds_for(small, 32) == pytest.approx(1.0)
    cost.estimate(0.5, 32, small)
    assert cost.seconds_for(small, 32) == pytest.approx(0.5)
    ratio = budget.work_of(large) / budget.work_of(small)
    cost.estimate(0.6 * ratio, 32, large)  # dearer per unit of work than 0.5 on the small batch
    assert cost.seconds_for(small, 32) == pytest.approx(0.5)
    cost.estimate(0.4 * ratio, 32, large)
    assert cost.seconds_for(small, 32) == pytest.approx(0.4)
    assert len(cost.runs) == 1


class _StallsWhileProbed(Blind):
    """The walk, with the machine stalled for 60 ms during each timed probe call of the first batch
    (its calls 2 and 3; a call takes about 1 ms): what a loaded 2-core runner does to one probe."""

    def __init__(self) -> None:
        super().__init__(WalkSampler())
        self.calls = 0

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        self.calls += 1
        if self.calls in (2, 3):
            time.sleep(0.06)
        return self.inner(batch)


def test_a_stall_during_the_probe_does_not_skip_every_batch() -> None:
    """A 3 s search whose first probe is stalled still screens batches: the probe keeps its fastest
    call, and until a screen has run each batch is probed again. (With the first probe's one timed
    call trusted, a 30 ms stall left that campaign nothing to screen: inconclusive, and
    `certify --cluster`'s walk with it, seen once in CI.) The walk is correct: it fails with
    probability at most the campaign's 1e-5."""
    variant = _StallsWhileProbed()
    result = run_campaign(variant, "walk", profile="ci", seconds=3.0, targeted=False, progress=False)
    assert result.screened >= 1, result.describe()
    assert result.failure is None, result.describe()


# ---------------------------------------------------------------------------------------------
# Screen, then confirm


def test_suspicion_is_bonferroni_adjusted_and_confirmation_stages_grow() -> None:
    """A check is suspicious when k times its p-value is below the screen level (k statistical
    verdicts); exact verdicts do not count. Stages grow to the full trials."""
    verdicts = run_checks(WalkSampler(), _batch(), num_samples=50, seed=1)
    statistical = [v for v in verdicts if v.pvalue is not None]
    k = len(statistical)
    assert k >= 3 and len(verdicts) > k
    first = verdicts.index(statistical[0])

    def with_pvalues(first_p: float, others: float) -> list:  # type: ignore[type-arg]
        return [
            v if v.pvalue is None else dataclasses.replace(v, pvalue=first_p if i == first else others)
            for i, v in enumerate(verdicts)
        ]

    assert _suspicious(with_pvalues(0.9 * SCREEN_LEVEL / k, 1.0)) == [statistical[0].check]
    assert not _suspicious(with_pvalues(1.1 * SCREEN_LEVEL / k, 1.1 * SCREEN_LEVEL / k))
    assert _stages(200, 4000) == [800, 4000]
    assert _stages(1500, 4000) == [4000]


def test_screens_of_a_correct_sampler_are_rarely_suspicious() -> None:
    """Under the walk, a screen is suspicious (Bonferroni-adjusted p < 0.01) at most about 1 time in
    100: over 300 screens of 60 trials, the count stays within the binomial(300, 0.01) bound at 1e-6
    (14). A screen that flagged 1 batch in 10 (a Bonferroni factor missing, say) would exceed that
    bound with probability above 0.999."""
    batch = _batch(3)
    screens = 300
    suspicious = sum(
        bool(_suspicious(run_checks(WalkSampler(), batch, num_samples=60, seed=seed)))
        for seed in range(screens)
    )
    bound = int(scipy_stats.binom.isf(1e-6, screens, SCREEN_LEVEL))
    assert suspicious <= bound, f"{suspicious} of {screens} screens suspicious"
    assert scipy_stats.binom.cdf(bound, screens, 0.1) < 1e-3


def test_a_statistical_failure_comes_from_a_confirmation_on_fresh_trials(tmp_path: Path) -> None:
    """M09 fails a statistical check within a 30 s campaign (plus `GRACE`, as above); the reproducer
    holds a confirmation stage's seed and trials, and replays to the same verdict. Measured on the
    2-core machine with one core kept busy: 30 s campaigns found M09 in 12 of 12 runs (6 s ones in 13
    of 22, where the screens get fewer trials; idle, 26 of 26)."""
    start = time.monotonic()
    result = run_campaign(
        Blind(MUTANTS["M09"].load()), "M09", profile="ci", seconds=30.0, corpus=tmp_path, progress=False
    )
    elapsed = time.monotonic() - start
    in_flight = min(result.longest_run, 30.0 / 2)
    assert elapsed <= 30.0 * (1 + GRACE) + in_flight + 0.5, f"{elapsed:.1f} s ({result.longest_run:.1f} s)"
    assert result.failure is not None and result.failure.pvalue is not None, result.describe()
    assert result.confirmations >= 1
    assert result.reproducer is not None
    reproducer = load_reproducer(result.reproducer)
    assert reproducer.seed >= CONFIRM_SEED  # a confirmation's seed, never a screen's
    replayed = CHECKS[reproducer.check].run(
        Blind(MUTANTS["M09"].load()),
        reproducer.batch,
        num_samples=reproducer.num_samples,
        alpha=reproducer.alpha,
        seed=reproducer.seed,
    )
    assert replayed.failed and replayed.pvalue == pytest.approx(result.failure.pvalue)


def test_discrepancy_of_a_correct_sampler_is_comparable_across_batches() -> None:
    """Under the walk, P(discrepancy > s) <= 10**-s whatever the batch: over 60 screens of two batch
    shapes, none scores above 3 + log10(60) (probability at most 1e-3 under the bound)."""
    scores = [
        discrepancy(run_checks(WalkSampler(), _batch(b), num_samples=60, seed=seed))
        for b in (0, 1)
        for seed in range(30)
    ]
    assert max(scores) < 3 + np.log10(60)


# ---------------------------------------------------------------------------------------------
# New bug classes: steps, uninitialised memory, precision


def test_a_sampler_that_ignores_the_step_fails_the_steps_check_only() -> None:
    """M24 draws the same uniforms at every step: the law checks (seeds varied) pass; steps fails."""
    m24 = Blind(MUTANTS["M24"].load())
    verdicts = {v.check: v for v in run_checks(m24, _batch(), num_samples=400, seed=2)}
    assert verdicts["steps"].failed, verdicts["steps"].message
    assert not verdicts["law_of_y"].failed and not verdicts["law_of_m"].failed
    correct = CHECKS["steps"].run(WalkSampler(), _batch(), num_samples=400, seed=2)
    assert correct.passed, correct.message
    assert correct.detectable is not None and correct.detectable.unit == "total variation"


def test_poisoned_allocations_differ_between_the_two_calls_and_are_restored() -> None:
    """torch.empty and its kin come filled with a different pattern in each block, then are restored,
    even when the block raises."""
    original = torch.empty
    with poisoned(0):
        a = torch.empty(4, dtype=torch.int64)
        b = torch.zeros(2).new_empty(3)
    with poisoned(1):
        c = torch.empty(4, dtype=torch.int64)
        d = torch.empty_like(torch.zeros(3))
    assert (a != c).all() and torch.isnan(b).all() and (d == 0.5).all()
    with pytest.raises(RuntimeError), poisoned(0):
        raise RuntimeError("inside")
    assert torch.empty is original


def test_output_read_from_uninitialised_memory_fails_determinism() -> None:
    """M25 leaves the padding after num_emitted unwritten: under the two poisons the outputs differ."""
    verdict = CHECKS["determinism"].run(Blind(MUTANTS["M25"].load()), _batch(), num_samples=8, seed=0)
    assert verdict.failed, verdict.message
    assert CHECKS["determinism"].run(WalkSampler(), _batch(), num_samples=8, seed=0).passed


@pytest.mark.parametrize("mutant", ["M26", "M27"])
def test_precision_mutants_fail_on_their_targeted_shapes(mutant: str) -> None:
    """M26 (no max subtraction) dies at a tiny temperature; M27 (fp32 probabilities declared as log
    space) on drafts below float32's normal range."""
    from specsample.fuzz.targeted import targeted_batches

    variant = Blind(MUTANTS[mutant].load())
    if mutant == "M26":
        rng = np.random.default_rng(4)
        batch = make_batch([RequestData(rng.normal(size=(2, 20)) * 3, [5], rng.normal(size=(1, 20)), 1e-3)])
    else:
        batch = dict(targeted_batches(("probabilistic",)))["probabilistic: underflow"]
    verdicts = run_checks(variant, batch, num_samples=300, seed=1)
    assert any(v.failed for v in verdicts), [v.message for v in verdicts]
    assert not any(v.failed for v in run_checks(WalkSampler(), batch, num_samples=300, seed=1))


# ---------------------------------------------------------------------------------------------
# Coverage


def test_coverage_counts_buckets_and_names_what_was_missed() -> None:
    """Each dimension counts its buckets; buckets never reached are listed, and only possible ones."""
    coverage = Coverage.of(profiles.get("ci"), Capabilities(methods=("probabilistic",)))
    assert coverage.possible["methods"] == ["probabilistic"]
    coverage.observe(
        {
            "method": "probabilistic",
            "vocab_size": 4097,
            "dtype": "float32",
            "layout": "flat",
            "placeholders": False,
            "requests": [
                {"family": "peaked", "temperature": 0.0, "num_drafts": 0},
                {"family": "tiny", "temperature": 1e-30, "num_drafts": 3},
            ],
        }
    )
    missing = coverage.missing()
    assert "methods" not in missing and "families" in missing and "peaked" not in missing["families"]
    assert missing["temperatures"] == ["cold", "about 1", "hot", "huge"]
    assert "4097" not in missing["vocabulary at a block edge"]
    assert coverage.counts["drafts per request"]["0"] == 1
    assert temperature_bucket(1.0) == "about 1" and temperature_bucket(1e4) == "huge"
    text = "\n".join(coverage.lines())
    assert "Not covered:" in text and "families:" in text
    json.dumps(coverage.summary())


def test_coverage_counts_block_verification_where_a_sampler_has_it() -> None:
    """Block verification is a bucket of the methods dimension for a sampler that implements it (the
    default capabilities, the walk's) and none for one that does not (the PyTorch sampler's)."""
    from specsample.kernels.torch_sampler import TorchRejectionSampler

    coverage = Coverage.of(profiles.get("ci"), Capabilities())
    assert "block" in coverage.possible["methods"]
    assert "block" in coverage.missing()["methods"]
    coverage.observe(
        {
            "method": "block",
            "vocab_size": 20,
            "dtype": "float32",
            "layout": "flat",
            "placeholders": True,
            "requests": [{"family": "zipf", "temperature": 1.0, "num_drafts": 4}],
        }
    )
    assert coverage.counts["methods"]["block"] == 1 and "block" not in coverage.missing().get("methods", [])
    torch_sampler = Coverage.of(profiles.get("ci"), TorchRejectionSampler.capabilities)
    assert "block" not in torch_sampler.possible["methods"]


def test_a_campaign_reports_its_coverage() -> None:
    """A short search campaign's result holds the coverage of the batches it checked."""
    result = run_campaign(WalkSampler(), "walk", profile="ci", seconds=4.0, targeted=False, progress=False)
    assert result.coverage is not None and result.coverage.batches == result.screened > 0
    assert result.summary()["coverage"]["batches"] == result.screened  # type: ignore[index]


def test_the_search_only_self_test_from_the_command_line(tmp_path: Path) -> None:
    """`mutants --no-targeted` runs the search alone and records when each mutant died."""
    from specsample.fuzz.cli import EXIT_PASSED, main

    out = tmp_path / "search.json"
    argv = ["mutants", "M03", "M24", "--no-targeted", "--budget", "20", "--profile", "ci", "--device", "cpu"]
    assert main([*argv, "--json", str(out)]) == EXIT_PASSED
    records = {r["id"]: r for r in json.loads(out.read_text())}
    assert records["M24"]["check"] in MUTANTS["M24"].expected  # steps, or step_pairs: pairs drawn alike
    for record in records.values():
        assert record["killed"] and record["batches"] >= 1
        assert 0.0 <= record["found_after"] <= 20.0
