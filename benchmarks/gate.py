"""The performance gate: time the gate subset and compare each median with a baseline of this GPU.

The bundled Triton sampler, against the committed baseline of this GPU (``benchmarks/baselines/``)::

    python -m specsample.benchmarks.gate                    # exit 1 if a median regressed past the margin
    python -m specsample.benchmarks.gate --save             # record this GPU's baseline
    python -m specsample.benchmarks.gate --self-check       # the planted slowdown must fail the gate
    python -m specsample.benchmarks.gate --margin 15 -- -k bf16   # arguments after -- go to pytest

Any variant, against a baseline its author records on their GPU (``--variant`` takes what
``fuzz --variant`` takes: ``package.module:NAME``, ``path/to/file.py:NAME``, a registered name)::

    python -m specsample.benchmarks.gate --variant path/to/my_sampler.py:MySampler --save
    python -m specsample.benchmarks.gate --variant path/to/my_sampler.py:MySampler
    python -m specsample.benchmarks.gate --variant path/to/my_sampler.py:MySampler --self-check

An author's baseline is ``./specsample-baselines/<GPU>/<variant name>.json`` under the current
directory (`author_baseline_path`; ``--baseline PATH`` picks another file). ``--save`` times the
cases three times (``--runs``), each run its own process, records each benchmark's middle median
(one slow or fast run is never the baseline) and prints how far the medians moved between the runs,
naming the margin that would hold a spread wider than ``--margin``. The variant is timed on
the gate's cases inside its ``capabilities`` (all of them when it declares none). The command runs
from any directory, the plain pytest command it prints first::

    python -m pytest <benchmarks folder> --rootdir=<its parent> -p no:cacheprovider -m bench \\
        --bench-grid=gate --bench-variants=<triton or the spec> --benchmark-json=<run> \\
        --benchmark-compare=<baseline>

and then lists every benchmark's change against the baseline and judges the medians itself. For the
bundled sampler it gates the GPU time of the ``triton`` variant only: the PyTorch sampler's time and
the Python call latency are bound by host work and moved up to 18 % between runs (RESULTS.md), too
much to share the margin; RESULTS.md reports both. A comparison against another GPU's baseline is
refused. `MARGIN_PERCENT` is justified in RESULTS.md from the spread measured on the bundled
sampler; a sampler whose time is bound by host work may need a wider ``--margin``.

``--self-check`` gates a run with a planted slowdown against the baseline, and passes only if the
gate fails that run:

- the bundled sampler gets one extra pass over the logits (`planted.ExtraLogitPass`), which slows
  every gated call by 29 % or more; the self-check passes if a median regressed past the margin.
- ``--variant SPEC`` is first timed as it is, and must pass the gate: a benchmark whose median moved
  past the margin with nothing changed (the MRV2-shaped example's did, by up to 33 % on an H100
  between two runs a minute apart) is one where the gate cannot tell a regression from the spread.
  Then it gets a spin of the GPU after each call for ``--planted`` percent of that call's own GPU
  time (`planted.ProportionalSlowdown`; twice the margin unless given, and it must exceed the
  margin); the self-check passes only if the unchanged run passed and every benchmark of the
  baseline regressed past the margin. Every benchmark, not most: 26 % more reads as at least 1.26 x
  0.94 - 1 = 18 % on a case whose median moves 6 % between runs (the largest spread measured on the
  bundled sampler, on which the 13 % margin rests); a case that misses it ran at least 10 % faster
  than in the baseline (1.13 / 1.26 = 0.90), a drift close to the margin, so there the gate can be
  trusted neither to pass an unchanged sampler nor to see a regression of the margin's size, and the
  self-check names it.

Exit codes: 0 passed (``--self-check``: the planted slowdown failed the gate, as it must, and with
``--variant`` the unchanged sampler passed it); 1 a median regressed past the margin or a benchmark
failed (``--self-check``: the planted slowdown went unseen, or with ``--variant`` the unchanged
sampler failed, in a benchmark it names); 2 a usage or environment error (an argument, a
spec that does not resolve, no CUDA GPU, no baseline, a baseline of another GPU or variant),
printed as one line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from specsample.benchmarks import report
from specsample.benchmarks.grid import GATE_CASES, Case, within
from specsample.benchmarks.planted import EXTRA_PASS_ENV, PLANTED_ENV
from specsample.properties.variant_spec import SpecError, load_variant
from specsample.reference.contract import capabilities

BENCHMARKS_DIR = Path(__file__).resolve().parent
BASELINES = BENCHMARKS_DIR / "baselines"
AUTHOR_BASELINES = "specsample-baselines"
MARGIN_PERCENT = report.MARGIN_PERCENT
# Runs of --save: the baseline keeps each benchmark's middle median, so one slow or fast run is not it.
SAVE_RUNS = 3
# The gate's module when it was not started with ``python -m`` (a test calling `main`).
INSTALLED_MODULE = "specsample.benchmarks.gate"


def command() -> str:
    """The gate as the user ran it: the interpreter (its bare name where that is the one on ``PATH``),
    then ``-m`` and the module (``specsample.benchmarks.gate``, or ``benchmarks.gate`` from the
    repository root), so every command it prints runs as printed."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", "") or ""
    module = name if name.split(".")[-2:] == ["benchmarks", "gate"] else INSTALLED_MODULE
    executable = Path(sys.executable)
    found = shutil.which(executable.name)
    python = executable.name if found and Path(found).absolute() == executable.absolute() else str(executable)
    return f"{shlex.quote(python)} -m {module}"


