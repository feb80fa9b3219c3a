"""The harness self-test: every planted mutant dies, every correct variant survives the same campaign.

Mutants run blind: they are presented as foreign variants (``streams = None``), so the
coupled check is off and the invariants and statistical checks must do the killing on their own.
Each campaign is the targeted cases plus a fixed number of Hypothesis rounds, so mutants and correct
variants face the same cases.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

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
    case: str | None
    message: str

    def to_json(self) -> dict[str, object]:
        """JSON-ready record: ``id``, ``killed``, ``check``, ``samples``, ``seconds`` and context."""
        return {
            "id": self.id,
            "killed": self.killed,
            "check": self.check,
            "expected": list(self.expected),
            "samples": self.samples,
            "seconds": round(self.seconds, 2),
            "case": self.case,
            "message": self.message,
        }


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
) -> SelfTestRecord:
    """Run the self-test campaign on one variant and record the outcome."""
    start = time.monotonic()
    result = run_campaign(
        variant,
        spec,
        profile=profile,
        seconds=float("inf"),
        rounds=rounds,
        num_samples=num_samples,
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
    )


def run_mutants(
    ids: list[str] | None = None,
    *,
    profile: str = "ci",
    rounds: int = 1,
    device: str = "cpu",
    progress: bool = True,
) -> list[SelfTestRecord]:
    """Run the blind campaign on each mutant (default: every CPU mutant)."""
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
            )
            records.append(record)
            verdict = f"killed by {record.check}" if record.killed else "SURVIVED"
            bar.update(last=f"{mutant.id} {verdict}", survived=sum(not r.killed for r in records))
    return records


def table(records: list[SelfTestRecord]) -> str:
    """A Markdown table: mutant, killing check, expected checks, samples needed, seconds."""
    lines = ["| mutant | bug | killed by | expected | samples | seconds |", "|---|---|---|---|---|---|"]
    for r in records:
        bug = MUTANTS[r.id].bug if r.id in MUTANTS else ""
        killer = r.check if r.killed else "**survived**"
        lines.append(
            f"| {r.id} | {bug} | {killer} | {', '.join(r.expected)} | {r.samples} | {r.seconds:.1f} |"
        )
    return "\n".join(lines)
