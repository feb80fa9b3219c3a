"""A fuzz campaign: targeted cases first, then Hypothesis-driven search steered toward discrepancies.

Every case runs the property checks of `properties.checks` on the variant; the first failing verdict
stops the campaign, is shrunk by Hypothesis to a minimal batch (unless shrinking is off), and is
written as a reproducer. Random choices inside the checks derive from a seed drawn with the case, so a
failure replays exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)

from specsample.fuzz.progress import Progress
from specsample.fuzz.reproducer import Reproducer, versions
from specsample.fuzz.targeted import targeted_batches
from specsample.properties import profiles, strategies
from specsample.properties.batching import select_requests
from specsample.properties.checks import CHECKS, Verdict, discrepancy, run_checks
from specsample.properties.checks.base import EnvironmentProblem
from specsample.properties.profiles import Profile
from specsample.reference.contract import METHODS, Capabilities, SpecBatch, Variant, capabilities


@dataclass
class CampaignResult:
    """What a campaign saw: cases run, checks passed, the best discrepancy, and the failure if any."""

    variant: str
    cases: int = 0
    checks_passed: int = 0
    checks_inconclusive: int = 0
    samples: int = 0
    best_discrepancy: float = 0.0
    seconds: float = 0.0
    failure: Verdict | None = None
    case: str | None = None
    reproducer: Path | None = None
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Whether no check failed."""
        return self.failure is None

    @property
    def status(self) -> str:
        """``"fail"`` when a check failed, else ``"inconclusive"`` when one lacked power, else ``"pass"``."""
        return "fail" if self.failure else "inconclusive" if self.checks_inconclusive else "pass"

    def summary(self) -> dict[str, object]:
        """JSON-ready summary."""
        return {
            "variant": self.variant,
            "status": self.status,
            "cases": self.cases,
            "checks_passed": self.checks_passed,
            "checks_inconclusive": self.checks_inconclusive,
            "samples": self.samples,
            "best_discrepancy": self.best_discrepancy,
            "seconds": round(self.seconds, 2),
            "case": self.case,
            "failure": None if self.failure is None else asdict(self.failure),
            "reproducer": None if self.reproducer is None else str(self.reproducer),
        }


class _Found(Exception):
    """A failing verdict, raised inside a Hypothesis example so that Hypothesis shrinks the case."""

    def __init__(self, verdict: Verdict, batch: SpecBatch, case_seed: int) -> None:
        super().__init__(verdict.message)
        self.verdict = verdict
        self.batch = batch
        self.case_seed = case_seed


def _show(bar: Progress, result: CampaignResult, start: float) -> None:
    """The campaign's bar: seconds of the budget spent; cases, checks, samples, best discrepancy."""
    bar.advance_to(
        time.monotonic() - start,
        cases=result.cases,
        passed=result.checks_passed,
        inconclusive=result.checks_inconclusive,
        samples=result.samples,
        best=f"{result.best_discrepancy:.2f}",
    )


@dataclass(frozen=True)
class Throughput:
    """What a sampler costs per trial, measured after its first (compiling) call.

    Attributes:
        seconds_per_trial: sampler time per trial of every batch together.
        trials: the trials per request that fit the budget, at most the ones wanted.
    """

    seconds_per_trial: float
    trials: int

    def seconds_for(self, trials: int) -> float:
        """About how long the checks' sampler calls take at ``trials`` per request."""
        return CALLS_PER_CHECK_RUN * trials * self.seconds_per_trial


