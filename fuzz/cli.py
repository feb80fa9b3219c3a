"""``python -m specsample.fuzz`` (``python -m fuzz`` from the repository root): run, replay, list,
mutants, certify, mutate.

Exit codes: 0 passed, 1 a check failed (or a mutant survived), 2 a usage or environment error (one
line naming the argument and the value), 3 inconclusive (nothing failed, but a check ran with less
power than the profile asks, or nothing was checked), 130 interrupted (Ctrl-C: what ran is reported
and kept).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from specsample.fuzz import command as cmdline

# Certify's default seconds of sampler calls per variant for the checks (`--check-budget`): the ci
# profile's 2,000 trials of every targeted case for the Triton sampler under the interpreter on a
# 2-core CPU, with room for a slower machine. On the CI machine of 2026-11-26 a trial took 24 to 26 ms
# (3 calls' worth a check run), so 120 s afforded 1,570 to 1,644 trials, for the tree before and after
# the kernels' rule set alike. With step_pairs a check run is 4 calls' worth, and on the same machine
# the reference sampler took 32.1 ms a trial (1,871 trials in 240 s). A later CI run afforded the Triton
# sampler 1,905 trials in 320 s; 360 s afforded 2,000 trials up to 45 ms a trial. A CI run of the
# same day's later tree measured 45.6 ms a trial (1,975 trials in 360 s; other tests 20 to 50 % slower
# than before, none of their code changed): 480 s affords 2,000 up to 60 ms.
CHECK_BUDGET_SECONDS = 480.0

EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_INCONCLUSIVE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
DEFAULT_CORPUS = Path("fuzz-corpus-local")
# The example database the workers of one host share unless --database names another.
DEFAULT_SHARED_DATABASE = Path(".hypothesis/fuzz-shared")


class UsageError(Exception):
    """A bad argument or environment (exit code 2)."""


def _device(args: argparse.Namespace) -> str:
    """``--device``, checked: cpu, cuda or cuda:N of a visible GPU (default: cuda when a GPU is visible)."""
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device != "cpu" and not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise UsageError(f"--device is {device!r}; expected cpu, cuda or cuda:N")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device is {device!r} but no CUDA GPU is visible")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise UsageError(f"--device is {device!r} but {torch.cuda.device_count()} CUDA GPUs are visible")
    return device


def _number(kind: type, low: float, option: str) -> object:
    """An argparse type: a ``kind`` number of at least ``low``, else an error naming ``option``."""

    def parse(value: str) -> object:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} is {value!r}; expected a number") from None
        if not low <= number < float("inf"):
            raise argparse.ArgumentTypeError(f"{option} is {value!r}; expected a finite number >= {low:g}")
        return number

    return parse


def _writable(path: Path, option: str, *, directory: bool = True) -> Path:
    """``path`` (a directory, or a file with ``directory=False``) if it can be written there, checked
    before any work is done by writing a probe file; the folders made for the probe are removed again.

    Raises:
        UsageError: naming ``option``, the path and why it cannot be written.
    """
    if path.exists() and directory != path.is_dir():
        raise UsageError(f"{option} is {str(path)!r}, which is a {'file' if directory else 'directory'}")
    folder = path if directory else path.parent
    made = [f for f in (folder, *folder.parents) if not f.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".specsample-probe-"):
            pass
    except OSError as error:
        raise UsageError(
            f"{option} is {str(path)!r}, which cannot be written: {error.strerror or error}"
        ) from None
    finally:
        for created in made:
            with contextlib.suppress(OSError):
                created.rmdir()
    return path


def _variant_and_methods(spec: str, methods: tuple[str, ...] | None) -> tuple[object, tuple[str, ...]]:
    """The variant ``spec`` names and the methods to check: those asked for that it implements.

    Raises:
        UsageError: ``--methods`` asks only for methods outside the variant's declared capabilities,
            or the declared capabilities are malformed.
    """
    from specsample.fuzz.spec import load_variant
    from specsample.reference.contract import METHODS, capabilities

    variant = load_variant(spec)
    try:
        caps = capabilities(variant)
    except (ValueError, TypeError) as error:
        raise UsageError(
            f"variant {spec!r} declares capabilities the harness cannot read: {error}"
        ) from error
    chosen = tuple(m for m in (methods or METHODS) if m in caps.methods)
    if not chosen:
        raise UsageError(
            f"--methods is {','.join(methods or ())!r}, but variant {spec!r} declares only "
            f"{', '.join(caps.methods)}: nothing to check"
        )
    return variant, chosen


def _probability(value: str) -> float:
    """``--false-failure-rate``: a probability in (0, 1)."""
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not 0 < number < 1:
        raise argparse.ArgumentTypeError(f"--false-failure-rate is {value!r}; expected a number in (0, 1)")
    return number


def _worker(value: str) -> tuple[int, int]:
    """The hidden ``--worker I/N`` of a local worker process: its index and the campaign's workers."""
    try:
        index, count = (int(part) for part in value.split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"--worker is {value!r}; expected I/N with 0 <= I < N")
    return index, count


