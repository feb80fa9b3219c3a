"""Poisoned allocations: what a sampler reads before it writes shows, instead of the allocator's luck.

Every variant call the checks make runs inside `poisoned`: ``torch.empty``, ``torch.empty_like``,
``torch.empty_strided`` and ``Tensor.new_empty`` return memory filled with a poison pattern (an
integer far outside any vocabulary, NaN, True). Output padding never written, or an accumulator
never zeroed, then holds the poison, reproducibly, where a quiet machine's allocator would often
have handed back a lucky ``-1`` or zero. The determinism check makes its second call with the other
pattern (`poison_pattern`), so such a read also shows as a difference between the two calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

# Two poison patterns per kind of dtype: an integer far outside any vocabulary, then a plausible
# token id; NaN, then an ordinary probability; True, then False.
POISON: tuple[dict[str, Any], dict[str, Any]] = (
    {"int": 0x5A5A5A5A, "float": float("nan"), "bool": True},
    {"int": 7, "float": 0.5, "bool": False},
)
_ALLOCATORS = ((torch, "empty"), (torch, "empty_like"), (torch, "empty_strided"), (torch.Tensor, "new_empty"))


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


# The pattern every variant call is poisoned with (`poison_pattern` changes it for a block).
_PATTERN = [0]


@contextlib.contextmanager
def poison_pattern(which: int) -> Iterator[None]:
    """Variant calls inside the block are poisoned with `POISON[which]` instead of pattern 0."""
    previous, _PATTERN[0] = _PATTERN[0], which
    try:
        yield
    finally:
        _PATTERN[0] = previous


def active_pattern() -> int:
    """The pattern variant calls are poisoned with now."""
    return _PATTERN[0]


@contextlib.contextmanager
def poisoned(which: int) -> Iterator[None]:
    """Within the block, memory from ``torch.empty`` and its kin comes filled with `POISON[which]`."""
    pattern = POISON[which]
    originals = [getattr(owner, name) for owner, name in _ALLOCATORS]

    def wrap(allocate: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def poisoned_allocate(*args: Any, **kwargs: Any) -> torch.Tensor:
            return _fill(allocate(*args, **kwargs), pattern)

        return poisoned_allocate

    try:
        for (owner, name), allocate in zip(_ALLOCATORS, originals, strict=True):
            setattr(owner, name, wrap(allocate))
        yield
    finally:
        for (owner, name), allocate in zip(_ALLOCATORS, originals, strict=True):
            setattr(owner, name, allocate)
