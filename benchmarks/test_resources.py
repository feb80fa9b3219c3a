"""The split plan's kernels compiled for sm_90 on a machine without a GPU: no more spills than recorded."""

from __future__ import annotations

import os
import subprocess
import sys

from specsample.benchmarks.resources import Resources, regressions


def test_the_kernels_spill_no_more_than_their_baseline() -> None:
    """`benchmarks.resources` compiles every case's kernels, the sampler's and the filters' (Triton's
    compiler, not the interpreter, so in a process of its own) and finds no stack or local access
    over benchmarks/baselines/sm90_resources.json."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    run = subprocess.run(
        [sys.executable, "-m", "specsample.benchmarks.resources"], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASSED (0 regressions" in run.stdout


def test_a_kernel_that_spills_more_is_named() -> None:
    """A grown stack or more local accesses is a regression naming the case, the kernel and both
    values; fewer, or more registers alone, is not; a kernel without a baseline is named too."""
    baseline = {"strict": {"row_stats_kernel": {"registers": 80, "stack": 0, "local_accesses": 0}}}
    spilled = {"strict": {"row_stats_kernel": Resources(registers=80, stack=136, local_accesses=68)}}
    assert regressions(spilled, baseline) == [
        "strict: row_stats_kernel stack 0 -> 136",
        "strict: row_stats_kernel local_accesses 0 -> 68",
    ]
    assert regressions({"strict": {"row_stats_kernel": Resources(96, 0, 0)}}, baseline) == []
    assert regressions({"strict": {"emit_kernel": Resources(56, 0, 0)}}, baseline) == [
        "strict: emit_kernel has no baseline (record one with --save)"
    ]