BUNDLED = "triton"


class GateUsageError(Exception):
    """A usage or environment error: the gate prints its one-line message and exits 2."""


def _file_name(text: str) -> str:
    """``text`` with every run of characters other than letters, digits, dots and dashes as ``_``."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", text).strip("_")


def baseline_path(gpu_name: str) -> Path:
    """The bundled sampler's baseline: ``benchmarks/baselines/<GPU name as a file name>.json``."""
    return BASELINES / f"{_file_name(gpu_name)}.json"


def author_baseline_path(gpu_name: str, variant_name: str, directory: Path | None = None) -> Path:
    """An author's baseline: ``<directory>/specsample-baselines/<GPU>/<variant name>.json``, both names as
    file names; ``directory`` is the current directory unless given."""
    root = Path.cwd() if directory is None else directory
    return root / AUTHOR_BASELINES / _file_name(gpu_name) / f"{_file_name(variant_name)}.json"


@dataclass(frozen=True)
class Target:
    """What one gate run times.

    Attributes:
        spec: the ``--variant`` spec as given, or ``None`` for the bundled sampler.
        bench_spec: what ``--bench-variants`` gets: ``triton``, or the spec with a file made absolute.
        name: the variant's name (the benchmark ids end with it; the planted slowdown finds it by it).
        cases: the gate cases inside the variant's capabilities.
    """

    spec: str | None
    bench_spec: str
    name: str
    cases: tuple[Case, ...]

    def default_baseline(self, gpu_name: str) -> Path:
        """Where this target's baseline lives on ``gpu_name`` unless ``--baseline`` says otherwise."""
        if self.spec is None:
            return baseline_path(gpu_name)
        return author_baseline_path(gpu_name, self.name)


def absolute_spec(spec: str) -> str:
    """``spec`` with the file of ``path/to/file.py:NAME`` made absolute (a module spec unchanged), so
    the benchmark run resolves it from any directory."""
    target, colon, name = spec.rpartition(":")
    if colon and (target.endswith(".py") or "/" in target):
        return f"{Path(target).resolve()}:{name}"
    return spec


