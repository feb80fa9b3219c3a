"""The checks of any `Variant`, one module each, from cheapest to strongest.

- ``invariants``: every sample keeps the hard invariants (ids, layout, prefix, greedy chains, logprobs).
- ``coupled``: on a scheme the walk replays, the variant emits what the float64 walk emits.
- ``law_of_m``: the number accepted follows `reference.law.exact_law`.
- ``law_of_y``: the joint law of ``(m, y)`` and the law of ``y`` given each ``m`` follow the exact law.
- ``marginal``: with the drafts drawn from ``q``, every reached position follows ``p``.
- ``steps``: with each request's seed fixed, outputs over distinct steps follow the exact law.
- ``step_pairs``: a seed's outputs at adjacent steps are independent (their pair law is the product).
- ``composition``: a request's output does not depend on the rest of the batch or on the slots.
- ``determinism``: the same batch gives the same output twice.

Each check is a `Check` (a name, `Check.applies`, `Check.run` returning a `Verdict`) registered in
`CHECKS`. Every statistical verdict has false-failure rate ``alpha`` (Holm's procedure splits it
across the check's tests) and states the smallest deviation it detects with power 0.999, with its
unit. ``seed`` derives every random choice, so a verdict replays exactly. `run_checks` computes the
batch's exact law once (`CheckedBatch`) for every check that reads it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

import numpy as np

from specsample.properties import stats
from specsample.properties.checks import (
    composition,
    coupled,
    determinism,
    invariants,
    law_of_m,
    law_of_y,
    marginal,
    step_pairs,
    steps,
)
from specsample.properties.checks.base import (
    DEFAULT_ALPHA,
    DEFAULT_NUM_SAMPLES,
    Check,
    CheckedBatch,
    Deviation,
    Settings,
    Trials,
    VariantError,
    Verdict,
    draw_trials,
    failed_call,
)
from specsample.reference.contract import SpecBatch, Variant, capabilities

CHECKS: dict[str, Check] = {
    check.name: check
    for check in (
        invariants.CHECK,
        coupled.CHECK,
        law_of_m.CHECK,
        law_of_y.CHECK,
        marginal.CHECK,
        steps.CHECK,
        step_pairs.CHECK,
        composition.CHECK,
        determinism.CHECK,
    )
}
# A failed exact check scores this for `hypothesis.target`; a p-value scores at most 300.
FAILED_EXACT_DISCREPANCY = 1000.0


def check(
    name: str,
    variant: Variant,
    batch: SpecBatch,
    *,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    trials: Trials | None = None,
    required_samples: int | None = None,
) -> Verdict | None:
    """Run the check called ``name``; ``None`` when it does not apply to ``variant`` on ``batch``."""
    unit = CHECKS[name]
    options = dict(num_samples=num_samples, alpha=alpha, seed=seed, required_samples=required_samples)
    return unit.run(variant, batch, trials=trials, **options) if unit.applies(variant, batch) else None


def run_checks(
    variant: Variant,
    batch: SpecBatch,
    *,
    checks: Sequence[str] = tuple(CHECKS),
    num_samples: int = DEFAULT_NUM_SAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    required_samples: int | None = None,
) -> list[Verdict]:
    """Run ``checks`` (names from `CHECKS`, run in that order) of ``variant`` on ``batch``.

    The checks that share trials draw one set of ``num_samples`` trials per request (their variant
    time is charged to the first of them); the others make their own calls. Every check reads the
    one `CheckedBatch` of ``batch``, so its exact law is computed once. Checks that do not apply are
    left out. Each verdict has false-failure rate ``alpha``; ``seed`` derives every random
    choice; a clean verdict below the power of ``required_samples`` trials per request (default:
    ``num_samples``) is inconclusive.
    """
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise ValueError(f"checks has {unknown}; expected names from {', '.join(CHECKS)}")
    Settings(num_samples, alpha, seed, required_samples)  # raises ValueError naming a bad argument
    wanted = [CHECKS[c] for c in CHECKS if c in checks and CHECKS[c].applies(variant, batch)]
    sharing = [c for c in wanted if c.shares_trials]
    shared: Trials | None = None
    verdicts: list[Verdict] = []
    if sharing:
        start = time.perf_counter()
        try:
            shared = draw_trials(variant, batch, num_samples, seed)
        except VariantError as error:
            verdicts += [failed_call(c.name, variant, error, time.perf_counter() - start) for c in sharing]
            wanted = [c for c in wanted if not c.shares_trials]
    options = dict(num_samples=num_samples, alpha=alpha, seed=seed, required_samples=required_samples)
    caps = capabilities(variant)
    checked = CheckedBatch(batch, caps.arithmetic, caps.filter_ulps)
    for unit in wanted:
        verdict = unit.run(variant, checked, trials=shared if unit.shares_trials else None, **options)
        if shared is not None and unit is sharing[0]:
            verdict = dataclasses.replace(verdict, seconds=verdict.seconds + shared.seconds)
        verdicts.append(verdict)
    order = list(CHECKS)
    return sorted(verdicts, key=lambda v: order.index(v.check))  # `CHECKS` order, failed calls too


def compare_variants(
    first: Variant,
    second: Variant,
    batch: SpecBatch,
    *,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
) -> Verdict:
    """Whether two variants draw ``(m, y)`` from the same law on ``batch``, with no exact law needed.

    Each variant runs ``num_samples`` trials of every request (their own seeds); per request, the
    two-sample G-test of homogeneity (`properties.stats.two_sample_test`) compares the joint counts of
    ``(m, y)``, and Holm combines the requests at level ``alpha``. ``detectable`` is the largest over
    requests of the total variation between the two joint laws detected with power 0.999 (at Holm's
    first level). Useful where the exact law is out of reach or to compare a new kernel with a
    trusted one.
    """
    start = time.perf_counter()
    runs = [
        draw_trials(v, batch, num_samples, seed, purpose=f"compare {i}")
        for i, v in enumerate((first, second))
    ]
    vocab_size = batch.vocab_size
    results = []
    for b, n in enumerate(batch.num_drafts()):
        counts = []
        for trials in runs:
            m, y = trials.outcomes(b)
            m, y = np.clip(m, 0, n), np.clip(y, 0, vocab_size - 1)
            counts.append(np.bincount(m * vocab_size + y, minlength=(n + 1) * vocab_size))
        results.append(stats.two_sample_test(counts[0], counts[1], alpha=alpha / batch.num_requests))
    adjusted = stats.holm_adjusted([r.pvalue for r in results])
    worst = int(np.argmin(adjusted))
    pvalue = float(adjusted[worst])
    detectable = Deviation(max(r.detectable_tv for r in results), "total variation")
    reject = pvalue < alpha
    message = (
        f"{first.name} vs {second.name}: request {worst} {results[worst].reason}; Holm p={pvalue:.3g} "
        f"{'<' if reject else '>='} alpha={alpha:g} over {len(results)} requests; detects {detectable}"
    )
    return Verdict(
        check="compare",
        status="fail" if reject else "pass",
        variant=f"{first.name} vs {second.name}",
        message=message,
        num_samples=2 * num_samples * batch.num_requests,
        seconds=time.perf_counter() - start,
        request=worst,
        statistic=results[worst].statistic,
        pvalue=pvalue,
        alpha=alpha,
        detectable=detectable,
    )


def discrepancy(verdicts: Sequence[Verdict]) -> float:
    """A scalar >= 0 that grows as the verdicts look worse, comparable across batches.

    ``-log10`` of the Bonferroni-adjusted smallest p-value of the statistical verdicts (``k`` times
    the smallest of ``k``, capped at 1; the score at most 300): under a correct sampler it exceeds
    ``s`` with probability at most ``10**-s`` whatever the batch, which is what makes it comparable
    for `hypothesis.target`. A failed exact check scores `FAILED_EXACT_DISCREPANCY`. Zero when there
    is nothing to score.
    """
    pvalues = [v.pvalue for v in verdicts if v.pvalue is not None]
    if any(v.pvalue is None and v.failed for v in verdicts):
        return FAILED_EXACT_DISCREPANCY
    if not pvalues:
        return 0.0
    adjusted = min(1.0, len(pvalues) * min(pvalues))
    return min(300.0, -math.log10(max(adjusted, 1e-300)))


__all__ = [
    "CHECKS",
    "Check",
    "CheckedBatch",
    "Deviation",
    "Trials",
    "Verdict",
    "check",
    "compare_variants",
    "discrepancy",
    "run_checks",
]
