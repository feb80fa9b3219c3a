"""A pytest plugin for engine CI: the harness's checks on your sampler, inside your own test run.

Installed with the project (the ``pytest11`` entry point ``specsample``), it is inert until asked::

    pytest --specsample-variant engine.sampling:MySampler --specsample-profile ci

adds one test per targeted case inside the sampler's declared capabilities (every check that
applies, at the profile's trials) and one Hypothesis search over generated batches (the profile's
examples), all marked ``specsample``. A failed check fails its test with the verdict and how to
replay it; an inconclusive one (too little power to decide) skips, saying why. Hypothesis and the
harness are imported only when the option is given. A spec that names nothing usable is a usage
error (pytest's exit code 4, one line), before anything is collected.

Time: ``--specsample-timeout SECONDS`` (default 600; 0 turns it off) bounds every call of the
sampler: a call that runs longer fails its test with the call's duration, and a call that cannot be
interrupted (stuck in native code) ends the run after twice the timeout with every thread's stack
printed. ``--specsample-budget SECONDS`` bounds the plugin's tests together, within `GRACE` of it:
the targeted cases share `TARGETED_SHARE` of it and the search the rest, as in ``run``. Each test's
trials are sized to its share of the time left (`fuzz.budget.CostModel`, learned from the session's
runs; the first measured with a probe, `fuzz.budget.affordable_samples`). A case that ran fewer
trials than the profile asks and saw nothing wrong is inconclusive, and skips saying so; one whose
share affords fewer than `FEWEST_TRIALS` skips, saying what it would need; the search screens each
batch with the trials its share affords, as ``run`` does, and does not shrink a failure (Hypothesis's
shrinker draws batches past any deadline). The terminal summary gives the time spent,
and, past the grace, why (one run of the checks is never cut short).

The replay line of a failure names the interpreter (``python -m pytest``, `fuzz.command.python`) and
the options that size the checks, so that it runs as printed and selects the failed test.

A failed statistical test is never re-run until it passes: each verdict's false-failure rate is
stated (1e-6 per assertion), so a failure is evidence about the sampler, and re-running it until
it passes throws that evidence away. Fix the sampler or replay the failure.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

VARIANT_OPTION = "--specsample-variant"
PROFILE_OPTION = "--specsample-profile"
TIMEOUT_OPTION = "--specsample-timeout"
BUDGET_OPTION = "--specsample-budget"
DEFAULT_TIMEOUT_SECONDS = 600.0
NO_RERUN = (
    "a failed statistical test is never re-run until it passes: its false-failure rate is stated, "
    "so a failure is evidence; replay it or fix the sampler"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    """The plugin's two options."""
    group = parser.getgroup("specsample", "speculative-decoding sampler checks (specsample)")
    group.addoption(
        VARIANT_OPTION,
        metavar="SPEC",
        help="check this sampler: package.module:NAME, path/to/file.py:NAME or a registered name; "
        f"adds the harness's tests to the run. Note: {NO_RERUN}",
    )
    group.addoption(
        PROFILE_OPTION,
        default="ci",
        metavar="PROFILE",
        help="trials, examples and sizes: ci, dev, gpu or nightly (default: ci)",
    )
    group.addoption(
        TIMEOUT_OPTION,
        type=float,
        default=DEFAULT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="fail a sampler call that runs longer than this (default: 600; 0: no limit)",
    )
    group.addoption(
        BUDGET_OPTION,
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds for the plugin's tests together: each test's trials are sized to its share of the "
        "time left (fewer than the profile's: inconclusive, skipped)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker; resolve the sampler spec, so that a bad one is a usage error at once."""
    config.addinivalue_line("markers", f"specsample: the harness's checks of {VARIANT_OPTION} ({NO_RERUN})")
    spec = config.getoption(VARIANT_OPTION)
    if not spec:
        return
    from specsample.fuzz.spec import SpecError, load_variant
    from specsample.properties import profiles

    for option in (TIMEOUT_OPTION, BUDGET_OPTION):
        value = config.getoption(option)
        if value is not None and not 0 <= value < float("inf"):
            raise pytest.UsageError(f"{option} is {value}; expected a finite number of seconds >= 0")
    profile = config.getoption(PROFILE_OPTION)
    if profile not in profiles.PROFILES:
        raise pytest.UsageError(
            f"{PROFILE_OPTION} is {profile!r}; expected one of {', '.join(profiles.PROFILES)}"
        )
    try:
        variant = load_variant(spec)
    except SpecError as error:
        raise pytest.UsageError(f"{VARIANT_OPTION}: {error}") from None
    state = _State(Timed(variant, config.getoption(TIMEOUT_OPTION)), config.getoption(BUDGET_OPTION))
    if state.budget is not None:
        from specsample.fuzz.budget import CostModel

        state.cost = CostModel()
    config.stash[_STATE] = state


class VariantTimeout(Exception):
    """A sampler call ran past ``--specsample-timeout``."""


class Timed:
    """The sampler, each call bounded by ``seconds`` (0: unbounded): past it the call is interrupted
    with `VariantTimeout` (a signal on the main thread), which fails the check that made it; a call
    stuck where no signal reaches it ends the process after twice ``seconds``, every thread's stack
    printed (`faulthandler`)."""

    def __init__(self, variant: Any, seconds: float) -> None:
        self.variant, self.seconds = variant, seconds
        self.name, self.streams = variant.name, variant.streams
        if hasattr(variant, "capabilities"):
            self.capabilities = variant.capabilities

    def __call__(self, batch: Any) -> Any:
        import faulthandler
        import signal
        import threading

        if not self.seconds or threading.current_thread() is not threading.main_thread():
            return self.variant(batch)
        began = time.monotonic()

        def expire(signum: int, frame: Any) -> None:
            raise VariantTimeout(
                f"a call of {self.name} on {batch.num_requests} requests (V={batch.vocab_size}) ran "
                f"past {TIMEOUT_OPTION} {self.seconds:g} s ({time.monotonic() - began:.0f} s)"
            )

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        faulthandler.dump_traceback_later(2 * self.seconds, exit=True)
        try:
            return self.variant(batch)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            faulthandler.cancel_dump_traceback_later()
            signal.signal(signal.SIGALRM, previous)


@dataclass
class _State:
    """The resolved sampler, the budget's deadline (set when the first test starts), and what the
    session's runs of the checks cost (`fuzz.budget.CostModel`, set when a budget is given)."""

    variant: Timed
    budget: float | None
    deadline: float | None = None
    cost: Any = None
    finished: float | None = None
    longest: tuple[float, str] = (0.0, "")
    reduced: list[str] = field(default_factory=list)

    def left(self) -> float:
        """Seconds of the budget left (infinite without one); the clock starts at the first call."""
        if self.budget is None:
            return float("inf")
        if self.deadline is None:
            self.deadline = time.monotonic() + self.budget
        return self.deadline - time.monotonic()

    def trials_within(self, batch: Any, seconds: float, wanted: int) -> int:
        """The trials per request, at most ``wanted``, whose checks of ``batch`` take about ``seconds``.

        Sized as ``run`` sizes its screens: by the cost model of the session's runs. Before the first,
        the sampler's cost per trial is measured as ``certify`` measures it (one untimed call, then
        `FIRST_SCREEN_TRIALS` trials per request timed twice), so that a slow sampler's first test is
        sized for its share rather than run blind.
        """
        from specsample.fuzz.budget import FIRST_SCREEN_TRIALS, affordable_samples

        if self.budget is None:
            return wanted
        if not self.cost.runs:
            probe_trials = min(wanted, FIRST_SCREEN_TRIALS)
            probe = affordable_samples(
                self.variant, [batch], wanted, seconds, _device(), probe_trials=probe_trials
            )
            self.cost.record(probe.seconds_for(probe_trials), probe_trials, batch)
        return int(self.cost.trials_within(seconds, batch, wanted))

    def record(self, name: str, seconds: float, trials: int, batch: Any) -> None:
        """Learn from a run of the checks of ``batch`` at ``trials`` that took ``seconds``."""
        if self.cost is not None:
            self.cost.record(seconds, trials, batch)
        self.longest = max(self.longest, (seconds, name))

    def overrun(self) -> str | None:
        """Why the plugin's tests ran past the budget plus `GRACE`, or ``None`` when they did not."""
        from specsample.fuzz.campaign import FEWEST_TRIALS, GRACE

        if self.budget is None or self.deadline is None or self.finished is None:
            return None
        spent = self.finished - (self.deadline - self.budget)
        if spent <= self.budget * (1 + GRACE):
            return None
        seconds, name = self.longest
        return (
            f"ran {spent:.1f} s on a {self.budget:g} s budget: one run of the checks took {seconds:.1f} s "
            f"({name}, at least {FEWEST_TRIALS} trials per request), and a run is never cut short"
        )


_STATE = pytest.StashKey[_State]()


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Add the harness's tests when ``--specsample-variant`` is given."""
    spec = config.getoption(VARIANT_OPTION)
    if spec:
        items.extend(SpecsampleSuite.from_parent(session, name="specsample", spec=spec).collect())


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """With ``--specsample-budget``: the time the plugin's tests took, the tests that ran fewer trials
    than the profile asks, and why the budget was overrun, if it was."""
    state = config.stash.get(_STATE, None)
    if state is None or state.budget is None or state.deadline is None or state.finished is None:
        return
    spent = state.finished - (state.deadline - state.budget)
    line = f"specsample: {spent:.1f} s of {BUDGET_OPTION} {state.budget:g} s"
    if state.reduced:
        line += f"; {len(state.reduced)} ran fewer trials than the profile asks: {', '.join(state.reduced)}"
    terminalreporter.write_line(line)
    if reason := state.overrun():
        terminalreporter.write_line(f"specsample: over budget: {reason}")


class SpecsampleSuite(pytest.Collector):
    """The harness's tests of one sampler: one per targeted case, and one search."""

    def __init__(self, *, spec: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec

    def collect(self) -> Iterator[pytest.Item]:
        """One item per targeted case inside the sampler's capabilities, then the search."""
        from specsample.fuzz.targeted import targeted_batches
        from specsample.properties import profiles
        from specsample.reference.contract import capabilities

        profile = profiles.get(self.config.getoption(PROFILE_OPTION))
        variant = self.config.stash[_STATE].variant
        for name, batch in targeted_batches(capabilities=capabilities(variant)):
            # A name that `-k` can select: no spaces.
            case = re.sub(r"[^\w.+-]+", "-", name)
            yield CaseItem.from_parent(
                self, name=f"{self.spec}[{case}]", variant=variant, batch=batch, profile=profile
            )
        yield SearchItem.from_parent(self, name=f"{self.spec}[search]", variant=variant, profile=profile)


class _Item(pytest.Item):
    def __init__(self, *, variant: Any, profile: Any, batch: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.variant, self.profile, self.batch = variant, profile, batch
        self.add_marker("specsample")

    @property
    def state(self) -> _State:
        return self.config.stash[_STATE]

    def runtest(self) -> None:
        """Run the test; the budget's clock stops when it ends."""
        try:
            self.check()
        finally:
            self.state.finished = time.monotonic()

    def check(self) -> None:
        raise NotImplementedError

    def budget_left(self) -> float:
        """Seconds of ``--specsample-budget`` left; skips the test when none is."""
        left = self.state.left()
        if left <= 0:
            pytest.skip(f"{BUDGET_OPTION} {self.config.getoption(BUDGET_OPTION):g} s spent before this test")
        return left

    def variant_spec(self) -> str:
        """The sampler's spec as the user gave it."""
        return self.parent.spec if isinstance(self.parent, SpecsampleSuite) else str(self.variant.name)

    def replay(self) -> str:
        """The command that runs this test again, as the user ran the plugin: the interpreter, ``-m
        pytest``, and the options that size the checks."""
        from specsample.fuzz.command import python

        spec, profile = self.variant_spec(), self.profile.name
        words = [python(), "-m", "pytest", VARIANT_OPTION, spec, PROFILE_OPTION, profile]
        timeout = self.config.getoption(TIMEOUT_OPTION)
        if timeout != DEFAULT_TIMEOUT_SECONDS:
            words += [TIMEOUT_OPTION, f"{timeout:g}"]
        if self.state.budget is not None:
            words += [BUDGET_OPTION, f"{self.state.budget:g}"]
        return " ".join(shlex.quote(word) for word in [*words, "-k", self.name])

    def judge(self, verdicts: list[Any], replay: str, reduced: str = "") -> None:
        """Fail on a failed verdict, skip on an inconclusive one, pass otherwise; ``reduced`` says why
        fewer trials than the profile's ran."""
        failed = [v for v in verdicts if v.failed]
        if failed:
            lines = [line for v in failed for line in v.explain()]
            raise AssertionError("\n".join([*lines, f"replay: {replay}", f"({NO_RERUN})"]))
        inconclusive = [v for v in verdicts if v.status == "inconclusive"]
        if inconclusive and reduced:
            names = ", ".join(v.check for v in inconclusive)
            pytest.skip(f"inconclusive {reduced}: {names} saw nothing wrong, without the profile's power")
        if inconclusive:
            pytest.skip("inconclusive: " + "; ".join(v.message for v in inconclusive))

    def reportinfo(self) -> tuple[str, int | None, str]:
        return __file__, None, self.name


class CaseItem(_Item):
    """Every check on one targeted case, at the profile's trials or as many as its share affords."""

    def share(self, left: float) -> float:
        """This case's share of the ``left`` seconds: the cases still to run share `TARGETED_SHARE` of
        the budget and what the search leaves, the search (when it is to run) keeps the rest."""
        from specsample.fuzz.campaign import TARGETED_SHARE

        mine = [item for item in self.session.items if isinstance(item, _Item)]
        later = mine[mine.index(self) :] if self in mine else [self]
        cases = sum(isinstance(item, CaseItem) for item in later)
        budget = self.state.budget or 0.0
        search = (1 - TARGETED_SHARE) * budget if any(isinstance(i, SearchItem) for i in later) else 0.0
        return (left - search) / max(cases, 1)

    def check(self) -> None:
        """Run the checks with the trials the case's share affords."""
        from specsample.fuzz.campaign import FEWEST_TRIALS
        from specsample.properties.batching import on_device
        from specsample.properties.checks import run_checks

        left = self.budget_left()
        wanted = self.profile.num_samples
        batch = on_device(self.batch, _device())
        share = self.share(left)
        trials = self.state.trials_within(batch, share, wanted)
        budget = f"{BUDGET_OPTION} {self.state.budget or 0:g} s"  # read only when a budget sized the trials
        if share <= 0:
            pytest.skip(
                f"{budget}: the targeted cases' share is spent; the {left:.1f} s left are the search's"
            )
        if trials < FEWEST_TRIALS:
            need = self.state.cost.seconds_for(batch, FEWEST_TRIALS)
            pytest.skip(
                f"{budget}: this case's share ({share:.1f} s of {left:.1f} s left) affords {trials} trials "
                f"per request; the checks need at least {FEWEST_TRIALS} (about {need:.1f} s)"
            )
        began = time.monotonic()
        verdicts = run_checks(
            self.variant, batch, num_samples=trials, alpha=self.profile.alpha, required_samples=wanted
        )
        self.state.record(self.name, time.monotonic() - began, trials, batch)
        reduced = ""
        if trials < wanted:
            self.state.reduced.append(f"{self.name.removeprefix(self.variant_spec())} ({trials})")
            need = self.state.cost.seconds_for(batch, wanted)
            reduced = (
                f"at {trials} of the profile's {wanted} trials per request ({budget}: this case's share "
                f"was {share:.1f} s; its full trials take about {need:.0f} s)"
            )
        self.judge(verdicts, self.replay(), reduced)


class SearchItem(_Item):
    """Hypothesis search over generated batches inside the sampler's capabilities."""

    def check(self) -> None:
        """Run the checks on the profile's number of generated batches, each with the trials its share
        of the time left affords (at most the profile's); Hypothesis shrinks a failure when no budget
        bounds the run."""
        from hypothesis import Phase, given, settings
        from hypothesis import strategies as st

        from specsample.fuzz.campaign import FEWEST_TRIALS, batch_fingerprint
        from specsample.properties import strategies
        from specsample.properties.checks import run_checks
        from specsample.reference.contract import capabilities

        profile = self.profile
        deadline = time.monotonic() + self.budget_left()
        budget = self.state.budget
        # Within a budget a failure is not shrunk: Hypothesis's shrinker draws batches on and on, past
        # any deadline. A failing batch seen again (Hypothesis's final replay) fails again without a run.
        phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
        phases += [Phase.shrink] if budget is None else []
        batches = strategies.spec_batches(
            profile=profile.name, capabilities=capabilities(self.variant), device=_device()
        )

        checked, tried = 0, 0
        failures: dict[tuple[int, str], tuple[list[Any], str]] = {}
        used: list[int] = []

        @settings(max_examples=profile.variant_examples, deadline=None, print_blob=True, phases=phases)
        @given(batch=batches, seed=st.integers(0, 2**31 - 1))
        def search(batch: Any, seed: int) -> None:
            nonlocal checked, tried
            now = time.monotonic()
            key = (seed, batch_fingerprint(batch))
            if key in failures:
                self.judge(*failures[key])
            if now > deadline:
                return  # the budget is spent: the remaining examples are no-ops
            tried += 1
            share = (deadline - now) / max(profile.variant_examples - tried + 1, 1)
            trials = self.state.trials_within(batch, share, profile.num_samples)
            if trials < FEWEST_TRIALS:
                return  # too large a batch for the time left
            checked += 1
            began = time.monotonic()
            verdicts = run_checks(self.variant, batch, num_samples=trials, alpha=profile.alpha, seed=seed)
            self.state.record(self.name, time.monotonic() - began, trials, batch)
            used.append(trials)
            failed = [v for v in verdicts if v.failed]
            replay = (
                f"{self.replay()} (its batch: the @reproduce_failure blob below; check seed {seed}, "
                f"{trials} trials per request)"
            )
            if failed:
                failures[key] = (failed, replay)
            self.judge(failed, replay)

        search()
        if not checked:
            left = f"{max(deadline - time.monotonic(), 0):.1f} s"
            pytest.skip(
                f"{BUDGET_OPTION} {budget:g} s: no batch the search drew could have {FEWEST_TRIALS} trials "
                f"per request in its share of the {left} left"
            )
        if min(used) < profile.num_samples:
            self.state.reduced.append(f"[search] ({checked} batches, {min(used)}-{max(used)})")


def _device() -> str:
    """Where the checked batches live: the GPU when there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
