"""Campaigns on a Ray cluster: one worker per GPU (or CPU slot), one report, one false-failure budget.

``run --cluster ADDRESS`` and ``certify --cluster ADDRESS`` spread their work over a Ray cluster:
``local`` starts a Ray instance on this machine for the command's lifetime, ``auto`` joins the
cluster that ``ray start`` made here, ``ray://HOST:PORT`` (Ray Client) or ``HOST:PORT`` joins another.
Each worker is a Ray actor that holds one GPU (Ray sets its ``CUDA_VISIBLE_DEVICES``), or one CPU on
a cluster without GPUs (or with ``--device cpu``); ``--workers`` says how many (default: every GPU,
else every CPU, of the cluster). Every node must have the harness installed and the variant's spec
must resolve there (a registered name, a module, or a file at the same path).

A campaign runs on every worker at once, each with its own search seed, and all of them share:
- a coordinator actor, which collects their progress into one bar, tells every worker to stop at
  the first failure any of them finds, and hands out the campaign's confirmation stages from one
  counter, so that the levels of every stage of every worker sum to at most the campaign's stated
  false-failure rate (`campaign.ErrorBudget`);
- the example database, when ``--database redis://...`` names one (Hypothesis's Redis database):
  what one worker found, every other worker and every later campaign tries first.
The first failure is shrunk on the worker that found it, written to the corpus here, and replayed
on another worker (another GPU, or another CPU process): the report says whether it failed there
too. A worker that dies (its node lost, out of memory, its process killed) or that the environment
fails (no driver, a compile error) is an environment error: its share of the budget was not
searched, so the campaign is never reported as passed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specsample.fuzz import command
from specsample.fuzz.campaign import CampaignResult, ErrorBudget
from specsample.fuzz.progress import Progress
from specsample.properties import profiles
from specsample.properties.checks.base import EnvironmentProblem

# Seconds the driver waits for the cluster to place every worker before it gives up.
START_SECONDS = 180.0
# Seconds between two looks of a worker at the coordinator's stop flag, and between two reports.
POLL_SECONDS = 1.0
# Environment variables every worker gets from the command's environment (read at import time).
FORWARDED = ("TRITON_", "HYPOTHESIS_", "SPECSAMPLE_", "PYTHONHASHSEED", "CUBLAS_")
# A worker's search seed: the campaign's seed plus this times the worker's index.
SEED_STRIDE = 1000


def _ray() -> Any:
    """The ``ray`` module, or an environment error that says how to install it."""
    try:
        import ray
    except ImportError as error:
        raise EnvironmentProblem(
            f"--cluster needs Ray, which is not installed ({error}); install it with: "
            "pip install 'specsample-harness[cluster]'"
        ) from error
    return ray


def connect(address: str) -> Any:
    """Join (or, for ``local``, start) the Ray cluster at ``address``; return the ``ray`` module.

    The workers get this command's ``TRITON_*``, ``HYPOTHESIS_*`` and ``SPECSAMPLE_*`` variables, so
    that a worker on the CPU imports the kernels under the interpreter exactly as this process does.
    """
    ray = _ray()
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}
    options: dict[str, Any] = {"runtime_env": {"env_vars": env}, "logging_level": "WARNING"}
    if ray.is_initialized():
        return ray
    try:
        if address == "local":
            ray.init(include_dashboard=False, **options)
        else:
            ray.init(address=address, **options)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise EnvironmentProblem(
            f"--cluster {address!r}: no Ray cluster could be joined ({error})"
        ) from error
    return ray


@dataclasses.dataclass(frozen=True)
class Slots:
    """What one worker holds, and how many the cluster has."""

    device: str
    count: int

    @property
    def resources(self) -> dict[str, float]:
        """The Ray resources of one worker."""
        return {"num_gpus": 1, "num_cpus": 0} if self.device == "cuda" else {"num_cpus": 1}

    @property
    def unit(self) -> str:
        return "GPU" if self.device == "cuda" else "CPU"

    def describe(self) -> str:
        return f"{self.count} {self.unit}{'s' * (self.count != 1)}"


def slots(ray: Any, device: str | None) -> Slots:
    """One worker per GPU of the cluster, or per CPU where it has none or ``device`` is ``cpu``."""
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    if device == "cuda" and not gpus:
        raise EnvironmentProblem("--device is 'cuda', and the Ray cluster has no GPU")
    if gpus and device != "cpu":
        return Slots("cuda", gpus)
    return Slots("cpu", max(1, int(resources.get("CPU", 1))))


class Coordinator:
    """The campaign's one point of contact (a Ray actor): progress, the stop flag, the stage counter."""

    def __init__(self) -> None:
        self.progress: dict[int, dict[str, Any]] = {}
        self.failed_by: int | None = None
        self.stage = 0

    def report(self, worker: int, progress: dict[str, Any]) -> None:
        """Worker ``worker``'s campaign so far; one that found a failure stops every other."""
        self.progress[worker] = progress
        if progress.get("found") and self.failed_by is None:
            self.failed_by = worker

    def stopped(self, worker: int) -> bool:
        """Whether another worker found a failure (the finder itself goes on shrinking)."""
        return self.failed_by is not None and self.failed_by != worker

    def next_stage(self) -> int:
        """The campaign's next confirmation stage, 1-based, over every worker."""
        self.stage += 1
        return self.stage

    def snapshot(self) -> tuple[dict[int, dict[str, Any]], int | None, int]:
        """Every worker's latest progress, the finder of the first failure, and the stages granted."""
        return dict(self.progress), self.failed_by, self.stage