def gate_domain() -> str:
    """What the gate cases span: their methods, logit dtypes, draft layouts and largest vocabulary."""

    def listed(values: Sequence[str]) -> str:
        return ", ".join(dict.fromkeys(values))

    return (
        f"methods {listed([c.method for c in GATE_CASES])}; logits {listed([c.dtype for c in GATE_CASES])}; "
        f"draft logits {listed([c.layout for c in GATE_CASES])}; V up to {max(c.vocab for c in GATE_CASES)}"
    )


def load_target(spec: str | None) -> Target:
    """The bundled sampler (``spec`` ``None``) or the variant ``spec`` names, with its gate cases.

    Raises:
        GateUsageError: naming ``--variant`` and the spec, if it does not resolve, declares
            capabilities that are not `Capabilities`, or admits none of the gate's cases.
    """
    if spec is None:
        return Target(None, BUNDLED, BUNDLED, GATE_CASES)
    try:
        variant = load_variant(spec)
        declared = capabilities(variant)
    except SpecError as error:
        raise GateUsageError(f"--variant: {error}") from error
    except ValueError as error:
        raise GateUsageError(f"--variant {spec!r}: {error}") from error
    cases = tuple(case for case in GATE_CASES if within(case, declared))
    if not cases:
        raise GateUsageError(
            f"--variant {spec!r}: its capabilities admit none of the {len(GATE_CASES)} gate cases "
            f"({gate_domain()})"
        )
    return Target(spec, absolute_spec(spec), str(variant.name), cases)


def pytest_command(bench_spec: str, extra: Sequence[str]) -> list[str]:
    """The pytest command of the gate subset for ``--bench-variants=bench_spec``, ``extra`` appended.

    Every path in it is absolute and pytest writes no cache, so it runs from any directory; the
    ``rootdir`` keeps the benchmark ids (``benchmarks/test_latency.py::...``) those of the baselines
    recorded from the repository root, installed or not.
    """
    locate = [str(BENCHMARKS_DIR), f"--rootdir={BENCHMARKS_DIR.parent}", "-p", "no:cacheprovider"]
    gate_options = ["-m", "bench", "--bench-grid=gate", f"--bench-variants={bench_spec}"]
    return [sys.executable, "-m", "pytest", *locate, *gate_options, *extra]


def planted_percent(args: argparse.Namespace) -> float:
    """The slowdown ``--variant SPEC --self-check`` plants, in percent of each call: ``--planted``, or
    twice the margin."""
    return float(2 * args.margin if args.planted is None else args.planted)


def planted_environment(args: argparse.Namespace, target: Target) -> dict[str, str]:
    """The variables that plant the self-check's slowdown in the benchmark run (none without
    ``--self-check``): the extra pass over the logits on the bundled sampler, a spin proportional to
    each call on a ``--variant``."""
    if not args.self_check:
        return {}
    if target.spec is None:
        return {EXTRA_PASS_ENV: target.name}
    return {PLANTED_ENV: f"{target.name}={planted_percent(args) / 100!r}"}


def run_environment(planted: Mapping[str, str]) -> dict[str, str]:
    """The benchmark run's environment: this one with the current directory first on ``PYTHONPATH``
    (a module spec resolves there as it did here), and the variables of the planted slowdown."""
    environment = dict(os.environ)
    paths = [os.getcwd(), *filter(None, [environment.get("PYTHONPATH")])]
    environment["PYTHONPATH"] = os.pathsep.join(paths)
    environment.update(planted)
    return environment


def run_pytest(command: Sequence[str], directory: Path, environment: dict[str, str]) -> int:
    """Run the benchmark command in ``directory`` (scratch: pytest-benchmark's storage goes there)."""
    return subprocess.call(list(command), cwd=directory, env=environment)


