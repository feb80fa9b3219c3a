"""A fuzz campaign: targeted cases first, then Hypothesis-driven search steered toward discrepancies.

Trials go where they pay. Every batch is screened: the property checks of `properties.checks` run
with few trials (fewer for a larger batch, so that a minute sees many batches). An exact check that
fails (no false failures) fails the campaign at once. A batch whose Bonferroni-adjusted smallest
p-value is below `SCREEN_LEVEL` is suspicious and is confirmed group-sequentially: the suspicious
checks run again on fresh trials, `CONFIRM_FACTOR` times the screen's and then the profile's full
ones. A statistical failure is only ever reported from a confirmation stage, and each stage is tested
at the level its campaign's `ErrorBudget` grants it: the levels of every stage of every worker sum to
at most the campaign's stated false-failure rate (default `FALSE_FAILURE_RATE`), however many screens,
confirmations and workers it runs. `hypothesis.target` steers the search on the screen's
Bonferroni-adjusted discrepancy, comparable across batches.

The first failure stops the campaign, is shrunk by Hypothesis to a minimal batch (unless shrinking
is off) until the budget's grace runs out, and is written as a reproducer. Random choices inside the
checks derive from a seed drawn with the case, so a failure replays exactly. Trials are sized to the
time left (`fuzz.budget.CostModel`) and every call to the device's free memory, so a campaign ends within its
budget plus `GRACE` of it, or one screen past it. At the end it reports what its batches covered
(`fuzz.coverage`).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)
from hypothesis.errors import Flaky

from specsample.fuzz.budget import CALLS_PER_CHECK_RUN, PROBE_REPEATS, CostModel
from specsample.fuzz.coverage import Coverage
from specsample.fuzz.progress import Progress
from specsample.fuzz.reproducer import Reproducer, versions
from specsample.fuzz.targeted import targeted_batches
from specsample.properties import profiles, strategies
from specsample.properties.batching import on_device
from specsample.properties.checks import CHECKS, Verdict, discrepancy, run_checks
from specsample.properties.checks.base import EnvironmentProblem
from specsample.reference.contract import METHODS, SpecBatch, Variant, capabilities


@dataclass
class CampaignResult:
    """What a campaign saw: cases checked, screens and confirmations, the failure if any, coverage.

    Attributes:
        screen_trials: the trials per request of each screen (fewer for larger batches), one entry
            per batch checked (targeted cases and search batches alike).
        confirmations: confirmation stages run on suspicious batches (fresh trials, each at the level
            its `ErrorBudget` granted: it fails a correct sampler with probability at most that).
        skipped: search batches left out because the time left could not check them.
        unconfirmed: suspicious batches that no time was left to confirm.
        checks_passed: checks that passed in a confirmation's last stage.
        checks_inconclusive: suspicious batches or checks that no confirmation could settle at the
            profile's power in the time left.
        samples: variant outputs drawn.
        best_discrepancy: the largest `properties.checks.discrepancy` of a checked batch.
        found_after: seconds from the start until the failure was found (before shrinking).
        case: where the failure was found; ``reproducer`` the file written for it.
        verdicts: every full-power verdict.
        searched: search batches screened (the targeted cases not counted).
        search_wanted: whether the campaign was asked to search (a campaign that was, and screened no
            search batch, checked nothing it was asked for beyond the targeted cases: inconclusive).
        interrupted: the campaign was stopped by the user (Ctrl-C) before its budget ran out.
        longest_run: the longest single run of the checks, in seconds (what a budget overrun is due to).
        budget: the campaign's budget in seconds.
        alpha: the most one stage is granted (the profile's alpha).
        false_failure_rate: the campaign's false-failure budget: the probability that it fails a
            correct sampler, over every stage of every worker, is at most this.
        spent: what this campaign's confirmation stages were granted of it (a sum of levels).
        share: how the budget is shared: ``None`` for a campaign of one worker, else a phrase.
        stopped: another worker of the same campaign failed first, and this one stopped early.
    """

    variant: str
    screen_trials: list[int] = field(default_factory=list)
    confirmations: int = 0
    skipped: int = 0
    unconfirmed: int = 0
    checks_passed: int = 0
    checks_inconclusive: int = 0
    samples: int = 0
    best_discrepancy: float = 0.0
    seconds: float = 0.0
    found_after: float | None = None
    alpha: float = 0.0
    failure: Verdict | None = None
    case: str | None = None
    reproducer: Path | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    coverage: Coverage | None = None
    searched: int = 0
    search_wanted: bool = True
    interrupted: bool = False
    longest_run: float = 0.0
    budget: float = math.inf
    false_failure_rate: float = 0.0
    spent: float = 0.0
    share: str | None = None
    stopped: bool = False

    @property
    def screened(self) -> int:
        """Batches checked: each was screened, targeted cases and search batches alike."""
        return len(self.screen_trials)

    @property
    def status(self) -> str:
        """``"fail"`` when a check failed, else ``"inconclusive"`` when one lacked power, when the campaign
        checked nothing (no batch at all, or no search batch where a search was asked for) or was
        interrupted, else ``"pass"``."""
        if self.failure:
            return "fail"
        nothing = not self.screened or (self.search_wanted and not self.searched)
        return "inconclusive" if self.checks_inconclusive or nothing or self.interrupted else "pass"

    def overrun(self) -> str | None:
        """Why the campaign ran past its budget plus `GRACE`, or ``None`` when it did not."""
        if not math.isfinite(self.budget) or self.seconds <= self.budget * (1 + GRACE) + 1e-9:
            return None
        return (
            f"ran {self.seconds:.0f} s on a {self.budget:.0f} s budget: one run of the checks took "
            f"{self.longest_run:.0f} s (at least {FEWEST_TRIALS} trials per request of one batch), and a "
            "run is never cut short"
        )

    def _trial_range(self) -> dict[str, int]:
        """The fewest, median and most trials per request of the screens (0 before any)."""
        trials = self.screen_trials or [0]
        return {"min": min(trials), "median": int(np.median(trials)), "max": max(trials)}

    def describe(self) -> str:
        """One line: what ran, how fast, and the false-failure bound of the confirmations."""
        minutes = max(self.found_after or self.seconds, 1e-9) / 60  # the search's pace, not the shrinking
        trials = self._trial_range()
        return (
            f"{self.screened} cases ({self.screened} batches screened at {trials['min']} to {trials['max']} "
            f"trials per request, median {trials['median']}, "
            f"{self.screened / minutes:.0f} per minute; {self.false_failure()}; {self.skipped} "
            f"skipped for time), {self.checks_passed} checks passed at full power, "
            f"{self.checks_inconclusive} inconclusive, {self.samples} samples, best discrepancy "
            f"{self.best_discrepancy:.2f}, "
            f"{self.seconds:.0f} s"
        )

    def false_failure(self) -> str:
        """The campaign's false-failure statement: its budget, and what its confirmation stages spent."""
        share = f"; {self.share}" if self.share else ""
        return (
            f"false-failure rate <= {self.false_failure_rate:.2g} for the campaign ({self.confirmations} "
            f"confirmation stages on fresh trials spent {self.spent:.2g} of it{share})"
        )

    def inconclusive_reasons(self, most: int = 3) -> list[str]:
        """Why the campaign is inconclusive: the first inconclusive verdicts, and unconfirmed batches."""
        reasons = []
        if self.interrupted:
            reasons.append(f"interrupted after {self.seconds:.0f} s of a {self.budget:.0f} s budget")
        if not self.screened:
            reasons.append("no batch was checked: nothing inside the sampler's capabilities, or no time")
        elif self.search_wanted and not self.searched and not self.interrupted:
            reasons.append(
                f"no search batch was checked: the targeted cases took the budget ({self.seconds:.0f} s of "
                f"{self.budget:.0f}); a larger --budget gives the search its time"
            )
        reasons += [v.message for v in self.verdicts if v.status == "inconclusive"][:most]
        if self.unconfirmed:
            reasons.append(
                f"{self.unconfirmed} suspicious batches could not be confirmed in the time left: a larger "
                "--budget confirms them"
            )
        return reasons

    def summary(self) -> dict[str, object]:
        """JSON-ready summary."""
        return {
            "variant": self.variant,
            "status": self.status,
            "cases": self.screened,
            "screened": self.screened,
            "searched": self.searched,
            "interrupted": self.interrupted,
            "overrun": self.overrun(),
            "screen_trials": self._trial_range(),
            "confirmations": self.confirmations,
            "false_failure_rate": self.false_failure_rate,
            "spent": self.spent,
            "share": self.share,
            "stopped": self.stopped,
            "skipped": self.skipped,
            "unconfirmed": self.unconfirmed,
            "checks_passed": self.checks_passed,
            "checks_inconclusive": self.checks_inconclusive,
            "samples": self.samples,
            "best_discrepancy": self.best_discrepancy,
            "seconds": round(self.seconds, 2),
            "found_after": None if self.found_after is None else round(self.found_after, 2),
            "case": self.case,
            "failure": None if self.failure is None else asdict(self.failure),
            "reproducer": None if self.reproducer is None else str(self.reproducer),
            "coverage": None if self.coverage is None else self.coverage.summary(),
        }


@dataclass(frozen=True)
class Run:
    """One run of the checks on a batch: its verdicts, the settings that replay them, and (for a
    search batch) the trials of the screen and of each confirmation stage that led to it, and the
    levels those stages were granted (``levels[0]``, the screen's, is never a failure's)."""

    verdicts: list[Verdict]
    trials: int
    seed: int
    ladder: tuple[int, ...] = ()
    levels: tuple[float, ...] = ()

    @property
    def score(self) -> float:
        """The run's `properties.checks.discrepancy`."""
        return discrepancy(self.verdicts)

    @property
    def failure(self) -> Verdict | None:
        """The first failing verdict, if any."""
        return next((v for v in self.verdicts if v.failed), None)

    @property
    def exact_failure(self) -> Verdict | None:
        """The first failing verdict of an exact check (no false failures), if any."""
        return next((v for v in self.verdicts if v.failed and v.pvalue is None), None)


class _Found(Exception):
    """A failing run, raised inside a Hypothesis example so that Hypothesis shrinks the case."""

    def __init__(self, run: Run, batch: SpecBatch) -> None:
        assert run.failure is not None
        super().__init__(run.failure.message)
        self.run = run
        self.batch = batch


def _show(bar: Progress, result: CampaignResult, start: float) -> None:
    """The campaign's bar: seconds of the budget spent; batches (per minute), checks, best discrepancy."""
    elapsed = time.monotonic() - start
    bar.advance_to(
        elapsed,
        cases=result.screened,
        per_min=f"{result.screened / max(elapsed / 60, 1e-9):.0f}",
        confirmed=result.confirmations,
        inconclusive=result.checks_inconclusive,
        best=f"{result.best_discrepancy:.2f}",
    )


# A screened batch whose Bonferroni-adjusted smallest p-value is below this is confirmed with the
# profile's trials: under a correct sampler about one batch in a hundred is.
SCREEN_LEVEL = 0.01
# A confirmation's checks run with the case seed plus this (case seeds are below 2**31): fresh trials.
CONFIRM_SEED = 2**31
# The fewest trials per request a batch is checked with; a batch that cannot have them in the time
# left is skipped.
FEWEST_TRIALS = 32
# A campaign may run past its budget by this fraction of it: to confirm a suspicious batch, to shrink.
GRACE = 0.1
# A confirmation's first stage runs this many times the screen's trials (then the full trials):
# a batch screened at p = 0.01 has about this much more evidence at p = 1e-6.
CONFIRM_FACTOR = 4


# A campaign's false-failure rate unless it is given one: what every stage of every worker shares.
FALSE_FAILURE_RATE = 1e-5


@dataclass
class ErrorBudget:
    """A campaign's false-failure budget, granted one confirmation stage at a time.

    The campaign's stage ``j`` (``j = 1, 2, ...``, counted over all its workers) is tested at level
    ``min(cap, total / (j (j + 1)))``. Those levels sum to at most ``total`` however many stages run,
    so by the union bound the campaign fails a correct sampler with probability at most ``total``,
    whatever the number of screens, confirmations and workers. ``cap`` (the profile's alpha) keeps the
    first stages at the level a single check states its power at.

    Workers share ``total`` without talking to each other: worker ``worker`` of ``workers`` takes the
    stages ``j = worker + 1, worker + 1 + workers, ...``, so no two take the same ``j``. Where one
    process hands out ``j`` to every worker (a Ray campaign's coordinator), ``ledger`` is that call:
    the first stages then go to whoever confirms first.
    """

    total: float
    cap: float
    worker: int = 0
    workers: int = 1
    ledger: Callable[[], int] | None = None
    stages: int = 0
    spent: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.total < 1:
            raise ValueError(f"false_failure_rate is {self.total!r}; expected a probability in (0, 1)")
        if not 0 <= self.worker < self.workers:
            raise ValueError(f"worker is {self.worker!r}; expected 0 <= worker < workers = {self.workers}")

    def level(self, stage: int) -> float:
        """The level of the campaign's stage ``stage`` (1-based)."""
        return min(self.cap, self.total / (stage * (stage + 1)))

    def grant(self) -> float:
        """The level of this worker's next confirmation stage, spent from the budget."""
        stage = self.ledger() if self.ledger is not None else self.worker + 1 + self.stages * self.workers
        self.stages += 1
        level = self.level(stage)
        self.spent += level
        return level

    def share(self) -> str | None:
        """How the budget is shared, or ``None`` for a campaign of one worker."""
        if self.workers == 1:
            return None
        how = "from one counter" if self.ledger is not None else "interleaved"
        return f"shared by {self.workers} workers, stages {how}"


def _stages(screen: int, full: int) -> list[int]:
    """The trials of each confirmation stage after a screen of ``screen`` trials."""
    return [t for t in (CONFIRM_FACTOR * screen,) if t < full] + [full]


def _suspicious(verdicts: Sequence[Verdict]) -> list[str]:
    """The statistical checks whose Bonferroni-adjusted p-value (over ``verdicts``) is below
    `SCREEN_LEVEL`."""
    tested = [v for v in verdicts if v.pvalue is not None]
    return [v.check for v in tested if v.pvalue is not None and len(tested) * v.pvalue < SCREEN_LEVEL]


# The targeted cases share this fraction of the budget, each screened with up to full power.
TARGETED_SHARE = 0.5
# The search screens a batch in about 1/SCREENS_PER_BUDGET of the budget, or MIN_SCREEN_SECONDS.
SCREENS_PER_BUDGET = 120
MIN_SCREEN_SECONDS = 0.25


def batch_fingerprint(batch: SpecBatch) -> str:
    """A digest of every tensor and value of ``batch``: equal batches, equal digests."""
    digest = hashlib.sha1()
    for name in batch.__dataclass_fields__:
        value = getattr(batch, name)
        if isinstance(value, torch.Tensor):
            digest.update(f"{name}{value.dtype}{tuple(value.shape)}".encode())
            if value.numel():  # (an empty tensor may carry a stride of 0, which no view takes)
                digest.update(value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        else:
            digest.update(f"{name}={value!r}".encode())
    return digest.hexdigest()


def is_redis(location: str | Path | None) -> bool:
    """Whether ``location`` names a Redis server (``redis://``, ``rediss://`` or ``unix://``)."""
    return isinstance(location, str) and location.split("://", 1)[0] in ("redis", "rediss", "unix")


def _database(location: str | Path) -> ExampleDatabase:
    """The example database at ``location``: Hypothesis's Redis database for a Redis URL (every
    worker of every host that reaches the server reads what the others saved), else a directory."""
    if not is_redis(location):
        return DirectoryBasedExampleDatabase(str(location))
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as error:
        raise EnvironmentProblem(
            f"--database is {location!r}, a Redis URL, and the Redis client is not installed ({error}); "
            "install it with: pip install 'specsample-harness[cluster]'"
        ) from error
    client = redis.Redis.from_url(str(location))
    try:
        client.ping()
    except redis.RedisError as error:
        raise EnvironmentProblem(
            f"--database {location!r}: the Redis server does not answer ({error})"
        ) from error
    return RedisExampleDatabase(client, key_prefix=b"specsample-fuzz:")


def example_database(local: str | Path | None, shared: Sequence[str | Path] = ()) -> ExampleDatabase | None:
    """The campaign's example database: ``local`` (a directory, or a Redis URL that every worker
    shares), with read-only ``shared`` ones (directories or Redis URLs) merged in."""
    if local is None and not shared:
        return None
    parts: list[ExampleDatabase] = []
    if local is not None:
        parts.append(_database(local))
    parts.extend(ReadOnlyDatabase(_database(location)) for location in shared)
    return parts[0] if len(parts) == 1 else MultiplexedDatabase(*parts)


def run_campaign(
    variant: Variant,
    spec: str,
    *,
    methods: tuple[str, ...] | None = None,
    profile: str = "ci",
    seconds: float | None = None,
    rounds: int | None = None,
    num_samples: int | None = None,
    seed: int = 0,
    corpus: Path | None = None,
    checks: Sequence[str] = tuple(CHECKS),
    targeted: bool = True,
    search: bool = True,
    shrink: bool = True,
    database: ExampleDatabase | None = None,
    device: str = "cpu",
    progress: bool = True,
    errors: ErrorBudget | None = None,
    stop: Callable[[], bool] | None = None,
    report: Callable[[CampaignResult], None] | None = None,
    part: tuple[int, int] = (0, 1),
) -> CampaignResult:
    """Fuzz ``variant`` until a check fails, the time budget runs out, or ``rounds`` search rounds ran.

    The targeted cases are screened first with up to ``num_samples`` (default: the profile's) trials
    per request, as `TARGETED_SHARE` of the budget allows, then the search's batches with up to the
    profile's ``screen_trials``; suspicious ones are confirmed in stages up to ``num_samples``, each at
    the level ``errors`` grants (default: a budget of `FALSE_FAILURE_RATE` for this campaign alone).
    Batches lie inside the variant's declared capabilities.

    A campaign that is worker ``part[0]`` of ``part[1]``: it screens every ``part[1]``-th targeted case
    (the others screen the rest), ``stop`` says when another worker has failed (the campaign then ends
    as if out of time, ``stopped``), and ``report`` receives the result so far after each batch.
    """
    caps = capabilities(variant)
    methods = tuple(m for m in (METHODS if methods is None else methods) if m in caps.methods)
    budget = profiles.get(profile)
    required = budget.num_samples
    full = num_samples if num_samples is not None else budget.num_samples
    screen = min(budget.screen_trials, full)
    start = time.monotonic()
    seconds = budget.fuzz_seconds if seconds is None else seconds
    deadline = start + seconds
    overtime = deadline + (GRACE * seconds if math.isfinite(seconds) else 0.0)  # to confirm, to shrink
    cost = CostModel()
    errors = errors if errors is not None else ErrorBudget(FALSE_FAILURE_RATE, budget.alpha)
    # A screen gets about this much time: a large batch is screened with fewer trials than a small
    # one, so that the search sees many batches (at least `SCREENS_PER_BUDGET` when they are large).
    screen_seconds = max(MIN_SCREEN_SECONDS, seconds / SCREENS_PER_BUDGET)
    result = CampaignResult(
        variant=spec,
        alpha=budget.alpha,
        coverage=Coverage.of(budget, caps, methods),
        search_wanted=search and rounds != 0 and bool(methods),
        budget=seconds,
        false_failure_rate=errors.total,
        share=errors.share(),
    )

    def out_of_time(until: float) -> bool:
        """Past ``until``, or stopped because another worker of the campaign failed."""
        if stop is not None and not result.stopped and stop():
            result.stopped = True
        return result.stopped or time.monotonic() > until

    def shown() -> None:
        """The bar, and the result so far to whoever collects the campaign's workers."""
        _show(bar, result, start)
        if report is not None:
            report(result)

    bar = Progress(f"fuzz {spec}", seconds, "s", enabled=progress, ticking=progress)

    def check(
        batch: SpecBatch, names: Sequence[str], trials: int, case_seed: int, power: int, level: float
    ) -> Run:
        """The checks ``names`` at ``trials`` per request and false-failure rate ``level``; a clean
        verdict below ``power`` is inconclusive."""
        began = time.monotonic()
        verdicts = run_checks(
            variant,
            batch,
            checks=names,
            num_samples=trials,
            alpha=level,
            seed=case_seed,
            required_samples=power,
        )
        took = time.monotonic() - began
        cost.record(took, trials, batch)
        result.longest_run = max(result.longest_run, took)
        result.samples += sum(v.num_samples for v in verdicts)
        run = Run(verdicts, trials, case_seed, levels=(level,))
        result.best_discrepancy = max(result.best_discrepancy, run.score)
        return run

    def probe(batch: SpecBatch) -> None:
        """Before any screen has run: one call of ``batch`` untimed (the first call compiles), then
        `PROBE_REPEATS` timed, the fastest giving the cost model what a screen of `FEWEST_TRIALS` would
        cost, so that a slow sampler's first screen is sized (or skipped) for the time left rather than
        run blind. Until a screen runs, each batch is probed and the model keeps the cheapest probe per
        unit of work: a stall of the machine during one probe (a 30 ms one makes a 1 ms call look too
        slow for any screen of a 3 s campaign) does not skip every batch after it."""
        probe_calls = CALLS_PER_CHECK_RUN * FEWEST_TRIALS  # what one call is of the estimate
        if cost.runs and (1 + PROBE_REPEATS) * cost.seconds_for(batch, FEWEST_TRIALS) / probe_calls > (
            deadline - time.monotonic()
        ):
            return  # no time left to probe again: the last probe stands

        def timed() -> float:
            began = time.monotonic()
            variant(batch)
            return time.monotonic() - began

        try:
            variant(batch)
            fastest = min(timed() for _ in range(PROBE_REPEATS))
        except Exception:
            return  # the checks call it again and report the error as the variant's
        cost.estimate(probe_calls * fastest, FEWEST_TRIALS, batch)

    def tally(run: Run) -> None:
        """Count a full-power run's verdicts."""
        result.checks_passed += sum(v.passed for v in run.verdicts)
        result.checks_inconclusive += sum(v.status == "inconclusive" for v in run.verdicts)
        result.verdicts.extend(run.verdicts)

    def screened_case(
        batch: SpecBatch,
        case_seed: int,
        trials: tuple[int, ...] | None,
        levels: tuple[float, ...] = (),
        steer: bool = True,
        most: int = screen,
        share: float = screen_seconds,
    ) -> Run | None:
        """Screen ``batch``; confirm it afresh while it looks suspicious. The failing run, or ``None``.

        Each stage reruns only the checks that still look suspicious. ``trials`` fixes the trials of
        the screen and of each stage, as shrinking needs (Hypothesis must see the same outcome for the
        same example), and ``levels`` the level of each (a stage is granted its level from the
        budget only when it first runs); otherwise they are sized to the time left: at most ``most``
        trials for the screen, fewer where they would take more than ``share`` seconds (never fewer than
        `FEWEST_TRIALS`). The screen never fails a batch on a p-value, so it runs at the profile's alpha
        and spends nothing of the budget.
        """
        shrinking = trials is not None
        if trials:
            first = trials[0]
        else:
            if not result.screen_trials:
                probe(batch)
            affordable = cost.trials_within(deadline - time.monotonic(), batch, most)
            if affordable < FEWEST_TRIALS:
                result.skipped += 1
                return None
            first = max(FEWEST_TRIALS, min(cost.trials_within(share, batch, most), affordable))
            result.screen_trials.append(first)
        run = check(batch, checks, first, case_seed, first, budget.alpha)
        if steer:  # inside the search: let Hypothesis steer toward larger discrepancies
            target(run.score, label="discrepancy")
        if run.exact_failure is not None:
            return Run([run.exact_failure], first, case_seed, ladder=(first,), levels=(budget.alpha,))
        ladder, ladder_levels = [first], [budget.alpha]
        suspicious = _suspicious(run.verdicts)
        if not suspicious and not shrinking and first >= required:
            tally(run)  # a screen at the profile's power (a targeted case with time for it) counts
        for stage, wanted in enumerate(trials[1:] if trials else _stages(first, full), start=1):
            if not suspicious:
                return None
            stage_trials = (
                wanted if shrinking else cost.trials_within(overtime - time.monotonic(), batch, wanted)
            )
            if stage_trials < FEWEST_TRIALS:
                result.checks_inconclusive += 1  # suspicious, and no time left to confirm it
                result.unconfirmed += 1
                return None
            level = levels[stage] if shrinking else errors.grant()
            ladder.append(stage_trials)
            ladder_levels.append(level)
            stage_seed = case_seed + stage * CONFIRM_SEED
            confirmation = check(batch, suspicious, stage_trials, stage_seed, required, level)
            if not shrinking:  # a shrink candidate's runs are not counted: they only order failures
                result.confirmations += 1
                # A failure or the last stage counts; a cleared earlier stage is only a screen.
                if confirmation.failure is not None or wanted >= full:
                    tally(confirmation)
            if confirmation.failure is not None:
                return Run(
                    confirmation.verdicts,
                    stage_trials,
                    stage_seed,
                    ladder=tuple(ladder),
                    levels=tuple(ladder_levels),
                )
            suspicious = _suspicious(confirmation.verdicts)
        return None

    def finish(found: Run, batch: SpecBatch, case: str) -> CampaignResult:
        verdict = found.failure
        assert verdict is not None
        result.failure, result.case = verdict, case
        if corpus is not None:
            reproducer = Reproducer(
                variant=spec,
                check=verdict.check,
                verdict=asdict(verdict),
                batch=on_device(batch, "cpu"),
                num_samples=found.trials,
                alpha=found.levels[-1] if found.levels else budget.alpha,
                seed=found.seed,
                versions=versions(),
            )
            result.reproducer = reproducer.save(corpus)
        return done()

    def done() -> CampaignResult:
        result.seconds = time.monotonic() - start
        result.spent = errors.spent
        _show(bar, result, start)
        bar.close()
        return result

    def targeted_cases() -> tuple[Run, SpecBatch, str] | None:
        """The targeted cases at full power where their share of the budget allows it."""
        cases = (targeted_batches(methods, caps) if methods else [])[part[0] :: part[1]]
        targeted_seconds = TARGETED_SHARE * seconds / max(len(cases), 1)
        for name, batch in cases:
            found = screened_case(
                on_device(batch, device), seed, None, steer=False, most=full, share=targeted_seconds
            )
            if found is not None:
                result.found_after = time.monotonic() - start
            shown()
            if found is not None:
                return found, batch, f"targeted: {name}"
            if out_of_time(deadline):
                break
        return None

    def search_round(round_seed: int) -> _Found | None:
        """One Hypothesis run of the profile's examples per round, each screened (and confirmed if
        suspicious); the smallest failure seen, if any.

        Past ``deadline`` the remaining examples are no-ops; a failure is shrunk until ``overtime`` with
        the trials it was found with, so that Hypothesis sees the same outcome for the same example.
        """
        phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
        phases += [Phase.shrink] if shrink else []
        smallest: _Found | None = None
        broken: EnvironmentProblem | None = None
        seen: dict[tuple[int, str], Run | None] = {}
        described: dict[str, object] = {}

        # `hypothesis.seed` sets ``database=None``: the settings go on top of it, or nothing is saved.
        @settings(
            max_examples=budget.fuzz_examples_per_round,
            deadline=None,
            database=database,
            phases=phases,
            suppress_health_check=list(HealthCheck),
            print_blob=False,
            report_multiple_bugs=False,
        )
        @hypothesis_seed(round_seed)
        @given(
            batch=strategies.spec_batches(
                methods=methods, profile=profile, capabilities=caps, describe=described.update
            ),
            case_seed=st.integers(0, CONFIRM_SEED - 1),
        )
        def example(batch: SpecBatch, case_seed: int) -> None:
            nonlocal smallest, broken
            if broken is not None or out_of_time(overtime if smallest else deadline):
                return  # out of time, stopped, or the machine failed: the remaining examples are no-ops
            fixed = None if smallest is None else smallest.run.ladder
            fixed_levels = () if smallest is None else smallest.run.levels
            screened = result.screened
            key = (case_seed, batch_fingerprint(batch))
            if key not in seen and smallest is not None and not shrink:
                return  # found, and nothing to shrink: what Hypothesis still tries is not needed
            try:
                # Hypothesis replays the smallest failing example at the end: its outcome is known.
                found = (
                    seen[key]
                    if key in seen
                    else screened_case(on_device(batch, device), case_seed, fixed, fixed_levels)
                )
            except EnvironmentProblem as error:
                broken = error  # not the sampler's failure: nothing for Hypothesis to shrink
                return
            seen[key] = found
            if result.screened > screened:
                result.searched += 1
                if result.coverage is not None:
                    result.coverage.observe(described)
            shown()
            if found is None:
                return
            if smallest is None:
                result.found_after = time.monotonic() - start
                shown()  # a campaign of several workers stops the others now, before shrinking
            smallest = _Found(found, batch)
            raise smallest

        # Saved examples are keyed by what decodes them: the variant, its methods and the profile.
        example.hypothesis.inner_test._hypothesis_internal_add_digest = (  # type: ignore[attr-defined]
            f"{spec}|{','.join(methods)}|{profile}".encode()
        )

        # A failure found (and shrunk as far as time allowed) leaves `smallest` holding it; Flaky
        # means the smallest one's final replay ran past the shrink deadline and was a no-op.
        try:
            with contextlib.suppress(_Found, Flaky):
                example()
        except KeyboardInterrupt:
            if smallest is None:
                raise
            result.interrupted = True  # stopped while shrinking: the smallest failure so far is kept
        if broken is not None:
            raise broken
        return smallest

    try:
        first = targeted_cases() if targeted else None
        if first is not None:
            return finish(*first)
        round_index = 0
        while result.search_wanted and not out_of_time(deadline) and (rounds is None or round_index < rounds):
            found = search_round(seed + round_index)
            if found is not None:
                return finish(found.run, found.batch, f"search round {round_index}")
            round_index += 1
    except KeyboardInterrupt:
        result.interrupted = True  # what ran so far is kept; the caller reports it
    return done()
