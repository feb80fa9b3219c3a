"""The throughput probe that sizes a variant's trials (`fuzz.budget.affordable_samples`)."""

from __future__ import annotations

import time

import numpy as np

from specsample.fuzz import budget
from specsample.reference.contract import RequestData, SpecBatch, make_batch


def _batch() -> SpecBatch:
    rng = np.random.default_rng(0)
    return make_batch([RequestData(rng.normal(size=(2, 8)), [3], rng.normal(size=(1, 8)))])


class _StallsOnce:
    """A sampler whose first timed call stalls for ``stall`` seconds, as on a busy shared machine."""

    name = "stalls-once"

    def __init__(self, stall: float) -> None:
        self.stall = stall
        self.calls = 0

    def __call__(self, batch: SpecBatch) -> None:
        self.calls += 1
        if self.calls == 2:  # the warm-up is call 1
            time.sleep(self.stall)


def test_a_stall_during_one_probe_does_not_cut_the_trials() -> None:
    """The probe is timed twice and the faster counts: a 1-second stall in the first timing, which
    alone would afford 12 s / (3 calls a run x 1 s / 64 trials) = 256 trials, leaves the full 2000."""
    sampler = _StallsOnce(stall=1.0)
    throughput = budget.affordable_samples(sampler, [_batch()], wanted=2000, seconds=12.0)
    assert sampler.calls == 1 + budget.PROBE_REPEATS
    assert throughput.trials == 2000
    assert throughput.seconds_per_trial < 1.0 / 64


def test_a_slow_sampler_still_gets_fewer_trials() -> None:
    """A sampler slow per trial in every timing is measured so, by both probes: at 0.2 s a call of 64
    trials (0.8 s at 256), 12 s afford at most 12 / (3.x calls a run x 0.2 s / 64 trials) trials."""

    def slow(batch: SpecBatch) -> None:
        time.sleep(0.2 * batch.num_requests / 64)

    throughput = budget.affordable_samples(slow, [_batch()], wanted=2000, seconds=12.0)
    expected = int(12.0 / (budget.CALLS_PER_CHECK_RUN * 0.2 / 64))
    assert throughput.seconds_per_trial >= 0.9 * 0.2 / 64
    assert throughput.trials < 2000 and throughput.trials <= expected


class _PaysPerCall:
    """A sampler that pays ``fixed`` seconds a call and ``per_trial`` a trial of its batch, as a kernel
    under the CPU interpreter pays per operation whatever the rows of its launch."""

    name = "pays-per-call"

    def __init__(self, fixed: float, per_trial: float) -> None:
        self.fixed, self.per_trial = fixed, per_trial

    def __call__(self, batch: SpecBatch) -> None:
        time.sleep(self.fixed + self.per_trial * batch.num_requests)


def test_a_sampler_that_pays_per_call_gets_the_trials_it_affords() -> None:
    """At 0.25 s a call plus 0.1 ms a trial, 64 trials cost 0.26 s (4 ms a trial: 12 s would afford
    about 12 / (3.x calls a run x 4 ms) < 1000 trials), but 2000 trials cost 0.45 s a call: the second
    probe, 256 trials, separates the two parts and the full 2000 fit."""
    sampler = _PaysPerCall(fixed=0.25, per_trial=1e-4)
    naive = int(12.0 / (budget.CALLS_PER_CHECK_RUN * (0.25 + 64e-4) / 64))
    assert naive < 2000
    throughput = budget.affordable_samples(sampler, [_batch()], wanted=2000, seconds=12.0)
    assert throughput.trials == 2000
    assert throughput.seconds_per_call > 0.2
    assert throughput.seconds_for(2000) < 12.0
    # Its cost at 2000 trials is read off both parts, not the probe's rate.
    assert throughput.per_trial(2000) < 0.5 / 2000
