"""The harness self-test: every planted mutant dies, every correct variant survives the same campaign.

Mutants run blind: they are presented as foreign variants (``streams = None``), so the
coupled check is off and the invariants and statistical checks must do the killing on their own.
Each campaign is the targeted cases plus a fixed number of Hypothesis rounds, so mutants and correct
variants face the same cases.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from specsample.fuzz.campaign import run_campaign
from specsample.fuzz.mutants import MUTANTS
from specsample.fuzz.progress import Progress
from specsample.reference.contract import SpecBatch, SpecOutput, Variant, capabilities


class Blind:
    """A variant presented as foreign: the same sampler with ``streams = None``."""

    streams = None

    def __init__(self, inner: Variant) -> None:
        self.inner = inner
        self.name = inner.name
        self.capabilities = capabilities(inner)

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample with the wrapped variant."""
        return self.inner(batch)


@dataclass(frozen=True)
class SelfTestRecord:
    """One mutant's (or correct variant's) outcome: killed or not, by which check, at what cost."""

    id: str
    killed: bool
    check: str | None
    expected: tuple[str, ...]
    samples: int
    seconds: float
    found_after: float | None
    batches: int
    case: str | None
    message: str

    def to_json(self) -> dict[str, object]:
        """JSON-ready record: ``id``, ``killed``, ``check``, ``samples``, ``seconds`` and context."""
        found_after = None if self.found_after is None else round(self.found_after, 2)
        rounded = {
            "expected": list(self.expected),
            "seconds": round(self.seconds, 2),
            "found_after": found_after,
        }
        return {**asdict(self), **rounded}


def run_variant(
    spec: str,
    variant: Variant,
    expected: tuple[str, ...],
    *,
    profile: str,
    rounds: int,
    device: str,
    progress: bool,
    num_samples: int | None = None,
    targeted: bool = True,
    seconds: float | None = None,
    seed: int = 0,
) -> SelfTestRecord:
    """Run the self-test campaign on one variant and record the outcome.

    With ``seconds`` the campaign searches for that long (``rounds`` ignored); otherwise it runs
    the targeted cases and ``rounds`` search rounds, whatever they take.
    """
    start = time.monotonic()
    result = run_campaign(
        variant,
        spec,
        profile=profile,
        seconds=float("inf") if seconds is None else seconds,
        rounds=rounds if seconds is None else None,
        num_samples=num_samples,
        seed=seed,
        targeted=targeted,
        shrink=False,
        device=device,
        progress=progress,
    )
    failure = result.failure
    return SelfTestRecord(
        id=spec,
        killed=failure is not None,
        check=None if failure is None else failure.check,
        expected=expected,
        samples=result.samples,
        seconds=time.monotonic() - start,
        case=result.case,
        message="survived" if failure is None else failure.message,
        found_after=result.found_after,
        batches=result.screened,
    )


def run_mutants(
    ids: list[str] | None = None,
    *,
    profile: str = "ci",
    rounds: int = 1,
    device: str = "cpu",
    progress: bool = True,
    targeted: bool = True,
    seconds: float | None = None,
    seed: int = 0,
) -> list[SelfTestRecord]:
    """Run the blind campaign on each mutant (default: every CPU mutant).

    ``targeted=False`` with ``seconds`` is the search-only self-test: each mutant faces the
    Hypothesis search alone for at most ``seconds``, and its record says when it died.
    """
    chosen = [MUTANTS[i] for i in (ids or [m for m in MUTANTS if not MUTANTS[m].gpu_only])]
    records: list[SelfTestRecord] = []
    with Progress(f"mutants, profile {profile}", len(chosen), "mutants", enabled=progress) as bar:
        for mutant in chosen:
            record = run_variant(
                mutant.id,
                Blind(mutant.load()),
                mutant.expected,
                profile=profile,
                rounds=rounds,
                device=device,
                progress=False,
                targeted=targeted,
                seconds=seconds,
                seed=seed,
            )
            records.append(record)
            verdict = f"killed by {record.check}" if record.killed else "SURVIVED"
            bar.update(last=f"{mutant.id} {verdict}", survived=sum(not r.killed for r in records))
    return records


def table(records: list[SelfTestRecord]) -> str:
    """A Markdown table: mutant, killing check, expected checks, samples, seconds (and, for a
    search-only run, the batches searched and the seconds until the kill)."""
    search = any(r.found_after is not None or r.batches for r in records)
    head = "| mutant | bug | killed by | expected | samples | seconds |"
    rule = "|---|---|---|---|---|---|"
    if search:
        head, rule = head + " batches | killed after s |", rule + "---|---|"
    lines = [head, rule]
    for r in records:
        bug = MUTANTS[r.id].bug if r.id in MUTANTS else ""
        killer = r.check if r.killed else "**survived**"
        line = f"| {r.id} | {bug} | {killer} | {', '.join(r.expected)} | {r.samples} | {r.seconds:.1f} |"
        if search:
            after = "-" if r.found_after is None else f"{r.found_after:.1f}"
            line += f" {r.batches} | {after} |"
        lines.append(line)
    return "\n".join(lines)