def _comma_list(value: str, option: str, known: Iterable[str]) -> tuple[str, ...]:
    """``value`` read as a comma list of names from ``known``; a usage error names ``option``."""
    known = tuple(known)
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{option} has {unknown or value!r}; expected a comma list of {', '.join(known)}"
        )
    return names


def _methods(value: str) -> tuple[str, ...]:
    from specsample.reference.contract import METHODS

    return _comma_list(value, "--methods", METHODS)


def cmd_run(args: argparse.Namespace) -> int:
    """Fuzz a variant: targeted cases, then Hypothesis search steered toward large discrepancies.
    Exit 1 with a reproducer on the first failure."""
    from specsample.fuzz.campaign import ErrorBudget, example_database, is_redis, run_campaign
    from specsample.properties import profiles

    _writable(args.corpus, "--corpus")
    if args.database is not None and not is_redis(args.database):
        _writable(Path(args.database), "--database")
    variant, methods = _variant_and_methods(args.variant, args.methods)
    if args.cluster is not None:
        return _run_cluster(args)
    device = _device(args)
    if (args.workers or 1) > 1:
        return _run_workers(args)
    worker, workers = args.worker
    errors = ErrorBudget(args.false_failure_rate, profiles.get(args.profile).alpha, worker, workers)
    if args.blind:
        from specsample.fuzz.selftest import Blind

        variant = Blind(variant)
    result = run_campaign(
        variant,
        args.variant,
        methods=methods,
        profile=args.profile,
        seconds=args.budget,
        seed=args.seed,
        corpus=args.corpus,
        shrink=not args.no_shrink,
        targeted=not args.no_targeted,
        device=device,
        database=example_database(args.database, args.shared_database),
        errors=errors,
        part=args.worker,
    )
    overrun = result.overrun()
    if result.failure is None:
        if result.coverage is not None and result.coverage.batches:
            print("\n".join(result.coverage.lines()))
        elif result.search_wanted:
            print("coverage: no search batch was checked")
        word = {"pass": "PASSED", "inconclusive": "INCONCLUSIVE"}[result.status]
        word = "INTERRUPTED" if result.interrupted else word
        print(f"{word}: {args.variant}: {result.describe()}")
        if result.status == "pass" and not result.checks_passed:
            print("  screens only: no check ran at the profile's power; a larger --budget gives it")
        for reason in result.inconclusive_reasons():
            print(f"  inconclusive: {reason}")
        if overrun:
            print(f"  over budget: {overrun}")
        if result.interrupted:
            return EXIT_INTERRUPTED
        return EXIT_PASSED if result.status == "pass" else EXIT_INCONCLUSIVE
    print(f"FAILED: {args.variant}: check {result.failure.check} ({result.case}): {result.failure.message}")
    for line in result.failure.explain()[1:]:  # below its one-line message
        print(f"  {line}")
    interrupted = " (interrupted while shrinking: the smallest failure so far)" if result.interrupted else ""
    print(f"Found after {result.found_after or 0.0:.1f} s{interrupted}; {result.describe()}")
    if overrun:
        print(f"Over budget: {overrun}")
    if result.reproducer is not None:
        print(f"Reproducer: {result.reproducer}\nReplay:     {cmdline.replay(result.reproducer)}")
    return EXIT_FAILED


