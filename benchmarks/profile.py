"""Where one sampler call spends its GPU time: per-kernel times from the PyTorch profiler.

    python3 -m benchmarks.profile [--variant triton] [--repeats 20] [CASE_ID ...]

CASE_ID is a case id of the full grid (``probabilistic-fp32-flat-T1-B64-n4-V128256``); without one,
the gate cases are profiled. Each kernel's time is its mean per call over the
repeats, next to the case's floor; the L2 is flushed before each call, outside the kernels shown.
A kernel launched more than once a call is listed once a launch, in launch order (``name #1``,
``name #2``: top-p's two passes of masses, say), where every call launches it as often.
The Triton sampler's launches run here one after another (``SPECSAMPLE_PDL=0``): programmatically
dependent, a kernel's time would include its wait for the one before. A call's GPU time with them
is what `benchmarks` measures.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from specsample.benchmarks.grid import GATE_CASES, Case, full_grid, make_inputs, min_bytes
from specsample.benchmarks.timing import ColdCallTimer, measure_ceilings
from specsample.kernels import launch, registry


def kernel_times(
    variant_name: str, case: Case, timer: ColdCallTimer, repeats: int
) -> list[tuple[str, float]]:
    """``(kernel name, mean GPU seconds per call)`` of one variant on one case, longest first."""
    variant = registry.get(variant_name)
    batch = make_inputs(case, "cuda")
    for _ in range(3):
        variant(batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        for _ in range(repeats):
            timer.flush()
            variant(batch)
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as flush_only:
        timer.flush()
        torch.cuda.synchronize()
    flush_names = {event.key for event in flush_only.key_averages() if event.device_time_total > 0}
    launches = [
        (event.name, event.time_range.start, event.device_time_total / 1e6)
        for event in trace.events()
        if event.device_type != DeviceType.CPU
        and event.device_time_total > 0
        and event.name not in flush_names
    ]
    return launch_times(launches, repeats)


def launch_times(launches: Sequence[tuple[str, float, float]], repeats: int) -> list[tuple[str, float]]:
    """``(label, mean seconds per call)``, longest first, from the device work of ``repeats`` calls made
    one after another: ``(kernel name, start, seconds)`` a launch. A kernel launched ``k > 1`` times
    in every call (its launches number ``k`` times ``repeats``) gets a line a launch, ``name #1`` to
    ``name #k`` in the order of their starts within the call; any other kernel one line, its
    launches added up."""
    by_name: dict[str, list[tuple[float, float]]] = {}
    for name, start, seconds in launches:
        by_name.setdefault(name, []).append((start, seconds))
    times = []
    for name, events in by_name.items():
        per_call, left = divmod(len(events), repeats)
        if per_call <= 1 or left:
            times.append((name, sum(seconds for _, seconds in events) / repeats))
            continue
        events.sort()
        for k in range(per_call):
            times.append((f"{name} #{k + 1}", sum(seconds for _, seconds in events[k::per_call]) / repeats))
    return sorted(times, key=lambda item: item[1], reverse=True)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.profile", description=__doc__.split("\n")[0])
    parser.add_argument("cases", nargs="*", help="case ids (default: the gate cases)")
    parser.add_argument("--variant", default="triton")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    os.environ[launch.PDL_ENV] = "0"
    by_id = {case.id: case for case in full_grid()}
    cases = [by_id[name] for name in args.cases] if args.cases else list(GATE_CASES)
    device = torch.device("cuda")
    ceilings = measure_ceilings(device)
    timer = ColdCallTimer(device)
    for case in cases:
        floor = min_bytes(case) / ceilings.copy_bytes_per_s
        times = kernel_times(args.variant, case, timer, args.repeats)
        total = sum(seconds for _, seconds in times)
        print(f"{case.id}: {total * 1e6:.1f} us in kernels, floor {floor * 1e6:.1f} us")
        for name, seconds in times:
            print(f"    {seconds * 1e6:9.1f} us  {100 * seconds / total:5.1f} %  {name[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
