"""What every check shares: the verdict, the interface, the batch's law, repeated trials, Holm's combination.

A check runs a variant on repeated trials of a batch: every request is replicated ``N`` times with
fresh seeds (its step and inputs unchanged), so one variant call gives ``N`` independent samples of
each request. Each check is one module of this package with one `Check` object; `Verdict` is what
every check (and `properties.checks.compare_variants`) returns. What the checks derive from the
batch itself (its exact law) a `CheckedBatch` computes once for all of them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch

from specsample.properties import stats
from specsample.properties.batching import draft_counts, pad_output, ranges, select_requests
from specsample.properties.checks.poison import active_pattern, poisoned
from specsample.reference.contract import (
    MAX_STEP,
    Arithmetic,
    SpecBatch,
    SpecOutput,
    Variant,
    capabilities,
    validate_output,
)
from specsample.reference.filters import pivot_band, pivot_slack
from specsample.reference.law import BatchRows, Pivots, RequestInputs, RequestLaw, exact_law, request_inputs

DEFAULT_NUM_SAMPLES = 2000
DEFAULT_ALPHA = stats.DEFAULT_ALPHA
# A filtered request whose laws without and with its near pivots differ by more than this total
# variation (of the joint law of (m, y), or of a target row) is one whose kept sets float32 rounding
# decides: a correct sampler may follow either law, so the statistical checks leave it out. Below it
# the difference is far under what they detect (about 0.1 at 2,000 trials, 0.03 at 20,000).
AMBIGUOUS_TV = 1e-3
# Logits gathered per variant call at most: requests are split into calls of no more than this many,
# or fewer where the device's free memory holds fewer (`elements_per_call`).
DEFAULT_MAX_ELEMENTS = 1 << 26

I64Array = npt.NDArray[np.int64]
F64Array = npt.NDArray[np.float64]
Status = Literal["pass", "fail", "inconclusive"]
Unit = Literal["total variation", "probability", "rate per sample"]


@dataclass(frozen=True)
class Deviation:
    """The smallest deviation a verdict detects with power 0.999 (``inf`` for none), and its unit.

    The unit is the total variation between token laws, a ``"probability"`` (the absolute deviation
    of a cell probability, as for the law of ``m``), or the ``"rate per sample"`` of a violation seen
    at least once (the exact checks).
    """

    value: float
    unit: Unit

    def __str__(self) -> str:
        return f"{self.value:.4g} ({self.unit})"


@dataclass(frozen=True)
class Cell:
    """One cell of a decisive test: the outcomes it holds, in words, and its observed and expected counts.

    Attributes:
        label: the outcomes in words (``"m=0"``, ``"token 2 given m=1"``, ``"position 2: token 5"``,
            ``"7 tokens of total probability 0.03 given m=1"``).
        observed: how many trials fell in it.
        expected: how many the exact law expects (0 where it gives the outcomes probability 0).
        outcomes: how many outcomes it holds (a pooled cell holds several).
    """

    label: str
    observed: int
    expected: float
    outcomes: int = 1

    @property
    def impossible(self) -> bool:
        """Whether trials fell where the exact law puts no mass."""
        return self.expected == 0 and self.observed > 0


@dataclass(frozen=True)
class Detail:
    """What one test shows of itself: its cells that weigh most (at most `MAX_CELLS`, the heaviest
    first) and the deviation it saw, in its check's unit."""

    cells: tuple[Cell, ...]
    observed: float


