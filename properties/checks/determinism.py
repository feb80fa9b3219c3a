"""Determinism: the same batch (a few trials of every request) gives the same output twice.

The two calls run with ``torch.empty`` (and ``empty_like``, ``empty_strided``, ``Tensor.new_empty``)
poisoned with two different patterns, so an output or workspace that a sampler reads before writing
(an accumulator never zeroed, padding never written) differs between them instead of holding
whatever the allocator happened to leave, which on a quiet machine is often the right value.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from specsample.properties.checks.base import (
    Check,
    Settings,
    Trials,
    Verdict,
    call_variant,
    differing_rows,
    exact_verdict,
    invariance_subject,
)
from specsample.reference.contract import SpecBatch, Variant


class Determinism(Check):
    """Two calls on the same batch give the same tokens, counts and logprobs. No statistics."""

    name = "determinism"
    counts_trials = False
    shares_trials = False

    def __init__(self, max_elements: int | None = None) -> None:
        self.max_elements = max_elements

    def verdict(
        self, variant: Variant, batch: SpecBatch, settings: Settings, trials: Trials | None
    ) -> Verdict:
        """No statistics: ``alpha`` and ``trials`` are unused."""
        subject, per_request = invariance_subject(batch, settings.num_samples, settings.seed)
        with poisoned(0):
            first, _ = call_variant(variant, subject, self.max_elements)
        with poisoned(1):
            second, _ = call_variant(variant, subject, self.max_elements)
        rows = np.arange(subject.num_requests)
        differ = differing_rows(first, second, rows, rows)
        r = differ[0] if differ else 0
        outputs = f"{first.token_ids[r].tolist()}, then {second.token_ids[r].tolist()}"
        return exact_verdict(
            self.name,
            variant,
            failures=len(differ),
            total=subject.num_requests,
            passed=f"{subject.num_requests} requests give the same output twice",
            failed=f"{len(differ)} of {subject.num_requests} requests change between two calls; first: "
            f"request {r // per_request} emits {outputs}",
            request=r // per_request,
        )


# Two poison patterns per kind of dtype: an integer far outside any vocabulary, then a plausible
# token id; NaN, then an ordinary probability; True, then False.
POISON: tuple[dict[str, Any], dict[str, Any]] = (
    {"int": 0x5A5A5A5A, "float": float("nan"), "bool": True},
    {"int": 7, "float": 0.5, "bool": False},
)
_ALLOCATORS = ("empty", "empty_like", "empty_strided")


def _fill(tensor: torch.Tensor, pattern: dict[str, Any]) -> torch.Tensor:
    if tensor.dtype == torch.bool:
        value = pattern["bool"]
    elif tensor.is_floating_point() or tensor.is_complex():
        value = pattern["float"]
    else:
        info = torch.iinfo(tensor.dtype)
        value = min(max(pattern["int"], info.min), info.max)
    with torch.no_grad():
        return tensor.fill_(value)


@contextlib.contextmanager
def poisoned(which: int) -> Iterator[None]:
    """Within the block, memory from ``torch.empty`` and its kin comes filled with `POISON[which]`."""
    pattern = POISON[which]
    originals: dict[str, Callable[..., torch.Tensor]] = {name: getattr(torch, name) for name in _ALLOCATORS}
    new_empty = torch.Tensor.new_empty

    def wrap(allocate: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def poisoned_allocate(*args: Any, **kwargs: Any) -> torch.Tensor:
            return _fill(allocate(*args, **kwargs), pattern)

        return poisoned_allocate

    try:
        for name, allocate in originals.items():
            setattr(torch, name, wrap(allocate))
        torch.Tensor.new_empty = wrap(new_empty)  # type: ignore[method-assign]
        yield
    finally:
        for name, allocate in originals.items():
            setattr(torch, name, allocate)
        torch.Tensor.new_empty = new_empty  # type: ignore[method-assign]


CHECK = Determinism()