def gpu_name() -> str | None:
    """The name of CUDA device 0, or ``None`` without a CUDA GPU."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def record_command(args: argparse.Namespace) -> str:
    """The command that records the baseline these arguments gate against."""
    words = [command()]
    if args.variant is not None:
        words += ["--variant", shlex.quote(args.variant)]
    if args.baseline is not None:
        words += ["--baseline", shlex.quote(args.baseline)]
    return " ".join([*words, "--save"])


def timed_run(
    args: argparse.Namespace,
    target: Target,
    baseline: Path,
    run_json: Path,
    scratch: Path,
    planted: Mapping[str, str],
) -> int:
    """Time the gate cases once (``planted`` names the slowdown, if any), the pytest-benchmark JSON in
    ``run_json`` beside the baseline's medians; pytest's exit code (0, or 1 if a benchmark failed).

    pytest-benchmark only shows the comparison: the gate judges the medians itself (`judge`), so a
    regression is one line of its own, never the plugin's exception.
    """
    extra = [f"--benchmark-json={run_json}"]
    if not args.save:
        extra.append(f"--benchmark-compare={baseline}")
    command = pytest_command(target.bench_spec, [*extra, *args.pytest_args])
    prefix = "".join(f"{name}={shlex.quote(value)} " for name, value in planted.items())
    print(f"$ {prefix}{shlex.join(command)}", flush=True)
    status = run_pytest(command, scratch, run_environment(planted))
    if status not in (0, 1) or not run_json.is_file():
        raise GateUsageError(f"the benchmark run ended with pytest exit code {status}; see its report")
    return status


def compared(
    args: argparse.Namespace, target: Target, recorded: report.Run, run: report.Run
) -> list[report.Change]:
    """Every benchmark of the run beside its baseline median, printed with the margin.

    Raises:
        GateUsageError: if the baseline shares no benchmark with the run.
    """
    baseline, run_json = recorded.path, run.path
    changes = report.compare(recorded, run)
    if not changes:
        raise GateUsageError(
            f"--baseline {str(baseline)!r} shares no benchmark with this run of {target.name!r}; "
            f"record one with: {record_command(args)}"
        )
    print(f"\nmedians against {baseline} (margin {args.margin} %):")
    report.main(["compare", str(baseline), str(run_json), "--margin", str(args.margin)])
    if len(run.records) > len(changes):
        print(f"{len(run.records) - len(changes)} benchmarks of this run have no baseline record: not gated")
    return changes


def judge_unchanged(
    args: argparse.Namespace, target: Target, baseline: Path, run_json: Path, pytest_status: int
) -> list[report.Change]:
    """The self-check's first run, of the sampler as it is: the benchmarks it regressed past the margin
    (the gate would fail an unchanged sampler there). A benchmark that failed is not timed, and the
    planted run, which fails it too, names it."""
    changes = compared(args, target, report.load_run(baseline), report.load_run(run_json))
    regressed = [change for change in changes if 100 * change.relative > args.margin]
    print(
        f"unchanged run of {target.name!r}: {len(regressed)} of {len(changes)} benchmarks past the "
        f"{args.margin} % margin"
        + (f"; a benchmark failed (pytest exit {pytest_status})" if pytest_status else "")
    )
    return regressed


def judge(
    args: argparse.Namespace,
    target: Target,
    baseline: Path,
    run_json: Path,
    pytest_status: int,
    unchanged: Sequence[report.Change] | None = None,
) -> int:
    """Compare the run with the baseline, print every change, and return the exit code; ``unchanged``
    holds what the self-check's run of the unchanged variant regressed (`judge_unchanged`)."""
    run = report.load_run(run_json)
    recorded = report.load_run(baseline)
    changes = compared(args, target, recorded, run)
    regressed = sum(100 * change.relative > args.margin for change in changes)
    if not args.self_check:
        if pytest_status and not regressed:
            print(f"a benchmark of {target.name!r} failed (pytest exit {pytest_status}); see its report")
        return 1 if regressed or pytest_status else 0
    if target.spec is not None:
        timed = {record.fullname for record in run.records}
        ours = (record.fullname for record in recorded.records if record.variant == target.name)
        not_timed = [fullname for fullname in ours if fullname not in timed]
        return judge_proportional(args, target, changes, not_timed, unchanged or ())
    if regressed:
        print(
            f"self-check passed: the planted extra pass over the logits regressed {regressed} of "
            f"{len(changes)} benchmarks of {target.name!r} past {args.margin} %, and the gate fails"
        )
        return 0
    print(
        f"self-check FAILED: the planted extra pass over the logits regressed none of the {len(changes)} "
        f"benchmarks of {target.name!r} past {args.margin} %: the gate would not see a change that "
        "reads the logits once more"
    )
    return 1


