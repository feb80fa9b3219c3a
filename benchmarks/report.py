"""Read pytest-benchmark JSON files: the RESULTS.md table, the latency targets, the run-to-run spread,
a comparison with a baseline, and the roofline plot.

    python3 -m benchmarks.report results RUN.json [MORE.json ...] [--markdown OUT.md] [--plot OUT.png]
    python3 -m benchmarks.report spread RUN1.json RUN2.json [RUN3.json ...]
    python3 -m benchmarks.report compare BASELINE.json RUN.json [--margin PERCENT]

``results`` pairs each case's ``triton`` record with its ``torch`` record (same inputs, same run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsample.benchmarks.grid import CALL_LATENCY_CASE, Case

OURS = "triton"
PYTORCH = "torch"
CASE_FIELDS = ("method", "dtype", "layout", "temperature", "batch", "num_drafts", "vocab")
# A gated median may grow by this much before the gate fails: twice the largest run-to-run spread
# of a gated median, 6.1 % over six runs on two H200 machines (RESULTS.md, "Run-to-run spread and
# the margin"). The planted extra pass over the logits raised every gated median by 29 % or more.
MARGIN_PERCENT = 13
# Two medians of one run within 5 % count as equal: the largest run-to-run spread of a median
# measured on an H200 was 6 %, on a 26 us case; cases above 40 us stayed within 1.4 %.
SAME_TIME_TOLERANCE = 0.05
# The targets of `CALL_LATENCY_CASE` (B = 1, n = 4, V = 128256, probabilistic fp32, T = 1), in seconds,
# per test: GPU time, CUDA-graph replay and a plain Python call.
SMALL_BATCH_TARGETS = {
    "test_gpu_time": (12e-6, "GPU time"),
    "test_graph_call_latency": (15e-6, "a CUDA-graph replay"),
    "test_call_latency": (30e-6, "a plain call from Python"),
}
# vLLM 0.33.0's MRV2 `rejection_sample`, GPU time on one H200 with the same inputs and method of
# measurement (`benchmarks.grid.make_inputs`, L2 flushed, CUDA events): the figures of the kernel-floor
# issue. Keys are (dtype, temperature, batch, num_drafts, vocab) of probabilistic flat cases; ours
# should take at most ENGINE_RATIO of each. Compared only on an H200.
ENGINE_H200_US = {
    ("fp32", 1.0, 1, 4, 128256): 21.7,
    ("fp32", 1.0, 16, 4, 128256): 53.7,
    ("fp32", 1.0, 64, 4, 128256): 135.7,
    ("fp32", 1.0, 256, 4, 128256): 451.7,
    ("fp32", 1.0, 64, 8, 151936): 228.9,
    ("bf16", 1.0, 64, 4, 128256): 123.3,
    ("fp32", 0.0, 64, 4, 128256): 61.3,
}
ENGINE_RATIO = 0.75


@dataclass(frozen=True)
class Record:
    """One benchmark of one run: ``fullname`` is the pytest node id (pytest-benchmark compares by it),
    ``test`` the test's name (``test_gpu_time``, ...), times are in seconds, ``info`` is the record's
    ``extra_info`` (case fields, bytes, floor, ...)."""

    fullname: str
    test: str
    median_s: float
    rounds: int
    iqr_s: float
    info: dict[str, Any]

    @property
    def variant(self) -> str:
        """The variant's registry name."""
        return str(self.info.get("variant", ""))

    @property
    def case(self) -> Case:
        """The case's parameters (``None`` where ``info`` lacks one): they pair a variant's record with
        another's."""
        filters = tuple((str(name), value) for name, value in self.info.get("filters") or ())
        return Case(**{name: self.info.get(name) for name in CASE_FIELDS}, filters=filters)


@dataclass(frozen=True)
class Run:
    """One pytest-benchmark JSON file: its records, machine information and measured ceilings."""

    path: str
    records: list[Record]
    machine_info: dict[str, Any]
    ceilings: dict[str, float] | None


def load_run(path: str | Path) -> Run:
    """Parse a pytest-benchmark JSON file written with ``--benchmark-json``."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    records = [
        Record(
            fullname=bench["fullname"],
            test=bench["name"].split("[", 1)[0],
            median_s=float(bench["stats"]["median"]),
            rounds=int(bench["stats"]["rounds"]),
            iqr_s=float(bench["stats"]["iqr"]),
            info=dict(bench.get("extra_info") or {}),
        )
        for bench in data.get("benchmarks", [])
    ]
    return Run(str(path), records, data.get("machine_info", {}), data.get("ceilings"))


def _us(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e6:.1f}"


def _paired(records: Iterable[Record]) -> dict[tuple[str, Case], dict[str, Record]]:
    pairs: dict[tuple[str, Case], dict[str, Record]] = {}
    for record in records:
        pairs.setdefault((record.test, record.case), {})[record.variant] = record
    return pairs


def _filters(info: dict[str, Any]) -> str:
    """A record's sampling parameters in words (``top_k 50, top_p 0.9``), empty when unfiltered."""
    return ", ".join(f"{name} {value:g}" for name, value in info.get("filters") or ())


