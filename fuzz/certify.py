"""Certify variants: the property checks on the targeted cases, a short fuzz campaign, and the self-test.

Every verdict is one of three: pass (the check ran with the profile's power), fail (with the
failing case), or inconclusive (it saw nothing wrong, but ran fewer trials than the profile's power
needs, or could detect nothing). A variant is PASSED only when every check that applies to it
passed; INCONCLUSIVE says what it would need. The report gives, per variant and check: the
verdict, the trials per request it actually ran, the smallest p-value seen, the weakest guarantee
(the largest deviation still detected with power 0.999), samples and time; what the variant's
declared capabilities left unchecked; then the campaign and the mutant self-test. It is printed and
written as Markdown (fit for a PR comment) and JSON.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specsample.fuzz.budget import Throughput, affordable_samples
from specsample.fuzz.campaign import CampaignResult, run_campaign
from specsample.fuzz.command import replay
from specsample.fuzz.mutants import MUTANTS
from specsample.fuzz.progress import Progress
from specsample.fuzz.reproducer import versions
from specsample.fuzz.selftest import SelfTestRecord, run_mutants, table
from specsample.fuzz.spec import load_variant
from specsample.fuzz.targeted import targeted_cases
from specsample.properties import profiles
from specsample.properties.batching import on_device
from specsample.properties.checks import CHECKS, Verdict, run_checks
from specsample.reference.contract import METHODS, capabilities

DEFAULT_VARIANTS = ("reference", "triton", "torch")


@dataclass(frozen=True)
class CheckSummary:
    """One check's verdicts on one variant, over every certification case."""

    check: str
    status: str
    cases: int
    trials: int | None
    min_pvalue: float | None
    detectable: float | None
    unit: str | None
    samples: int
    seconds: float
    message: str


def _status(statuses: list[str]) -> str:
    """``fail`` if any failed, else ``interrupted`` if any was, else ``inconclusive`` if any was, else
    ``pass``."""
    for status in ("fail", "interrupted", "inconclusive"):
        if status in statuses:
            return status
    return "pass"


def summarise(verdicts: list[Verdict]) -> list[CheckSummary]:
    """Fold verdicts per check, in the order of `CHECKS`."""
    summaries = []
    for check in CHECKS:
        mine = [v for v in verdicts if v.check == check]
        if not mine:
            continue
        pvalues = [v.pvalue for v in mine if v.pvalue is not None]
        detectable = [v.detectable for v in mine if v.detectable is not None]
        trials = [v.trials for v in mine if v.trials is not None]
        status = _status([v.status for v in mine])
        decisive = next((v for v in mine if v.status == status), mine[0])
        summaries.append(
            CheckSummary(
                check=check,
                status=status,
                cases=len(mine),
                trials=min(trials) if trials else None,
                min_pvalue=min(pvalues) if pvalues else None,
                detectable=max(d.value for d in detectable) if detectable else None,
                unit=detectable[0].unit if detectable else None,
                samples=sum(v.num_samples for v in mine),
                seconds=sum(v.seconds for v in mine),
                message=decisive.message,
            )
        )
    return summaries


@dataclass
class VariantReport:
    """Everything certify found for one variant."""

    spec: str
    num_samples: int
    required_samples: int
    throughput: Throughput
    checks: list[CheckSummary]
    campaign: CampaignResult
    not_checked: list[str] = field(default_factory=list)
    methods: tuple[str, ...] = ()
    interrupted: str | None = None
    failure: Verdict | None = None

    @property
    def status(self) -> str:
        """``pass`` only when every applicable check passed at the profile's power: a report with no
        check at all (no method asked for that the variant implements) is inconclusive, never a pass."""
        if self.interrupted:
            return "interrupted"
        if not self.checks:
            return "inconclusive"
        return _status([c.status for c in self.checks] + [self.campaign.status])

    def needs(self) -> str:
        """What an inconclusive variant would need to be certified."""
        if not self.methods:
            return "a method it implements: none of those asked for is in its declared capabilities"
        if not self.checks:
            return "targeted cases inside its declared capabilities: none of them fits"
        seconds = self.throughput.seconds_for(self.required_samples)
        return (
            f"{self.required_samples} trials per request and case (it ran {self.num_samples}): about "
            f"{seconds:.0f} s of sampler time over the targeted cases at the measured "
            f"{self.throughput.per_trial(self.required_samples) * 1e3:.3g} ms per trial of every case; give "
            f"`--check-budget {seconds * 1.1:.0f}`, or run on a GPU"
        )


