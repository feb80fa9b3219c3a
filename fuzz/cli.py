"""``python -m fuzz``: run, replay, list, mutants, certify.

Exit codes: 0 passed, 1 a check failed (or a mutant survived), 2 a usage or environment error,
3 inconclusive (nothing failed, but a check ran with less power than the profile asks).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

EXIT_PASSED, EXIT_FAILED, EXIT_USAGE, EXIT_INCONCLUSIVE = 0, 1, 2, 3
DEFAULT_CORPUS = Path("fuzz-corpus-local")


class UsageError(Exception):
    """A bad argument or environment (exit code 2)."""


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _check_device(device: str) -> str:
    import torch

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


def _methods(value: str) -> tuple[str, ...]:
    from specsample.reference.contract import METHODS

    methods = tuple(m.strip() for m in value.split(",") if m.strip())
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise argparse.ArgumentTypeError(
            f"--methods has {unknown or value!r}; expected a comma list of {', '.join(METHODS)}"
        )
    return methods


def _profiles() -> list[str]:
    from specsample.properties.profiles import PROFILES

    return list(PROFILES)


def cmd_run(args: argparse.Namespace) -> int:
    """Fuzz one variant."""
    from specsample.fuzz.campaign import example_database, run_campaign
    from specsample.fuzz.spec import load_variant

    if args.workers > 1:
        return _run_workers(args)
    variant = load_variant(args.variant)
    if args.blind:
        from specsample.fuzz.selftest import Blind

        variant = Blind(variant)
    device = _check_device(args.device or _default_device())
    database = example_database(args.database, args.shared_database)
    result = run_campaign(
        variant,
        args.variant,
        methods=args.methods,
        profile=args.profile,
        seconds=args.budget,
        seed=args.seed,
        corpus=args.corpus,
        shrink=not args.no_shrink,
        targeted=not args.no_targeted,
        database=database,
        device=device,
    )
    if result.failure is None:
        if result.coverage is not None and result.coverage.batches:
            print("\n".join(result.coverage.lines()))
        word = "PASSED" if result.status == "pass" else "INCONCLUSIVE"
        print(f"{word}: {args.variant}: {result.describe()}")
        if result.status == "pass" and not result.checks_passed:
            print("  screens only: no check ran at the profile's power; a larger --budget gives it")
        for reason in result.inconclusive_reasons():
            print(f"  inconclusive: {reason}")
        return EXIT_PASSED if result.status == "pass" else EXIT_INCONCLUSIVE
    print(f"FAILED: {args.variant}: check {result.failure.check} ({result.case}): {result.failure.message}")
    print(f"Found after {result.found_after or 0.0:.1f} s; {result.describe()}")
    if result.reproducer is not None:
        print(f"Reproducer: {result.reproducer}\nReplay:     python -m fuzz replay {result.reproducer}")
    return EXIT_FAILED


def _run_workers(args: argparse.Namespace) -> int:
    """Spread a campaign over processes, one GPU each when there are GPUs, sharing the example database."""
    import torch

    gpus = torch.cuda.device_count()
    database = args.database or Path(".hypothesis/fuzz-shared")
    procs = []
    for worker in range(args.workers):
        command = [
            sys.executable,
            "-m",
            "fuzz",
            "run",
            "--variant",
            args.variant,
            "--profile",
            args.profile,
            "--seed",
            str(args.seed + 1000 * worker),
            "--corpus",
            str(args.corpus),
            "--database",
            str(database),
            "--workers",
            "1",
        ]
        command += ["--budget", str(args.budget)] if args.budget is not None else []
        command += ["--methods", ",".join(args.methods)] if args.methods else []
        command += [arg for shared in args.shared_database for arg in ("--shared-database", str(shared))]
        command += ["--no-shrink"] if args.no_shrink else []
        command += ["--blind"] if args.blind else []
        command += ["--no-targeted"] if args.no_targeted else []
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(worker % gpus)
        procs.append(subprocess.Popen(command, env=env))
    codes = [p.wait() for p in procs]
    if any(code == EXIT_FAILED for code in codes):
        return EXIT_FAILED
    return EXIT_USAGE if any(code not in (EXIT_PASSED, EXIT_FAILED) for code in codes) else EXIT_PASSED


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay one reproducer or every reproducer of a directory."""
    from specsample.fuzz.reproducer import load_reproducer
    from specsample.fuzz.spec import load_variant
    from specsample.properties.batching import on_device
    from specsample.properties.checks import CHECKS, run_checks
    from specsample.reference.contract import capabilities

    if not args.path.exists():
        raise UsageError(f"path {args.path} does not exist")
    paths = sorted(args.path.glob("*.json")) if args.path.is_dir() else [args.path]
    if not paths:
        raise UsageError(f"path {args.path} holds no reproducer (*.json)")
    device = _check_device(args.device or _default_device())
    failures = skipped = 0
    for path in paths:
        try:
            reproducer = load_reproducer(path)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise UsageError(f"path {path} is not a reproducer: {type(error).__name__}: {error}") from error
        spec = args.variant or reproducer.variant
        variant = load_variant(spec)
        outside = capabilities(variant).admits(reproducer.batch)
        if outside is not None:
            skipped += 1
            print(f"{path}: {spec}: skipped: {outside} lies outside its declared capabilities")
            continue
        checks = tuple(CHECKS) if args.all_checks else (reproducer.check,)
        verdicts = run_checks(
            variant,
            on_device(reproducer.batch, device),
            checks=checks,
            num_samples=reproducer.num_samples,
            alpha=reproducer.alpha,
            seed=reproducer.seed,
        )
        failed = [v for v in verdicts if v.failed]
        failures += bool(failed)
        status = f"FAILED {failed[0].check}: {failed[0].message}" if failed else "passed"
        print(f"{path}: {spec}: {status}")
    print(f"{len(paths) - failures - skipped} passed, {failures} failed, {skipped} skipped")
    if failures:
        return EXIT_FAILED
    return EXIT_INCONCLUSIVE if skipped == len(paths) else EXIT_PASSED