@dataclasses.dataclass(frozen=True)
class CampaignTask:
    """What every worker of a campaign runs (`fuzz.campaign.run_campaign`'s arguments)."""

    spec: str
    methods: tuple[str, ...] | None
    profile: str
    seconds: float | None
    seed: int
    shrink: bool
    targeted: bool
    blind: bool
    database: str | None
    shared: tuple[str, ...]
    false_failure_rate: float


@dataclasses.dataclass
class WorkerOutcome:
    """What one worker's campaign returned: its result, and the failure's reproducer as JSON text."""

    worker: int
    where: str
    result: CampaignResult
    reproducer: str | None = None
    reproducer_name: str | None = None


class Worker:
    """One slot of the cluster (a Ray actor): runs a campaign, replays a reproducer, certifies."""

    def __init__(self, index: int, device: str) -> None:
        self.index, self.device = index, device

    def where(self) -> str:
        """The worker's host, process and GPU."""
        import ray

        gpus = ray.get_gpu_ids()
        slot = f"GPU {','.join(str(g) for g in gpus)}" if gpus else "CPU"
        return f"{socket.gethostname()} pid {os.getpid()} {slot}"

    def campaign(self, coordinator: Any, task: CampaignTask, workers: int) -> WorkerOutcome:
        """Worker ``self.index``'s share of the campaign: its own seed, the shared budget and stop flag."""
        import ray

        from specsample.fuzz.campaign import example_database, run_campaign
        from specsample.fuzz.selftest import Blind
        from specsample.fuzz.spec import load_variant

        variant = load_variant(task.spec)
        variant = Blind(variant) if task.blind else variant
        errors = ErrorBudget(
            task.false_failure_rate,
            profiles.get(task.profile).alpha,
            worker=self.index,
            workers=workers,
            ledger=lambda: int(ray.get(coordinator.next_stage.remote())),
        )
        last = {"poll": 0.0, "stopped": False, "report": 0.0}

        def stop() -> bool:
            now = time.monotonic()
            if not last["stopped"] and now - last["poll"] >= POLL_SECONDS:
                last["poll"] = now
                last["stopped"] = bool(ray.get(coordinator.stopped.remote(self.index)))
            return bool(last["stopped"])

        def report(result: CampaignResult, final: bool = False) -> None:
            now = time.monotonic()
            found = result.found_after is not None
            if final or found or now - last["report"] >= POLL_SECONDS:
                last["report"] = now
                progress = {
                    "screened": result.screened,
                    "confirmations": result.confirmations,
                    "found": found,
                }
                coordinator.report.remote(self.index, progress)

        with tempfile.TemporaryDirectory() as corpus:
            result = run_campaign(
                variant,
                task.spec,
                methods=task.methods,
                profile=task.profile,
                seconds=task.seconds,
                seed=task.seed + SEED_STRIDE * self.index,
                corpus=Path(corpus),
                shrink=task.shrink,
                targeted=task.targeted,
                device=self.device,
                database=example_database(task.database, task.shared),
                progress=False,
                errors=errors,
                stop=stop,
                report=report,
                part=(self.index, workers),
            )
            report(result, final=True)
            outcome = WorkerOutcome(self.index, self.where(), result)
            if result.reproducer is not None:
                outcome.reproducer = result.reproducer.read_text()
                outcome.reproducer_name = result.reproducer.name
        return outcome

    def replay(self, reproducer: str) -> str:
        """Replay a reproducer (its JSON text) here: ``FAILED <check>: <message>`` or ``passed``."""
        from specsample.fuzz.reproducer import load_reproducer, replay_verdicts

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "reproducer.json"
            path.write_text(reproducer)
            loaded = load_reproducer(path)
        verdicts = replay_verdicts(loaded, loaded.variant, self.device)
        if isinstance(verdicts, str):
            return f"skipped: {verdicts}"
        failed = [v for v in verdicts if v.failed]
        return f"FAILED {failed[0].check}: {failed[0].message}" if failed else "passed"

    def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``function(*args, device=<this worker's device>, **kwargs)`` here (certify's pieces)."""
        return function(*args, device=self.device, **kwargs)


@dataclasses.dataclass
class ClusterResult:
    """A campaign over the cluster's workers, as one verdict."""

    spec: str
    slots: Slots
    outcomes: list[WorkerOutcome]
    lost: list[str]
    false_failure_rate: float
    stages: int
    seconds: float
    reproducer: Path | None = None
    replayed: str | None = None
    interrupted: bool = False

    @property
    def failure(self) -> WorkerOutcome | None:
        """The worker that found the first failure, if any worker did."""
        found = [o for o in self.outcomes if o.result.failure is not None]
        return min(found, key=lambda o: o.result.found_after or 0.0) if found else None

    @property
    def status(self) -> str:
        """``fail`` when a worker found a failure (it stands whatever else happened); ``environment``
        when a worker was lost; ``interrupted``; ``inconclusive`` when a worker was; else ``pass``."""
        if self.failure is not None:
            return "fail"
        if self.lost:
            return "environment"
        if self.interrupted:
            return "interrupted"
        statuses = {o.result.status for o in self.outcomes}
        return "pass" if statuses == {"pass"} else "inconclusive"

    def lines(self) -> list[str]:
        """The report: one verdict for the campaign, then each worker's line."""
        screened = sum(o.result.screened for o in self.outcomes)
        confirmations = sum(o.result.confirmations for o in self.outcomes)
        spent = sum(o.result.spent for o in self.outcomes)
        passed = sum(o.result.checks_passed for o in self.outcomes)
        minutes = max(self.seconds, 1e-9) / 60
        workers = len(self.outcomes) + len(self.lost)
        word = {
            "pass": "PASSED",
            "fail": "FAILED",
            "environment": "ENVIRONMENT ERROR",
            "interrupted": "INTERRUPTED",
            "inconclusive": "INCONCLUSIVE",
        }[self.status]
        lines = [
            f"{word}: {self.spec}: {workers} worker{'s' * (workers != 1)} (one {self.slots.unit} each; "
            f"the cluster has {self.slots.describe()}), "
            f"{screened} batches screened "
            f"({screened / minutes:.0f} per minute), {confirmations} confirmation stages; false-failure rate "
            f"<= {self.false_failure_rate:.2g} for the whole campaign ({self.stages} stages granted from one "
            f"counter spent {spent:.2g} of it); {passed} checks passed at full power; {self.seconds:.0f} s"
        ]
        failure = self.failure
        if failure is not None and failure.result.failure is not None:
            verdict = failure.result.failure
            lines.append(
                f"  found by worker {failure.worker} ({failure.where}) after "
                f"{failure.result.found_after or 0.0:.1f} s: check {verdict.check} ({failure.result.case}): "
                f"{verdict.message}"
            )
            lines += [f"  {line}" for line in verdict.explain()[1:]]
        if self.reproducer is not None:
            lines.append(f"Reproducer: {self.reproducer}\nReplay:     {command.replay(self.reproducer)}")
        if self.replayed is not None:
            lines.append(f"  replayed on {self.replayed}")
        for name in self.lost:
            lines.append(
                f"  environment error: {name}; its share of the campaign was not searched, so the campaign "
                "is not passed"
            )
        for outcome in sorted(self.outcomes, key=lambda o: o.worker):
            result = outcome.result
            state = "stopped by the failure elsewhere" if result.stopped else result.status
            lines.append(f"  worker {outcome.worker} ({outcome.where}): {state}; {result.describe()}")
            if failure is None:
                lines += [f"    inconclusive: {reason}" for reason in result.inconclusive_reasons()]
        return lines