def certify_variant(
    spec: str,
    *,
    profile: str,
    campaign_seconds: float,
    check_seconds: float,
    device: str,
    methods: tuple[str, ...] | None = None,
    progress: bool = True,
) -> VariantReport:
    """The checks on every targeted case inside the variant's capabilities, then a short campaign.

    A sampler too slow for the profile's trials in ``check_seconds`` (a Triton kernel under the CPU
    interpreter with one program per row, such as the split plan) gets fewer trials, measured after
    its first call; its verdicts then say inconclusive rather than pass.
    """
    variant = load_variant(spec)
    caps = capabilities(variant)
    budget = profiles.get(profile)
    chosen = tuple(m for m in (methods or METHODS) if m in caps.methods)
    cases = targeted_cases(chosen, caps) if chosen else []
    batches = [(name, on_device(batch, device)) for name, batch, reason in cases if reason is None]
    not_checked = caps.not_checked() + [
        f"method {m} (not asked for)" for m in caps.methods if m not in chosen
    ]
    not_checked += [f"targeted case '{name}': {reason}" for name, _, reason in cases if reason is not None]
    verdicts: list[Verdict] = []
    throughput, interrupted = Throughput(0.0, 0), None
    campaign = CampaignResult(variant=spec, search_wanted=bool(chosen), budget=campaign_seconds)
    try:
        throughput = affordable_samples(
            variant, [b for _, b in batches], budget.num_samples, check_seconds, device, progress=progress
        )
        desc = f"certify {spec}: targeted cases, {throughput.trials} trials per request"
        with Progress(desc, len(batches), "cases", enabled=progress) as bar:
            for index, (name, batch) in enumerate(batches):
                interrupted = f"during the targeted case '{name}' ({index} of {len(batches)} done)"
                verdicts += run_checks(
                    variant,
                    batch,
                    num_samples=throughput.trials,
                    alpha=budget.alpha,
                    seed=index,
                    required_samples=budget.num_samples,
                )
                bar.update(case=name, failed=sum(v.failed for v in verdicts))
        interrupted = None
        if chosen:
            campaign = run_campaign(
                variant,
                spec,
                methods=chosen,
                profile=profile,
                seconds=campaign_seconds,
                targeted=False,
                num_samples=throughput.trials,
                device=device,
                progress=progress,
            )
            interrupted = (
                f"during the fuzz campaign, after {campaign.seconds:.0f} s" if campaign.interrupted else None
            )
    except KeyboardInterrupt:
        interrupted = interrupted or "while measuring its throughput"
    return VariantReport(
        spec,
        throughput.trials,
        budget.num_samples,
        throughput,
        summarise(verdicts),
        campaign,
        not_checked,
        methods=chosen,
        interrupted=interrupted,
        failure=next((v for v in verdicts if v.failed), None),
    )


def _explained(verdict: Verdict) -> list[str]:
    """A failed verdict's explanation below its message (`Verdict.explain`), as a code block."""
    lines = verdict.explain()[1:]
    return ["", "```", *lines, "```", ""] if lines else []


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


STATUS_WORDS = {
    "pass": "PASSED",
    "fail": "FAILED",
    "inconclusive": "INCONCLUSIVE",
    "interrupted": "INTERRUPTED",
}

