"""An author's own performance gate: arguments, exit codes, baseline paths, case selection, any directory."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from xml.etree import ElementTree

import pytest
import torch

from specsample.benchmarks import gate
from specsample.benchmarks.grid import GATE_CASES, SMOKE_CASES, Case, within
from specsample.benchmarks.planted import EXTRA_PASS_ENV, PLANTED_ENV, ExtraLogitPass
from specsample.benchmarks.session import load_variants
from specsample.kernels.torch_sampler import TORCH_METHODS
from specsample.properties.variant_spec import SpecError
from specsample.reference.contract import Capabilities

H100 = "NVIDIA H100 80GB HBM3"
# Samplers an author might bring: one that declares probabilistic fp32 flat drafts only, one that
# declares nothing (it takes every case), one whose only dtype is in no gate case.
VARIANTS = """
import torch

from specsample.kernels.torch_sampler import TorchRejectionSampler
from specsample.reference.contract import Capabilities


class Mine(TorchRejectionSampler):
    name = "mine"
    capabilities = Capabilities(methods=("probabilistic",), dtypes=(torch.float32,), draft_kinds=("flat",))


class Bare:
    name = "bare"
    streams = None

    def __call__(self, batch):
        return TorchRejectionSampler()(batch)


class HalfOnly(TorchRejectionSampler):
    name = "half-only"
    capabilities = Capabilities(dtypes=(torch.float16,))
