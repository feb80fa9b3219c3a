"""Certify variants: the property checks on the targeted cases, a short fuzz campaign, and the self-test.

The report gives, per variant and check: the verdict, the smallest p-value seen, the weakest
guarantee (the largest deviation that is still certain to be detected with power 0.999), samples
and time; then the campaign and the mutant self-test. It is printed and written as Markdown (fit for
a PR comment) and JSON.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fuzz.campaign import CampaignResult, affordable_samples, on_device, run_campaign, say
from fuzz.reproducer import versions
from fuzz.selftest import SelfTestRecord, run_mutants, table
from fuzz.spec import load_variant
from fuzz.targeted import targeted_batches
from properties import profiles
from properties.checks import CHECKS, Verdict, run_checks

DEFAULT_VARIANTS = ("reference", "triton", "torch")


@dataclass(frozen=True)
class CheckSummary:
    """One check's verdicts on one variant, over every certification case."""

    check: str
    passed: bool
    cases: int
    min_pvalue: float | None
    detectable: float | None
    samples: int
    seconds: float
    message: str


def summarise(verdicts: list[Verdict]) -> list[CheckSummary]:
    """Fold verdicts per check, in the order of `CHECKS`."""
    summaries = []
    for check in CHECKS:
        mine = [v for v in verdicts if v.check == check]
        if not mine:
            continue
        pvalues = [v.pvalue for v in mine if v.pvalue is not None]
        detectable = [v.detectable.value for v in mine if v.detectable is not None]
        failed = [v for v in mine if not v.passed]
        summaries.append(
            CheckSummary(
                check=check,
                passed=not failed,
                cases=len(mine),
                min_pvalue=min(pvalues) if pvalues else None,
                detectable=max(detectable) if detectable else None,
                samples=sum(v.num_samples for v in mine),
                seconds=sum(v.seconds for v in mine),
                message=(failed[0] if failed else mine[0]).message,
            )
        )
    return summaries


@dataclass
class VariantReport:
    """Everything certify found for one variant."""

    spec: str
    num_samples: int
    checks: list[CheckSummary]
    campaign: CampaignResult

    @property
    def passed(self) -> bool:
        """Whether every check and the campaign passed."""
        return all(c.passed for c in self.checks) and self.campaign.passed


def certify_variant(
    spec: str, *, profile: str, campaign_seconds: float, check_seconds: float, device: str, progress: bool
) -> VariantReport:
    """The checks on every targeted case, then a short campaign.

    A sampler too slow for the profile's trial count in ``check_seconds`` (a Triton kernel under the
    CPU interpreter) gets fewer trials; the report's detectable deviations say what that costs.
    """
    variant = load_variant(spec)
    budget = profiles.get(profile)
    batches = targeted_batches()
    num_samples = affordable_samples(
        variant, [b for _, b in batches], budget.num_samples, check_seconds, device
    )
    verdicts: list[Verdict] = []
    for index, (name, batch) in enumerate(batches):
        if progress:
            say(f"[certify {spec}] checks on targeted case '{name}' ({num_samples} trials per request)")
        verdicts.extend(
            run_checks(
                variant, on_device(batch, device), num_samples=num_samples, alpha=budget.alpha, seed=index
            )
        )
    campaign = run_campaign(
        variant,
        spec,
        profile=profile,
        seconds=campaign_seconds,
        targeted=False,
        num_samples=num_samples,
        device=device,
        progress=progress,
    )
    return VariantReport(spec=spec, num_samples=num_samples, checks=summarise(verdicts), campaign=campaign)


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def markdown(
    reports: list[VariantReport], mutants: list[SelfTestRecord], profile: str, seconds: float
) -> str:
    """The report as Markdown."""
    budget = profiles.get(profile)
    ok = all(r.passed for r in reports) and all(m.killed for m in mutants)
    lines = [
        f"# Certification: {'PASSED' if ok else 'FAILED'}",
        "",
        f"Profile `{profile}`: {budget.num_samples} samples per check and case, alpha {budget.alpha:g} per "
        f"assertion; detectable = the smallest deviation (total variation for token laws, absolute for "
        f"acceptance rates) detected with power 0.999. Total time {seconds:.0f} s.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()),
        "",
    ]
    for report in reports:
        lines += [
            f"## `{report.spec}`: {'passed' if report.passed else 'FAILED'}",
            "",
            f"{report.num_samples} trials per request and case.",
            "",
            "| check | verdict | cases | min p-value | detectable | samples | seconds |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in report.checks:
            lines.append(
                f"| {c.check} | {'pass' if c.passed else '**FAIL**'} | {c.cases} | {_fmt(c.min_pvalue)} | "
                f"{_fmt(c.detectable, '.4f')} | {c.samples} | {c.seconds:.1f} |"
            )
        campaign = report.campaign
        lines += [
            "",
            f"Fuzz campaign: {'passed' if campaign.passed else 'FAILED'}, {campaign.cases} cases, "
            f"{campaign.checks_passed} checks passed, {campaign.samples} samples, "
            f"{campaign.seconds:.0f} s.",
        ]
        failed = [c for c in report.checks if not c.passed]
        if failed:
            lines.append(f"First failure: {failed[0].message}")
        if campaign.failure is not None:
            lines.append(
                f"Campaign failure: {campaign.failure.message}"
                + (f" (reproducer: `{campaign.reproducer}`)" if campaign.reproducer else "")
            )
        lines.append("")
    if mutants:
        killed = sum(m.killed for m in mutants)
        lines += [f"## Planted-bug self-test: {killed}/{len(mutants)} mutants killed", "", table(mutants), ""]
    return "\n".join(lines)


def certify(
    specs: list[str],
    *,
    profile: str,
    campaign_seconds: float,
    check_seconds: float,
    mutants: bool,
    out: Path,
    device: str,
    progress: bool = True,
) -> bool:
    """Certify ``specs``, print the report, write ``report.md`` and ``report.json`` under ``out``."""
    start = time.monotonic()
    reports = [
        certify_variant(
            spec,
            profile=profile,
            campaign_seconds=campaign_seconds,
            check_seconds=check_seconds,
            device=device,
            progress=progress,
        )
        for spec in specs
    ]
    records = run_mutants(profile=profile, device=device, progress=progress) if mutants else []
    seconds = time.monotonic() - start
    text = markdown(reports, records, profile, seconds)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text + "\n")
    data = {
        "passed": all(r.passed for r in reports) and all(m.killed for m in records),
        "profile": profile,
        "seconds": round(seconds, 1),
        "versions": versions(),
        "variants": [
            {
                "spec": r.spec,
                "num_samples": r.num_samples,
                "passed": r.passed,
                "checks": [asdict(c) for c in r.checks],
                "campaign": r.campaign.summary(),
            }
            for r in reports
        ],
        "mutants": [m.to_json() for m in records],
    }
    (out / "report.json").write_text(json.dumps(data, indent=1) + "\n")
    print(text)
    print(f"Report written to {out / 'report.md'} and {out / 'report.json'}")
    return bool(data["passed"])