# A verdict shows at most this many cells of its decisive test.
MAX_CELLS = 5


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The outcome of one check of one variant on one batch.

    Attributes:
        check: the check's name.
        status: ``"pass"`` (the check ran with the power it states and saw nothing wrong),
            ``"fail"``, or ``"inconclusive"`` (it saw nothing wrong but ran too few trials for the
            profile's power, or could not have detected any deviation).
        variant: the variant's name.
        message: one line a person can read.
        num_samples: samples (variant outputs) the verdict rests on.
        trials: trials per request the check ran (``None`` where it does not count trials).
        seconds: wall time of the check, variant calls included.
        request: the request (index in the checked batch) where a failure is localised.
        position: the position (draft index; ``n_b`` is the bonus) where a failure is localised.
        statistic: the statistic of the decisive test (a count of violations for exact checks).
        pvalue: the Holm-adjusted p-value of the decisive test (``None`` for exact checks).
        alpha: the false-failure rate of the verdict (``None`` for exact checks).
        detectable: the smallest deviation detected with power 0.999.
        subject: the request of the decisive test (or of the first violation) in words: method,
            vocabulary, drafts, temperature, seed, step, draft layout, and how the trials vary it.
        cells: the decisive test's cells that weigh most, the heaviest first (statistical
            failures; `MAX_CELLS` at most).
        observed: the deviation the decisive test saw, in the unit of ``detectable`` (failures).
        finding: the first violation in words, where an exact check has more to say than its message.
    """

    check: str
    status: Status
    variant: str
    message: str
    num_samples: int
    seconds: float
    trials: int | None = None
    request: int | None = None
    position: int | None = None
    statistic: float | None = None
    pvalue: float | None = None
    alpha: float | None = None
    detectable: Deviation | None = None
    subject: str | None = None
    cells: tuple[Cell, ...] = ()
    observed: Deviation | None = None
    finding: str | None = None

    @property
    def passed(self) -> bool:
        """Whether the variant passed with the stated power."""
        return self.status == "pass"

    @property
    def failed(self) -> bool:
        """Whether the variant failed."""
        return self.status == "fail"

    def explain(self) -> list[str]:
        """The verdict for a person, one line each: the message, the request, a table of the decisive
        cells (observed against expected counts), every outcome observed where the exact law gives
        probability 0, and the deviation seen against the one detected with power 0.999."""
        lines = [self.message]
        if self.subject:
            lines.append(f"{self.subject[:1].upper()}{self.subject[1:]}.")
        if self.finding:
            lines.append(f"{self.finding}.")
        if self.cells:
            width = max(len("cell"), *(len(c.label) for c in self.cells))
            lines.append("The decisive cells, the largest contributions first:")
            lines.append(f"  {'cell':<{width}}  {'observed':>9}  {'expected':>9}")
            for c in self.cells:
                mark = "  probability 0" if c.expected == 0 else ""
                lines.append(f"  {c.label:<{width}}  {c.observed:>9}  {_count(c.expected):>9}{mark}")
        impossible = [c for c in self.cells if c.impossible]
        if len(impossible) == 1:
            c = impossible[0]
            it, times = "it" if c.outcomes == 1 else "them", "time" if c.observed == 1 else "times"
            lines.append(f"{c.label} observed {c.observed} {times}; the exact law gives {it} probability 0.")
        elif impossible:
            seen = ", ".join(f"{c.label} ({c.observed} times)" for c in impossible)
            lines.append(f"Observed where the exact law gives probability 0: {seen}.")
        if self.observed is not None:
            seen = f"Seen: {_in_words(self.observed)}"
            if self.cells:
                seen += " in the decisive test"
            if self.detectable is not None:
                seen += f"; the check detects {_in_words(self.detectable)} or more with power 0.999"
            lines.append(f"{seen}.")
        return lines


def _in_words(deviation: Deviation) -> str:
    """A deviation in words, in its unit: ``"a total variation of 0.12"``."""
    value = f"{deviation.value:.4g}"
    if deviation.unit == "total variation":
        return f"a total variation of {value}"
    if deviation.unit == "probability":
        return f"a probability off by {value}"
    return f"a violation rate of {value} per sample"


def _count(expected: float) -> str:
    """An expected count, as exact as a reader needs it."""
    if expected == 0:
        return "0"
    if expected < 0.1:
        return f"{expected:.2g}"
    return f"{expected:.1f}" if expected < 100 else f"{expected:.0f}"


class VariantError(Exception):
    """The variant raised on a valid batch, or returned something that is not a `SpecOutput`; the
    check that called it fails."""


@dataclass(frozen=True)
class Settings:
    """How a check runs: ``num_samples`` trials per request, the false-failure rate ``alpha``, and
    the ``seed`` every random choice derives from. ``required_samples`` (default: ``num_samples``)
    is the trials per request the profile's power needs: a check that runs fewer and sees nothing
    wrong is inconclusive.
    """

    num_samples: int = DEFAULT_NUM_SAMPLES
    alpha: float = DEFAULT_ALPHA
    seed: int = 0
    required_samples: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.num_samples, int) and self.num_samples >= 1):
            raise ValueError(f"num_samples is {self.num_samples!r}; expected an integer >= 1")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha is {self.alpha!r}; expected a false-failure rate in (0, 1)")
        if self.required_samples is not None and not self.required_samples >= 1:
            raise ValueError(f"required_samples is {self.required_samples!r}; expected an integer >= 1")


class CheckedBatch:
    """A batch under check, and what the checks derive from it, each computed once on first use.

    `run_checks` makes one per batch and hands it to every check it runs, so the batch's exact law
    is computed once however many checks read it; a check run on its own makes its own. The law
    follows the sampler's ``arithmetic`` (`reference.contract.Capabilities`).

    In a filtered batch the laws are taken on the kept sets *with* their near pivots (the tokens
    within the sampler's declared ``filter_ulps`` of a pivot, `reference.filters.near_pivot`), so
    that a token rounding may legitimately keep is never an impossible outcome; the mass this adds
    is at most the near pivots' (``pivot_slack`` bounds its effect on a log-probability).
    """

    def __init__(self, batch: SpecBatch, arithmetic: Arithmetic = "log", filter_ulps: float = 4.0) -> None:
        self.batch = batch
        self.arithmetic: Arithmetic = arithmetic
        self.band = pivot_band(filter_ulps)

    @classmethod
    def of(
        cls, batch: SpecBatch | CheckedBatch, arithmetic: Arithmetic = "log", filter_ulps: float = 4.0
    ) -> CheckedBatch:
        """``batch`` itself if it is a `CheckedBatch` (which brings its own arithmetic), else a new
        one of ``batch`` in ``arithmetic``."""
        return batch if isinstance(batch, CheckedBatch) else cls(batch, arithmetic, filter_ulps)

    @property
    def pivots(self) -> Pivots:
        """The kept sets the laws use: with their near pivots where the batch filters."""
        return "upper" if self.batch.filtered else "exact"

    @functools.cached_property
    def inputs(self) -> list[RequestInputs]:
        """Each request's float64 inputs (`reference.law.request_inputs`)."""
        return request_inputs(self.batch, self.pivots, self.band)

    @functools.cached_property
    def laws(self) -> list[RequestLaw]:
        """Each request's exact law in the sampler's arithmetic (`reference.law.exact_law`)."""
        return exact_law(self.batch, self.arithmetic, self.pivots, self.band)

    @functools.cached_property
    def ambiguous(self) -> list[bool]:
        """Per request, whether float32 rounding decides its law: its near pivots carry more than
        `AMBIGUOUS_TV` (the laws without and with them differ by more, in the joint law of ``(m, y)``
        or in a target row). A sampler may keep or drop a near pivot, so such a request has no one law
        to test; the statistical checks leave it out (the invariants and the coupled check keep it)."""
        if not self.batch.filtered:
            return [False] * self.batch.num_requests
        lower = exact_law(self.batch, self.arithmetic, "lower", self.band)
        return [
            max(
                _total_variation(a.joint_probs(), b.joint_probs()),
                _total_variation(a.target_probs, b.target_probs),
            )
            > AMBIGUOUS_TV
            for a, b in zip(lower, self.laws, strict=True)
        ]

    @functools.cached_property
    def pivot_slack(self) -> list[F64Array]:
        """Per request, ``[n + 1]`` how far each target row's log-normaliser may move with its near
        pivots (`reference.filters.pivot_slack`; zeros in an unfiltered batch)."""
        counts = draft_counts(self.batch)
        if not self.batch.filtered:
            return [np.zeros(n + 1) for n in counts]
        rows = BatchRows.of(self.batch)
        assert rows.filters is not None
        slack = []
        for b, n in enumerate(counts):
            request = np.full(n + 1, b)
            logits = rows.raw_target_rows(request, np.arange(n + 1))
            params = rows.filters.take(request)
            slack.append(pivot_slack(logits, rows.temperature[request], params, self.band))
        return slack


def _total_variation(first: F64Array, second: F64Array) -> float:
    """The largest total variation between matching rows of two ``[..., V]`` laws (or two whole laws)."""
    return float(0.5 * np.abs(first - second).reshape(-1, first.shape[-1]).sum(axis=-1).max(initial=0.0))


class Check:
    """A check: a name, which variants and batches it `applies` to, and `run` returning a `Verdict`.

    ``shares_trials``: it runs on the trials `run_checks` draws once for every such check (otherwise
    it makes its own variant calls). ``counts_trials``: its power grows with the trials per request,
    so too few of them make a clean verdict inconclusive.
    """

    name: str
    shares_trials = True
    counts_trials = True

    @property
    def trial_calls(self) -> int:
        """Calls' worth of trials per request it draws beyond the shared ones, what a run of the
        checks costs in sampler calls (`specsample.fuzz.budget`): one for a check with its own
        trials whose power grows with them, none for one on the shared trials."""
        return int(not self.shares_trials and self.counts_trials)

    def applies(self, variant: Variant, batch: SpecBatch) -> bool:
        """Whether the check means anything for ``variant`` on ``batch``."""
        return True

    def run(
        self,
        variant: Variant,
        batch: SpecBatch | CheckedBatch,
        *,
        num_samples: int = DEFAULT_NUM_SAMPLES,
        alpha: float = DEFAULT_ALPHA,
        seed: int = 0,
        trials: Trials | None = None,
        required_samples: int | None = None,
    ) -> Verdict:
        """Check ``variant`` on ``batch`` with ``num_samples`` trials per request (or ``trials``).

        ``batch`` may be a `CheckedBatch` that other checks share (in the variant's arithmetic).
        The verdict's time includes the variant calls the check makes; a variant that raises fails
        it; a clean verdict below the power of ``required_samples`` trials is inconclusive.
        """
        start = time.perf_counter()
        caps = capabilities(variant)
        arithmetic = caps.arithmetic
        checked = CheckedBatch.of(batch, arithmetic, caps.filter_ulps)
        if checked.arithmetic != arithmetic:
            raise ValueError(
                f"batch holds its exact law in arithmetic {checked.arithmetic!r}; "
                f"expected {variant.name}'s {arithmetic!r}"
            )
        settings = Settings(num_samples, alpha, seed, required_samples)
        try:
            verdict = self.verdict(variant, checked, settings, trials)
        except VariantError as error:
            verdict = failed_call(self.name, variant, error)
        if verdict.passed and (reason := self.starved(verdict, settings)):
            message = verdict.message.replace(f"{self.name} passes", f"{self.name} is INCONCLUSIVE", 1)
            verdict = dataclasses.replace(verdict, status="inconclusive", message=f"{message}; {reason}")
        return dataclasses.replace(verdict, seconds=time.perf_counter() - start)

    def starved(self, verdict: Verdict, settings: Settings) -> str | None:
        """Why a clean verdict lacks the power it should have, or ``None``."""
        required = settings.required_samples or settings.num_samples
        if self.counts_trials and verdict.trials is not None and verdict.trials < required:
            return f"{verdict.trials} trials per request ran; the profile's power needs {required}"
        if verdict.detectable is not None and not math.isfinite(verdict.detectable.value):
            return "no deviation is detectable with power 0.999 at these trials"
        return None

    def verdict(
        self, variant: Variant, checked: CheckedBatch, settings: Settings, trials: Trials | None
    ) -> Verdict:
        """The check itself (`run` times it and turns a raising variant into a failed verdict)."""
        raise NotImplementedError


class StatisticalCheck(Check):
    """A check made of statistical tests on trials, combined by Holm at level ``alpha``.

    The verdict fails iff the smallest Holm-adjusted p-value is below ``alpha``; it names the
    request of its decisive test (``varies``: how its trials differ from the request) and, on
    failure, that test's cells and the deviation it saw.
    """

    varies = "each trial with a fresh seed"

    def draw(self, variant: Variant, checked: CheckedBatch, settings: Settings) -> Trials:
        """The trials the tests run on."""
        return draw_trials(variant, checked.batch, settings.num_samples, settings.seed)

    def components(
        self, checked: CheckedBatch, trials: Trials, settings: Settings
    ) -> tuple[list[Component], Deviation]:
        """The tests at level ``settings.alpha``, and the deviation they detect with power 0.999."""
        raise NotImplementedError

    def verdict(
        self, variant: Variant, checked: CheckedBatch, settings: Settings, trials: Trials | None
    ) -> Verdict:
        """Holm's combination of `components` on the trials."""
        batch = checked.batch
        trials = trials or self.draw(variant, checked, settings)
        alpha = settings.alpha
        tests, detectable = self.components(checked, trials, settings)
        summary = f"{batch.num_requests} requests x {trials.num_trials} trials"
        left_out = sum(checked.ambiguous)
        if left_out:
            summary += f" ({left_out} left out: float32 rounding decides their kept sets)"
        common = dict(
            check=self.name,
            variant=variant.name,
            num_samples=batch.num_requests * trials.num_trials,
            seconds=0.0,
            trials=trials.num_trials,
            alpha=alpha,
            detectable=detectable,
        )
        if not tests:
            return Verdict(status="inconclusive", message=f"{summary}; nothing to test", pvalue=1.0, **common)
        adjusted = stats.holm_adjusted([t.pvalue for t in tests])
        worst = int(np.argmin(adjusted))
        test, pvalue = tests[worst], float(adjusted[worst])
        passed = pvalue >= alpha
        where = f"request {test.request}" + ("" if test.position is None else f" position {test.position}")
        message = (
            f"{self.name} {'passes' if passed else 'FAILS'}: {summary}; decisive test at {where}: "
            f"{test.what}, Holm p={pvalue:.3g} over {len(tests)} tests, alpha={alpha:g}; "
            f"detects {detectable} with power 0.999"
        )
        detail = None if passed or test.detail is None else test.detail()
        return Verdict(
            status="pass" if passed else "fail",
            message=message,
            request=test.request,
            position=test.position,
            statistic=test.statistic,
            pvalue=pvalue,
            subject=f"{describe_request(checked, test.request)}; {self.varies}",
            cells=() if detail is None else detail.cells,
            observed=None if detail is None else Deviation(detail.observed, detectable.unit),
            **common,
        )


def trial_seeds(seed: int, purpose: str, count: int) -> I64Array:
    """``count`` int64 request seeds in ``[0, 2**63)`` derived from ``(seed, purpose)``."""
    words = np.random.SeedSequence([seed & (2**64 - 1), *purpose.encode()]).generate_state(count, np.uint64)
    return np.asarray(words >> np.uint64(1), dtype=np.int64)


def derived_rng(seed: int, purpose: str) -> np.random.Generator:
    """A generator derived from ``(seed, purpose)``."""
    return np.random.default_rng(np.random.SeedSequence([seed & (2**64 - 1), *purpose.encode()]))


class EnvironmentProblem(Exception):
    """The environment, not the sampler, failed a call: out of memory, no driver, a compile error.
    Never a verdict nor a reproducer; the CLI reports it with exit code 2."""


# Words in an exception's text that mark a failure of the machine rather than of the sampler.
_ENVIRONMENT_MARKERS = (
    "out of memory",
    "cuda error",
    "cuda driver",
    "no kernel image",
    "active drivers",
    "cudnn",
    "cublas",
    "nccl",
    "device-side assert",
)


def environment_problem(error: BaseException) -> bool:
    """Whether ``error`` is the environment's: memory, the driver, Triton's compiler, a missing module."""
    if isinstance(error, MemoryError | ImportError | torch.cuda.OutOfMemoryError):
        return True
    if type(error).__module__.startswith("triton.compiler"):
        return True
    text = str(error).lower()
    return any(marker in text for marker in _ENVIRONMENT_MARKERS)


def elements_per_call(device: torch.device, bytes_per_element: int = 64) -> int:
    """The most logits one variant call may gather: `DEFAULT_MAX_ELEMENTS`, or less where the free
    memory of ``device`` (the host's for the CPU) holds less at ``bytes_per_element`` each (the
    call's gathered logits plus the sampler's own intermediates, generously)."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(1, min(DEFAULT_MAX_ELEMENTS, free // (4 * bytes_per_element)))


@dataclass(frozen=True)
class Trials:
    """``N`` independent samples of every request of a batch (what `draw_trials` returns).

    Request ``b``'s trial ``t`` is replica ``b * N + t``: request ``b`` with its own seed and, for
    the marginal check, its own drafts. Replicas are built a call at a time, never all at once.

    Attributes:
        output: the variant's output for every replica, on the CPU, padded to the full width.
        seeds, steps: ``[B * N]`` the replicas' seeds and steps (``None``: their requests' own).
        draft_token_ids: the replicas' drafts, request-major, or ``None`` for the batch's own.
        seconds: wall time of the variant calls.
        problems: shape and dtype violations of the raw outputs.
    """

    batch: SpecBatch
    output: SpecOutput
    num_trials: int
    seeds: I64Array
    draft_token_ids: I64Array | None
    seconds: float
    problems: list[str] = field(default_factory=list)
    steps: I64Array | None = None

    def request_rows(self, request: int) -> tuple[I64Array, I64Array]:
        """``(tokens [N, W], emitted [N])`` of one request's trials."""
        rows = slice(request * self.num_trials, (request + 1) * self.num_trials)
        tokens = self.output.token_ids[rows].numpy().astype(np.int64)
        emitted = self.output.num_emitted[rows].numpy().astype(np.int64)
        return tokens, emitted

    def outcomes(self, request: int) -> tuple[I64Array, I64Array]:
        """``(stop [N], y [N])`` of one request's trials: the target row each stopped at (the index of
        `reference.law.RequestLaw`: ``m``, the drafts accepted, on a chain; on a tree the row of the
        last accepted node, ``1 + v``, or 0) and the token it emitted there; ``stop`` is ``-1`` where a
        trial's count or accepted nodes lie outside the request's, ``y`` where its token does too."""
        tokens, emitted = self.request_rows(request)
        n = int(draft_counts(self.batch)[request])
        m = emitted - 1
        ok = (m >= 0) & (m <= n)
        stop = m
        if self.batch.tree_parent is not None:
            nodes = self.node_rows(request)
            last = np.full(m.shape, -1, dtype=np.int64)
            if nodes.shape[1]:
                last = np.where(
                    m > 0, nodes[np.arange(m.shape[0]), np.clip(m - 1, 0, nodes.shape[1] - 1)], -1
                )
            ok &= (m == 0) | ((last >= 0) & (last < n))
            stop = np.where(m > 0, last + 1, 0)
        y = np.where(ok, tokens[np.arange(m.shape[0]), np.clip(m, 0, tokens.shape[1] - 1)], -1)
        good_y = ok & (y >= 0) & (y < self.batch.vocab_size)
        return np.where(ok, stop, -1), np.where(good_y, y, -1)

    def node_rows(self, request: int) -> I64Array:
        """``[N, W - 1]`` the accepted nodes of one request's trials (a tree batch's), ``-1`` after them."""
        assert self.output.accepted_nodes is not None
        rows = slice(request * self.num_trials, (request + 1) * self.num_trials)
        return self.output.accepted_nodes[rows].numpy().astype(np.int64)

    def passes(self, request: int) -> npt.NDArray[np.bool_]:
        """``[N, n + 1]`` which target rows each trial of one request went through (the rows whose
        draw it made): rows ``0 .. m`` on a chain; on a tree the root's and those of its accepted nodes."""
        _, emitted = self.request_rows(request)
        n = int(draft_counts(self.batch)[request])
        m = np.clip(emitted - 1, 0, n)
        if self.batch.tree_parent is None:
            return np.arange(n + 1)[None, :] <= m[:, None]
        nodes = self.node_rows(request)
        inside = (np.arange(nodes.shape[1])[None, :] < m[:, None]) & (nodes >= 0) & (nodes < n)
        through = np.zeros((m.shape[0], n + 1), dtype=bool)
        through[:, 0] = True
        trial, column = np.nonzero(inside)
        through[trial, nodes[trial, column] + 1] = True
        return through

    def replicas(self, rows: I64Array) -> SpecBatch:
        """The batch of replicas ``rows``, as the variant saw them."""
        return replicas(self.batch, self.num_trials, self.seeds, self.draft_token_ids, rows, self.steps)


