"""State the benchmarks of one pytest session share: device, ceilings, timer, inputs and variants."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from specsample.benchmarks.grid import Case, make_inputs, specialise
from specsample.benchmarks.planted import with_planted_slowdown
from specsample.benchmarks.timing import Ceilings, ColdCallTimer, measure_ceilings
from specsample.properties.variant_spec import SpecError, load_variant
from specsample.reference.contract import SpecBatch, Variant, capabilities


def load_variants(specs: str) -> dict[str, Variant]:
    """The variants of ``--bench-variants`` by name, each wrapped in the planted slowdown where
    ``SPECSAMPLE_BENCH_EXTRA_PASS`` or ``SPECSAMPLE_BENCH_PLANTED`` names it (`planted`).

    Args:
        specs: comma-separated variant specs, as ``fuzz --variant`` takes them: registered names
            (``triton``, ``torch``), ``package.module:NAME`` or ``path/to/file.py:NAME``.

    Raises:
        SpecError: naming the spec that does not resolve, whose ``capabilities`` are not
            `Capabilities`, or that shares its name with another spec's variant.
        ValueError: naming ``SPECSAMPLE_BENCH_PLANTED`` and its entry, if one is malformed.
    """
    variants: dict[str, Variant] = {}
    for spec in (entry.strip() for entry in specs.split(",")):
        if not spec:
            continue
        variant = load_variant(spec)
        try:
            capabilities(variant)
        except ValueError as error:
            raise SpecError(f"variant spec {spec!r}: {error}") from error
        if variant.name in variants:
            raise SpecError(f"variant spec {spec!r} names a second variant called {variant.name!r}")
        variants[variant.name] = with_planted_slowdown(variant.name, variant)
    return variants


@dataclasses.dataclass
class BenchSession:
    """What the benchmarks of one session share. Inputs for one ``(dtype, batch, drafts, vocab, layout)``
    are built once and kept until a case needs other logits, so the variants of a case, and the methods
    and temperatures that share its logits, run on the same tensors. ``variants`` are the variants
    timed, by name (``--bench-variants``, with the planted slowdown where it is asked for)."""

    device: torch.device
    grid: str
    variants: dict[str, Variant] = dataclasses.field(default_factory=dict)
    _inputs: tuple[tuple[Any, ...], SpecBatch] | None = None  # (key, batch) of the last case

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
        """The variant timed under ``name``."""
        return self.variants[name]

    def inputs(self, case: Case) -> SpecBatch:
        """The batch of ``case``, sharing logits with the previous case when they agree."""
        key = (case.dtype, case.batch, case.num_drafts, case.vocab, case.layout, case.depth)
        if self._inputs is None or self._inputs[0] != key:
            self._inputs = None  # frees the previous logits before the next are allocated
            self._inputs = (key, make_inputs(case, self.device))
        return specialise(self._inputs[1], case)
