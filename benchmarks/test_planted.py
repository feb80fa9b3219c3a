"""The planted slowdowns: the spin's calibration, the proportional sizing, the wrappers, the environment."""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
from collections.abc import Callable
from typing import Any

import pytest
import torch

from specsample.benchmarks.grid import SMOKE_CASES, make_inputs
from specsample.benchmarks.planted import (
    CALIBRATION_CALLS,
    EXTRA_PASS_ENV,
    PLANTED_ENV,
    ColdCallMedian,
    ExtraLogitPass,
    ProportionalSlowdown,
    planted_fractions,
    with_planted_slowdown,
)
from specsample.benchmarks.session import load_variants
from specsample.benchmarks.timing import SPIN_CALIBRATION_CYCLES, SPIN_CALIBRATION_REPEATS, GpuSpin
from specsample.reference.contract import Capabilities, SpecBatch, Variant
from specsample.reference.sampler import ReferenceSampler
from specsample.reference.schemes import MRV2

DISPATCH_SECONDS = 40e-6
# Call k of a batch (k >= 1) takes this multiple of the batch's GPU time: any run of 3 consecutive
# calls has the median 1, as the median of `CALIBRATION_CALLS` calls must find.
JITTER = (0.9, 1.1, 1.0)
COMPILE_MULTIPLE = 50.0


class FakeGpu:
    """A simulated GPU clock: a sampler's call advances it by the call's GPU time, a spin of ``c``
    cycles by ``c / cycles_per_second``."""

    def __init__(self, cycles_per_second: float = 1.5e9) -> None:
        self.cycles_per_second = cycles_per_second
        self.now = 0.0
        self.spins: list[int] = []
        self.timings = 0

    def sleep(self, cycles: int) -> None:
        self.spins.append(cycles)
        self.now += cycles / self.cycles_per_second

    def elapsed(self, fn: Callable[[], Any]) -> float:
        start = self.now
        fn()
        return self.now - start

    def median_seconds(self, fn: Callable[[], Any], repeats: int) -> float:
        """What `timing.median_event_seconds` measures, on this clock."""
        self.timings += 1
        fn()
        return statistics.median(self.elapsed(fn) for _ in range(repeats))


class FakeTimer:
    """`timing.ColdCallTimer` on a `FakeGpu`: a probe times one call; the hold is recorded."""

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.hold_seconds = 0.0
        self.holds_at_probe: list[float] = []
        self.dispatches: list[float] = []

    def probe(self, fn: Callable[..., Any], *args: Any) -> tuple[float, float, Any]:
        self.holds_at_probe.append(self.hold_seconds)
        start = self.gpu.now
        result = fn(*args)
        return self.gpu.now - start, DISPATCH_SECONDS, result

    def hold_for_dispatch(self, dispatch_seconds: float) -> None:
        self.dispatches.append(dispatch_seconds)
        self.hold_seconds = 2 * dispatch_seconds


class FakeSampler:
    """A sampler whose calls take ``seconds[batch.vocab_size]`` on ``gpu``: the first call with a batch
    ``COMPILE_MULTIPLE`` times that (it compiles), later ones that times `JITTER`."""

    name = "fake"
    streams = MRV2
    capabilities = Capabilities(methods=("probabilistic",))
    block_size = 4096

    def __init__(self, gpu: FakeGpu, seconds: dict[int, float]) -> None:
        self.gpu, self.seconds = gpu, seconds
        self.calls: dict[int, int] = {}
        self.last_seconds = 0.0
        self.output = object()

    def __call__(self, batch: SpecBatch) -> Any:
        count = self.calls.get(id(batch), 0)
        self.calls[id(batch)] = count + 1
        multiple = COMPILE_MULTIPLE if count == 0 else JITTER[count % len(JITTER)]
        self.last_seconds = multiple * self.seconds[batch.vocab_size]
        self.gpu.now += self.last_seconds
        return self.output


def _batch(vocab: int) -> SpecBatch:
    return make_inputs(dataclasses.replace(SMOKE_CASES[0], vocab=vocab), "cpu")