def _run_cluster(args: argparse.Namespace) -> int:
    """The campaign on a Ray cluster's workers (`fuzz.cluster`): one verdict, one false-failure rate."""
    from specsample.fuzz.cluster import CampaignTask, run_campaign_on_cluster

    task = CampaignTask(
        spec=args.variant,
        methods=args.methods,
        profile=args.profile,
        seconds=args.budget,
        seed=args.seed,
        shrink=not args.no_shrink,
        targeted=not args.no_targeted,
        blind=args.blind,
        database=str(args.database or DEFAULT_SHARED_DATABASE),
        shared=tuple(str(shared) for shared in args.shared_database),
        false_failure_rate=args.false_failure_rate,
    )
    result = run_campaign_on_cluster(
        task, address=args.cluster, workers=args.workers, device=args.device, corpus=args.corpus
    )
    print("\n".join(result.lines()))
    codes = {"pass": EXIT_PASSED, "fail": EXIT_FAILED, "environment": EXIT_USAGE}
    codes |= {"interrupted": EXIT_INTERRUPTED, "inconclusive": EXIT_INCONCLUSIVE}
    return codes[result.status]


def _run_workers(args: argparse.Namespace) -> int:
    """Spread a campaign over processes, one GPU each when there are GPUs, sharing the example database
    and the campaign's false-failure budget (each worker takes every ``workers``-th stage)."""
    import torch

    gpus = torch.cuda.device_count()
    options = {
        "--variant": args.variant,
        "--profile": args.profile,
        "--corpus": args.corpus,
        "--database": args.database or DEFAULT_SHARED_DATABASE,
        "--workers": 1,
        "--budget": args.budget,
        "--methods": ",".join(args.methods) if args.methods else None,
        "--false-failure-rate": repr(args.false_failure_rate),
    }
    argv = [*cmdline.argv(), "run"]
    argv += [str(arg) for name, value in options.items() if value is not None for arg in (name, value)]
    argv += [arg for shared in args.shared_database for arg in ("--shared-database", str(shared))]
    flags = {"--no-shrink": args.no_shrink, "--blind": args.blind, "--no-targeted": args.no_targeted}
    argv += [flag for flag, given in flags.items() if given]
    procs = []
    for worker in range(args.workers):
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(worker % gpus)
        mine = ["--seed", str(args.seed + 1000 * worker), "--worker", f"{worker}/{args.workers}"]
        procs.append(subprocess.Popen([*argv, *mine], env=env))
    try:
        codes = {p.wait() for p in procs}
    except KeyboardInterrupt:  # each worker got the Ctrl-C too, and reports what it did
        codes = {p.wait() for p in procs}
        return EXIT_INTERRUPTED
    print(
        f"campaign of {args.workers} workers: false-failure rate <= {args.false_failure_rate:.2g} for the "
        "whole campaign (each worker's line says what its stages spent of it)"
    )
    if EXIT_FAILED in codes:
        return EXIT_FAILED
    if codes <= {EXIT_PASSED, EXIT_INCONCLUSIVE}:
        return EXIT_PASSED if codes == {EXIT_PASSED} else EXIT_INCONCLUSIVE
    return EXIT_USAGE  # a worker's usage or environment error


def cmd_replay(args: argparse.Namespace) -> int:
    """Re-run reproducers; a fixed bug turns them green (exit 0)."""
    from specsample.fuzz.reproducer import ReproducerError, load_reproducer, replay_verdicts

    if not args.path.exists():
        raise UsageError(f"path {args.path} does not exist")
    paths = sorted(args.path.glob("*.json")) if args.path.is_dir() else [args.path]
    if not paths:
        raise UsageError(f"path {args.path} holds no reproducer (*.json)")
    device = _device(args)
    failures = skipped = 0
    for path in paths:
        try:
            reproducer = load_reproducer(path)
        except ReproducerError as error:
            raise UsageError(str(error)) from error
        spec = args.variant or reproducer.variant
        verdicts = replay_verdicts(reproducer, spec, device, all_checks=args.all_checks)
        if isinstance(verdicts, str):
            skipped += 1
            print(f"{path}: {spec}: skipped: {verdicts}")
            continue
        failed = [v for v in verdicts if v.failed]
        failures += bool(failed)
        status = f"FAILED {failed[0].check}: {failed[0].message}" if failed else "passed"
        print(f"{path}: {spec}: {status}")
        for line in failed[0].explain()[1:] if failed else []:
            print(f"  {line}")
    print(f"{len(paths) - failures - skipped} passed, {failures} failed, {skipped} skipped")
    if failures:
        return EXIT_FAILED
    return EXIT_INCONCLUSIVE if skipped == len(paths) else EXIT_PASSED


