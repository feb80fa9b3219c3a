"""The performance gate: time the gate subset and compare each median with this GPU's baseline.

    python3 -m benchmarks.gate                    # exit 1 if a median regressed past the margin
    python3 -m benchmarks.gate --save             # record this GPU's baseline
    python3 -m benchmarks.gate --margin 15 -- -k bf16   # arguments after -- go to pytest

It runs, from the repository root, the plain pytest command it prints first::

    python3 -m pytest benchmarks -m bench --bench-grid=gate --bench-variants=triton \\
        --benchmark-compare=benchmarks/baselines/<GPU>.json --benchmark-compare-fail=median:<M>%

and then lists every benchmark's change against the baseline. It gates the GPU time of the
``triton`` variant only: the gate guards our kernel, while the PyTorch sampler's time and the
Python call latency are bound by host work and moved up to 18 % between runs (RESULTS.md), too
much to share the margin; RESULTS.md reports both. Baselines live in
``benchmarks/baselines/``, one file per GPU name (`baseline_path`); a comparison against another
GPU's baseline is refused. `MARGIN_PERCENT` is justified in RESULTS.md from the measured spread.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from specsample.benchmarks import report

REPO_ROOT = Path(__file__).resolve().parent.parent
BASELINES = REPO_ROOT / "benchmarks" / "baselines"
MARGIN_PERCENT = report.MARGIN_PERCENT


def baseline_path(gpu_name: str) -> Path:
    """``benchmarks/baselines/<GPU name with every run of other characters as _>.json``."""
    return BASELINES / (re.sub(r"[^A-Za-z0-9.-]+", "_", gpu_name).strip("_") + ".json")


def pytest_command(extra: Sequence[str]) -> list[str]:
    """The pytest command of the gate subset, with ``extra`` appended."""
    gate_options = ["-m", "bench", "--bench-grid=gate", "--bench-variants=triton"]
    return [sys.executable, "-m", "pytest", "benchmarks", *gate_options, *extra]


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.gate", description=__doc__.split("\n")[0])
    parser.add_argument("--save", action="store_true", help="record this GPU's baseline instead")
    parser.add_argument("--margin", type=int, default=MARGIN_PERCENT, help="allowed median growth, percent")
    parser.add_argument("--json", help="also keep this run's pytest-benchmark JSON here")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("the gate needs a CUDA GPU; on a CPU, `python3 -m pytest benchmarks` is the smoke test")
        return 2
    baseline = baseline_path(torch.cuda.get_device_name())
    with tempfile.TemporaryDirectory() as scratch:
        run_json = Path(args.json) if args.json else Path(scratch) / "gate.json"
        if args.save:
            baseline.parent.mkdir(parents=True, exist_ok=True)
            command = pytest_command([f"--benchmark-json={baseline}", *args.pytest_args])
        elif not baseline.exists():
            print(f"no baseline for this GPU at {baseline}; record one with --save")
            return 2
        else:
            compare = [f"--benchmark-compare={baseline}", f"--benchmark-compare-fail=median:{args.margin}%"]
            command = pytest_command([*compare, f"--benchmark-json={run_json}", *args.pytest_args])
        print("$", " ".join(command), flush=True)
        status = subprocess.call(command, cwd=REPO_ROOT)
        if not args.save and run_json.exists():
            print(f"\nmedians against {baseline.name} (margin {args.margin} %):")
            compare_status = report.main(
                ["compare", str(baseline), str(run_json), "--margin", str(args.margin)]
            )
            status = status or compare_status
    return status


if __name__ == "__main__":
    sys.exit(main())