def _planted(gpu: FakeGpu, seconds: dict[int, float], fraction: float) -> ProportionalSlowdown:
    spin = GpuSpin(sleep=gpu.sleep, gpu_seconds=gpu.median_seconds)
    measure = ColdCallMedian(timer=FakeTimer(gpu))
    return ProportionalSlowdown(FakeSampler(gpu, seconds), fraction, measure=measure, spin=spin)


def test_spin_rate_is_calibrated_once_and_sizes_every_spin() -> None:
    """The spin's clock rate is the calibration cycles over their median time, measured once; a spin of
    s seconds is s times that rate in cycles, and a spin of no time enqueues nothing."""
    gpu = FakeGpu(cycles_per_second=1.7e9)
    spin = GpuSpin(sleep=gpu.sleep, gpu_seconds=gpu.median_seconds)
    spin(2e-3)
    spin(0.5e-3)
    spin(0.0)
    assert gpu.timings == 1
    assert spin.cycles_per_second == pytest.approx(1.7e9)
    calibration = gpu.spins[: 1 + SPIN_CALIBRATION_REPEATS]
    assert calibration == [SPIN_CALIBRATION_CYCLES] * (1 + SPIN_CALIBRATION_REPEATS)
    assert gpu.spins[len(calibration) :] == [round(2e-3 * 1.7e9), round(0.5e-3 * 1.7e9)]


def test_a_spin_that_takes_no_time_is_refused() -> None:
    """A calibration that times the spin at 0 s raises instead of sizing spins from an infinite rate."""
    spin = GpuSpin(sleep=lambda cycles: None, gpu_seconds=lambda fn, repeats: 0.0)
    with pytest.raises(RuntimeError, match="expected > 0"):
        spin(1e-3)


def test_cold_call_median_times_as_the_benchmark_does() -> None:
    """The unplanted time is the median of the timed calls, after a call that compiles and a probe
    without a hold whose dispatch sizes the hold of the timed calls."""
    gpu = FakeGpu()
    timer = FakeTimer(gpu)
    timer.hold_seconds = 1.0
    batch = _batch(5000)
    sampler = FakeSampler(gpu, {5000: 3e-3})
    seconds = ColdCallMedian(timer=timer)(sampler, batch)
    assert seconds == pytest.approx(3e-3)
    assert sampler.calls[id(batch)] == 2 + CALIBRATION_CALLS
    assert timer.dispatches == [DISPATCH_SECONDS]
    assert timer.holds_at_probe == [0.0] + [2 * DISPATCH_SECONDS] * CALIBRATION_CALLS


def test_cold_call_median_needs_a_cuda_batch_or_a_timer() -> None:
    """Without a timer, a batch on the CPU is refused, naming its device; fewer than one call too."""
    with pytest.raises(ValueError, match=r"batch\.target_logits is on cpu.*CUDA GPU"):
        ColdCallMedian()(ReferenceSampler(), _batch(5000))
    with pytest.raises(ValueError, match="calls is 0"):
        ColdCallMedian(calls=0)


@pytest.mark.parametrize("fraction", [0.26, 0.5])
def test_the_planted_spin_is_a_fraction_of_each_batch_s_own_time(fraction: float) -> None:
    """Each planted call takes its own GPU time plus ``fraction`` of its batch's unplanted GPU time (the
    median of the calibration), a 2 ms batch and a 30 ms batch alike; each batch is measured once, on
    its first call."""
    gpu = FakeGpu()
    seconds = {5000: 2e-3, 7000: 30e-3}
    planted = _planted(gpu, seconds, fraction)
    sampler = planted.variant
    batches = {vocab: _batch(vocab) for vocab in seconds}
    for vocab, batch in batches.items():
        planted(batch)  # measures the batch, then plants
        for _ in range(6):
            elapsed = gpu.elapsed(lambda b=batch: planted(b))
            assert elapsed - sampler.last_seconds == pytest.approx(fraction * seconds[vocab], rel=1e-6)
        assert planted.unplanted(batch) == pytest.approx(seconds[vocab])
    assert [sampler.calls[id(b)] for b in batches.values()] == [2 + CALIBRATION_CALLS + 7] * 2