def benchmark_name(fullname: str) -> str:
    """A benchmark's name without its file: ``test_gpu_time[<case id>-<variant name>]``."""
    return fullname.rpartition("::")[2]


def judge_proportional(
    args: argparse.Namespace,
    target: Target,
    changes: Sequence[report.Change],
    not_timed: Sequence[str],
    unchanged: Sequence[report.Change],
) -> int:
    """The verdict of ``--variant SPEC --self-check``: 0 if the unchanged run passed the gate and the
    planted slowdown regressed every benchmark of the baseline past the margin, else 1, naming the
    benchmarks that failed the unchanged sampler or missed the slowdown."""
    planted = planted_percent(args)
    why = f"twice the {args.margin} % margin" if args.planted is None else "--planted"
    caught = [change for change in changes if 100 * change.relative > args.margin]
    missed = [change for change in changes if 100 * change.relative <= args.margin]
    total = len(changes) + len(not_timed)
    print(
        f"\nplanted +{planted:g} % GPU time per call of {target.name!r} ({why}): after each call the GPU "
        f"spins for {planted:g} % of that call's own GPU time"
    )
    print(f"caught (past {args.margin} %) in {len(caught)} of {total} benchmarks:")
    for change in caught:
        print(f"  {100 * change.relative:+7.1f} %  {benchmark_name(change.fullname)}")
    if unchanged:
        print(f"failed the unchanged sampler in {len(unchanged)} of {total} benchmarks:")
        for change in unchanged:
            print(f"  {100 * change.relative:+7.1f} %  {benchmark_name(change.fullname)}")
        names = ", ".join(benchmark_name(change.fullname) for change in unchanged)
        print(
            f"self-check FAILED: the gate fails {target.name!r} unchanged in {names}: its medians there "
            f"moved past the {args.margin} % margin between the baseline and this run, so a regression there "
            "cannot be told from the spread; record the baseline again, or gate with a wider --margin"
        )
        return 1
    if not missed and not not_timed:
        print(
            f"self-check passed: the gate passes {target.name!r} unchanged and fails a run {planted:g} % "
            f"slower in every one of its {total} benchmarks"
        )
        return 0
    print(f"missed in {len(missed) + len(not_timed)} of {total} benchmarks:")
    for change in missed:
        print(f"  {100 * change.relative:+7.1f} %  {benchmark_name(change.fullname)}")
    for fullname in not_timed:
        print(f"  not timed in this run  {benchmark_name(fullname)}")
    names = ", ".join(benchmark_name(name) for name in [*(c.fullname for c in missed), *not_timed])
    print(
        f"self-check FAILED: the gate did not see {target.name!r} run {planted:g} % slower in {names}: "
        f"there it cannot be trusted to see a regression of the {args.margin} % margin (a wider --margin "
        "plants a proportionally larger slowdown)"
    )
    return 1


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (exit 2 through `GateUsageError`)."""

    def error(self, message: str) -> NoReturn:
        raise GateUsageError(message)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; see the module docstring."""
    parser = _Parser(prog=command(), description=__doc__.split("\n")[0])
    parser.add_argument(
        "--variant",
        metavar="SPEC",
        help="gate this variant instead of the bundled Triton sampler: package.module:NAME, "
        "path/to/file.py:NAME or a registered name (triton, torch)",
    )
    parser.add_argument(
        "--baseline",
        metavar="PATH",
        help="the baseline file (default: benchmarks/baselines/<GPU>.json for the bundled sampler, "
        f"./{AUTHOR_BASELINES}/<GPU>/<variant name>.json with --variant)",
    )
    parser.add_argument("--save", action="store_true", help="record the baseline instead of gating")
    parser.add_argument(
        "--runs",
        type=int,
        help=f"with --save: time the cases this many times, each run its own process, and record each "
        f"benchmark's middle median (default {SAVE_RUNS})",
    )
    parser.add_argument(
        "--self-check",
        action="store_true",
        help="gate a run with a planted slowdown: one extra pass over the logits on the bundled sampler "
        "(passes if a median regressed past the margin); with --variant, first a run of the sampler as it "
        "is, then --planted percent of each call's own GPU time (passes if the first run passed the gate "
        "and the second regressed every benchmark past the margin)",
    )
    parser.add_argument("--margin", type=int, default=MARGIN_PERCENT, help="allowed median growth, percent")
    parser.add_argument(
        "--planted",
        type=float,
        metavar="PERCENT",
        help="with --variant and --self-check: the slowdown planted in each call, percent of its GPU time "
        "(default: twice the margin; it must exceed the margin)",
    )
    parser.add_argument("--json", metavar="PATH", help="also keep this run's pytest-benchmark JSON here")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.margin <= 0:
        raise GateUsageError(f"--margin {args.margin}: the allowed growth must be a positive percent")
    if args.runs is not None and (args.runs < 1 or not args.save):
        raise GateUsageError(f"--runs {args.runs}: it counts the runs of --save, at least 1")
    args.runs = SAVE_RUNS if args.runs is None else args.runs
    if args.save and args.self_check:
        raise GateUsageError("--save and --self-check: record the baseline first, then self-check against it")
    if args.planted is not None:
        if not (args.self_check and args.variant is not None):
            raise GateUsageError(
                f"--planted {args.planted:g}: it sizes the slowdown of --variant SPEC --self-check; the "
                "bundled sampler's self-check plants one extra pass over the logits"
            )
        if not (math.isfinite(args.planted) and args.planted > args.margin):
            raise GateUsageError(
                f"--planted {args.planted:g}: the planted slowdown must exceed the {args.margin} % margin, "
                "or the gate need not see it"
            )
    return args


