"""Timing GPU work under pytest-benchmark, and measuring the bandwidth ceilings that set the floor.

Two measurements of a call:

- **GPU time** (`ColdCallTimer` with `EventClock`): before each round the L2 is flushed (a write
  several times its size) and the GPU is then held busy by a spin kernel for about twice the
  host's dispatch time of the call; only then is the call timed between two CUDA events. The hold
  lets Python enqueue every launch before the first one runs, so the events see the kernels back
  to back and not the launcher's host overhead (120 to 190 us a call on an H200; without the hold,
  small shapes timed the host). The flush evicts the inputs, so every round reads them from
  device memory as a serving step would: the effect of rotating among input sets larger than the
  L2, without the memory. pytest-benchmark reads `EventClock` before and after each round; the
  timed call advances it by the event time, so each recorded duration is exactly the GPU time.
- **Call latency** (`ColdCallTimer.synchronised_call` with the default ``perf_counter`` timer): a
  flush and a synchronisation outside the timed region, then the call and a synchronisation inside
  it: the time a user waits from Python for a result, host overhead included.

`measure_ceilings` times a large device-to-device copy and a large read-only reduction once per
session; the floor of a benchmark is its bytes over the copy bandwidth (see `Ceilings`).
"""

from __future__ import annotations

import functools
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton

# The flush writes max(FLUSH_MIN_BYTES, FLUSH_L2_MULTIPLE x L2) bytes, several times any Hopper L2.
FLUSH_MIN_BYTES = 256 << 20
FLUSH_L2_MULTIPLE = 8
CEILING_BYTES = 2 << 30
CEILING_REPEATS = 30
# The spin after the flush lasts HOLD_DISPATCH_MULTIPLE x the call's host dispatch time plus
# HOLD_EXTRA_SECONDS, at most HOLD_MAX_SECONDS (a variant that synchronises inside the call, like
# the PyTorch one, gains nothing from a longer hold).
HOLD_DISPATCH_MULTIPLE = 2.0
HOLD_EXTRA_SECONDS = 20e-6
HOLD_MAX_SECONDS = 2e-3
# The spin's clock rate is timed on SPIN_CALIBRATION_REPEATS spins of SPIN_CALIBRATION_CYCLES cycles
# (about 0.5 ms each on a Hopper GPU), median.
SPIN_CALIBRATION_CYCLES = 1_000_000
SPIN_CALIBRATION_REPEATS = 5
# Rounds per benchmark: enough for a stable median within a time budget per benchmark. The gate
# spends more per benchmark than the full grid, whose 2304 benchmarks must fit in a few minutes.
ROUND_BUDGET_SECONDS = {"gate": 0.3, "full": 0.05, "smoke": 0.0}
MIN_ROUNDS = {"gate": 20, "full": 10, "smoke": 1}
MAX_ROUNDS = {"gate": 200, "full": 50, "smoke": 1}
# Host work between timed rounds (flush, hold, synchronisation, Python), for the round estimate.
ROUND_OVERHEAD_SECONDS = 5e-4


def rounds_for(grid: str, estimate_seconds: float) -> int:
    """Rounds that fit the grid's time budget, clamped to its minimum and maximum."""
    wanted = math.ceil(ROUND_BUDGET_SECONDS[grid] / (estimate_seconds + ROUND_OVERHEAD_SECONDS))
    return max(MIN_ROUNDS[grid], min(MAX_ROUNDS[grid], wanted))


class EventClock:
    """A pytest-benchmark timer that reads the summed CUDA-event time of the calls timed so far.

    Pass it as ``@pytest.mark.benchmark(timer=EVENT_CLOCK)``; only `ColdCallTimer.timed_call`
    advances it, so host work between rounds (the flush, Python) never counts.
    """

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        """The clock's reading in seconds."""
        return self.seconds

    def __repr__(self) -> str:
        return "EventClock(CUDA events around each call, L2 flushed before it)"


EVENT_CLOCK = EventClock()


