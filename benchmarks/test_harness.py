"""The benchmark harness itself: byte accounting, inputs, the planted slowdown, the gate's decisions."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from specsample.benchmarks import report
from specsample.benchmarks.gate import baseline_path
from specsample.benchmarks.grid import (
    GATE_CASES,
    SMOKE_CASES,
    TOP_K_P_MIN_P,
    TREES,
    Case,
    eagle_tree,
    full_grid,
    make_inputs,
    min_bytes,
)
from specsample.benchmarks.planted import EXTRA_PASS_ENV, ExtraLogitPass, with_planted_slowdown
from specsample.benchmarks.profile import launch_times
from specsample.benchmarks.timing import rounds_for
from specsample.reference.sampler import ReferenceSampler

HEADLINE = Case("probabilistic", "fp32", "flat", 1.0, 64, 4, 128256)


def test_headline_bytes_are_every_target_and_draft_logit_once() -> None:
    """B=64, n=4, V=128256 fp32 must read 64 x (5 + 4) rows of 128256 fp32 logits, plus small tensors."""
    logits = 64 * (5 + 4) * 128256 * 4
    assert HEADLINE.logit_bytes == logits
    assert logits < min_bytes(HEADLINE) < logits + 16 * 1024


def test_draft_logits_count_only_where_the_law_needs_them() -> None:
    """Greedy, strict and synthetic cases need only the target logits."""
    for method, temperature in (("probabilistic", 0.0), ("strict", 1.0), ("synthetic", 1.0)):
        case = Case(method, "bf16", "flat", temperature, 16, 8, 32000)
        assert case.logit_bytes == 16 * 9 * 32000 * 2


def test_grids_cover_the_design() -> None:
    """The full grid is the cross product of docs/design.md; the gate and smoke cases are distinct cases."""
    full = full_grid()
    assert len({c.id for c in full}) == len(full) == 4 * 3 * 4 * 2 * 2 * 2 * 4 + 4 * 2 * 2 + 3 * 3 * 2 * 2 * 2
    assert sum(bool(c.filters) for c in full) == 16
    assert sum(c.method == "tree" for c in full) == 72
    assert set(GATE_CASES) <= set(full)
    assert len(set(SMOKE_CASES)) == len(SMOKE_CASES) == 4 * 2 * 2 * 2 + 2


def test_tree_cases_hold_eagle_trees() -> None:
    """A tree case's requests are each the case's EAGLE-2-like tree: nodes over its depth, the first
    nodes of each level the parents of the next, each node's token its rank among its siblings in its
    parent's row (the first child the likeliest)."""
    assert eagle_tree(16, 5) == [-1, -1, -1, -1, 0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    for nodes, depth in TREES:
        parents = eagle_tree(nodes, depth)
        levels = [0] * nodes
        for node, parent in enumerate(parents):
            assert -1 <= parent < node
            levels[node] = 1 if parent < 0 else levels[parent] + 1
        assert max(levels) == depth
    case = Case("tree", "fp32", "one-hot", 1.0, 2, 16, 300, depth=5)
    batch = make_inputs(case, "cpu")
    batch.validate()
    assert batch.draft_logits is None and batch.tree_parent is not None
    assert batch.tree_parent.tolist() == eagle_tree(16, 5) * 2
    assert min_bytes(case) == 2 * 17 * 300 * 4 + (8 * 32 + 4 * 3 + 4 * 2 + 16 + 16 + 8 * 32) + (
        8 * 34 + 4 * 34 + 8 + 4 * 32
    )
    with pytest.raises(ValueError, match="depth"):
        eagle_tree(4, 5)


def test_slotted_inputs_read_through_the_slots() -> None:
    """Slot ``draft_slot[b]`` of a slotted batch holds request b's rows of the flat batch."""
    flat = make_inputs(Case("probabilistic", "fp32", "flat", 1.0, 3, 2, 64), "cpu", seed=5)
    slotted = make_inputs(Case("probabilistic", "fp32", "slotted", 1.0, 3, 2, 64), "cpu", seed=5)
    slotted.validate()
    assert slotted.draft_logits is not None and slotted.draft_slot is not None
    assert flat.draft_logits is not None
    for b in range(3):
        rows = flat.draft_logits[2 * b : 2 * b + 2]
        assert torch.equal(slotted.draft_logits[int(slotted.draft_slot[b])], rows)


def test_planted_slowdown_keeps_the_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted extra pass changes only the time: outputs equal the wrapped variant's."""
    monkeypatch.setenv(EXTRA_PASS_ENV, "torch, triton")
    sampler = ReferenceSampler()
    slowed = with_planted_slowdown("triton", sampler)
    assert isinstance(slowed, ExtraLogitPass)
    assert with_planted_slowdown("other", sampler) is sampler
    batch = make_inputs(SMOKE_CASES[0], "cpu")
    expected, got = sampler(batch), slowed(batch)
    assert torch.equal(expected.token_ids, got.token_ids)
    assert torch.equal(expected.num_emitted, got.num_emitted)


def test_baselines_are_named_after_the_gpu() -> None:
    """A GPU name maps to one file name of letters, digits, dots, dashes and underscores."""
    assert baseline_path("NVIDIA H100 80GB HBM3").name == "NVIDIA_H100_80GB_HBM3.json"
    assert baseline_path("NVIDIA H200").name == "NVIDIA_H200.json"


def test_rounds_fit_the_budget() -> None:
    """Fast calls get the most rounds, slow ones the fewest."""
    assert rounds_for("gate", 1e-6) == 200
    assert rounds_for("gate", 0.1) == 20
    assert rounds_for("full", 0.1) == 10


def _write_run(path: Path, medians: dict[str, float], variant: str = "triton") -> Path:
    benchmarks = []
    for name, median in medians.items():
        info = {"variant": variant, "method": "probabilistic", "dtype": "fp32", "layout": "flat"}
        info |= {"temperature": 1.0, "batch": 64, "num_drafts": 4, "vocab": 128256}
        info |= {"bytes": 295_526_400, "floor_us": 70.0, "floor_ratio": median / 70e-6}
        info |= {"achieved_GBps": 295_526_400 / median / 1e9}
        benchmarks.append(
            {
                "name": f"test_gpu_time[{name}]",
                "fullname": f"benchmarks/test_latency.py::test_gpu_time[{name}]",
                "stats": {"median": median, "rounds": 20, "iqr": median / 100},
                "extra_info": info,
            }
        )
    path.write_text(json.dumps({"benchmarks": benchmarks, "machine_info": {}}), encoding="utf-8")
    return path


def test_compare_flags_only_regressions_past_the_margin(tmp_path: Path) -> None:
    """A median 20 % slower fails a 10 % margin; one 5 % slower passes it."""
    baseline = _write_run(tmp_path / "base.json", {"a": 100e-6, "b": 100e-6})
    now = _write_run(tmp_path / "now.json", {"a": 120e-6, "b": 105e-6})
    changes = {
        c.fullname.split("[")[1].rstrip("]"): c.relative
        for c in report.compare(*map(report.load_run, (baseline, now)))
    }
    assert changes == pytest.approx({"a": 0.2, "b": 0.05})
    assert report.main(["compare", str(baseline), str(now), "--margin", "10"]) == 1
    assert report.main(["compare", str(baseline), str(now), "--margin", "25"]) == 0


def test_spread_and_margin(tmp_path: Path) -> None:
    """The suggested margin is twice the largest spread of a median, at least 5 %."""
    runs = [
        report.load_run(_write_run(tmp_path / f"{i}.json", {"a": a, "b": 50e-6}))
        for i, a in enumerate((100e-6, 104e-6))
    ]
    spreads = report.run_spread(runs)
    assert spreads[0].relative == pytest.approx(0.04)
    assert report.suggested_margin(spreads) == 8


def test_targets_read_the_headline_case(tmp_path: Path) -> None:
    """The 1.25x target holds at 80 us against a 70 us floor and fails at 100 us."""
    for median, met in ((80e-6, True), (100e-6, False)):
        run = report.load_run(_write_run(tmp_path / "run.json", {"x": median}))
        headline = report.check_targets(run.records)[0]
        assert headline.target.startswith("probabilistic B=64") and headline.met is met


def test_engine_comparison_only_on_an_h200(tmp_path: Path) -> None:
    """At B=64 n=4 the engine kernel took 135.7 us on an H200: 100 us meets 0.75x of it (101.8 us),
    110 us does not; a run on another GPU is not compared."""
    for median, met in ((100e-6, True), (110e-6, False)):
        run = report.load_run(_write_run(tmp_path / "run.json", {"x": median}))
        engine = [t for t in report.check_targets(run.records, h200=True) if "vLLM" in t.target]
        assert len(engine) == 1 and engine[0].met is met
        assert not [t for t in report.check_targets(run.records) if "vLLM" in t.target]


def test_bf16_drafts_measure_is_exact_where_it_must_be() -> None:
    """q = p exactly: with fp32 drafts every draft is accepted (E[m] = n); rounding the drafts to
    bf16 moves the law (TV > 0) and loses acceptances; nearly uniform logits barely move."""
    from specsample.benchmarks.bf16_drafts import measure

    mean_tv, max_tv, fp32, rounded = measure("equal", 1.0, 0.0, 0.0, 3, 257, 3, seed=0)
    assert fp32 == pytest.approx(3.0) and rounded < 3.0 and 0.0 < mean_tv <= max_tv <= 1.0
    flat_tv, _, _, _ = measure("flat", 1.0, 0.0, 0.0, 3, 257, 3, seed=0)
    assert flat_tv < mean_tv


def test_block_accepted_length_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """With one draft block verification is probabilistic verification (gain exactly 0); with drafts
    drawn from q the mean gain over many sequences is not negative; the command prints both."""
    import numpy as np

    from specsample.benchmarks import block_accepted

    rng = np.random.default_rng(0)
    one = block_accepted.drafts_from_q(
        make_inputs(Case("probabilistic", "fp32", "flat", 1.0, 4, 1, 64), "cpu"), 2, rng
    )
    np.testing.assert_allclose(
        block_accepted.accepted(one, "block"), block_accepted.accepted(one, "probabilistic")
    )
    four = make_inputs(Case("probabilistic", "fp32", "flat", 1.0, 8, 4, 64), "cpu")
    drawn = block_accepted.drafts_from_q(four, 64, rng)
    gain = block_accepted.accepted(drawn, "block") - block_accepted.accepted(drawn, "probabilistic")
    assert gain.mean() > 0.0
    block_accepted.main(["--shapes", "2x2x64", "--draws", "2", "--batches", "3"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(lines) >= 2 + 3 and any("drafts from q" in line for line in lines)


def test_reports_keep_filtered_cases_apart(tmp_path: Path) -> None:
    """A filtered record has its own case (read back from its ``extra_info``), its own row in the results
    table and its own group in the summary, beside the unfiltered record of the same shape."""
    path = _write_run(tmp_path / "run.json", {"plain": 86e-6, "filtered": 2_370e-6})
    data = json.loads(path.read_text(encoding="utf-8"))
    data["benchmarks"][1]["extra_info"]["filters"] = [["top_k", 50], ["top_p", 0.9], ["min_p", 0.05]]
    path.write_text(json.dumps(data), encoding="utf-8")
    plain, filtered = report.load_run(path).records
    assert filtered.case == dataclasses.replace(HEADLINE, filters=TOP_K_P_MIN_P) and plain.case == HEADLINE
    rows = report.results_table([plain, filtered]).splitlines()[2:]
    assert len(rows) == 2 and "| 128256 |  |" in rows[0] and "| top_k 50, top_p 0.9, min_p 0.05 |" in rows[1]
    groups = report.summary_table([plain, filtered]).splitlines()[2:]
    assert len(groups) == 2 and "| probabilistic |  | 1 |" in groups[0] and "top_p 0.9" in groups[1]


def test_a_kernel_launched_twice_a_call_is_profiled_a_launch() -> None:
    """Three calls (starts in microseconds): a statistics pass, two passes of masses (2 us then 5) and a
    kernel launched in two of the three calls only, which cannot be told apart by launch."""
    launches = []
    for call in range(3):
        begin = 100.0 * call
        launches += [("stats", begin, 10e-6), ("mass", begin + 20, 2e-6), ("mass", begin + 40, 5e-6)]
        if call:
            launches.append(("sometimes", begin + 60, 3e-6))
    times = dict(launch_times(sorted(launches, key=lambda launch: -launch[1]), 3))
    assert times == pytest.approx({"stats": 10e-6, "mass #2": 5e-6, "mass #1": 2e-6, "sometimes": 2e-6})
    assert [label for label, _ in launch_times(launches, 3)] == ["stats", "mass #2", "mass #1", "sometimes"]