def run_gate(args: argparse.Namespace) -> int:
    """Record a baseline, gate against it, or self-check, as ``args`` ask; the exit code."""
    target = load_target(args.variant)
    explicit = Path(args.baseline).resolve() if args.baseline is not None else None
    if explicit is not None and not args.save and not explicit.is_file():
        raise GateUsageError(
            f"--baseline {args.baseline!r}: no file at {explicit}; record one with: {record_command(args)}"
        )
    gpu = gpu_name()
    if gpu is None:
        raise GateUsageError(
            f"no CUDA GPU (torch.cuda.is_available() is False): the gate times on a GPU; on a CPU, "
            f"`python -m pytest {BENCHMARKS_DIR}` is the smoke test"
        )
    baseline = explicit or target.default_baseline(gpu)
    if not args.save and not baseline.is_file():
        raise GateUsageError(
            f"no baseline of {target.name!r} on {gpu} at {baseline}; record one with: {record_command(args)}"
        )
    if not args.save:
        try:
            report.load_run(baseline)
        except (ValueError, KeyError, TypeError) as error:
            raise GateUsageError(f"{baseline} is not a pytest-benchmark JSON baseline: {error!r}") from error
    with tempfile.TemporaryDirectory(prefix="specsample-gate-") as scratch:
        run_json = Path(args.json).resolve() if args.json else Path(scratch) / "run.json"
        unchanged: list[report.Change] | None = None
        if args.self_check and target.spec is not None:
            # First the sampler as it is: a gate that fails it cannot be trusted at this margin.
            null_json = Path(scratch) / "unchanged.json"
            null_status = timed_run(args, target, baseline, null_json, Path(scratch), {})
            unchanged = judge_unchanged(args, target, baseline, null_json, null_status)
        if args.save:
            return record_baseline(args, target, baseline, run_json, Path(scratch), gpu)
        status = timed_run(args, target, baseline, run_json, Path(scratch), planted_environment(args, target))
        return judge(args, target, baseline, run_json, status, unchanged)