def cmd_list(args: argparse.Namespace) -> int:
    """List the registered variants and the planted mutants."""
    from specsample.fuzz.mutants import MUTANTS
    from specsample.kernels import registry

    print("variants:")
    print("  reference        the float64 reference sampler (scheme canonical-v3)")
    print("  walk             specsample.reference.walk:WalkSampler: the vectorised walk, the mutants' host")
    for name in registry.names():
        streams = registry.get(name).streams
        print(f"  {name:<16} {'its own RNG' if streams is None else f'scheme {streams.name}'}")
    print("mutants:")
    for m in MUTANTS.values():
        tier = " (GPU tier)" if m.gpu_only else ""
        print(f"  {m.id}  {m.bug}{tier}; expected killer: {', '.join(m.expected)}; {m.spec}")
    return EXIT_PASSED


def cmd_mutants(args: argparse.Namespace) -> int:
    """Every mutant must die in the blind campaign (coupling off)."""
    from specsample.fuzz.mutants import MUTANTS
    from specsample.fuzz.selftest import run_mutants, table

    if args.json is not None:
        _writable(args.json, "--json", directory=False)
    ids = [i.upper() for i in args.ids] if args.ids else None
    unknown = [i for i in ids or [] if i not in MUTANTS]
    if unknown:
        raise UsageError(f"mutant ids {unknown} are unknown; known: {', '.join(MUTANTS)}")
    gpu_tier = [i for i in ids or [] if MUTANTS[i].gpu_only]
    if gpu_tier:
        raise UsageError(
            f"mutants {gpu_tier} need a batch past 2**31 logits in one call: run "
            "python3 -m pytest -m gpu fuzz/tests/test_gpu_tier.py on a GPU"
        )
    records = run_mutants(
        ids,
        profile=args.profile,
        rounds=args.rounds,
        device=_device(args),
        targeted=not args.no_targeted,
        seconds=args.budget if args.no_targeted else None,
        seed=args.seed,
    )
    print(table(records))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.to_json() for r in records], indent=1) + "\n")
    survivors = [r.id for r in records if not r.killed]
    killed = len(records) - len(survivors)
    print(f"{killed} killed, {len(survivors)} survived" + (f": {survivors}" if survivors else ""))
    return EXIT_FAILED if survivors else EXIT_PASSED


def cmd_certify(args: argparse.Namespace) -> int:
    """Run the property checks, a short fuzz campaign and the mutant self-test; print the report and
    write it as Markdown and JSON."""
    from specsample.fuzz.certify import DEFAULT_VARIANTS, certify, report_paths
    from specsample.fuzz.spec import load_variant

    markdown, _ = report_paths(args.out)
    _writable(args.out, "--out", directory=markdown != args.out)
    specs = args.variant or list(DEFAULT_VARIANTS)
    for spec in specs:
        load_variant(spec)  # a spec that names nothing is a usage error before any work
    pool = None
    if args.cluster is not None:
        from specsample.fuzz.cluster import map_on_cluster

        pool = functools.partial(map_on_cluster, args.cluster, args.workers, args.device)

    status = certify(
        specs,
        profile=args.profile,
        campaign_seconds=args.budget,
        check_seconds=args.check_budget,
        mutants=not args.no_mutants,
        out=args.out,
        device=(args.device or "cpu") if args.cluster is not None else _device(args),
        methods=args.methods,
        pool=pool,
    )
    codes = {"pass": EXIT_PASSED, "fail": EXIT_FAILED, "interrupted": EXIT_INTERRUPTED}
    return codes.get(status, EXIT_INCONCLUSIVE)


def _operators(value: str) -> tuple[str, ...]:
    from specsample.fuzz.mutate import OPERATORS

    return _comma_list(value, "--operators", OPERATORS)