def results_table(records: Sequence[Record]) -> str:
    """The Markdown table of GPU times: shape, filters, mean tokens emitted, ours, floor, ratio,
    bandwidth, PyTorch."""
    lines = [
        "| method | dtype | drafts | T | B | n | V | filters | emitted | ours (us) | floor (us) | ratio "
        "| GB/s | torch (us) | torch / ours |",
        "|---|---|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for variants in _paired(r for r in records if r.test == "test_gpu_time").values():
        ours, torch_record = variants.get(OURS), variants.get(PYTORCH)
        reference = ours or torch_record
        if reference is None:
            continue
        info = reference.info
        ratio = f"{ours.info['floor_ratio']:.2f}" if ours and "floor_ratio" in ours.info else ""
        bandwidth = f"{ours.info['achieved_GBps']:.0f}" if ours and "achieved_GBps" in ours.info else ""
        speedup = f"{torch_record.median_s / ours.median_s:.1f}x" if ours and torch_record else ""
        emitted = f"{ours.info['mean_emitted']:.2f}" if ours and "mean_emitted" in ours.info else ""
        lines.append(
            f"| {info['method']} | {info['dtype']} | {info['layout']} | {info['temperature']:g} "
            f"| {info['batch']} | {info['num_drafts']} | {info['vocab']} | {_filters(info)} | {emitted} "
            f"| {_us(ours.median_s if ours else None)} | {info.get('floor_us', 0):.1f} | {ratio} "
            f"| {bandwidth} | {_us(torch_record.median_s if torch_record else None)} | {speedup} |"
        )
    return "\n".join(lines)


def summary_table(records: Sequence[Record]) -> str:
    """Floor ratios of ours per method, temperature, dtype and batch range, with PyTorch's slowdown."""
    groups: dict[tuple[Any, ...], list[tuple[float, float | None]]] = {}
    for variants in _paired(r for r in records if r.test == "test_gpu_time").values():
        ours = variants.get(OURS)
        if ours is None or "floor_ratio" not in ours.info:
            continue
        info = ours.info
        key = (info["method"], _filters(info), info["temperature"], info["dtype"], info["batch"] >= 64)
        pytorch = variants.get(PYTORCH)
        slowdown = pytorch.median_s / ours.median_s if pytorch else None
        groups.setdefault(key, []).append((info["floor_ratio"], slowdown))
    lines = [
        "| method | filters | T | dtype | B | cases | ratio min | ratio median | ratio max "
        "| torch / ours median |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for (method, filters, temperature, dtype, large), values in sorted(groups.items()):
        ratios = [ratio for ratio, _ in values]
        slowdowns = [s for _, s in values if s is not None]
        slowdown = f"{statistics.median(slowdowns):.0f}x" if slowdowns else ""
        lines.append(
            f"| {method} | {filters} | {temperature:g} | {dtype} | {'>= 64' if large else '< 64'} "
            f"| {len(values)} "
            f"| {min(ratios):.2f} | {statistics.median(ratios):.2f} | {max(ratios):.2f} | {slowdown} |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class TargetResult:
    """One latency target: what it asks, what was measured, and whether it holds."""

    target: str
    measured: str
    met: bool


def _find(records: Iterable[Record], case: Case) -> Record | None:
    return next((record for record in records if record.case == case), None)


def check_targets(records: Sequence[Record], h200: bool = False) -> list[TargetResult]:
    """Evaluate the latency targets on the records present (a target with no record is left out);
    ``h200``: also compare with the engine kernel's H200 figures (`ENGINE_H200_US`)."""
    return list(_targets(records, h200))


def _targets(records: Sequence[Record], h200: bool) -> Iterator[TargetResult]:
    ours = [r for r in records if r.variant == OURS and r.test == "test_gpu_time" and "floor_ratio" in r.info]
    headline = _find(ours, Case("probabilistic", "fp32", "flat", 1.0, 64, 4, 128256))
    if headline:
        ratio = headline.info["floor_ratio"]
        yield TargetResult(
            "probabilistic B=64 n=4 V=128256 fp32: <= 1.25x the floor",
            f"{ratio:.2f}x ({_us(headline.median_s)} us, floor {headline.info['floor_us']:.1f} us)",
            ratio <= 1.25,
        )
    for dtype, limit in (("fp32", 1.3), ("bf16", 1.35)):
        large = [r for r in ours if r.info["batch"] >= 64 and r.info["dtype"] == dtype]
        if large:
            worst = max(large, key=lambda r: r.info["floor_ratio"])
            over = sum(r.info["floor_ratio"] > limit for r in large)
            yield TargetResult(
                f"B >= 64, {dtype}: <= {limit}x the floor everywhere",
                f"worst {worst.info['floor_ratio']:.2f}x at {_case_label(worst)}; "
                f"{over} of {len(large)} cases over",
                over == 0,
            )
    for test, (limit, how) in SMALL_BATCH_TARGETS.items():
        found = _find([r for r in records if r.test == test and r.variant == OURS], CALL_LATENCY_CASE)
        if found:
            yield TargetResult(
                f"B=1 n=4 V=128256: <= {limit * 1e6:g} us ({how})", f"{_us(found.median_s)} us",
                found.median_s <= limit,
            )  # fmt: skip
    if h200:
        for (dtype, temperature, batch, num_drafts, vocab), engine_us in ENGINE_H200_US.items():
            record = _find(ours, Case("probabilistic", dtype, "flat", temperature, batch, num_drafts, vocab))
            if record:
                limit = ENGINE_RATIO * engine_us
                yield TargetResult(
                    f"{_case_label(record)}: <= {ENGINE_RATIO}x vLLM MRV2's {engine_us} us ({limit:.1f})",
                    f"{_us(record.median_s)} us ({record.median_s * 1e6 / engine_us:.2f}x)",
                    record.median_s * 1e6 <= limit,
                )
    kinds = (
        ("greedy (T=0, probabilistic and strict)", lambda m, t: t == 0 and m in ("probabilistic", "strict")),
        ("strict (T=1)", lambda m, t: t > 0 and m == "strict"),
    )
    for label, selected in kinds:
        ratios = []
        for record in ours:
            if selected(record.info["method"], record.info["temperature"]):
                same_shape = dataclasses.replace(record.case, method="probabilistic", temperature=1.0)
                probabilistic = _find(ours, same_shape)
                if probabilistic:
                    ratios.append((record.median_s / probabilistic.median_s, _case_label(record)))
        slower = [(ratio, name) for ratio, name in ratios if ratio > 1 + SAME_TIME_TOLERANCE]
        if ratios:
            worst = "; ".join(f"{name} {ratio:.2f}x" for ratio, name in sorted(slower, reverse=True)[:3])
            yield TargetResult(
                f"{label} never slower than probabilistic T=1 at the same shape",
                f"{len(slower)} of {len(ratios)} slower" + (f"; worst: {worst}" if slower else ""),
                not slower,
            )


def _case_label(record: Record) -> str:
    info = record.info
    return (
        f"{info['method']} {info['dtype']} {info['layout']} T={info['temperature']:g} "
        f"B={info['batch']} n={info['num_drafts']} V={info['vocab']}"
    )


def targets_table(results: Sequence[TargetResult]) -> str:
    """The targets as a Markdown table."""
    lines = ["| target | measured | met |", "|---|---|---|"]
    lines += [f"| {r.target} | {r.measured} | {'yes' if r.met else 'no'} |" for r in results]
    return "\n".join(lines)


@dataclass(frozen=True)
class Spread:
    """The run-to-run spread of one benchmark's median: ``max / min - 1`` over the runs."""

    fullname: str
    medians_s: tuple[float, ...]

    @property
    def relative(self) -> float:
        """``max(median) / min(median) - 1``."""
        return max(self.medians_s) / min(self.medians_s) - 1


def run_spread(runs: Sequence[Run]) -> list[Spread]:
    """Per benchmark present in every run, the spread of its median, largest first."""
    medians: dict[str, list[float]] = {}
    for run in runs:
        for record in run.records:
            medians.setdefault(record.fullname, []).append(record.median_s)
    spreads = [Spread(name, tuple(values)) for name, values in medians.items() if len(values) == len(runs)]
    return sorted(spreads, key=lambda s: s.relative, reverse=True)


def suggested_margin(spreads: Sequence[Spread]) -> int:
    """Twice the largest observed spread, in whole percent, and at least 5 %."""
    largest = max((s.relative for s in spreads), default=0.0)
    return max(5, math.ceil(200 * largest))


@dataclass(frozen=True)
class Change:
    """One benchmark's median now against the baseline."""

    fullname: str
    baseline_s: float
    now_s: float

    @property
    def relative(self) -> float:
        """``now / baseline - 1``."""
        return self.now_s / self.baseline_s - 1


def compare(baseline: Run, now: Run) -> list[Change]:
    """Every benchmark of ``now`` that the baseline also has, largest slowdown first."""
    base = {r.fullname: r.median_s for r in baseline.records}
    changes = [Change(r.fullname, base[r.fullname], r.median_s) for r in now.records if r.fullname in base]
    return sorted(changes, key=lambda c: c.relative, reverse=True)


def plot_roofline(runs: Sequence[Run], path: str | Path) -> None:
    """Achieved bandwidth of every GPU-time record against its bytes, under the measured ceilings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for run in runs for r in run.records if r.test == "test_gpu_time" and "bytes" in r.info]
    ceilings = next((run.ceilings for run in runs if run.ceilings), None)
    gpu = next(((run.machine_info.get("gpu") or {}).get("name") for run in runs), None)
    figure, axes = plt.subplots(figsize=(9, 6), dpi=120)
    styles = {
        (OURS, "fp32"): ("tab:blue", "o"),
        (OURS, "bf16"): ("tab:cyan", "s"),
        (PYTORCH, "fp32"): ("tab:red", "o"),
        (PYTORCH, "bf16"): ("tab:orange", "s"),
    }
    for (variant, dtype), (color, marker) in styles.items():
        chosen = [r for r in records if r.variant == variant and r.info["dtype"] == dtype]
        if chosen:
            moved = [r.info["bytes"] for r in chosen]
            bandwidth = [r.info["bytes"] / r.median_s / 1e9 for r in chosen]
            label = f"{variant} {dtype} ({len(chosen)})"
            axes.scatter(moved, bandwidth, s=14, c=color, marker=marker, alpha=0.7, label=label)
    if ceilings:
        axes.axhline(ceilings["copy_bytes_per_s"] / 1e9, color="k", label="copy ceiling (read + written)")
        axes.axhline(ceilings["read_bytes_per_s"] / 1e9, color="k", ls="--", label="read-only ceiling")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("bytes that must move per call")
    axes.set_ylabel("achieved bandwidth (GB/s) = bytes / median GPU time")
    axes.set_title(f"Rejection sampler against the memory ceiling ({gpu or 'GPU'})")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _results(args: argparse.Namespace) -> int:
    runs = [load_run(path) for path in args.runs]
    records = [r for run in runs for r in run.records]
    gpus = {str((run.machine_info.get("gpu") or {}).get("name", "")) for run in runs}
    h200 = bool(gpus) and all("H200" in gpu for gpu in gpus)
    tables = [targets_table(check_targets(records, h200)), summary_table(records), results_table(records)]
    text = "\n\n".join(tables)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n", encoding="utf-8")
    if args.plot:
        plot_roofline(runs, args.plot)
    print(text)
    return 0


def _spread(args: argparse.Namespace) -> int:
    spreads = run_spread([load_run(path) for path in args.runs])
    relative = [s.relative for s in spreads]
    for spread in spreads[: args.top]:
        medians = ", ".join(_us(m) for m in spread.medians_s)
        print(f"{100 * spread.relative:6.2f} %  {spread.fullname}  [{medians}] us")
    if relative:
        print(
            f"{len(spreads)} benchmarks; spread of the median: max {100 * max(relative):.2f} %, "
            f"median {100 * statistics.median(relative):.2f} %; suggested margin "
            f"{suggested_margin(spreads)} %"
        )
    return 0


def _compare(args: argparse.Namespace) -> int:
    changes = compare(load_run(args.baseline), load_run(args.run))
    regressed = [c for c in changes if 100 * c.relative > args.margin]
    for change in changes[: args.top]:
        flag = "REGRESSED" if change in regressed else "ok"
        print(
            f"{flag:9} {100 * change.relative:+7.1f} %  {_us(change.baseline_s):>9} -> "
            f"{_us(change.now_s):>9} us  {change.fullname}"
        )
    print(f"{len(regressed)} of {len(changes)} benchmarks regressed past {args.margin} %")
    return 1 if regressed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.report", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    results = commands.add_parser("results", help="targets and the results table (Markdown), roofline PNG")
    results.add_argument("runs", nargs="+")
    results.add_argument("--markdown")
    results.add_argument("--plot")
    results.set_defaults(handler=_results)
    spread = commands.add_parser("spread", help="run-to-run spread of each median across runs")
    spread.add_argument("runs", nargs="+")
    spread.add_argument("--top", type=int, default=15)
    spread.set_defaults(handler=_spread)
    comparison = commands.add_parser("compare", help="each median against a baseline")
    comparison.add_argument("baseline")
    comparison.add_argument("run")
    comparison.add_argument("--margin", type=float, default=MARGIN_PERCENT)
    comparison.add_argument("--top", type=int, default=1000)
    comparison.set_defaults(handler=_compare)
    args = parser.parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
