"""What a fuzz campaign's batches covered, and what they did not.

The search draws batches from `properties.strategies.spec_batches`, which describes each batch it
draws (method, vocabulary size, dtype, draft layout, requests, and per request its family,
temperature and draft count). `Coverage` counts those descriptions in buckets and names the buckets
the campaign never reached, so a clean campaign says what it did not look at.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specsample.properties.profiles import Profile
from specsample.properties.strategies import (
    DEGENERATE_ROWS,
    DRAFT_KINDS,
    DTYPES,
    FAMILIES,
    FILTER_MIXES,
    TREE_SHAPES,
)
from specsample.reference.contract import METHODS, Capabilities
from specsample.reference.filters import FILTERS

# Temperature buckets: greedy, tiny (logits / T overflows float32), cold, about 1, hot, huge.
TEMPERATURE_BUCKETS = ("greedy", "tiny", "cold", "about 1", "hot", "huge")


def temperature_bucket(t: float) -> str:
    """The bucket of a temperature."""
    if not t > 0:
        return "greedy"
    if t < 1e-6:
        return "tiny"
    if t < 0.5:
        return "cold"
    if t <= 2.0:
        return "about 1"
    return "hot" if t <= 100.0 else "huge"


def _ranges(bounds: Sequence[int], most: int) -> list[tuple[int, int]]:
    """Consecutive ranges ``[lo, hi]`` split at ``bounds``, up to ``most``."""
    out, lo = [], bounds[0]
    for hi in [*bounds[1:], most + 1]:
        if lo <= most:
            out.append((lo, min(hi - 1, most)))
        lo = hi
    return out


def _label(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _bucket(value: int, ranges: Sequence[tuple[int, int]]) -> str:
    for lo, hi in ranges:
        if lo <= value <= hi:
            return _label(lo, hi)
    return f">{ranges[-1][1]}" if ranges else str(value)


@dataclass
class Coverage:
    """Counts of the drawn batches in buckets per dimension, against the buckets that were possible:
    built by `Coverage.of` for a profile and a sampler's capabilities, fed each batch by `observe`."""

    possible: dict[str, list[str]]
    bucketers: dict[str, Callable[[Any], str]] = field(repr=False)
    counts: dict[str, Counter[str]] = field(default_factory=dict)
    batches: int = 0

    @classmethod
    def of(cls, profile: Profile, caps: Capabilities, methods: Sequence[str] = METHODS) -> Coverage:
        """The coverage table of a campaign over ``profile``'s sizes inside ``caps``."""
        sizes = profile.sizes
        most = min(sizes.max_vocab, caps.max_vocab)
        vocab = _ranges([1, 2, 17, 257, 4097, 65537], most)
        requests = _ranges([1, 2, 5, 17, 65], sizes.max_requests)
        drafts = _ranges([0, 1, 2, 5, 9], sizes.max_drafts)
        edges = sorted({b + d for b in sizes.block_sizes for d in (-1, 0, 1) if b + d <= most})
        possible = {
            "methods": [m for m in methods if m in caps.methods],
            "families": list(FAMILIES),
            "vocabulary": [_label(lo, hi) for lo, hi in vocab],
            "vocabulary at a block edge": [str(e) for e in edges],
            "requests per batch": [_label(lo, hi) for lo, hi in requests],
            "drafts per request": [_label(lo, hi) for lo, hi in drafts],
            "temperatures": list(TEMPERATURE_BUCKETS),
            "dtypes": [str(d).removeprefix("torch.") for d in DTYPES if d in caps.dtypes],
            "draft layouts": [k for k in DRAFT_KINDS if k in caps.draft_kinds],
            "placeholders": ["none", "some"],
        }
        if "flat" in caps.draft_kinds or "slotted" in caps.draft_kinds:  # degenerate rows need draft logits
            possible["degenerate draft rows"] = ["none", *DEGENERATE_ROWS]
        if any(name in caps.filters for name in FILTERS):
            possible["sampling parameters"] = list(FILTER_MIXES)
        if "tree" in possible["methods"]:
            possible["tree shapes"] = list(TREE_SHAPES)
        bucketers: dict[str, Callable[[Any], str]] = {
            "vocabulary": lambda v: _bucket(v, vocab),
            "vocabulary at a block edge": str,
            "requests per batch": lambda v: _bucket(v, requests),
            "drafts per request": lambda v: _bucket(v, drafts),
            "temperatures": temperature_bucket,
        }
        return cls(possible, bucketers)

    def observe(self, description: Mapping[str, Any]) -> None:
        """Count one batch, described as `properties.strategies.spec_batches` describes it."""
        self.batches += 1
        requests = description["requests"]
        values: dict[str, Iterable[Any]] = {
            "methods": [description["method"]],
            "families": [r["family"] for r in requests],
            "vocabulary": [description["vocab_size"]],
            "vocabulary at a block edge": [description["vocab_size"]],
            "requests per batch": [len(requests)],
            "drafts per request": [r["num_drafts"] for r in requests],
            "temperatures": [r["temperature"] for r in requests],
            "dtypes": [description["dtype"]],
            "draft layouts": [description["layout"]],
            "placeholders": ["some" if description["placeholders"] else "none"],
            "degenerate draft rows": [r.get("degenerate rows", "none") for r in requests],
            "sampling parameters": [r.get("filters", "off") for r in requests],
            "tree shapes": [r["tree"] for r in requests if r.get("tree") is not None],
        }
        for dimension, items in values.items():
            if dimension not in self.possible:
                continue
            bucket = self.bucketers.get(dimension, str)
            counter = self.counts.setdefault(dimension, Counter())
            for item in items:
                label = bucket(item)
                if dimension != "vocabulary at a block edge" or label in self.possible[dimension]:
                    counter[label] += 1

    def missing(self) -> dict[str, list[str]]:
        """The possible buckets no batch reached, per dimension (dimensions with none left out)."""
        seen = {dimension: self.counts.get(dimension, Counter()) for dimension in self.possible}
        absent = {d: [label for label in labels if not seen[d][label]] for d, labels in self.possible.items()}
        return {dimension: labels for dimension, labels in absent.items() if labels}

    def lines(self) -> list[str]:
        """The coverage as text: one line per dimension with the counts, then what was not covered."""
        out = [f"Coverage of {self.batches} searched batches (counts per batch, or per request):"]
        for dimension, labels in self.possible.items():
            seen = self.counts.get(dimension, Counter())
            parts = [f"{label} {seen[label]}" for label in labels if seen[label]]
            out.append(f"  {dimension}: " + (", ".join(parts) or "none"))
        missing = self.missing()
        if missing:
            out.append(
                "Not covered: " + "; ".join(f"{d}: {', '.join(labels)}" for d, labels in missing.items())
            )
        else:
            out.append("Not covered: nothing; every bucket was reached")
        return out

    def summary(self) -> dict[str, Any]:
        """JSON-ready: the counts per dimension and the buckets not covered."""
        return {
            "batches": self.batches,
            "counts": {d: dict(self.counts.get(d, Counter())) for d in self.possible},
            "not_covered": self.missing(),
        }