def _kernel_files(args: argparse.Namespace, variant: object) -> list[Path]:
    """The files to mutate: ``--source`` (each must exist, define a ``@triton.jit`` function and be
    imported by the variant), or the variant's own kernel modules.

    Raises:
        UsageError: a ``--source`` that does not qualify, or a variant without any kernel.
    """
    from specsample.fuzz import mutate

    if not args.source:
        files = mutate.kernel_files(variant)
        if not files:
            raise UsageError(
                f"--variant is {args.variant!r}, whose code defines no @triton.jit function (nor do the "
                "modules it imports): nothing to mutate; name the kernel files with --source FILE"
            )
        return files
    imported = {mutate.module_file(m) for m in mutate.variant_modules(variant)}
    files = []
    for source in args.source:
        if not source.is_file():
            raise UsageError(f"--source is {str(source)!r}, which does not exist")
        try:
            defined = mutate.jit_functions(source.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError) as error:
            raise UsageError(f"--source is {str(source)!r}, which is not Python source: {error}") from None
        if not defined:
            raise UsageError(f"--source is {str(source)!r}, which defines no @triton.jit function")
        if os.path.realpath(source) not in imported:
            raise UsageError(f"--source is {str(source)!r}, which variant {args.variant!r} does not import")
        files.append(source)
    return files