# What every column and term of the report means; printed under the report's header.
LEGEND = (
    "How to read it. Per check: **verdict** pass (it ran with the profile's power and saw nothing "
    "wrong), fail, or inconclusive (it saw nothing wrong but ran fewer trials than the power needs, or "
    "could detect nothing); **cases** the targeted cases it ran on; **trials** the fewest trials per "
    "request it ran on a case (the profile asks the number above); **min p-value** the smallest "
    "Holm-adjusted p-value of its tests over the cases (a check fails below alpha); **detectable** the "
    "largest, over the cases, of the smallest deviation it detects with power 0.999, in **unit** (`tv`: "
    "total variation between the observed and the exact law; `abs`: an absolute shift of one "
    "probability; `rate`: the rate of violating samples an exact check sees); **samples** the sampler "
    "outputs it drew; **seconds** its wall time, sampler calls included. The fuzz campaign: **cases** "
    "the batches it screened (every check at few trials per request); **confirmation stages** the "
    "re-runs of suspicious batches on fresh trials, each at the level the campaign's false-failure "
    "budget grants it (at most alpha; the levels of all of them sum to at most the campaign's stated "
    "rate); **skipped for time** batches the time left could not check; **checks passed "
    "at full power** verdicts from a confirmation's last stage; **best discrepancy** the largest "
    "-log10 of a screen's Bonferroni-adjusted smallest p-value (under a correct sampler it exceeds s "
    "with probability at most 10^-s: 2 is common, 6 would be suspicious, a failed exact check scores "
    "300)."
)


