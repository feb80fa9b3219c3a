"""Where the host time of one small call goes: validation, the structure key, allocations, launches.

    python3 -m benchmarks.host [CASE_ID ...]

CASE_ID is a case id of the full grid; without one, the B=1 call-latency case. Each line is the
median over 2000 repetitions (300 for the cold ones) of ``time.perf_counter`` around the piece; a
GPU-bound piece is not waited for unless its line says "and synchronisation". Needs a CUDA GPU.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from specsample.benchmarks.grid import CALL_LATENCY_CASE, Case, full_grid, make_inputs
from specsample.benchmarks.timing import ColdCallTimer, capture_graph
from specsample.kernels import rejection


def median_us(fn: Callable[[], Any], repeats: int = 2000, *, synchronise: bool = False) -> float:
    """Median host time of ``fn()`` in microseconds (with a device synchronisation if asked)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        if synchronise:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - begin)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def cold_us(fn: Callable[[], Any], timer: ColdCallTimer, repeats: int = 300) -> float:
    """Median of ``fn()`` and a synchronisation, each after an L2 flush on an idle device."""
    times = []
    for _ in range(repeats):
        timer.flush_and_wait()
        begin = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - begin)
    return statistics.median(times) * 1e6


def host_times(case: Case, device: torch.device, timer: ColdCallTimer) -> list[tuple[str, float]]:
    """``(piece, median microseconds)`` of one case's call on the current CUDA device."""
    batch = make_inputs(case, device)

    def call() -> Any:
        return rejection.rejection_sample(batch)

    call()
    tensors = rejection._batch_tensors(batch)
    device_index = torch.cuda.current_device()
    addresses = [tensor.data_ptr() for tensor in tensors]
    key = rejection._plan_key(batch, device_index, addresses)
    plan, cached = rejection._cache[key]
    structure = rejection.batch_structure(batch)
    graph, _ = capture_graph(call)
    return [
        ("SpecBatch.validate (structure only)", median_us(lambda: batch.validate(check_values=False))),
        ("the batch's structure", median_us(lambda: rejection.batch_structure(batch))),
        ("validation of a structure seen before", median_us(
            lambda: rejection._validate(batch, rejection.batch_structure(batch), None))),
        ("plan key", median_us(lambda: rejection._plan_key(batch, 0, addresses, 0, structure))),
        ("cached launches with their allocations", median_us(
            lambda: rejection._run_cached(batch, plan, cached, addresses, device_index, key))),
        ("whole call enqueued", median_us(call)),
        ("whole call and synchronisation", median_us(call, synchronise=True)),
        ("whole call and synchronisation, cold", cold_us(call, timer)),
        ("CUDA graph replay and synchronisation, cold", cold_us(graph.replay, timer)),
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; see the module docstring."""
    names = list(sys.argv[1:] if argv is None else argv)
    by_id = {case.id: case for case in full_grid()}
    cases = [by_id[name] for name in names] if names else [CALL_LATENCY_CASE]
    device = torch.device("cuda")
    timer = ColdCallTimer(device)
    for case in cases:
        print(f"{case.id} on {torch.cuda.get_device_name(device)}")
        for label, micros in host_times(case, device, timer):
            print(f"    {micros:8.1f} us  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