def cmd_mutate(args: argparse.Namespace) -> int:
    """Mutation-test a variant's @triton.jit kernels: each mutant (a one-place change of the kernel
    source, in a copy; the files on disk are never written) runs in a process of its own through the
    campaign of `run`, after a control run of the unmutated variant. Prints the kill matrix and
    writes it as Markdown (--out) and JSON (--json). Exit 0 when every scored mutant was killed, 1
    when one survived (or the unmutated variant fails its checks), 3 when no mutant could be scored,
    130 interrupted (the report of what ran is written)."""
    from specsample.fuzz import mutate

    for path, option in ((args.out, "--out"), (args.json, "--json")):
        if path is not None:
            _writable(path, option, directory=False)
    variant, _ = _variant_and_methods(args.variant, None)
    device = _device(args)
    files = {mutate.shown_path(path): path for path in _kernel_files(args, variant)}
    mutants = [
        m
        for shown, path in files.items()
        for m in mutate.generate_mutants(path, path.read_text(encoding="utf-8"), shown)
        if args.operators is None or m.operator in args.operators
    ]
    unknown = sorted(set(args.mutant) - {m.id for m in mutants})
    if unknown:
        raise UsageError(f"--mutant has {unknown}, which no kernel file of {args.variant!r} gives now")
    if args.list:
        for m in mutants:
            print(f"{m.id}  {m.operator:<14} {m.function} ({m.path}:{m.line})  {m.change}")
        print(f"{len(mutants)} mutants of {len(files)} files")
        return EXIT_PASSED
    options = [("--variant", args.variant)] + [("--source", str(s)) for s in args.source]
    options += [("--profile", args.profile), ("--device", device)]
    options += [("--budget-per-mutant", f"{args.budget_per_mutant:g}"), ("--seed", str(args.seed))]
    replay_base = " ".join([cmdline.program(), "mutate", *(f"{k} {shlex.quote(v)}" for k, v in options)])
    command = replay_base
    if args.operators:
        command += f" --operators {','.join(args.operators)}"
    if args.sample is not None:
        command += f" --sample {args.sample}"
    command += "".join(f" --mutant {shlex.quote(i)}" for i in args.mutant)
    budget = args.budget_per_mutant
    report = mutate.mutate(
        args.variant,
        files,
        mutants,
        count=args.sample,
        chosen_ids=args.mutant,
        budget=budget,
        timeout=args.timeout or mutate.TIMEOUT_FACTOR * budget + mutate.STARTUP_SECONDS,
        profile=args.profile,
        device=device,
        seed=args.seed,
        control=not args.no_control,
        command=command,
        replay_base=replay_base,
        markdown=args.out,
        json_path=args.json,
        jobs=args.jobs,
    )
    print(report.markdown())
    control = report.control or {}
    if control and control["verdict"] not in ("passed", "failed"):
        raise UsageError(
            f"the control run of {args.variant!r} could not run ({control['verdict']}): "
            f"{control.get('message')}"
        )
    if control.get("verdict") == "failed":
        print(
            f"FAILED: the unmutated variant {args.variant!r} fails check {control.get('check')}: "
            f"{control.get('message')}; a kill proves nothing until `run` passes it"
        )
        return EXIT_FAILED
    if report.interrupted:
        return EXIT_INTERRUPTED
    _, scored = report.score()
    if report.survivors:
        return EXIT_FAILED
    return EXIT_PASSED if scored else EXIT_INCONCLUSIVE


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; its usage lines name the program as the user ran it (`command.program`)."""
    from specsample.fuzz.campaign import FALSE_FAILURE_RATE
    from specsample.fuzz.mutate import DEFAULT_BUDGET
    from specsample.properties.profiles import PROFILES

    parser = argparse.ArgumentParser(
        prog=cmdline.program(), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, handler: Callable[[argparse.Namespace], int], help_: str
    ) -> argparse.ArgumentParser:
        """A subcommand; its description is the handler's docstring."""
        sub = commands.add_parser(name, help=help_, description=handler.__doc__)
        sub.set_defaults(handler=handler)
        return sub

    def cluster(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--cluster",
            metavar="ADDRESS",
            help="spread the work over a Ray cluster: 'local' starts one on this machine, 'auto' joins the "
            "one `ray start` made here, ray://HOST:PORT or HOST:PORT joins another",
        )

    def common(sub: argparse.ArgumentParser, profile: bool = True) -> None:
        if profile:
            sub.add_argument(
                "--profile", choices=list(PROFILES), default="ci", help="budget profile (default: ci)"
            )
        sub.add_argument("--device", help="cpu or cuda (default: cuda when a GPU is visible)")

    run = command("run", cmd_run, "fuzz one variant for a time budget")
    variant_help = "package.module:NAME, path/to/file.py:NAME, a registered name, or a mutant id"
    run.add_argument("--variant", required=True, help=variant_help)
    run.add_argument("--methods", type=_methods, help="comma list (default: every method)")
    run.add_argument(
        "--budget", type=_number(float, 1e-3, "--budget"), help="seconds (default: the profile's)"
    )
    run.add_argument("--seed", type=int, default=0, help="seed of the search (default: 0)")
    corpus_help = f"where reproducers are written (default: {DEFAULT_CORPUS})"
    run.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help=corpus_help)
    database_help = (
        "the Hypothesis example database: a directory, or redis://HOST:PORT/DB that every worker of every "
        f"host shares (default: none; with --workers or --cluster {DEFAULT_SHARED_DATABASE})"
    )
    run.add_argument("--database", help=database_help)
    shared_help = "a read-only example database merged in: a directory or a Redis URL (repeatable)"
    run.add_argument("--shared-database", action="append", default=[], help=shared_help)
    workers_help = (
        "workers: processes of this host, one GPU each when GPUs are visible (default 1); with --cluster, "
        "Ray workers (default: one per GPU of the cluster, else one per CPU)"
    )
    run.add_argument("--workers", type=_number(int, 1, "--workers"), help=workers_help)
    cluster(run)
    rate_help = (
        "the campaign's false-failure rate: the probability that it fails a correct sampler, over every "
        f"confirmation of every worker (default: {FALSE_FAILURE_RATE:g})"
    )
    run.add_argument("--false-failure-rate", type=_probability, default=FALSE_FAILURE_RATE, help=rate_help)
    run.add_argument("--worker", type=_worker, default=(0, 1), help=argparse.SUPPRESS)
    run.add_argument("--no-shrink", action="store_true", help="report the first failure without shrinking it")
    run.add_argument("--no-targeted", action="store_true", help="skip the targeted cases: random search only")
    blind_help = "treat the variant as foreign (no coupled check): the statistical checks must find the bug"
    run.add_argument("--blind", action="store_true", help=blind_help)
    common(run)

    replay = command("replay", cmd_replay, "re-run a reproducer or a corpus directory")
    replay.add_argument("path", type=Path, help="a reproducer .json file or a directory of them")
    replay.add_argument("--variant", help="replay against this variant instead of the recorded one")
    replay.add_argument(
        "--all-checks", action="store_true", help="run every check, not only the one that failed"
    )
    common(replay, profile=False)

    command("list", cmd_list, "list registered variants and mutants")

    mutants = command("mutants", cmd_mutants, "run the planted-bug self-test")
    mutants.add_argument("ids", nargs="*", help="mutant ids (default: every CPU mutant)")
    rounds_help = "Hypothesis rounds after the targeted cases"
    mutants.add_argument("--rounds", type=_number(int, 0, "--rounds"), default=1, help=rounds_help)
    search_help = "the search alone: no targeted cases; each mutant gets --budget seconds of search"
    mutants.add_argument("--no-targeted", action="store_true", help=search_help)
    blind_help = "accepted for the spelling '--blind --no-targeted': every mutant's campaign is blind already"
    mutants.add_argument("--blind", action="store_true", help=blind_help)
    budget_help = "seconds of search per mutant with --no-targeted (default: 60)"
    mutants.add_argument("--budget", type=_number(float, 1e-3, "--budget"), default=60.0, help=budget_help)
    mutants.add_argument("--seed", type=int, default=0, help="seed of the search (default: 0)")
    mutants.add_argument("--json", type=Path, help="write one record per mutant to this file")
    common(mutants)

    cert = command("certify", cmd_certify, "certify variants and print the report (the main job)")
    variant_help = "a variant spec (repeatable; default: every bundled one)"
    cert.add_argument("--variant", action="append", help=variant_help)
    budget_help = "fuzz seconds per variant (default: 20)"
    cert.add_argument("--budget", type=_number(float, 0, "--budget"), default=20.0, help=budget_help)
    check_help = (
        "seconds of sampler calls per variant for the checks; a slower sampler gets fewer trials "
        f"(default: {CHECK_BUDGET_SECONDS:.0f}, what the Triton sampler under the interpreter needs on a "
        "2-core CPU for the ci profile's trials of every targeted case)"
    )
    cert.add_argument(
        "--check-budget",
        type=_number(float, 1e-3, "--check-budget"),
        default=CHECK_BUDGET_SECONDS,
        help=check_help,
    )
    cert.add_argument("--methods", type=_methods, help="comma list (default: every method it implements)")
    cert.add_argument(
        "--out",
        type=Path,
        default=Path("certify-report"),
        help="the report: a folder (report.md and report.json in it; default certify-report), or a file "
        "ending in .md (its JSON beside it, with .json)",
    )
    cert.add_argument("--no-mutants", action="store_true", help="skip the mutant self-test")
    cluster(cert)
    cert_workers_help = "with --cluster: Ray workers (default: one per GPU of the cluster, else one per CPU)"
    cert.add_argument("--workers", type=_number(int, 1, "--workers"), help=cert_workers_help)
    common(cert)

    mut = command("mutate", cmd_mutate, "mutation-test a variant's @triton.jit kernels: the kill matrix")
    spec_help = "package.module:NAME, path/to/file.py:NAME or a registered name"
    mut.add_argument("--variant", required=True, help=spec_help)
    source_help = "a kernel file to mutate (repeatable; default: the variant's modules with @triton.jit code)"
    mut.add_argument("--source", type=Path, action="append", default=[], help=source_help)
    budget_help = f"seconds of campaign per mutant (default: {DEFAULT_BUDGET:g})"
    mut.add_argument(
        "--budget-per-mutant",
        type=_number(float, 1e-3, "--budget-per-mutant"),
        default=DEFAULT_BUDGET,
        help=budget_help,
    )
    timeout_help = "seconds before a mutant's process is ended as timed out (default: 2 x budget + 60)"
    mut.add_argument("--timeout", type=_number(float, 1, "--timeout"), help=timeout_help)
    mut.add_argument(
        "--sample", type=_number(int, 1, "--sample"), help="run this many mutants, drawn at random"
    )
    mut.add_argument("--seed", type=int, default=0, help="seed of the sample and the campaigns (default: 0)")
    jobs_help = "mutants run at a time, each in its own process (default: 1); on a GPU they share it"
    mut.add_argument("--jobs", type=_number(int, 1, "--jobs"), default=1, help=jobs_help)
    mut.add_argument("--operators", type=_operators, help="comma list of operators (default: every one)")
    mutant_help = "run only this mutant id (repeatable; no control run): a survivor's replay"
    mut.add_argument("--mutant", action="append", default=[], help=mutant_help)
    mut.add_argument(
        "--no-control", action="store_true", help="skip the control run of the unmutated variant"
    )
    mut.add_argument("--list", action="store_true", help="list the mutants and exit")
    mut.add_argument("--out", type=Path, help="write the kill matrix as Markdown to this file")
    mut.add_argument("--json", type=Path, help="write the kill matrix as JSON to this file")
    common(mut)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return EXIT_PASSED if exit_.code == 0 else EXIT_USAGE
    from specsample.fuzz.spec import SpecError
    from specsample.properties.checks.base import EnvironmentProblem

    try:
        return int(args.handler(args))
    except KeyboardInterrupt:  # a command that keeps partial work reports it and returns 130 itself
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (UsageError, SpecError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except EnvironmentProblem as error:
        print(f"environment error (not the sampler's): {error}", file=sys.stderr)
        return EXIT_USAGE
