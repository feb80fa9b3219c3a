"""Latency of each sampler variant over the benchmark grid, reported against the memory floor."""

from __future__ import annotations

import statistics
from typing import Any

import pytest
import torch

from specsample.benchmarks.grid import Case, min_bytes
from specsample.benchmarks.session import BenchSession
from specsample.benchmarks.timing import EVENT_CLOCK, Ceilings, ColdCallTimer, capture_graph, rounds_for
from specsample.reference.contract import SpecBatch, SpecOutput, Variant, validate_output

CALL_LATENCY_ROUNDS = 200
# Variants whose call never synchronises with the host, so a CUDA graph can capture it.
GRAPH_CAPTURABLE = frozenset({"triton"})


def case_info(case: Case, variant_name: str) -> dict[str, Any]:
    """The case's parameters and byte count, for a record's ``extra_info``."""
    return {
        "variant": variant_name,
        "method": case.method,
        "dtype": case.dtype,
        "layout": case.layout,
        "temperature": case.temperature,
        "batch": case.batch,
        "num_drafts": case.num_drafts,
        "vocab": case.vocab,
        "filters": [list(pair) for pair in case.filters],
        "depth": case.depth,
        "bytes": min_bytes(case),
    }


def floor_info(case: Case, ceilings: Ceilings, median_seconds: float) -> dict[str, float]:
    """The floor (bytes over the copy bandwidth), the time over it, and the achieved bandwidth."""
    floor_seconds = min_bytes(case) / ceilings.copy_bytes_per_s
    return {
        "copy_GBps": ceilings.copy_bytes_per_s / 1e9,
        "read_GBps": ceilings.read_bytes_per_s / 1e9,
        "median_us": median_seconds * 1e6,
        "floor_us": floor_seconds * 1e6,
        "floor_ratio": median_seconds / floor_seconds,
        "achieved_GBps": min_bytes(case) / median_seconds / 1e9,
    }


def check_output(output: SpecOutput, batch: SpecBatch) -> None:
    """Fail unless the call produced a well-formed output: a benchmark of a broken call means nothing."""
    validate_output(output, batch)
    emitted = output.num_emitted.cpu()
    assert bool(((emitted >= 1) & (emitted <= batch.resolved_max_num_drafts() + 1)).all())


def prepare(bench_session: BenchSession, case: Case, variant_name: str) -> tuple[Variant, SpecBatch]:
    """The variant and the case's inputs."""
    return bench_session.variant(variant_name), bench_session.inputs(case)


@pytest.mark.bench
@pytest.mark.benchmark(timer=EVENT_CLOCK)
def test_gpu_time(benchmark: Any, bench_session: BenchSession, case: Case, variant_name: str) -> None:
    """A variant's GPU time per call on a cold L2 is recorded with its floor and achieved bandwidth."""
    variant, batch = prepare(bench_session, case, variant_name)
    benchmark.group = case.id
    benchmark.extra_info.update(case_info(case, variant_name))
    if not benchmark.enabled:
        check_output(benchmark.pedantic(variant, args=(batch,)), batch)
        return
    timer = bench_session.timer
    timer.hold_seconds = 0.0
    timer.dispatch_seconds.clear()
    # Compile (or load from Triton's cache) and fill the allocator outside every timed call.
    first = variant(batch)
    check_output(first, batch)
    # How far the walk went: a sampler may skip the rows after a rejection, so its time depends on it.
    benchmark.extra_info["mean_emitted"] = float(first.num_emitted.float().mean())
    # Without a hold the probe's GPU time may include host gaps: an upper bound, which is all the
    # round count needs.
    estimate, dispatch, output = timer.probe(variant, batch)
    check_output(output, batch)
    timer.hold_for_dispatch(dispatch)
    benchmark.pedantic(
        timer.timed_call,
        args=(variant, batch),
        setup=timer.prepare_round,
        rounds=rounds_for(bench_session.grid, estimate),
        warmup_rounds=1,
    )
    benchmark.extra_info.update(floor_info(case, bench_session.ceilings, benchmark.stats.stats.median))
    benchmark.extra_info["dispatch_us"] = statistics.median(timer.dispatch_seconds) * 1e6
    benchmark.extra_info["hold_us"] = timer.hold_seconds * 1e6


@pytest.mark.bench
def test_call_latency(
    benchmark: Any, bench_session: BenchSession, call_latency_case: Case, variant_name: str
) -> None:
    """A call's latency from Python to a synchronised result, L2 cold, is what a user waits for."""
    if bench_session.grid == "gate":
        pytest.skip("host-bound call latency is reported, not gated: its median moved 18 % between runs")
    case = call_latency_case
    variant, batch = prepare(bench_session, case, variant_name)
    benchmark.group = f"call-latency-{case.id}"
    benchmark.extra_info.update(case_info(case, variant_name), measure="python-call")
    if not benchmark.enabled:
        check_output(benchmark.pedantic(variant, args=(batch,)), batch)
        return
    timer = bench_session.timer
    check_output(variant(batch), batch)
    torch.cuda.synchronize()
    benchmark.pedantic(
        ColdCallTimer.synchronised_call,
        args=(variant, batch),
        setup=timer.flush_and_wait,
        rounds=CALL_LATENCY_ROUNDS,
        warmup_rounds=5,
    )
    benchmark.extra_info.update(floor_info(case, bench_session.ceilings, benchmark.stats.stats.median))


@pytest.mark.bench
def test_graph_call_latency(
    benchmark: Any, bench_session: BenchSession, call_latency_case: Case, variant_name: str
) -> None:
    """The same call captured once in a CUDA graph and replayed, L2 cold: the latency of a caller
    that keeps its inputs in persistent buffers, as serving engines do for graph capture."""
    if bench_session.grid == "gate":
        pytest.skip("host-bound call latency is reported, not gated: its median moved 18 % between runs")
    if variant_name not in GRAPH_CAPTURABLE:
        pytest.skip(f"{variant_name} reads tensors back to the host inside a call: it cannot be captured")
    case = call_latency_case
    variant, batch = prepare(bench_session, case, variant_name)
    benchmark.group = f"graph-call-latency-{case.id}"
    benchmark.extra_info.update(case_info(case, variant_name), measure="graph-replay")
    if not benchmark.enabled:
        check_output(benchmark.pedantic(variant, args=(batch,)), batch)
        return
    graph, output = capture_graph(lambda: variant(batch))
    graph.replay()
    torch.cuda.synchronize()
    check_output(output, batch)
    benchmark.pedantic(
        ColdCallTimer.synchronised_call,
        args=(graph.replay,),
        setup=bench_session.timer.flush_and_wait,
        rounds=CALL_LATENCY_ROUNDS,
        warmup_rounds=5,
    )
    benchmark.extra_info.update(floor_info(case, bench_session.ceilings, benchmark.stats.stats.median))
