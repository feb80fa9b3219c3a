"""What checking costs: the campaign's cost model (`CostModel`), and a sampler's throughput for certify."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specsample.fuzz.progress import Progress
from specsample.properties.batching import on_device, select_requests
from specsample.properties.checks import CHECKS
from specsample.reference.contract import SpecBatch, Variant

# Before anything is measured, a search batch is screened with at most this many trials.
FIRST_SCREEN_TRIALS = 64


def work_of(batch: SpecBatch) -> float:
    """The logits one trial of every request of ``batch`` gathers (64 at least per row)."""
    rows = int(batch.target_logits.shape[0]) * (2 if batch.draft_logits is not None else 1)
    return float(rows * max(batch.vocab_size, 64))


@dataclass
class CostModel:
    """What checking a batch costs, learned from the runs so far: ``seconds = (a + b * t) * work``.

    ``work`` is the logits one trial of every request gathers (`work_of`), ``t`` the trials per
    request. ``a`` is what does not grow with the trials (the exact law, the invariance checks' few
    calls; it dominates for a fast sampler on a GPU), ``b`` what does (the sampler's calls, the
    counting; it dominates for a Python sampler). Both are fitted by least squares on the runs seen,
    each kept at least zero; a run's estimate is never below what it would cost at the mean rate.
    """

    runs: list[tuple[float, float, float]] = field(default_factory=list)  # (work, trials, seconds)

    def record(self, seconds: float, trials: int, batch: SpecBatch) -> None:
        """Learn from a run of ``trials`` per request on ``batch`` that took ``seconds``."""
        self.runs.append((work_of(batch), float(trials), seconds))

    def estimate(self, seconds: float, trials: int, batch: SpecBatch) -> None:
        """Before any run: what a run of ``trials`` on ``batch`` would take, from a probe; of several
        probes the cheapest per unit of work stands (a stall of the machine inflates one probe, never
        deflates it). An estimate is only ever the model's one entry: `record` a run after it."""
        run = (work_of(batch), float(trials), seconds)
        if not self.runs or run[2] / run[0] < self.runs[0][2] / self.runs[0][0]:
            self.runs[:] = [run]

    def coefficients(self) -> tuple[float, float]:
        """``(a, b)``, fitted to the runs (per unit of work, and per trial and unit of work)."""
        work, trials, seconds = np.array(self.runs, dtype=float).reshape(-1, 3).T
        design = np.stack([work, work * trials], axis=1)
        if len(self.runs) >= 2 and np.ptp(trials) > 0:
            (a, b), *_ = np.linalg.lstsq(design, seconds, rcond=None)
            if a >= 0 and b >= 0:
                return float(a), float(b)
        per_trial = float(seconds.sum() / (work * (trials + 1)).sum())  # one rate for both
        return per_trial, per_trial

    def seconds_for(self, batch: SpecBatch, trials: int) -> float:
        """About how long the checks of ``batch`` take at ``trials`` per request."""
        a, b = self.coefficients()
        return (a + b * trials) * work_of(batch)

    def trials_within(self, seconds: float, batch: SpecBatch, wanted: int) -> int:
        """The trials per request, at most ``wanted``, whose checks of ``batch`` take about ``seconds``."""
        if not math.isfinite(seconds):
            return wanted
        if not self.runs:
            return min(wanted, FIRST_SCREEN_TRIALS)
        a, b = self.coefficients()
        work = work_of(batch)
        spare = seconds / work - a
        if spare <= 0:
            return 0
        return min(wanted, int(spare / max(b, 1e-15)))


@dataclass(frozen=True)
class Throughput:
    """What a sampler's call of every batch together costs, measured after its first (compiling) call:
    a fixed part and a part per trial per request; and the trials per request that fit the budget (at
    most the ones wanted). A sampler that pays per call rather than per element (a Triton kernel under
    the CPU interpreter, whose launch takes whole rows at once) costs far less per trial at the
    checks' thousands of trials than at the probe's tens."""

    seconds_per_trial: float
    trials: int
    seconds_per_call: float = 0.0

    def seconds_for(self, trials: int) -> float:
        """About how long the checks' sampler calls take at ``trials`` per request."""
        return CALLS_PER_CHECK_RUN * (self.seconds_per_call + trials * self.seconds_per_trial)

    def per_trial(self, trials: int) -> float:
        """Seconds per trial of every batch at ``trials`` per request, the fixed part shared."""
        return self.seconds_per_trial + self.seconds_per_call / max(trials, 1)