def cmd_list(args: argparse.Namespace) -> int:
    """List registered variants and mutants."""
    from specsample.fuzz.mutants import MUTANTS
    from specsample.kernels import registry

    print("variants:")
    print("  reference        the float64 reference sampler (scheme canonical-v2)")
    print("  walk             specsample.reference.walk:WalkSampler: the vectorised walk, the mutants' host")
    for name in registry.names():
        streams = registry.get(name).streams
        print(f"  {name:<16} {'its own RNG' if streams is None else f'scheme {streams.name}'}")
    print("mutants:")
    for mutant in MUTANTS.values():
        tier = " (GPU tier)" if mutant.gpu_only else ""
        print(
            f"  {mutant.id}  {mutant.bug}{tier}; expected killer: {', '.join(mutant.expected)}; {mutant.spec}"
        )
    return EXIT_PASSED


def cmd_mutants(args: argparse.Namespace) -> int:
    """Run the planted-bug self-test."""
    from specsample.fuzz.mutants import MUTANTS
    from specsample.fuzz.selftest import run_mutants, table

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
    device = _check_device(args.device or _default_device())
    records = run_mutants(
        ids,
        profile=args.profile,
        rounds=args.rounds,
        device=device,
        targeted=not args.no_targeted,
        seconds=args.budget if args.no_targeted else None,
        seed=args.seed,
    )
    print(table(records))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.to_json() for r in records], indent=1) + "\n")
    survivors = [r.id for r in records if not r.killed]
    print(
        f"{len(records) - len(survivors)} killed, {len(survivors)} survived"
        + (f": {survivors}" if survivors else "")
    )
    return EXIT_FAILED if survivors else EXIT_PASSED