"""


@pytest.fixture
def in_author_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory other than the repository root holding ``mine.py``, made the current directory."""
    (tmp_path / "mine.py").write_text(VARIANTS, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _gate(argv: Sequence[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """Run the gate in this process: its exit code and the lines it printed to stderr."""
    status = gate.main(list(argv))
    return status, capsys.readouterr().err.splitlines()


def test_within_reads_every_declared_axis() -> None:
    """A case lies outside capabilities that leave out its method, dtype, draft layout or vocabulary."""
    case = Case("strict", "bf16", "slotted", 1.0, 16, 4, 151936)
    assert within(case, Capabilities())
    assert not within(case, Capabilities(methods=("probabilistic",)))
    assert not within(case, Capabilities(dtypes=(torch.float32, torch.float16)))
    assert not within(case, Capabilities(draft_kinds=("one-hot", "flat")))
    assert not within(case, Capabilities(max_vocab=151935))
    assert within(case, Capabilities(max_vocab=151936))
    filtered = dataclasses.replace(case, filters=(("top_k", 50), ("min_p", 0.05)))
    assert filtered.id == "strict-bf16-slotted-T1-B16-n4-V151936-top_k50-min_p0.05"
    assert not within(filtered, Capabilities())
    assert not within(filtered, Capabilities(filters=("top_k", "top_p")))
    assert within(filtered, Capabilities(filters=("top_k", "min_p")))


def test_gate_cases_follow_the_capabilities(in_author_dir: Path) -> None:
    """A variant is gated on the gate cases inside its capabilities; one that declares none gets all
    of them but the filtered ones and the trees (a sampler is never sent sampling parameters or a
    tree it does not declare); the bundled sampler gets all of them."""
    unfiltered = tuple(c for c in GATE_CASES if not c.filters and c.method != "tree")
    assert len(unfiltered) == 13 and len(GATE_CASES) == 18
    mine = gate.load_target("mine.py:Mine")
    assert mine.name == "mine"
    assert mine.bench_spec == f"{in_author_dir / 'mine.py'}:Mine"
    assert len(mine.cases) == 6
    assert {(c.method, c.dtype, c.layout) for c in mine.cases} == {("probabilistic", "fp32", "flat")}
    assert gate.load_target("mine.py:Bare").cases == unfiltered
    assert gate.load_target(None) == gate.Target(None, "triton", "triton", GATE_CASES)
    torch_target = gate.load_target("torch")
    assert torch_target.bench_spec == "torch"
    assert torch_target.cases == tuple(c for c in GATE_CASES if c.method in TORCH_METHODS)  # it filters


def test_baseline_path_rule(in_author_dir: Path) -> None:
    """An author's baseline is ./specsample-baselines/<GPU>/<variant name>.json, both as file names;
    the bundled sampler's stays benchmarks/baselines/<GPU>.json."""
    expected = in_author_dir / "specsample-baselines" / "NVIDIA_H100_80GB_HBM3" / "my_sampler_v2.json"
    assert gate.author_baseline_path(H100, "my sampler/v2") == expected
    elsewhere = in_author_dir / "ci"
    assert (
        gate.author_baseline_path(H100, "mine", elsewhere)
        == elsewhere / expected.parent.relative_to(in_author_dir) / "mine.json"
    )
    mine = gate.load_target("mine.py:Mine")
    assert mine.default_baseline(H100) == expected.parent / "mine.json"
    assert gate.load_target(None).default_baseline(H100) == gate.BASELINES / "NVIDIA_H100_80GB_HBM3.json"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--margin", "x"], "--margin"),
        (["--margin", "0"], "--margin 0"),
        (["--save", "--self-check"], "--save and --self-check"),
        (["--bogus"], "--bogus"),
        (["--variant", "nowhere.py:Mine"], "'nowhere.py'"),
        (["--variant", "mine.py:Missing"], "'Missing'"),
        (["--variant", "no_such_module_here:Mine"], "'no_such_module_here'"),
        (["--variant", "nonsense"], "'nonsense'"),
        (["--variant", "mine.py:HalfOnly"], f"admit none of the {len(GATE_CASES)} gate cases"),
    ],
)
def test_usage_errors_are_one_line(
    argv: list[str], named: str, in_author_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad argument or a spec that does not resolve exits 2 with one line naming it, before the GPU."""
    status, lines = _gate(argv, capsys)
    assert status == 2
    assert len(lines) == 1 and lines[0].startswith("gate: ") and named in lines[0]
    if "--variant" in argv:
        assert "--variant" in lines[0]


def test_missing_baseline_names_the_path_and_the_record_command(
    in_author_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a baseline the gate exits 2 naming the file it looked for and the command that records it."""
    monkeypatch.setattr(gate, "gpu_name", lambda: H100)
    monkeypatch.setattr(gate, "run_pytest", _never_run)
    status, lines = _gate(["--variant", "mine.py:Mine"], capsys)
    path = in_author_dir / "specsample-baselines" / "NVIDIA_H100_80GB_HBM3" / "mine.json"
    assert status == 2 and len(lines) == 1
    assert str(path) in lines[0]
    assert lines[0].endswith("python -m specsample.benchmarks.gate --variant mine.py:Mine --save")
    status, lines = _gate(["--variant", "mine.py:Mine", "--baseline", "ci/base.json"], capsys)
    assert status == 2 and len(lines) == 1
    assert str(in_author_dir / "ci" / "base.json") in lines[0]
    assert lines[0].endswith("--variant mine.py:Mine --baseline ci/base.json --save")
    monkeypatch.setattr(gate, "gpu_name", lambda: "Some Future GPU")
    status, lines = _gate([], capsys)
    assert status == 2 and str(gate.BASELINES / "Some_Future_GPU.json") in lines[0]
    assert lines[0].endswith("python -m specsample.benchmarks.gate --save")


def _never_run(command: Sequence[str], directory: Path, environment: dict[str, str]) -> int:
    raise AssertionError("the gate ran the benchmarks after a usage error")


class FakeBenchmarks:
    """Stands in for the benchmark run: writes a pytest-benchmark JSON of the first ``timed`` of two
    benchmarks of ``variant`` whose medians grow by ``planted`` (one growth, or one per benchmark) when
    a planted slowdown names the variant and by ``drift`` otherwise."""

    def __init__(
        self, planted: float | Sequence[float], drift: float = 0.0, variant: str = "mine", timed: int = 2
    ) -> None:
        self.planted = [planted] * 2 if isinstance(planted, float) else list(planted)
        self.drift, self.variant, self.timed = drift, variant, timed
        self.calls: list[tuple[list[str], Path, dict[str, str]]] = []

    def __call__(self, command: Sequence[str], directory: Path, environment: dict[str, str]) -> int:
        self.calls.append((list(command), directory, environment))
        named = environment.get(EXTRA_PASS_ENV) == self.variant
        named |= environment.get(PLANTED_ENV, "").startswith(f"{self.variant}=")
        growth = self.planted if named else [self.drift] * 2
        benchmarks = [
            {
                "name": f"test_gpu_time[{case.id}-{self.variant}]",
                "fullname": f"benchmarks/test_latency.py::{benchmark(case, self.variant)}",
                "stats": {"median": median * (1 + grown), "rounds": 20, "iqr": 1e-7},
                "extra_info": {"variant": self.variant},
            }
            for case, median, grown in zip(GATE_CASES[:2], (80e-6, 30e-6), growth, strict=True)
        ][: self.timed]
        output = next(word.split("=", 1)[1] for word in command if word.startswith("--benchmark-json="))
        Path(output).write_text(json.dumps({"benchmarks": benchmarks, "machine_info": {}}), encoding="utf-8")
        return 0

    def option(self, prefix: str) -> list[str]:
        """The values of the options of the last command that start with ``prefix``."""
        return [word.removeprefix(prefix) for word in self.calls[-1][0] if word.startswith(prefix)]


def benchmark(case: Case, variant: str) -> str:
    """The name of the GPU-time benchmark of ``variant`` on ``case``."""
    return f"test_gpu_time[{case.id}-{variant}]"


def test_record_gate_and_self_check(
    in_author_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The three commands: --save records the baseline where the gate looks for it; the gate passes an
    unchanged variant and fails one 20 % slower; --self-check plants twice the margin on the variant,
    passes when the planted slowdown fails the gate and fails when it goes unseen."""
    monkeypatch.setattr(gate, "gpu_name", lambda: H100)
    runs = FakeBenchmarks(planted=0.4)
    monkeypatch.setattr(gate, "run_pytest", runs)
    spec = ["--variant", "mine.py:Mine"]
    baseline = in_author_dir / "specsample-baselines" / "NVIDIA_H100_80GB_HBM3" / "mine.json"

    assert gate.main([*spec, "--save"]) == 0
    assert baseline.is_file() and not runs.option("--benchmark-compare")
    assert runs.option("--bench-variants=") == [f"{in_author_dir / 'mine.py'}:Mine"]
    _, directory, environment = runs.calls[-1]
    assert directory != in_author_dir and environment["PYTHONPATH"].split(os.pathsep)[0] == str(in_author_dir)
    assert EXTRA_PASS_ENV not in environment

    assert gate.main(spec) == 0
    assert runs.option("--benchmark-compare=") == [str(baseline)]
    # The gate judges the medians itself: pytest-benchmark only shows them (its own failure is an exception).
    assert not runs.option("--benchmark-compare-fail")

    capsys.readouterr()
    calls = len(runs.calls)
    assert gate.main([*spec, "--self-check"]) == 0
    # Two runs: the sampler as it is, then with the planted slowdown.
    assert len(runs.calls) == calls + 2 and PLANTED_ENV not in runs.calls[-2][2]
    assert runs.calls[-1][2][PLANTED_ENV] == "mine=0.26"
    assert EXTRA_PASS_ENV not in runs.calls[-1][2]
    out = capsys.readouterr().out
    assert "unchanged run of 'mine': 0 of 2 benchmarks past the 13 % margin" in out
    assert f"$ {PLANTED_ENV}=mine=0.26 " in out
    passed = "self-check passed: the gate passes 'mine' unchanged and fails a run 26 % slower in every one"
    assert f"{passed} of its 2" in out

    monkeypatch.setattr(gate, "run_pytest", FakeBenchmarks(planted=0.05))
    assert gate.main([*spec, "--self-check"]) == 1
    assert "self-check FAILED" in capsys.readouterr().out

    monkeypatch.setattr(gate, "run_pytest", FakeBenchmarks(planted=0.0, drift=0.2))
    assert gate.main(spec) == 1
    assert "2 of 2 benchmarks regressed past 13" in capsys.readouterr().out
    assert gate.main([*spec, "--margin", "25"]) == 0


def test_a_gate_that_fails_the_unchanged_sampler_fails_the_self_check(
    in_author_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sampler whose medians move past the margin with nothing changed (20 % here) fails the
    self-check, naming those benchmarks, even though the planted slowdown was seen everywhere."""
    monkeypatch.setattr(gate, "gpu_name", lambda: H100)
    monkeypatch.setattr(gate, "run_pytest", FakeBenchmarks(planted=0.4))
    spec = ["--variant", "mine.py:Mine"]
    assert gate.main([*spec, "--save"]) == 0
    monkeypatch.setattr(gate, "run_pytest", FakeBenchmarks(planted=0.4, drift=0.2))
    capsys.readouterr()
    assert gate.main([*spec, "--self-check"]) == 1
    out = capsys.readouterr().out
    first, second = (benchmark(case, "mine") for case in GATE_CASES[:2])
    assert "unchanged run of 'mine': 2 of 2 benchmarks past the 13 % margin" in out
    assert "caught (past 13 %) in 2 of 2 benchmarks:" in out
    assert (
        f"failed the unchanged sampler in 2 of 2 benchmarks:\n    +20.0 %  {first}\n    +20.0 %  {second}"
        in out
    )
    verdict = out.splitlines()[-1]
    assert verdict.startswith("self-check FAILED: the gate fails 'mine' unchanged in") and second in verdict
    # A wider margin holds the spread: the same runs pass.
    assert gate.main([*spec, "--self-check", "--margin", "25"]) == 0


class CyclingBenchmarks(FakeBenchmarks):
    """`FakeBenchmarks` whose unplanted medians grow by the next of ``drifts`` at each run, in turn."""

    def __init__(self, drifts: Sequence[float]) -> None:
        super().__init__(planted=0.4)
        self.drifts = list(drifts)

    def __call__(self, command: Sequence[str], directory: Path, environment: dict[str, str]) -> int:
        self.drift = self.drifts[len(self.calls) % len(self.drifts)]
        return super().__call__(command, directory, environment)


def test_save_records_the_middle_of_three_runs_and_their_spread(
    in_author_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--save times the cases three times and keeps each benchmark's middle median, so one slow run
    is not the baseline; a spread past the margin is named with the margin that would hold it."""
    monkeypatch.setattr(gate, "gpu_name", lambda: H100)
    runs = CyclingBenchmarks([0.0, 0.3, 0.1])
    monkeypatch.setattr(gate, "run_pytest", runs)
    spec = ["--variant", "mine.py:Mine"]
    capsys.readouterr()
    assert gate.main([*spec, "--save"]) == 0
    assert len(runs.calls) == 3 and all(PLANTED_ENV not in call[2] for call in runs.calls)
    baseline = in_author_dir / "specsample-baselines" / "NVIDIA_H100_80GB_HBM3" / "mine.json"
    medians = sorted(bench["stats"]["median"] for bench in json.loads(baseline.read_text())["benchmarks"])
    assert medians == pytest.approx([30e-6 * 1.1, 80e-6 * 1.1])
    out = capsys.readouterr().out
    assert "medians of 3 runs (the baseline keeps the middle one)" in out
    assert f"30.0 %        80.0 ..      104.0 us  {benchmark(GATE_CASES[0], 'mine')}" in out
    assert (
        "2 of 2 benchmarks moved more than the 13 % margin between runs of the same code (up to 30 %)" in out
    )
    assert "or gate with --margin 30" in out

    runs = CyclingBenchmarks([0.0, 0.05])
    monkeypatch.setattr(gate, "run_pytest", runs)
    assert gate.main([*spec, "--save", "--runs", "2"]) == 0
    out = capsys.readouterr().out
    assert len(runs.calls) == 2 and "moved more than" not in out
    medians = sorted(bench["stats"]["median"] for bench in json.loads(baseline.read_text())["benchmarks"])
    assert medians == pytest.approx([30e-6, 80e-6])  # the lower middle of two
    assert gate.main([*spec, "--save", "--runs", "1"]) == 0 and "medians of" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "arguments", [["--save", "--runs", "0"], ["--runs", "2"], ["--self-check", "--runs", "3"]]
)
def test_runs_counts_the_runs_of_save(
    in_author_dir: Path,
    arguments: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--runs below 1, or without --save, is a one-line usage error naming it."""
    monkeypatch.setattr(gate, "run_pytest", _never_run)
    capsys.readouterr()
    assert gate.main(["--variant", "mine.py:Mine", *arguments]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gate: --runs ")


@pytest.fixture
def recorded_mine(in_author_dir: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``mine``'s baseline recorded on a (pretended) H100; the gate's arguments for it."""
    monkeypatch.setattr(gate, "gpu_name", lambda: H100)
    monkeypatch.setattr(gate, "run_pytest", FakeBenchmarks(planted=0.0))
    spec = ["--variant", "mine.py:Mine"]
    assert gate.main([*spec, "--save"]) == 0
    return spec


def test_the_variant_self_check_needs_every_case(
    recorded_mine: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The self-check of a variant says what it planted and lists the cases that caught it; one case
    whose median stayed within the margin fails it, named with its change."""
    first, second = (benchmark(case, "mine") for case in GATE_CASES[:2])
    monkeypatch.setattr(gate, "run_pytest", FakeBenchmarks(planted=(0.30, 0.25)))
    capsys.readouterr()
    assert gate.main([*recorded_mine, "--self-check"]) == 0
    out = capsys.readouterr().out
    assert "planted +26 % GPU time per call of 'mine' (twice the 13 % margin)" in out
    assert "caught (past 13 %) in 2 of 2 benchmarks:" in out
    assert f"+30.0 %  {first}" in out and f"+25.0 %  {second}" in out
    assert "missed" not in out

    monkeypatch.setattr(gate, "run_pytest", FakeBenchmarks(planted=(0.30, 0.11)))
    assert gate.main([*recorded_mine, "--self-check"]) == 1
    out = capsys.readouterr().out
    assert "caught (past 13 %) in 1 of 2 benchmarks:" in out
    assert f"missed in 1 of 2 benchmarks:\n    +11.0 %  {second}" in out
    verdict = out.splitlines()[-1]
    assert verdict.startswith("self-check FAILED") and second in verdict and first not in verdict


def test_the_planted_slowdown_follows_the_margin(
    recorded_mine: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The planted fraction is twice --margin, or --planted percent; the gate judges it at the margin."""
    runs = FakeBenchmarks(planted=0.35)
    monkeypatch.setattr(gate, "run_pytest", runs)
    capsys.readouterr()
    assert gate.main([*recorded_mine, "--self-check", "--margin", "20"]) == 0
    assert runs.calls[-1][2][PLANTED_ENV] == "mine=0.4"
    assert "planted +40 % GPU time per call of 'mine' (twice the 20 % margin)" in capsys.readouterr().out
    assert gate.main([*recorded_mine, "--self-check", "--planted", "30"]) == 0
    assert runs.calls[-1][2][PLANTED_ENV] == "mine=0.3"
    assert "planted +30 % GPU time per call of 'mine' (--planted)" in capsys.readouterr().out
    assert gate.main([*recorded_mine, "--self-check", "--margin", "40"]) == 1


def test_a_case_the_run_left_out_fails_the_self_check(
    recorded_mine: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A benchmark of the baseline that the planted run did not time (it failed) counts as missed."""
    monkeypatch.setattr(gate, "run_pytest", FakeBenchmarks(planted=0.4, timed=1))
    capsys.readouterr()
    assert gate.main([*recorded_mine, "--self-check"]) == 1
    out = capsys.readouterr().out
    left_out = benchmark(GATE_CASES[1], "mine")
    assert f"not timed in this run  {left_out}" in out
    assert out.splitlines()[-1].startswith("self-check FAILED") and left_out in out.splitlines()[-1]


def test_the_bundled_self_check_plants_the_extra_pass(
    in_author_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --variant the self-check plants one extra pass over the logits on the bundled sampler
    and passes when any median regressed past the margin."""
    monkeypatch.setattr(gate, "gpu_name", lambda: H100)
    runs = FakeBenchmarks(planted=(0.4, 0.0), variant="triton")
    monkeypatch.setattr(gate, "run_pytest", runs)
    baseline = ["--baseline", str(in_author_dir / "triton.json")]
    assert gate.main([*baseline, "--save"]) == 0
    capsys.readouterr()
    assert gate.main([*baseline, "--self-check"]) == 0
    assert runs.calls[-1][2][EXTRA_PASS_ENV] == "triton" and PLANTED_ENV not in runs.calls[-1][2]
    out = capsys.readouterr().out
    assert "self-check passed: the planted extra pass over the logits regressed 1 of 2" in out
    assert "planted +" not in out
    monkeypatch.setattr(gate, "run_pytest", FakeBenchmarks(planted=0.05, variant="triton"))
    assert gate.main([*baseline, "--self-check"]) == 1
    assert (
        "self-check FAILED: the planted extra pass over the logits regressed none" in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (
            ["--variant", "mine.py:Mine", "--planted", "30"],
            "--planted 30: it sizes the slowdown of --variant",
        ),
        (["--self-check", "--planted", "30"], "--planted 30: it sizes the slowdown of --variant"),
        (["--variant", "mine.py:Mine", "--self-check", "--planted", "13"], "must exceed the 13 % margin"),
        (["--variant", "mine.py:Mine", "--self-check", "--planted", "nan"], "--planted nan"),
        (
            ["--variant", "mine.py:Mine", "--self-check", "--margin", "30", "--planted", "26"],
            "the 30 % margin",
        ),
    ],
)
def test_planted_usage_errors(
    argv: list[str], named: str, in_author_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--planted outside a variant's self-check, or not past the margin, exits 2 with one line naming it."""
    status, lines = _gate(argv, capsys)
    assert status == 2
    assert len(lines) == 1 and lines[0].startswith("gate: --planted") and named in lines[0]


def test_a_baseline_that_cannot_gate_the_run_is_refused(
    in_author_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A baseline that is not pytest-benchmark JSON exits 2 before any run; one that shares no
    benchmark with the run (another variant's) exits 2 after it, never passes."""
    monkeypatch.setattr(gate, "gpu_name", lambda: H100)
    monkeypatch.setattr(gate, "run_pytest", _never_run)
    broken = in_author_dir / "broken.json"
    broken.write_text("not json", encoding="utf-8")
    status, lines = _gate(["--variant", "mine.py:Mine", "--baseline", str(broken)], capsys)
    assert status == 2 and len(lines) == 1 and "is not a pytest-benchmark JSON baseline" in lines[0]
    monkeypatch.setattr(gate, "run_pytest", FakeBenchmarks(planted=0.0))
    other = in_author_dir / "other.json"
    other.write_text(json.dumps({"benchmarks": [], "machine_info": {}}), encoding="utf-8")
    status, lines = _gate(["--variant", "mine.py:Mine", "--baseline", str(other)], capsys)
    assert status == 2 and len(lines) == 1 and "shares no benchmark" in lines[0]


def test_bench_variants_take_specs_by_name(in_author_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--bench-variants resolves registered names and specs to variants keyed by their names, and plants
    the slowdown on the variant SPECSAMPLE_BENCH_EXTRA_PASS names, keeping its capabilities."""
    monkeypatch.setenv(EXTRA_PASS_ENV, "mine")
    variants = load_variants("triton, mine.py:Mine")
    assert list(variants) == ["triton", "mine"]
    assert not isinstance(variants["triton"], ExtraLogitPass)
    assert isinstance(variants["mine"], ExtraLogitPass)
    assert variants["mine"].capabilities.methods == ("probabilistic",)
    with pytest.raises(SpecError, match="second variant called 'torch'"):
        load_variants("torch,torch")
    with pytest.raises(SpecError, match=r"nowhere\.py"):
        load_variants("triton,nowhere.py:Mine")


def _installed_run(argv: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``argv`` run from ``cwd`` as an installed user runs it: no repository on the path but the install."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(
        list(argv), cwd=cwd, env=environment, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the exit without a CUDA GPU")
def test_no_gpu_exits_2_from_any_directory(in_author_dir: Path) -> None:
    """Run from another directory without a GPU, the gate resolves the spec there, then exits 2 with one
    line and no traceback."""
    command = [sys.executable, "-m", "specsample.benchmarks.gate", "--variant", "mine.py:Mine"]
    done = _installed_run(command, in_author_dir)
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(lines) == 1 and lines[0].startswith("gate: no CUDA GPU")


def test_benchmark_command_runs_from_another_directory(in_author_dir: Path) -> None:
    """The gate's pytest command, run from another directory with no project configuration (as from an
    installed copy), times an author's file spec on the cases inside its capabilities (here the smoke
    grid's, on the CPU) under the node ids of the repository root, which the baselines are keyed by."""
    empty_ini = in_author_dir / "pytest.ini"
    empty_ini.write_text("[pytest]\n", encoding="utf-8")
    report_xml = in_author_dir / "report.xml"
    extra = ["--bench-grid=smoke", f"-c={empty_ini}", "--strict-markers", f"--junitxml={report_xml}"]
    command = gate.pytest_command(gate.load_target("mine.py:Mine").bench_spec, extra)
    done = _installed_run(command, in_author_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    passed = {
        (case.get("classname"), case.get("name"))
        for case in ElementTree.parse(report_xml).iter("testcase")
        if not len(case)  # no failure, error or skipped element
    }
    mine = Capabilities(methods=("probabilistic",), dtypes=(torch.float32,), draft_kinds=("flat",))
    timed = {f"test_gpu_time[{c.id}-mine]" for c in SMOKE_CASES if within(c, mine)}
    assert len(timed) == 2
    assert passed == {("benchmarks.test_latency", name) for name in [*timed, "test_call_latency[mine]"]}


@pytest.mark.parametrize("module", ["benchmarks.gate", "specsample.benchmarks.gate"])
def test_the_usage_line_names_the_module_the_user_ran(module: str) -> None:
    """``--help`` run as ``python -m benchmarks.gate`` (the repository root) or ``python -m
    specsample.benchmarks.gate`` (installed) names that module and this interpreter."""
    root = Path(gate.__file__).resolve().parents[1]
    shown = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    usage = shown.stdout.splitlines()[0]
    assert usage.startswith("usage: ") and f" -m {module} " in f"{usage} "
    assert Path(usage.split()[1]).name == Path(sys.executable).name
