"""Planted slowdowns for proving the gate: variant wrappers that add GPU time and change nothing else.

The gate's ``--self-check`` names the variant to slow down in an environment variable of the
benchmark run; the run wraps that variant under its own name (`with_planted_slowdown`), so the
benchmark ids match the baseline and the gate must report the regression:

- `ExtraLogitPass` (``SPECSAMPLE_BENCH_EXTRA_PASS=NAME``): one extra pass over the logits, the
  self-check of the bundled Triton sampler, whose calls (20 to 235 us on an H200) it slows by 29 %
  or more.
- `ProportionalSlowdown` (``SPECSAMPLE_BENCH_PLANTED=NAME=FRACTION``): after each call, the GPU
  spins for ``FRACTION`` of that call's own GPU time; the self-check of ``--variant SPEC``. A fixed
  pass is a small part of a slower sampler's time (1 to 7 % of the PyTorch sampler's 2 to 32 ms
  calls on an H200), so it cannot show whether the gate sees a regression the size of its margin
  there; a slowdown proportional to each call can, on any sampler and GPU.

Both lists are comma-separated. Nothing in the sampler changes: the outputs are the wrapped
variant's.
"""

from __future__ import annotations

import math
import os
import statistics
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch

from specsample.benchmarks.timing import ColdCallTimer, EventClock, GpuSpin
from specsample.reference.contract import SpecBatch, SpecOutput, Variant, capabilities

EXTRA_PASS_ENV = "SPECSAMPLE_BENCH_EXTRA_PASS"
PLANTED_ENV = "SPECSAMPLE_BENCH_PLANTED"
# The unplanted GPU time of a call is the median of this many cold calls: one noisy call moves it
# little, and they cost a few tenths of a second per case for a 30 ms sampler.
CALIBRATION_CALLS = 9


class _Planted:
    """What every planted wrapper keeps of ``variant``: its name (the benchmark ids end with it), its
    random scheme and its capabilities (the benchmarks pick its cases from them); any other attribute
    is read from ``variant``."""

    def __init__(self, variant: Variant) -> None:
        self.variant = variant
        self.name = variant.name
        self.streams = variant.streams
        self.capabilities = capabilities(variant)

    def __getattr__(self, name: str) -> Any:
        """Any attribute the wrapper does not set is the wrapped variant's."""
        variant = self.__dict__.get("variant")
        if variant is None:
            raise AttributeError(name)
        return getattr(variant, name)


