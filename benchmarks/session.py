"""State the benchmarks of one pytest session share: device, ceilings, timer, inputs and variants."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
import torch

from specsample.benchmarks.grid import Case, make_inputs, specialise
from specsample.benchmarks.planted import with_planted_slowdown
from specsample.benchmarks.timing import Ceilings, ColdCallTimer, measure_ceilings
from specsample.kernels import registry
from specsample.reference.contract import SpecBatch, Variant


@dataclasses.dataclass
class BenchSession:
    """What the benchmarks of one session share. Inputs for one ``(dtype, batch, drafts, vocab, layout)``
    are built once and kept until a case needs other logits, so the variants of a case, and the methods
    and temperatures that share its logits, run on the same tensors."""

    device: torch.device
    grid: str
    _inputs: tuple[tuple[Any, ...], SpecBatch] | None = None  # (key, batch) of the last case
    _variants: dict[str, Variant] = dataclasses.field(default_factory=dict)

    @functools.cached_property
    def ceilings(self) -> Ceilings:
        """The copy and read bandwidths of this GPU, measured on first use."""
        return measure_ceilings(self.device)

    @property
    def measured_ceilings(self) -> Ceilings | None:
        """The ceilings if a benchmark has measured them, else ``None`` (never measures)."""
        return self.__dict__.get("ceilings")

    @functools.cached_property
    def timer(self) -> ColdCallTimer:
        """The cold-L2 call timer (it holds the flush buffer)."""
        return ColdCallTimer(self.device)

    def variant(self, name: str) -> Variant:
        """The registered variant ``name`` (with the planted slowdown if asked for), or a skip."""
        if name not in self._variants:
            if name not in registry.names():
                pytest.skip(f"variant {name!r} is not registered (registered: {registry.names()})")
            self._variants[name] = with_planted_slowdown(name, registry.get(name))
        return self._variants[name]

    def inputs(self, case: Case) -> SpecBatch:
        """The batch of ``case``, sharing logits with the previous case when they agree."""
        key = (case.dtype, case.batch, case.num_drafts, case.vocab, case.layout)
        if self._inputs is None or self._inputs[0] != key:
            self._inputs = None  # frees the previous logits before the next are allocated
            self._inputs = (key, make_inputs(case, self.device))
        return specialise(self._inputs[1], case)