def cmd_certify(args: argparse.Namespace) -> int:
    """Certify variants and print the report."""
    from specsample.fuzz.certify import DEFAULT_VARIANTS, certify

    device = _check_device(args.device or _default_device())
    specs = args.variant or list(DEFAULT_VARIANTS)
    status = certify(
        specs,
        profile=args.profile,
        campaign_seconds=args.budget,
        check_seconds=args.check_budget,
        mutants=not args.no_mutants,
        out=args.out,
        device=device,
        methods=args.methods,
    )
    return {"pass": EXIT_PASSED, "fail": EXIT_FAILED}.get(status, EXIT_INCONCLUSIVE)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m fuzz``."""
    parser = argparse.ArgumentParser(
        prog="python -m fuzz", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--profile", choices=_profiles(), default="ci", help="budget profile (default: ci)")
        sub.add_argument("--device", help="cpu or cuda (default: cuda when a GPU is visible)")

    run = commands.add_parser(
        "run",
        help="fuzz one variant for a time budget",
        description="Fuzz a variant: targeted cases, then Hypothesis search steered toward "
        "large discrepancies. Exit 1 with a reproducer on the first failure.",
    )
    run.add_argument(
        "--variant",
        required=True,
        help="package.module:NAME, path/to/file.py:NAME, a registered name, or a mutant id",
    )
    run.add_argument("--methods", type=_methods, help="comma list (default: every method)")
    run.add_argument(
        "--budget", type=_number(float, 1e-3, "--budget"), help="seconds (default: the profile's)"
    )
    run.add_argument("--seed", type=int, default=0, help="seed of the search (default: 0)")
    run.add_argument(
        "--corpus",
        type=Path,
        default=DEFAULT_CORPUS,
        help=f"where reproducers are written (default: {DEFAULT_CORPUS})",
    )
    run.add_argument("--database", type=Path, help="local Hypothesis example database directory")
    run.add_argument(
        "--shared-database",
        type=Path,
        action="append",
        default=[],
        help="a read-only example database merged in (repeatable)",
    )
    run.add_argument(
        "--workers",
        type=_number(int, 1, "--workers"),
        default=1,
        help="processes (one GPU each when GPUs are visible)",
    )
    run.add_argument("--no-shrink", action="store_true", help="report the first failure without shrinking it")
    run.add_argument("--no-targeted", action="store_true", help="skip the targeted cases: random search only")
    run.add_argument(
        "--blind",
        action="store_true",
        help="treat the variant as foreign (no coupled check): the statistical checks must find the bug",
    )
    common(run)
    run.set_defaults(handler=cmd_run)

    replay = commands.add_parser(
        "replay",
        help="re-run a reproducer or a corpus directory",
        description="Re-run reproducers; a fixed bug turns them green (exit 0).",
    )
    replay.add_argument("path", type=Path, help="a reproducer .json file or a directory of them")
    replay.add_argument("--variant", help="replay against this variant instead of the recorded one")
    replay.add_argument(
        "--all-checks", action="store_true", help="run every check, not only the one that failed"
    )
    replay.add_argument("--device", help="cpu or cuda (default: cuda when a GPU is visible)")
    replay.set_defaults(handler=cmd_replay)

    listing = commands.add_parser(
        "list",
        help="list registered variants and mutants",
        description="List the registered variants and the planted mutants.",
    )
    listing.set_defaults(handler=cmd_list)

    mutants = commands.add_parser(
        "mutants",
        help="run the planted-bug self-test",
        description="Every mutant must die in the blind campaign (coupling off).",
    )
    mutants.add_argument("ids", nargs="*", help="mutant ids (default: every CPU mutant)")
    mutants.add_argument(
        "--rounds",
        type=_number(int, 0, "--rounds"),
        default=1,
        help="Hypothesis rounds after the targeted cases",
    )
    mutants.add_argument(
        "--no-targeted",
        action="store_true",
        help="the search alone: no targeted cases; each mutant gets --budget seconds of search",
    )
    mutants.add_argument(
        "--budget",
        type=_number(float, 1e-3, "--budget"),
        default=60.0,
        help="seconds of search per mutant with --no-targeted (default: 60)",
    )
    mutants.add_argument("--seed", type=int, default=0, help="seed of the search (default: 0)")
    mutants.add_argument("--json", type=Path, help="write one record per mutant to this file")
    common(mutants)
    mutants.set_defaults(handler=cmd_mutants)

    cert = commands.add_parser(
        "certify",
        help="certify variants and print the report (the main job)",
        description="Run the property checks, a short fuzz campaign and the mutant "
        "self-test; print the report and write it as Markdown and JSON.",
    )
    cert.add_argument(
        "--variant", action="append", help="a variant spec (repeatable; default: every bundled one)"
    )
    cert.add_argument(
        "--budget",
        type=_number(float, 0, "--budget"),
        default=20.0,
        help="fuzz seconds per variant (default: 20)",
    )
    cert.add_argument(
        "--check-budget",
        type=_number(float, 1e-3, "--check-budget"),
        default=120.0,
        help="seconds of sampler calls per variant for the checks; a slower sampler gets fewer trials "
        "(default: 120, what the float64 reference needs on a 2-core CPU for every targeted case)",
    )
    cert.add_argument("--methods", type=_methods, help="comma list (default: every method it implements)")
    cert.add_argument("--out", type=Path, default=Path("certify-report"), help="report directory")
    cert.add_argument("--no-mutants", action="store_true", help="skip the mutant self-test")
    common(cert)
    cert.set_defaults(handler=cmd_certify)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return EXIT_PASSED if exit_.code == 0 else EXIT_USAGE
    from specsample.properties.checks.base import EnvironmentProblem

    try:
        return int(args.handler(args))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except EnvironmentProblem as error:
        print(f"environment error (not the sampler's): {error}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as error:
        from specsample.fuzz.spec import SpecError

        if isinstance(error, SpecError):
            print(f"error: {error}", file=sys.stderr)
            return EXIT_USAGE
        raise