class ColdCallTimer:
    """Times single calls on the CUDA ``device`` with a cold L2; `timed_call` advances ``clock``."""

    def __init__(self, device: torch.device, clock: EventClock = EVENT_CLOCK) -> None:
        l2_bytes = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
        flush_bytes = max(FLUSH_MIN_BYTES, FLUSH_L2_MULTIPLE * l2_bytes)
        self.flush_buffer = torch.empty(flush_bytes // 4, dtype=torch.int32, device=device)
        self.clock = clock
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.dispatch_seconds: list[float] = []
        self.hold_seconds = 0.0
        self.spin = GpuSpin()

    def flush(self) -> None:
        """Evict the L2 by overwriting the flush buffer (enqueued, not waited for)."""
        self.flush_buffer.zero_()

    def hold_for_dispatch(self, dispatch_seconds: float) -> None:
        """Size the spin of `prepare_round` for a call whose host dispatch takes ``dispatch_seconds``."""
        wanted = HOLD_DISPATCH_MULTIPLE * dispatch_seconds + HOLD_EXTRA_SECONDS
        self.hold_seconds = min(HOLD_MAX_SECONDS, wanted)

    def prepare_round(self) -> None:
        """Flush the L2, then keep the GPU busy for `hold_seconds` (both enqueued, not waited for)."""
        self.flush()
        self.spin(self.hold_seconds)

    def flush_and_wait(self) -> None:
        """Evict the L2 and wait until the device is idle."""
        self.flush()
        torch.cuda.synchronize()

    def timed_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` between two events, wait, and advance the clock by the GPU time.

        Also records the host time to enqueue the call in `dispatch_seconds`: if it approaches the
        flush time, launches were on the critical path and the event time includes host overhead.
        """
        self.start.record()
        begin = time.perf_counter()
        result = fn(*args)
        self.dispatch_seconds.append(time.perf_counter() - begin)
        self.end.record()
        self.end.synchronize()
        self.clock.seconds += self.start.elapsed_time(self.end) / 1e3
        return result

    def probe(self, fn: Callable[..., Any], *args: Any) -> tuple[float, float, Any]:
        """One cold call of ``fn(*args)`` outside pytest-benchmark, with the current hold: its GPU time
        and host dispatch time in seconds, and its result."""
        self.prepare_round()
        before = self.clock.seconds
        result = self.timed_call(fn, *args)
        return self.clock.seconds - before, self.dispatch_seconds.pop(), result

    @staticmethod
    def synchronised_call(fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` followed by a device synchronisation: what a user waiting on the result pays."""
        result = fn(*args)
        torch.cuda.synchronize()
        return result


class GpuSpin:
    """Keeps the current CUDA stream busy for a given time, adding no memory traffic.

    A call enqueues `torch.cuda._sleep`: one thread spinning on the SM clock for a number of cycles,
    converted from seconds at the clock rate measured on first use (`cycles_per_second`).

    Args:
        sleep: enqueues a spin of the given number of cycles on the current stream
            (`torch.cuda._sleep` unless given).
        gpu_seconds: the median GPU time in seconds of a callable over a number of repeats
            (`median_event_seconds` unless given).
    """

    def __init__(
        self,
        sleep: Callable[[int], None] | None = None,
        gpu_seconds: Callable[[Callable[[], Any], int], float] | None = None,
    ) -> None:
        self.sleep = torch.cuda._sleep if sleep is None else sleep
        self.gpu_seconds = median_event_seconds if gpu_seconds is None else gpu_seconds

    @functools.cached_property
    def cycles_per_second(self) -> float:
        """The spin's clock rate: `SPIN_CALIBRATION_CYCLES` over the median time of a spin that long."""
        seconds = self.gpu_seconds(lambda: self.sleep(SPIN_CALIBRATION_CYCLES), SPIN_CALIBRATION_REPEATS)
        if not seconds > 0:
            raise RuntimeError(f"a spin of {SPIN_CALIBRATION_CYCLES} cycles took {seconds} s; expected > 0")
        return SPIN_CALIBRATION_CYCLES / seconds

    def cycles(self, seconds: float) -> int:
        """The spin cycles that last ``seconds``."""
        return round(seconds * self.cycles_per_second)

    def __call__(self, seconds: float) -> None:
        """Enqueue a spin of ``seconds`` on the current stream (nothing for ``seconds <= 0``)."""
        if seconds > 0:
            self.sleep(self.cycles(seconds))


@dataclass(frozen=True)
class Ceilings:
    """The device-memory ceilings measured on this GPU in this run.

    Attributes:
        copy_bytes_per_s: a device-to-device copy's bytes read plus bytes written, per second. The
            floor of a benchmark is its bytes over this rate: the same convention as the figures of
            issue 6, and the DRAM traffic rate a streaming kernel can count on.
        read_bytes_per_s: a read-only reduction's bytes read per second: a second, usually
            slightly higher ceiling for kernels that only read (reported, not used for the floor).
    """

    copy_bytes_per_s: float
    read_bytes_per_s: float


def capture_graph(fn: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
    """A CUDA graph of ``fn()`` and the output its replays write, after three warm-up calls on a side
    stream (compilation and the allocator's first blocks stay outside the capture, as it requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = fn()
    return graph, output


def median_event_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """The median GPU time of ``fn()`` over ``repeats`` calls enqueued back to back, each between two
    CUDA events on the current stream, after one call outside the timing."""
    fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True))


def measure_ceilings(device: torch.device, num_bytes: int = CEILING_BYTES) -> Ceilings:
    """Time a ``num_bytes`` device-to-device copy and a ``num_bytes`` fp32 sum (medians of 30)."""
    source = torch.randn(num_bytes // 4, device=device)
    target = torch.empty_like(source)
    copy_seconds = median_event_seconds(lambda: target.copy_(source), CEILING_REPEATS)
    read_seconds = median_event_seconds(lambda: source.sum(), CEILING_REPEATS)
    return Ceilings(copy_bytes_per_s=2 * num_bytes / copy_seconds, read_bytes_per_s=num_bytes / read_seconds)


def gpu_description(device: torch.device) -> dict[str, Any]:
    """The GPU's name, driver, memory, multiprocessors and L2, and the CUDA, torch and Triton versions."""
    props = torch.cuda.get_device_properties(device)
    return {
        "name": props.name,
        "driver": driver_version(),
        "cuda_runtime": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)),
    }


def driver_version() -> str:
    """The NVIDIA driver version as nvidia-smi reports it, or ``"unknown"``."""
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "unknown"


def cuda_timing() -> tuple[torch.device, ColdCallTimer, Ceilings] | None:
    """What a benchmark script times with: the CUDA device, a cold-call timer on it and the device's
    measured ceilings; ``None``, with a line on stderr, where there is no CUDA GPU."""
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return None
    device = torch.device("cuda")
    return device, ColdCallTimer(device), measure_ceilings(device)