def markdown(
    reports: list[VariantReport], mutants: list[SelfTestRecord], profile: str, seconds: float, status: str
) -> str:
    """The report as Markdown, under the overall ``status``."""
    budget = profiles.get(profile)
    lines = [
        f"# Certification: {STATUS_WORDS[status]}",
        "",
        f"Profile `{profile}`: {budget.num_samples} trials per request and case for the profile's power, "
        f"alpha {budget.alpha:g} per assertion; detectable = the smallest deviation detected with power "
        f"0.999, in its unit. A check that ran fewer trials and saw nothing wrong is inconclusive. "
        f"Total time {seconds:.0f} s.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()),
        "",
        LEGEND,
        "",
    ]
    for report in reports:
        lines += [f"## `{report.spec}`: {STATUS_WORDS[report.status]}", ""]
        if not report.methods:
            lines += [
                "Nothing checked: none of the methods asked for is in its declared capabilities "
                "(`Not checked` below), so no check and no campaign ran.",
                "",
            ]
            lines += [
                "Not checked (outside the declared capabilities): " + "; ".join(report.not_checked) + "."
            ]
            lines += [f"To certify it needs: {report.needs()}.", ""]
            continue
        lines += [
            f"{report.num_samples} trials per request and case (the profile asks {report.required_samples}; "
            f"{report.throughput.per_trial(report.num_samples) * 1e3:.3g} ms per trial of every case, "
            "measured after the first call).",
            "",
            "| check | verdict | cases | trials | min p-value | detectable | unit | samples | seconds |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for c in report.checks:
            verdict = c.status if c.status == "pass" else f"**{c.status.upper()}**"
            lines.append(
                f"| {c.check} | {verdict} | {c.cases} | {_fmt(c.trials, 'd')} | {_fmt(c.min_pvalue)} | "
                f"{_fmt(c.detectable, '.4f')} | {c.unit or '-'} | {c.samples} | {c.seconds:.1f} |"
            )
        if not report.checks:
            lines.append("| (none) | - | 0 | - | - | - | - | 0 | 0.0 |")
        campaign = report.campaign
        word = STATUS_WORDS[campaign.status]
        if campaign.status == "pass" and not campaign.checks_passed:
            word += " (screens only: no failure found, no check ran at the profile's power)"
        lines += ["", f"Fuzz campaign: {word}, {campaign.describe()}."]
        lines += [f"Campaign inconclusive: {reason}." for reason in campaign.inconclusive_reasons()]
        if campaign.overrun():
            lines.append(f"Campaign over budget: {campaign.overrun()}.")
        if report.interrupted:
            lines.append(f"Interrupted {report.interrupted}: the table holds the cases that finished.")
        if report.not_checked:
            lines.append(
                "Not checked (outside the declared capabilities): " + "; ".join(report.not_checked) + "."
            )
        if report.failure is not None:
            lines += [f"First failure: {report.failure.message}", *_explained(report.failure)]
        if campaign.failure is not None:
            lines.append(
                f"Campaign failure: {campaign.failure.message}"
                + (f" (replay: `{replay(campaign.reproducer)}`)" if campaign.reproducer else "")
            )
            lines += _explained(campaign.failure)
        if report.status == "inconclusive":
            lines.append(f"To certify it needs: {report.needs()}.")
        lines.append("")
    if mutants:
        killed = sum(m.killed for m in mutants)
        lines += [f"## Planted-bug self-test: {killed}/{len(mutants)} mutants killed", "", table(mutants), ""]
    return "\n".join(lines)


def report_paths(out: Path) -> tuple[Path, Path]:
    """Where certify writes its report: ``out`` itself and the same name with ``.json`` when ``out``
    names a Markdown file (``*.md``), else ``report.md`` and ``report.json`` in the folder ``out``."""
    if out.suffix.lower() == ".md":
        return out, out.with_suffix(".json")
    return out / "report.md", out / "report.json"


def certify(
    specs: list[str],
    *,
    profile: str,
    campaign_seconds: float,
    check_seconds: float,
    mutants: bool,
    out: Path,
    device: str,
    methods: tuple[str, ...] | None = None,
    progress: bool = True,
    pool: Callable[[Sequence[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]]], list[Any]]
    | None = None,
) -> str:
    """Certify ``specs``, print the report, write ``report.md`` and ``report.json`` under ``out``.

    With ``pool`` (`fuzz.cluster.map_on_cluster`: the calls spread over a cluster's workers, each
    given its own ``device``) every variant and every mutant of the self-test is certified on the
    next free worker, and the report is the same.

    Returns the overall status: ``pass``, ``fail`` or ``inconclusive``.
    """
    start = time.monotonic()
    reports: list[VariantReport] = []
    records: list[SelfTestRecord] = []
    if pool is not None:
        options = {
            "profile": profile,
            "campaign_seconds": campaign_seconds,
            "check_seconds": check_seconds,
            "methods": methods,
            "progress": False,
        }
        ids = [m for m in MUTANTS if not MUTANTS[m].gpu_only] if mutants else []
        calls = [(certify_variant, (spec,), options) for spec in specs]
        calls += [(run_mutants, ([id_],), {"profile": profile, "progress": False}) for id_ in ids]
        results = pool(calls)
        reports = results[: len(specs)]
        records = [record for chunk in results[len(specs) :] for record in chunk]
    for spec in specs[len(reports) :]:
        reports.append(
            certify_variant(
                spec,
                profile=profile,
                campaign_seconds=campaign_seconds,
                check_seconds=check_seconds,
                device=device,
                methods=methods,
                progress=progress,
            )
        )
        if reports[-1].interrupted:
            break  # Ctrl-C: report what ran, certify nothing more
    stopped = len(reports) < len(specs) or any(r.interrupted for r in reports)
    self_test = "pass" if not records or all(m.killed for m in records) else "fail"
    if mutants and not stopped and pool is None:
        try:
            records = run_mutants(profile=profile, device=device, progress=progress)
            self_test = "pass" if all(m.killed for m in records) else "fail"
        except KeyboardInterrupt:
            self_test = "interrupted"
    seconds = time.monotonic() - start
    status = _status([r.status for r in reports] + [self_test])
    text = markdown(reports, records, profile, seconds, status)
    if stopped or self_test == "interrupted":
        left = specs[len(reports) :]
        missed = [f"not certified: {', '.join(f'`{s}`' for s in left)}"] if left else []
        missed += ["the self-test did not run"] if mutants else []
        said = "; ".join(missed) or "the tables above hold what finished"
        text += f"\n**Interrupted** (Ctrl-C): {said}.\n"
    markdown_path, json_path = report_paths(out)
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    markdown_path.write_text(text + "\n")
    data = {
        "status": status,
        "profile": profile,
        "seconds": round(seconds, 1),
        "versions": versions(),
        "variants": [
            {
                "spec": r.spec,
                "status": r.status,
                "num_samples": r.num_samples,
                "required_samples": r.required_samples,
                "seconds_per_trial": r.throughput.per_trial(r.num_samples),
                "seconds_per_call": r.throughput.seconds_per_call,
                "not_checked": r.not_checked,
                "methods": list(r.methods),
                "interrupted": r.interrupted,
                "checks": [asdict(c) for c in r.checks],
                "campaign": r.campaign.summary(),
            }
            for r in reports
        ],
        "mutants": [m.to_json() for m in records],
    }
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    print(text)
    print(f"Report written to {markdown_path} and {json_path}")
    return status