# Each run of the checks draws the shared trials once, and each check's own trials beyond them
# (marginal, steps, step_pairs' partners: `Check.trial_calls`): calls' worth of trials per run.
CALLS_PER_CHECK_RUN = 1.0 + sum(c.trial_calls for c in CHECKS.values())
# `affordable_samples` times its probe this many times and keeps the fastest.
PROBE_REPEATS = 2
# Where fewer trials than wanted would fit at the probe's cost per trial, a second probe this many
# times larger separates the fixed part of a call from the part per trial, if it costs at most
# SECOND_PROBE_SHARE of the budget at the first probe's rate.
SECOND_PROBE_FACTOR = 4
SECOND_PROBE_SHARE = 0.1


def affordable_samples(
    variant: Variant,
    batches: Sequence[SpecBatch],
    wanted: int,
    seconds: float,
    device: str = "cpu",
    floor: int = 32,
    probe_trials: int = 64,
    progress: bool = False,
) -> Throughput:
    """The trial count, at most ``wanted``, whose calls on ``batches`` fit in about ``seconds``.

    Each batch is called once untimed (the first call compiles), then the cost is measured with one
    call of ``min(wanted, probe_trials)`` trials of each batch, the size the checks' calls come in,
    twice: the faster of the two counts, so that a stall of the machine during one (on a shared
    2-core runner, a second of timing is easily cut by a third) does not cut the trials. Where that
    cost per trial would afford fewer trials than wanted, one more call of `SECOND_PROBE_FACTOR`
    times the trials (if it costs at most `SECOND_PROBE_SHARE` of ``seconds``) separates a call's
    fixed cost from its cost per trial, and the trials are sized from both. A fast sampler gets
    ``wanted``; a slow one (a Python sampler, or a Triton kernel under the CPU interpreter on large
    rows) gets fewer trials, never fewer than ``floor``. A batch the sampler raises on is left out of
    the measure (the checks report the error).
    """
    trials = max(1, min(wanted, probe_trials))
    name = getattr(variant, "name", type(variant).__name__)
    with Progress(
        f"{name}: warm-up, then {trials} trials timed twice",
        (1 + PROBE_REPEATS) * len(batches),
        "calls",
        enabled=progress,
    ) as bar:
        usable = []
        for batch in batches:
            bar.update()
            try:
                variant(on_device(batch, device))
            except Exception:  # the checks call it again and report the error as the variant's
                continue
            usable.append(batch)
        bar.update(len(batches) - len(usable))

        def timed(count: int) -> float:
            start = time.monotonic()
            for batch in usable:
                index = np.repeat(np.arange(batch.num_requests), count)
                variant(select_requests(on_device(batch, device), index, seed=np.arange(index.size)))
                bar.update()
            if device.startswith("cuda"):
                import torch

                torch.cuda.synchronize()
            bar.update(len(batches) - len(usable))
            return time.monotonic() - start

        first = min(timed(trials) for _ in range(PROBE_REPEATS))
        throughput = Throughput(first / trials, 0)
        larger = min(wanted, SECOND_PROBE_FACTOR * trials)
        affordable_second = larger * throughput.seconds_per_trial <= SECOND_PROBE_SHARE * seconds
        if _affordable(throughput, seconds) < wanted and larger > trials and affordable_second:
            # (The bar, sized for the first probe, stays full.)
            second = timed(larger)
            per_trial = min(first / trials, max(0.0, (second - first) / (larger - trials)))
            throughput = Throughput(per_trial, 0, max(0.0, first - per_trial * trials))
    affordable = _affordable(throughput, seconds)
    return Throughput(
        throughput.seconds_per_trial,
        max(min(floor, wanted), min(wanted, affordable)),
        throughput.seconds_per_call,
    )


def _affordable(throughput: Throughput, seconds: float) -> int:
    """The most trials per request whose checks' calls take at most ``seconds`` at ``throughput``."""
    spare = seconds / CALLS_PER_CHECK_RUN - throughput.seconds_per_call
    return max(0, int(spare / max(throughput.seconds_per_trial, 1e-12)))
