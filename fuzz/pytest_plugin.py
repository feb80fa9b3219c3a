"""A pytest plugin for engine CI: the harness's checks on your sampler, inside your own test run.

Installed with the project (the ``pytest11`` entry point ``specsample``), it is inert until asked::

    pytest --specsample-variant engine.sampling:MySampler --specsample-profile ci

adds one test per targeted case inside the sampler's declared capabilities (every check that
applies, at the profile's trials) and one Hypothesis search over generated batches (the profile's
examples), all marked ``specsample``. A failed check fails its test with the verdict and how to
replay it; an inconclusive one (too little power to decide) skips, saying why. Hypothesis and the
harness are imported only when the option is given.

A failed statistical test is never re-run until it passes: each verdict's false-failure rate is
stated (1e-6 per assertion), so a failure is evidence about the sampler, and re-running it until
it passes throws that evidence away. Fix the sampler or replay the failure.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

VARIANT_OPTION = "--specsample-variant"
PROFILE_OPTION = "--specsample-profile"
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


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker."""
    config.addinivalue_line("markers", f"specsample: the harness's checks of {VARIANT_OPTION} ({NO_RERUN})")


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
        from specsample.fuzz.spec import load_variant
        from specsample.fuzz.targeted import targeted_batches
        from specsample.properties import profiles
        from specsample.reference.contract import capabilities

        profile = profiles.get(self.config.getoption(PROFILE_OPTION))
        variant = load_variant(self.spec)
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

    def judge(self, verdicts: list[Any], replay: str) -> None:
        """Fail on a failed verdict, skip on an inconclusive one, pass otherwise."""
        failed = [v for v in verdicts if v.failed]
        if failed:
            lines = [v.message for v in failed]
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
        batches = strategies.spec_batches(
            profile=profile.name, capabilities=capabilities(self.variant), device=_device()
        )

        @settings(max_examples=profile.variant_examples, deadline=None, print_blob=True)
        @given(batch=batches, seed=st.integers(0, 2**31 - 1))
        def search(batch: Any, seed: int) -> None:
            verdicts = run_checks(
                self.variant, batch, num_samples=profile.num_samples, alpha=profile.alpha, seed=seed
            )
            self.judge(
                [v for v in verdicts if v.failed], f"the @reproduce_failure blob below (check seed {seed})"
            )

        search()


def _device() -> str:
    """Where the checked batches live: the GPU when there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