def test_a_freed_batch_forgets_its_measurement() -> None:
    """A batch's measurement goes with the batch, so a later batch at the same address is measured anew."""
    gpu = FakeGpu()
    planted = _planted(gpu, {5000: 1e-3}, 0.26)
    batch = _batch(5000)
    planted(batch)
    assert list(planted.unplanted_seconds) == [id(batch)]
    del batch
    gc.collect()
    assert planted.unplanted_seconds == {}


def test_the_proportional_slowdown_keeps_the_outputs() -> None:
    """The planted spin changes only the time: the outputs equal the wrapped variant's."""
    spins: list[float] = []
    sampler = ReferenceSampler()
    planted = ProportionalSlowdown(sampler, 0.26, measure=lambda variant, batch: 1e-3, spin=spins.append)
    batch = make_inputs(SMOKE_CASES[0], "cpu")
    expected, got = sampler(batch), planted(batch)
    assert torch.equal(expected.token_ids, got.token_ids)
    assert torch.equal(expected.num_emitted, got.num_emitted)
    assert spins == [pytest.approx(0.26e-3)]


@pytest.mark.parametrize("fraction", [0.0, -0.1, math.nan, math.inf])
def test_a_fraction_that_plants_nothing_is_refused(fraction: float) -> None:
    """The fraction must be finite and positive; the error names it."""
    with pytest.raises(ValueError, match=f"fraction is {fraction}"):
        ProportionalSlowdown(ReferenceSampler(), fraction)


@pytest.mark.parametrize(
    "wrap",
    [ExtraLogitPass, lambda variant: ProportionalSlowdown(variant, 0.26, measure=lambda v, b: 1.0)],
    ids=["extra-pass", "proportional"],
)
def test_a_planted_wrapper_passes_for_its_variant(wrap: Callable[[Variant], Variant]) -> None:
    """A wrapper keeps the variant's name, random scheme and capabilities, and reads any other
    attribute from it."""
    sampler = FakeSampler(FakeGpu(), {})
    planted = wrap(sampler)
    assert isinstance(planted, Variant)
    assert (planted.name, planted.streams) == ("fake", MRV2)
    assert planted.capabilities == Capabilities(methods=("probabilistic",))
    assert planted.block_size == 4096  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="no_such_attribute"):
        planted.no_such_attribute  # type: ignore[attr-defined]  # noqa: B018


def test_the_environment_picks_the_planted_slowdown(monkeypatch: pytest.MonkeyPatch) -> None:
    """SPECSAMPLE_BENCH_PLANTED gives the named variants their fraction; one also named by
    SPECSAMPLE_BENCH_EXTRA_PASS gets both; a variant named by neither is returned as it is."""
    monkeypatch.setenv(PLANTED_ENV, " mine=0.26, torch=1 ")
    assert planted_fractions() == {"mine": 0.26, "torch": 1.0}
    sampler = ReferenceSampler()
    mine = with_planted_slowdown("mine", sampler)
    assert isinstance(mine, ProportionalSlowdown) and mine.fraction == 0.26 and mine.variant is sampler
    assert with_planted_slowdown("other", sampler) is sampler
    monkeypatch.setenv(EXTRA_PASS_ENV, "mine")
    both = with_planted_slowdown("mine", sampler)
    assert isinstance(both, ProportionalSlowdown) and isinstance(both.variant, ExtraLogitPass)


@pytest.mark.parametrize("entry", ["mine", "mine=", "=0.26", "mine=fast", "mine=0", "mine=-0.2", "mine=nan"])
def test_a_malformed_planted_entry_is_refused(entry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry that is not NAME=FRACTION with a finite positive fraction raises, naming the variable
    and the entry; the benchmark run turns it into a usage error."""
    monkeypatch.setenv(PLANTED_ENV, f"torch=0.3,{entry}")
    with pytest.raises(ValueError, match=f"{PLANTED_ENV} has entry '{entry}'"):
        planted_fractions()
    with pytest.raises(ValueError, match=PLANTED_ENV):
        load_variants("torch")