def middle_run(runs: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, tuple[float, float]]]:
    """One pytest-benchmark JSON from several runs of the same benchmarks: for each benchmark timed
    in every run, its record from the run whose median is the middle one (the lower middle of an
    even count); and each benchmark's smallest and largest median over the runs."""
    records: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for bench in run.get("benchmarks", []):
            records.setdefault(bench["fullname"], []).append(bench)
    combined = {key: value for key, value in runs[0].items() if key != "benchmarks"}
    combined["benchmarks"] = []
    ranges: dict[str, tuple[float, float]] = {}
    for fullname, timed in records.items():
        if len(timed) < len(runs):
            continue
        timed.sort(key=lambda bench: float(bench["stats"]["median"]))
        combined["benchmarks"].append(timed[(len(timed) - 1) // 2])
        ranges[fullname] = (float(timed[0]["stats"]["median"]), float(timed[-1]["stats"]["median"]))
    return combined, ranges


def record_baseline(
    args: argparse.Namespace, target: Target, baseline: Path, run_json: Path, scratch: Path, gpu: str
) -> int:
    """``--save``: time the gate cases ``--runs`` times, each in its own process, and record the
    middle median of each benchmark as the baseline (`middle_run`); print how far the medians moved
    between the runs, and say where that spread exceeds the margin. The exit code."""
    runs = []
    for index in range(args.runs):
        path = scratch / f"save-{index}.json"
        status = timed_run(args, target, baseline, path, scratch, {})
        if status:
            print(f"no baseline recorded: a benchmark of {target.name!r} failed (pytest exit {status})")
            return 1
        runs.append(json.loads(path.read_text(encoding="utf-8")))
    combined, ranges = middle_run(runs)
    if not combined["benchmarks"]:
        raise GateUsageError(f"no baseline recorded: the runs timed no benchmark of {target.name!r}")
    text = json.dumps(combined, indent=2)
    run_json.write_text(text, encoding="utf-8")
    baseline.parent.mkdir(parents=True, exist_ok=True)
    baseline.write_text(text, encoding="utf-8")
    spreads = sorted(((high / low - 1, name) for name, (low, high) in ranges.items()), reverse=True)
    if args.runs > 1:
        print(
            f"\nmedians of {args.runs} runs (the baseline keeps the middle one); "
            "spread = largest / smallest - 1:"
        )
        for spread, name in spreads:
            low, high = ranges[name]
            print(
                f"  {100 * spread:6.1f} %  {1e6 * low:10.1f} .. {1e6 * high:10.1f} us  {benchmark_name(name)}"
            )
        wide = [name for spread, name in spreads if 100 * spread > args.margin]
        if wide:
            print(
                f"{len(wide)} of {len(spreads)} benchmarks moved more than the {args.margin} % margin "
                f"between runs of the same code (up to {100 * spreads[0][0]:.0f} %): the gate may fail "
                f"{target.name!r} unchanged there; --self-check says whether it holds, or gate with --margin "
                f"{math.ceil(round(100 * spreads[0][0], 6))}"
            )
    gate_command = record_command(args).removesuffix(" --save")
    print(
        f"recorded {len(combined['benchmarks'])} benchmarks of {target.name!r} on {gpu} at {baseline}; "
        f"gate with: {gate_command}"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; see the module docstring."""
    try:
        return run_gate(parse_args(argv))
    except GateUsageError as error:
        print(f"gate: {' '.join(str(error).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