def replicas(
    batch: SpecBatch,
    num_trials: int,
    seeds: I64Array,
    draft_token_ids: I64Array | None,
    rows: I64Array,
    steps: I64Array | None = None,
) -> SpecBatch:
    """Replicas ``rows`` of ``batch`` (replica ``b * num_trials + t`` is request ``b``) on its device."""
    ids = None
    if draft_token_ids is not None:
        counts = np.repeat(draft_counts(batch), num_trials)
        take = ranges((np.cumsum(counts) - counts)[rows], counts[rows])
        ids = torch.as_tensor(draft_token_ids[take], dtype=torch.int64)
    step = None if steps is None else steps[rows]
    return select_requests(batch, rows // num_trials, seed=seeds[rows], step=step, draft_token_ids=ids)


def _call(variant: Variant, part: SpecBatch, problems: list[str]) -> SpecOutput:
    """One variant call, poisoned (`poisoned`), its raw output checked against the contract's shapes."""
    try:
        with poisoned(active_pattern()):
            output = variant(part)
    except Exception as error:
        if environment_problem(error):
            raise EnvironmentProblem(f"{type(error).__name__}: {error}") from error
        raise VariantError(f"the variant raised on a valid batch: {type(error).__name__}: {error}") from error
    if not isinstance(output, SpecOutput):
        raise VariantError(f"the variant returned {type(output).__name__}, not a SpecOutput")
    try:
        validate_output(output, part)
    except ValueError as error:
        problems.append(str(error))
        output = _coerce(output, part)
    return output


def _chunks(batch: SpecBatch, index: I64Array, max_elements: int) -> list[I64Array]:
    """Runs of ``index`` (requests of ``batch``) whose calls gather at most ``max_elements`` logits."""
    counts = draft_counts(batch)
    rows = counts + 1 + (counts if batch.draft_logits is not None and not batch.slotted else 0)
    per_call = max(1, max_elements // max(batch.vocab_size, 1))
    load = np.cumsum(rows[index])
    cuts, start = [], 0
    while start < index.size:
        base = load[start - 1] if start else 0
        end = max(start + 1, int(np.searchsorted(load, base + per_call, side="right")))
        cuts.append(np.arange(start, min(end, index.size)))
        start = end
    return cuts


def call_variant(
    variant: Variant, batch: SpecBatch, max_elements: int | None = None
) -> tuple[SpecOutput, list[str]]:
    """Run ``variant`` on ``batch`` in calls of at most ``max_elements`` logits; stack the outputs on the CPU.

    Returns the output padded to ``max_n + 1`` columns and the shape violations of each raw output.

    Raises:
        VariantError: the variant raised, or returned something that is not a `SpecOutput`.
        EnvironmentProblem: the machine failed the call (memory, driver, compiler).
    """
    budget = max_elements or elements_per_call(batch.device)
    problems: list[str] = []
    chunks = _chunks(batch, np.arange(batch.num_requests), budget)
    outputs = [
        _call(variant, batch if len(chunks) == 1 else select_requests(batch, c), problems) for c in chunks
    ]
    return pad_output(outputs, batch.resolved_max_num_drafts() + 1), problems


def _coerce(output: SpecOutput, batch: SpecBatch) -> SpecOutput:
    """A malformed output forced into the contract's shapes, so the invariants can point at it."""
    width = batch.resolved_max_num_drafts() + 1
    tokens = torch.full((batch.num_requests, width), -1, dtype=torch.int64)
    raw = output.token_ids.detach().cpu().reshape(batch.num_requests, -1)[:, :width].to(torch.int64)
    tokens[:, : raw.shape[1]] = raw
    emitted = output.num_emitted.detach().cpu().reshape(-1)[: batch.num_requests].to(torch.int32)
    nodes = None
    if batch.tree_parent is not None:
        nodes = torch.full((batch.num_requests, width - 1), -1, dtype=torch.int32)
        given_nodes = output.accepted_nodes
        if given_nodes is not None and given_nodes.numel() % batch.num_requests == 0:
            given = given_nodes.detach().cpu().reshape(batch.num_requests, -1)[:, : width - 1]
            nodes[:, : given.shape[1]] = given.to(torch.int32)
    return SpecOutput(token_ids=tokens, num_emitted=emitted, logprobs=None, accepted_nodes=nodes)


def draw_trials(
    variant: Variant,
    batch: SpecBatch,
    num_trials: int,
    seed: int,
    *,
    draft_token_ids: I64Array | None = None,
    purpose: str = "trials",
    max_elements: int | None = None,
    vary: Literal["seed", "step"] = "seed",
) -> Trials:
    """Run ``variant`` on ``num_trials`` replicas of every request of ``batch`` with fresh seeds.

    The replicas are gathered a call at a time, each call at most ``max_elements`` logits (default:
    what the device's free memory holds, `elements_per_call`). ``seed`` and ``purpose`` (which
    separates the streams of different uses) derive the replicas' seeds. ``draft_token_ids``: the
    replicas' ``[B * N * ...]`` draft ids, request-major (the marginal check draws them from ``q``).
    ``vary="step"`` keeps each request's seed and gives each replica a step of its own instead,
    distinct within the request.
    """
    if num_trials < 1:
        raise ValueError(f"num_trials is {num_trials}; expected at least 1")
    index = np.repeat(np.arange(batch.num_requests), num_trials)
    seeds = trial_seeds(seed, purpose, index.size)
    steps = None
    if vary == "step":
        seeds = batch.seed.detach().cpu().numpy().astype(np.int64)[index]
        steps = distinct_steps(seed, purpose, batch.num_requests, num_trials)
    ids = None if draft_token_ids is None else np.asarray(draft_token_ids, dtype=np.int64)
    budget = max_elements or elements_per_call(batch.device)
    start = time.perf_counter()
    problems: list[str] = []
    outputs = [
        _call(variant, replicas(batch, num_trials, seeds, ids, rows, steps), problems)
        for rows in _chunks(batch, index, budget)
    ]
    output = pad_output(outputs, batch.resolved_max_num_drafts() + 1)
    return Trials(batch, output, num_trials, seeds, ids, time.perf_counter() - start, problems, steps)


def distinct_steps(seed: int, purpose: str, num_requests: int, num_trials: int) -> I64Array:
    """``[num_requests * num_trials]`` steps in ``[0, MAX_STEP)``, distinct within each request."""
    rng = derived_rng(seed, f"{purpose} steps")
    rows = [rng.choice(MAX_STEP, size=num_trials, replace=False) for _ in range(num_requests)]
    return np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Component:
    """One statistical test inside a check: the request and position (``None`` for a whole-request
    test) it tests, its p-value before Holm's adjustment, its statistic (G, or an observed proportion
    for a binomial test), a short description, and ``detail``, which computes its cells and the
    deviation it saw when it turns out decisive (only then: a check runs many tests)."""

    request: int
    position: int | None
    pvalue: float
    statistic: float
    what: str
    detail: Callable[[], Detail] | None = field(default=None, compare=False, repr=False)


def describe_request(batch: SpecBatch | CheckedBatch, request: int) -> str:
    """Request ``request`` in words, with what an author needs to recompute its law by hand:
    ``"request 0: probabilistic, V=12, n=3, drafts [4, 9, 2], T=0.7, seed 5, step 0, one-hot drafts,
    float32 logits"`` (with the synthetic rates, the slot and the arithmetic where they matter)."""
    checked = CheckedBatch.of(batch)
    spec = checked.batch
    start, end = (int(x) for x in spec.cu_num_drafts[request : request + 2].tolist())
    drafts = spec.draft_token_ids[start:end].tolist()
    temperature = float(spec.temperature[request])
    parts = [
        f"request {request}: {spec.method}",
        f"V={spec.vocab_size}",
        f"n={end - start}, drafts {drafts}",
        *([] if spec.tree_parent is None else [f"tree parents {spec.tree_parent[start:end].tolist()}"]),
        "T=0 (greedy)" if temperature == 0 else f"T={temperature:.6g}",
        f"seed {int(spec.seed[request])}",
        f"step {int(spec.step[request])}",
    ]
    if spec.draft_logits is None:
        parts.append("one-hot drafts")
    elif spec.slotted:
        slot = None if spec.draft_slot is None else int(spec.draft_slot[request])
        parts.append(f"slotted draft logits (slot {slot})")
    else:
        parts.append("flat draft logits")
    parts.append(f"{str(spec.target_logits.dtype).removeprefix('torch.')} logits")
    if spec.synthetic_rates is not None and spec.method == "synthetic":
        rates = spec.synthetic_rates.detach().cpu().tolist()[: end - start]
        parts.append(f"synthetic rates {[round(r, 6) for r in rates]}")
    if checked.arithmetic != "log":
        parts.append(f"the law in {checked.arithmetic} arithmetic")
    parts += _filters_in_words(spec, request)
    return ", ".join(parts)


def _filters_in_words(batch: SpecBatch, request: int) -> list[str]:
    """Request ``request``'s sampling parameters in words (only those that filter)."""
    words = []
    if batch.top_k is not None and 0 < int(batch.top_k[request]) < batch.vocab_size:
        words.append(f"top-k {int(batch.top_k[request])}")
    if batch.top_p is not None and float(batch.top_p[request]) < 1.0:
        words.append(f"top-p {float(batch.top_p[request]):.9g}")
    if batch.min_p is not None and float(batch.min_p[request]) > 0.0:
        words.append(f"min-p {float(batch.min_p[request]):.9g}")
    if words and batch.draft_filter:
        words.append("filters applied to the draft logits too (draft_filter)")
    return words


def outcome_label(members: Sequence[int], probability: float, context: str = "") -> str:
    """The tokens of one cell in words: ``"token 7{context}"``, ``"tokens 3, 8{context}"`` (up to three
    named), or ``"12 tokens of total probability 0.031{context}"``."""
    if len(members) == 1:
        return f"token {members[0]}{context}"
    if len(members) <= 3:
        return f"tokens {', '.join(str(i) for i in members)}{context}"
    mass = "probability 0" if probability == 0 else f"total probability {probability:.3g}"
    return f"{len(members)} tokens of {mass}{context}"


def fit_detail(
    fit: stats.GoodnessOfFit, counts: npt.ArrayLike, label: Callable[[stats.FitCell], str]
) -> Detail:
    """The detail of a G-test: its heaviest cells (``label`` names each in words) and the total
    variation seen over its cells (`stats.GoodnessOfFit.observed_tv`)."""
    cells = tuple(
        Cell(label(c), round(c.observed), c.expected, int(c.members.size))
        for c in fit.cells(counts, MAX_CELLS)
    )
    return Detail(cells, fit.observed_tv(counts))


def binomial_detail(
    labels: tuple[str, str], hits: int, num_trials: int, prob: float, others: Sequence[Cell] = ()
) -> Detail:
    """The detail of a binomial test of ``hits`` in ``num_trials`` against ``prob``: the cell tested and
    its complement (``labels``), then ``others`` (cells of the same trials that weigh most), and the
    deviation ``|hits / num_trials - prob|``."""
    cells = [
        Cell(labels[0], hits, num_trials * prob),
        Cell(labels[1], num_trials - hits, num_trials * (1.0 - prob)),
    ]
    return Detail(tuple([*cells, *others][:MAX_CELLS]), abs(hits / num_trials - prob))


def heaviest(cells: Sequence[Cell], limit: int = MAX_CELLS) -> tuple[Cell, ...]:
    """The ``limit`` cells that weigh most in a G statistic over them (`stats.deviance`), heaviest
    first; cells neither expected nor observed are left out."""
    cells = [c for c in cells if c.observed or c.expected]
    shares = stats.deviance([c.observed for c in cells], [c.expected for c in cells])
    return tuple(cells[i] for i in np.argsort(-shares, kind="stable")[:limit])


def pooled_cells(count: int) -> str:
    """``"1 pooled cell"``, ``"7 pooled cells"``."""
    return f"{count} pooled cell{'' if count == 1 else 's'}"


def impossible_note(probs: npt.ArrayLike, counts: npt.ArrayLike, name: Callable[[int], str]) -> str:
    """``"; 800 trials emit outcomes of probability 0 (token 0)"``: the observations where the law
    ``probs`` puts no mass, the first three of those outcomes named by ``name``; empty when none."""
    observed = np.asarray(counts).reshape(-1)
    hit = np.nonzero((np.asarray(probs).reshape(-1) <= 0) & (observed > 0))[0]
    if hit.size == 0:
        return ""
    hit = hit[np.argsort(-observed[hit], kind="stable")]
    named = ", ".join(name(int(i)) for i in hit[:3]) + (f" and {hit.size - 3} more" if hit.size > 3 else "")
    return f"; {int(observed[hit].sum())} trials emit outcomes of probability 0 ({named})"


def impossible_detail(label: str, count: int, num_trials: int) -> Detail:
    """The detail of ``count`` of ``num_trials`` trials falling where no outcome is possible."""
    return Detail((Cell(label, count, 0.0),), count / max(num_trials, 1))


def failed_call(check: str, variant: Variant, error: VariantError, seconds: float = 0.0) -> Verdict:
    """The verdict of a check whose variant call raised or returned something other than a `SpecOutput`."""
    return Verdict(
        check=check,
        status="fail",
        variant=variant.name,
        message=f"{check} FAILS: {error}",
        num_samples=0,
        seconds=seconds,
    )


def exact_verdict(
    check: str,
    variant: Variant,
    *,
    failures: int,
    total: int,
    passed: str,
    failed: str,
    request: int | None = None,
    position: int | None = None,
    samples_per_case: int | None = None,
    trials: int | None = None,
    subject: str | None = None,
    finding: str | None = None,
) -> Verdict:
    """The verdict of an exact check: ``failures`` out of ``total`` samples broke it.

    ``detectable`` is the per-sample rate of a violation seen at least once with probability 0.999
    among ``samples_per_case`` samples (default: all of them); a failure also states the rate seen,
    the request of its first violation in words (``subject``) and that violation (``finding``).
    """
    detectable = Deviation(stats.zero_cell_detectable(samples_per_case or total), "rate per sample")
    seen = Deviation(failures / max(total, 1), "rate per sample") if failures else None
    return Verdict(
        check=check,
        status="fail" if failures else "pass",
        variant=variant.name,
        message=f"{check} FAILS: {failed}" if failures else f"{check} passes: {passed}",
        num_samples=total,
        seconds=0.0,
        trials=trials,
        request=request if failures else None,
        position=position if failures else None,
        statistic=float(failures),
        detectable=detectable,
        subject=subject if failures else None,
        observed=seen,
        finding=finding if failures else None,
    )


# Requests compared by the invariance checks (composition, determinism): the first trials of each.
INVARIANCE_TRIALS = 8


class InvarianceCheck(Check):
    """Two calls on a few trials of every request (`INVARIANCE_TRIALS` at most) give the same tokens,
    counts and logprobs; no statistics. A subclass makes the calls (`outputs`) and names them in
    its messages (``change``: how the calls differ; ``shown``: one request's two outputs)."""

    counts_trials = False
    shares_trials = False
    change: str
    shown: str

    def __init__(self, max_elements: int | None = None) -> None:
        self.max_elements = max_elements

    def outputs(
        self, variant: Variant, subject: SpecBatch, seed: int
    ) -> tuple[SpecOutput, SpecOutput, I64Array, str]:
        """The two outputs, the row of the second holding each request of ``subject``, and how the
        passing message says they were called."""
        raise NotImplementedError

    def verdict(
        self, variant: Variant, checked: CheckedBatch, settings: Settings, trials: Trials | None
    ) -> Verdict:
        """Compare the two calls request by request; ``alpha`` and ``trials`` are unused."""
        batch = checked.batch
        per_request = max(1, min(settings.num_samples, INVARIANCE_TRIALS))
        index = np.repeat(np.arange(batch.num_requests), per_request)
        subject = select_requests(batch, index, seed=trial_seeds(settings.seed, "invariance", index.size))
        first, second, place, same = self.outputs(variant, subject, settings.seed)
        tokens_a, tokens_b = first.token_ids.numpy(), second.token_ids.numpy()[place]
        width = min(tokens_a.shape[1], tokens_b.shape[1])
        differ = (first.num_emitted.numpy() != second.num_emitted.numpy()[place]) | (
            tokens_a[:, :width] != tokens_b[:, :width]
        ).any(axis=1)
        if first.logprobs is not None and second.logprobs is not None:
            lp_a, lp_b = first.logprobs.numpy()[:, :width], second.logprobs.numpy()[place, :width]
            differ |= ~np.isclose(lp_a, lp_b, rtol=1e-6, atol=1e-6, equal_nan=True).all(axis=1)
        failures = np.nonzero(differ)[0]
        r = int(failures[0]) if failures.size else 0
        total = subject.num_requests
        return exact_verdict(
            self.name,
            variant,
            failures=failures.size,
            total=total,
            passed=f"{total} requests give the same output {same}",
            failed=f"{failures.size} of {total} requests change {self.change}; first: request "
            f"{r // per_request} emits {self.shown.format(tokens_a[r].tolist(), tokens_b[r].tolist())}",
            request=r // per_request,
            subject=f"{describe_request(checked, r // per_request)}; its trial {r % per_request} "
            f"with seed {int(subject.seed[r])}"
            if failures.size
            else None,
        )