class ExtraLogitPass(_Planted):
    """``variant`` preceded by one full read of the target and draft logits (a max reduction each).

    The outputs are the wrapped variant's, unchanged: only the time grows, by about one pass over the
    vocabulary of every row, the slowdown a kernel change that re-reads the logits would cause.
    """

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Read every logit once more, then run the wrapped variant."""
        torch.amax(batch.target_logits)
        if batch.draft_logits is not None:
            torch.amax(batch.draft_logits)
        return self.variant(batch)


class CallTimer(Protocol):
    """What `ColdCallMedian` needs of `timing.ColdCallTimer`."""

    hold_seconds: float

    def probe(self, fn: Callable[..., Any], *args: Any) -> tuple[float, float, Any]: ...

    def hold_for_dispatch(self, dispatch_seconds: float) -> None: ...


class ColdCallMedian:
    """The GPU time of ``variant(batch)`` as `test_latency.test_gpu_time` records it: the L2 flushed,
    the GPU held busy past the call's host dispatch, CUDA events around the call; the median of
    ``calls`` such calls after one call that compiles and one that sizes the hold.

    Args:
        calls: how many timed calls the median takes.
        timer: the `timing.ColdCallTimer` to time with; by default one of the batch's CUDA device,
            made on first use, whose clock is its own (the benchmarks' clock never moves).
    """

    def __init__(self, calls: int = CALIBRATION_CALLS, timer: CallTimer | None = None) -> None:
        if calls < 1:
            raise ValueError(f"calls is {calls}; expected at least 1")
        self.calls = calls
        self.timer = timer

    def __call__(self, variant: Variant, batch: SpecBatch) -> float:
        """The median GPU seconds of an unplanted call of ``variant`` on ``batch``.

        Raises:
            ValueError: naming the device, if ``batch`` is not on a CUDA GPU and no timer was given.
        """
        if self.timer is None:
            device = batch.target_logits.device
            if device.type != "cuda":
                raise ValueError(
                    f"batch.target_logits is on {device}; the planted slowdown times calls on a CUDA GPU"
                )
            self.timer = ColdCallTimer(device, EventClock())
        timer = self.timer
        variant(batch)
        timer.hold_seconds = 0.0
        _, dispatch, _ = timer.probe(variant, batch)
        timer.hold_for_dispatch(dispatch)
        return statistics.median(timer.probe(variant, batch)[0] for _ in range(self.calls))


class ProportionalSlowdown(_Planted):
    """``variant`` followed by a spin of the GPU for ``fraction`` of the call's own GPU time.

    The first call with a batch measures the unplanted call on it (``measure``, median of cold calls)
    before it runs; every call with that batch then runs the variant and enqueues, on the current
    stream, a spin of ``fraction`` x that time, so its GPU time grows by ``fraction`` whatever the
    sampler spends it on. The measurement is kept per batch object, as long as the batch lives: the
    benchmarks build one batch per case, and cases that share shapes can differ in values (the
    temperature) that cannot be read without waiting for the GPU. The outputs are the variant's.

    Args:
        variant: the sampler to slow down.
        fraction: the spin's length over the call's GPU time (``0.26``: 26 % slower).
        measure: the unplanted GPU seconds of ``variant(batch)``; a `ColdCallMedian` unless given.
        spin: enqueues GPU work of the given seconds on the current stream; a `timing.GpuSpin`
            unless given.

    Raises:
        ValueError: naming ``fraction``, unless it is finite and positive.
    """

    def __init__(
        self,
        variant: Variant,
        fraction: float,
        measure: Callable[[Variant, SpecBatch], float] | None = None,
        spin: Callable[[float], None] | None = None,
    ) -> None:
        if not (math.isfinite(fraction) and fraction > 0):
            raise ValueError(f"fraction is {fraction}; expected a finite number > 0")
        super().__init__(variant)
        self.fraction = fraction
        self.measure = ColdCallMedian() if measure is None else measure
        self.spin = GpuSpin() if spin is None else spin
        # Unplanted GPU seconds by id of a live batch: an entry goes when its batch is freed, before
        # another object can take its id.
        self.unplanted_seconds: dict[int, float] = {}

    def unplanted(self, batch: SpecBatch) -> float:
        """The unplanted call's GPU seconds on ``batch``, measured on the first call with it."""
        key = id(batch)
        if key not in self.unplanted_seconds:
            self.unplanted_seconds[key] = self.measure(self.variant, batch)
            weakref.finalize(batch, self.unplanted_seconds.pop, key, None)
        return self.unplanted_seconds[key]

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Run the wrapped variant, then spin the GPU for ``fraction`` of its unplanted time on ``batch``."""
        planted = self.fraction * self.unplanted(batch)
        output = self.variant(batch)
        self.spin(planted)
        return output


def _listed(variable: str) -> list[str]:
    """The comma-separated entries of environment variable ``variable``, stripped, empty ones left out."""
    return [entry.strip() for entry in os.environ.get(variable, "").split(",") if entry.strip()]


def planted_fractions() -> dict[str, float]:
    """The fraction ``SPECSAMPLE_BENCH_PLANTED`` plants on each variant it names (``NAME=FRACTION``).

    Raises:
        ValueError: naming the variable and the entry that is not ``NAME=FRACTION`` with a finite
            positive fraction.
    """
    fractions: dict[str, float] = {}
    for entry in _listed(PLANTED_ENV):
        name, equals, value = entry.rpartition("=")
        try:
            fraction = float(value)
        except ValueError:
            fraction = math.nan
        if not (equals and name.strip() and math.isfinite(fraction) and fraction > 0):
            raise ValueError(
                f"{PLANTED_ENV} has entry {entry!r}; expected NAME=FRACTION with a finite fraction > 0"
            )
        fractions[name.strip()] = fraction
    return fractions


def with_planted_slowdown(name: str, variant: Variant) -> Variant:
    """``variant`` (registered as ``name``) wrapped in `ExtraLogitPass` if ``SPECSAMPLE_BENCH_EXTRA_PASS``
    lists ``name``, then in `ProportionalSlowdown` if ``SPECSAMPLE_BENCH_PLANTED`` gives it a fraction.

    Raises:
        ValueError: if ``SPECSAMPLE_BENCH_PLANTED`` is malformed (`planted_fractions`).
    """
    if name in _listed(EXTRA_PASS_ENV):
        variant = ExtraLogitPass(variant)
    fraction = planted_fractions().get(name)
    if fraction is not None:
        variant = ProportionalSlowdown(variant, fraction)
    return variant
