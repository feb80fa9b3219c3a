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
printed. ``--specsample-budget SECONDS`` bounds the plugin's tests together: the search stops
drawing batches when it is spent, and a test that would start after it skips, saying so.

A failed statistical test is never re-run until it passes: each verdict's false-failure rate is
stated (1e-6 per assertion), so a failure is evidence about the sampler, and re-running it until
it passes throws that evidence away. Fix the sampler or replay the failure.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
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
        help="seconds for the plugin's tests together: the search stops and later tests skip when spent",
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
    config.stash[_STATE] = _State(
        Timed(variant, config.getoption(TIMEOUT_OPTION)), config.getoption(BUDGET_OPTION)
    )


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
    """The resolved sampler and the budget's deadline (set when the first test starts)."""

    variant: Timed
    budget: float | None
    deadline: float | None = None

    def left(self) -> float:
        """Seconds of the budget left (infinite without one); the clock starts at the first call."""
        if self.budget is None:
            return float("inf")
        if self.deadline is None:
            self.deadline = time.monotonic() + self.budget
        return self.deadline - time.monotonic()


_STATE = pytest.StashKey[_State]()


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Add the harness's tests when ``--specsample-variant`` is given."""
    spec = config.getoption(VARIANT_OPTION)
    if spec:
        items.extend(SpecsampleSuite.from_parent(session, name="specsample", spec=spec).collect())


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

    def budget_left(self) -> float:
        """Seconds of ``--specsample-budget`` left; skips the test when none is."""
        left = self.config.stash[_STATE].left()
        if left <= 0:
            pytest.skip(f"{BUDGET_OPTION} {self.config.getoption(BUDGET_OPTION):g} s spent before this test")
        return left

    def judge(self, verdicts: list[Any], replay: str) -> None:
        """Fail on a failed verdict, skip on an inconclusive one, pass otherwise."""
        failed = [v for v in verdicts if v.failed]
        if failed:
            lines = [line for v in failed for line in v.explain()]
            raise AssertionError("\n".join([*lines, f"replay: {replay}", f"({NO_RERUN})"]))
        inconclusive = [v for v in verdicts if v.status == "inconclusive"]
        if inconclusive:
            pytest.skip("inconclusive: " + "; ".join(v.message for v in inconclusive))

    def reportinfo(self) -> tuple[str, int | None, str]:
        return __file__, None, self.name


class CaseItem(_Item):
    """Every check on one targeted case, at the profile's trials."""

    def runtest(self) -> None:
        """Run the checks."""
        from specsample.properties.batching import on_device
        from specsample.properties.checks import run_checks

        self.budget_left()
        batch = on_device(self.batch, _device())
        verdicts = run_checks(
            self.variant, batch, num_samples=self.profile.num_samples, alpha=self.profile.alpha
        )
        spec = self.parent.spec if isinstance(self.parent, SpecsampleSuite) else self.variant.name
        self.judge(verdicts, f"pytest {VARIANT_OPTION} {spec} -k '{self.name}'")


class SearchItem(_Item):
    """Hypothesis search over generated batches inside the sampler's capabilities."""

    def runtest(self) -> None:
        """Run the checks on the profile's number of generated batches; Hypothesis shrinks a failure."""
        from hypothesis import given, settings
        from hypothesis import strategies as st

        from specsample.properties import strategies
        from specsample.properties.checks import run_checks
        from specsample.reference.contract import capabilities

        profile = self.profile
        deadline = time.monotonic() + self.budget_left()
        batches = strategies.spec_batches(
            profile=profile.name, capabilities=capabilities(self.variant), device=_device()
        )

        checked = 0

        @settings(max_examples=profile.variant_examples, deadline=None, print_blob=True)
        @given(batch=batches, seed=st.integers(0, 2**31 - 1))
        def search(batch: Any, seed: int) -> None:
            nonlocal checked
            if time.monotonic() > deadline:
                return  # the budget is spent: the remaining examples are no-ops
            checked += 1
            verdicts = run_checks(
                self.variant, batch, num_samples=profile.num_samples, alpha=profile.alpha, seed=seed
            )
            self.judge(
                [v for v in verdicts if v.failed], f"the @reproduce_failure blob below (check seed {seed})"
            )

        search()
        if not checked:
            pytest.skip(f"{BUDGET_OPTION} spent before the search checked a batch")


def _device() -> str:
    """Where the checked batches live: the GPU when there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