def _failure_of(ray: Any, error: BaseException) -> str:
    """An error a worker raised or died of, as the environment error it is reported as."""
    if isinstance(error, ray.exceptions.RayTaskError):
        cause = error.as_instanceof_cause()
        return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1]}"
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"


def start_workers(ray: Any, slots_: Slots, count: int) -> tuple[list[Any], list[str]]:
    """``count`` worker actors, each holding one slot; their places. An environment error when the
    cluster cannot place them all within `START_SECONDS`."""
    actor = ray.remote(Worker)
    workers = [actor.options(**slots_.resources).remote(i, slots_.device) for i in range(count)]
    try:
        places = ray.get([w.where.remote() for w in workers], timeout=START_SECONDS)
    except ray.exceptions.GetTimeoutError as error:
        for worker in workers:
            ray.kill(worker)
        raise EnvironmentProblem(
            f"--workers {count}: the cluster ({slots_.describe()}) placed fewer in {START_SECONDS:.0f} s"
        ) from error
    return workers, [str(p) for p in places]


def run_campaign_on_cluster(
    task: CampaignTask,
    *,
    address: str,
    workers: int | None,
    device: str | None,
    corpus: Path,
    progress: bool = True,
) -> ClusterResult:
    """Run ``task`` on ``workers`` workers of the Ray cluster at ``address`` (module docstring)."""
    ray = connect(address)
    slots_ = slots(ray, device)
    count = workers or slots_.count
    actors, places = start_workers(ray, slots_, count)
    coordinator = ray.remote(num_cpus=0)(Coordinator).remote()
    print(f"cluster: {count} workers: " + "; ".join(f"{i}: {p}" for i, p in enumerate(places)), flush=True)
    start = time.monotonic()
    pending = {actor.campaign.remote(coordinator, task, count): i for i, actor in enumerate(actors)}
    outcomes: list[WorkerOutcome] = []
    lost: list[str] = []
    interrupted = False
    seconds = task.seconds if task.seconds is not None else profiles.get(task.profile).fuzz_seconds
    bar = Progress(f"cluster fuzz {task.spec}", seconds, "s", enabled=progress and seconds > 0, ticking=True)
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_SECONDS * 2)
            for ref in done:
                index = pending.pop(ref)
                try:
                    outcomes.append(ray.get(ref))
                except ray.exceptions.RayError as error:
                    lost.append(f"worker {index} ({places[index]}) failed: {_failure_of(ray, error)}")
            board, _, stages = ray.get(coordinator.snapshot.remote())
            elapsed = time.monotonic() - start
            screened = sum(p["screened"] for p in board.values())
            bar.advance_to(
                min(elapsed, seconds),
                cases=screened,
                per_min=f"{screened / max(elapsed / 60, 1e-9):.0f}",
                confirmed=sum(p["confirmations"] for p in board.values()),
                workers=f"{len(pending)}/{count} running",
            )
    except KeyboardInterrupt:
        interrupted = True
        for actor in actors:
            ray.kill(actor)
    bar.close()
    _, _, stages = ray.get(coordinator.snapshot.remote())
    result = ClusterResult(
        task.spec,
        slots_,
        outcomes,
        lost,
        task.false_failure_rate,
        stages,
        time.monotonic() - start,
        interrupted=interrupted,
    )
    failure = result.failure
    if failure is not None and failure.reproducer is not None and failure.reproducer_name is not None:
        corpus.mkdir(parents=True, exist_ok=True)
        result.reproducer = corpus / failure.reproducer_name
        data = json.loads(failure.reproducer)
        data["replay"] = command.replay(result.reproducer)  # here, not the worker's temporary folder
        result.reproducer.write_text(json.dumps(data, indent=1) + "\n")
        others = [i for i in range(count) if i != failure.worker and i not in pending]
        if others and not interrupted:
            other = others[0]
            try:
                said = ray.get(actors[other].replay.remote(failure.reproducer))
            except ray.exceptions.RayError as error:
                said = f"error: {_failure_of(ray, error)}"
            result.replayed = f"worker {other} ({places[other]}): {said}"
    for actor in actors:
        ray.kill(actor)
    ray.kill(coordinator)
    return result


def map_on_cluster(
    address: str,
    workers: int | None,
    device: str | None,
    calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]],
) -> list[Any]:
    """Each ``(function, args, kwargs)`` of ``calls`` on the next free worker of the cluster, called
    with ``device=`` the worker's; the results in the order of ``calls``. A worker lost is an
    environment error."""
    ray = connect(address)
    slots_ = slots(ray, device)
    count = min(workers or slots_.count, max(len(calls), 1))
    actors, places = start_workers(ray, slots_, count)
    print(f"cluster: {count} workers: " + "; ".join(f"{i}: {p}" for i, p in enumerate(places)), flush=True)
    pool = ray.util.ActorPool(actors)
    try:
        return list(pool.map(lambda actor, call: actor.call.remote(call[0], *call[1], **call[2]), calls))
    except ray.exceptions.RayError as error:
        raise EnvironmentProblem(f"a cluster worker failed: {_failure_of(ray, error)}") from error
    finally:
        for actor in actors:
            ray.kill(actor)