# Each run of the checks makes about two calls' worth of trials (shared trials, marginal).
CALLS_PER_CHECK_RUN = 2.0


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
    call of ``min(wanted, probe_trials)`` trials of each batch, the size the checks' calls come in.
    A fast sampler gets ``wanted``; a slow one (a Triton kernel under the CPU interpreter) gets
    fewer trials, never fewer than ``floor``. A batch the sampler raises on is left out of the
    measure (the checks report the error).
    """
    trials = max(1, min(wanted, probe_trials))
    name = getattr(variant, "name", type(variant).__name__)
    with Progress(
        f"{name}: warm-up, then {trials} trials timed", 2 * len(batches), "calls", enabled=progress
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
        start = time.monotonic()
        for batch in usable:
            index = np.repeat(np.arange(batch.num_requests), trials)
            variant(select_requests(on_device(batch, device), index, seed=np.arange(index.size)))
            bar.update()
        if device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
        per_trial = (time.monotonic() - start) / trials
    affordable = int(seconds / max(CALLS_PER_CHECK_RUN * per_trial, 1e-9))
    return Throughput(per_trial, max(min(floor, wanted), min(wanted, affordable)))


def example_database(local: Path | None, shared: Sequence[Path] = ()) -> ExampleDatabase | None:
    """A local directory database, with read-only shared ones merged in."""
    if local is None and not shared:
        return None
    parts: list[ExampleDatabase] = []
    if local is not None:
        parts.append(DirectoryBasedExampleDatabase(str(local)))
    parts.extend(ReadOnlyDatabase(DirectoryBasedExampleDatabase(str(path))) for path in shared)
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
) -> CampaignResult:
    """Fuzz ``variant`` until a check fails, the time budget runs out, or ``rounds`` search rounds ran.

    Batches lie inside the variant's declared capabilities; ``num_samples`` (default: the profile's)
    sets the trials, and a clean check below the profile's power is counted inconclusive.
    """
    caps = capabilities(variant)
    methods = tuple(m for m in (methods or METHODS) if m in caps.methods)
    budget = profiles.get(profile)
    required = budget.num_samples
    if num_samples is not None:
        budget = replace(budget, num_samples=num_samples)
    start = time.monotonic()
    deadline = start + (budget.fuzz_seconds if seconds is None else seconds)
    result = CampaignResult(variant=spec)
    bar = Progress(f"fuzz {spec}", deadline - start, "s", enabled=progress)

    def probe(name: str, batch: SpecBatch, case_seed: int) -> Verdict | None:
        verdicts = run_checks(
            variant,
            batch,
            checks=checks,
            num_samples=budget.num_samples,
            alpha=budget.alpha,
            seed=case_seed,
            required_samples=required,
        )
        result.cases += 1
        result.samples += sum(v.num_samples for v in verdicts)
        result.checks_passed += sum(v.passed for v in verdicts)
        result.checks_inconclusive += sum(v.status == "inconclusive" for v in verdicts)
        steer = discrepancy(verdicts)
        result.best_discrepancy = max(result.best_discrepancy, steer)
        result.verdicts.extend(verdicts)
        if name == "search":
            target(steer, label="discrepancy")
        _show(bar, result, start)
        return next((v for v in verdicts if v.failed), None)

    def finish(verdict: Verdict, batch: SpecBatch, case_seed: int, case: str) -> CampaignResult:
        result.failure, result.case = verdict, case
        if corpus is not None:
            reproducer = Reproducer(
                variant=spec,
                check=verdict.check,
                verdict=asdict(verdict),
                batch=on_device(batch, "cpu"),
                num_samples=budget.num_samples,
                alpha=budget.alpha,
                seed=case_seed,
                versions=versions(),
            )
            result.reproducer = reproducer.save(corpus)
        result.seconds = time.monotonic() - start
        _show(bar, result, start)
        bar.close()
        return result

    if targeted:
        for name, batch in targeted_batches(methods, caps):
            verdict = probe(name, on_device(batch, device), seed)
            if verdict is not None:
                return finish(verdict, batch, seed, f"targeted: {name}")
            if time.monotonic() > deadline:
                break

    round_index = 0
    while search and time.monotonic() < deadline and (rounds is None or round_index < rounds):
        found = _search_round(
            probe, methods, caps, profile, budget, seed + round_index, deadline, shrink, database, device
        )
        if found is not None:
            return finish(found.verdict, found.batch, found.case_seed, f"search round {round_index}")
        round_index += 1
    result.seconds = time.monotonic() - start
    _show(bar, result, start)
    bar.close()
    return result


def _search_round(
    probe: Callable[[str, SpecBatch, int], Verdict | None],
    methods: tuple[str, ...],
    caps: Capabilities,
    profile: str,
    budget: Profile,
    round_seed: int,
    deadline: float,
    shrink: bool,
    database: ExampleDatabase | None,
    device: str,
) -> _Found | None:
    """One Hypothesis run of ``examples_per_round`` cases; returns the (shrunk) failure if any."""
    failing = False
    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target] + ([Phase.shrink] if shrink else [])

    @hypothesis_seed(round_seed)
    @settings(
        max_examples=budget.fuzz_examples_per_round,
        deadline=None,
        database=database,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        report_multiple_bugs=False,
    )
    @given(
        batch=strategies.spec_batches(methods=methods, profile=profile, capabilities=caps),
        case_seed=st.integers(0, 2**31 - 1),
    )
    def search(batch: SpecBatch, case_seed: int) -> None:
        nonlocal failing, broken
        if broken is not None or (not failing and time.monotonic() > deadline):
            return  # out of time, or the machine failed: the remaining examples are no-ops
        try:
            verdict = probe("search", on_device(batch, device), case_seed)
        except EnvironmentProblem as error:
            broken = error  # not the sampler's failure: nothing for Hypothesis to shrink
            return
        if verdict is None:
            return
        failing = True
        raise _Found(verdict, batch, case_seed)

    broken: EnvironmentProblem | None = None
    try:
        search()
    except _Found as found:
        return found
    if broken is not None:
        raise broken
    return None


def on_device(batch: SpecBatch, device: str) -> SpecBatch:
    """``batch`` with every tensor on ``device``."""
    if str(batch.device) == device:
        return batch
    moved = {name: getattr(batch, name) for name in batch.__dataclass_fields__}
    for name, value in moved.items():
        if hasattr(value, "to") and not isinstance(value, str):
            moved[name] = value.to(device)
    return SpecBatch(**moved)
