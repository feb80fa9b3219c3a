"""The pytest plugin: an engine's test run gains the harness's tests of its sampler with one option."""

from __future__ import annotations

import re
import shlex
import time

import pytest

from specsample.fuzz import command


def test_the_plugin_is_inert_without_its_option(pytester: pytest.Pytester) -> None:
    """A run that does not name a sampler collects nothing of the plugin's, and lists its options."""
    pytester.makepyfile("def test_nothing():\n    assert True\n")
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    help_text = pytester.runpytest_subprocess("--help").stdout.str()
    assert "--specsample-variant" in help_text and "never re-run until it passes" in help_text


def test_a_correct_sampler_passes_and_a_planted_bug_fails(pytester: pytest.Pytester) -> None:
    """The walk passes a test per targeted case and the search; M03 (an unclamped residual) fails one."""
    options = ("--specsample-profile", "ci", "-q", "-p", "no:cacheprovider")
    correct = pytester.runpytest_subprocess("--specsample-variant", "walk", *options)
    outcomes = correct.parseoutcomes()
    from specsample.fuzz.targeted import targeted_batches
    from specsample.reference.walk import WalkSampler

    # One test per targeted case inside the walk's capabilities (the filtered ones too), and the search.
    expected = len(targeted_batches(capabilities=WalkSampler.capabilities)) + 1
    assert outcomes.get("passed", 0) == expected and "failed" not in outcomes, correct.stdout.str()
    planted = pytester.runpytest_subprocess("--specsample-variant", "M03", "-x", *options)
    assert planted.parseoutcomes().get("failed") == 1, planted.stdout.str()
    assert "law_of_y FAILS" in planted.stdout.str()
    # The failure names the command that replays it; that command selects exactly the failed test.
    replay = re.search(r"replay: (.+ -k '([^']+)')$", planted.stdout.str(), re.MULTILINE)
    assert replay is not None, planted.stdout.str()
    # The interpreter and module the user ran, and the options that size the checks.
    program = f"{shlex.quote(command.python())} -m pytest"
    assert replay.group(1).startswith(f"{program} --specsample-variant M03 --specsample-profile ci -k "), (
        replay
    )
    again = pytester.runpytest_subprocess(*shlex.split(replay.group(1))[3:], "-q", "-p", "no:cacheprovider")
    assert again.parseoutcomes().get("failed") == 1 and "passed" not in again.parseoutcomes()


def test_a_bad_variant_spec_is_a_usage_error(pytester: pytest.Pytester) -> None:
    """A file or attribute that does not exist: pytest's usage error (exit 4), one line naming the
    option and the spec, no INTERNALERROR traceback."""
    pytester.makepyfile(sampler="class Nothing:\n    pass\n")
    for spec in ("missing.py:Sampler", "sampler.py:Absent", "sampler.py:Nothing"):
        result = pytester.runpytest_subprocess("--specsample-variant", spec, "-p", "no:cacheprovider")
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stderr.str()
        errors = result.stderr.str()
        assert "INTERNALERROR" not in errors and "Traceback" not in errors, errors
        assert "--specsample-variant: variant spec" in errors and spec.split(":")[0] in errors, errors


SLOW_SAMPLER = """
import time

from specsample.reference.walk import WalkSampler


class Slow:
    name = "slow"
    streams = None

    def __init__(self):
        self.inner = WalkSampler()
        self.capabilities = getattr(self.inner, "capabilities", None)

    def __call__(self, batch):
        time.sleep(30)  # a sampler that hangs
        return self.inner(batch)
"""


def test_a_hanging_sampler_fails_at_the_timeout(pytester: pytest.Pytester) -> None:
    """A call past ``--specsample-timeout`` fails its test, naming the timeout, in about that time."""
    pytester.makepyfile(sampler=SLOW_SAMPLER)
    options = ("--specsample-timeout", "0.5", "-q", "-p", "no:cacheprovider", "-x")
    result = pytester.runpytest_subprocess("--specsample-variant", "sampler.py:Slow", *options)
    assert result.parseoutcomes().get("failed") == 1, result.stdout.str()
    assert "ran past --specsample-timeout 0.5 s" in result.stdout.str()
    assert result.duration < 25, result.duration  # not the 30 s the call would take


def test_a_spent_budget_skips_rather_than_passes(pytester: pytest.Pytester) -> None:
    """With ``--specsample-budget`` spent, the remaining tests skip saying so; none passes on nothing."""
    options = ("--specsample-budget", "0", "-q", "-p", "no:cacheprovider", "-rs")
    result = pytester.runpytest_subprocess("--specsample-variant", "walk", *options)
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) >= 2 and "passed" not in outcomes, result.stdout.str()
    assert "--specsample-budget 0 s spent" in result.stdout.str()


# A sampler whose calls cost 2 ms per row: the checks of a targeted case at the ci profile's 2000
# trials take tens of seconds, a few hundred trials a second or less.
ROW_COST_SAMPLER = """
import time

from specsample.reference.walk import WalkSampler


class PerRow:
    name = "per-row"
    streams = None

    def __init__(self):
        self.inner = WalkSampler()
        self.capabilities = self.inner.capabilities

    def __call__(self, batch):
        time.sleep(2e-3 * batch.num_requests)
        return self.inner(batch)
"""
BUDGET = 8.0
# What the subprocess spends outside the budget's clock: starting Python, importing torch and the
# harness, collecting; generous for a shared 2-core runner.
STARTUP_GRACE = 20.0


def test_a_slow_sampler_keeps_the_budget_and_the_search_runs(pytester: pytest.Pytester) -> None:
    """With ``--specsample-budget``, a slow sampler's tests are sized to their share: the run ends
    within the budget plus 10 %, the cases that ran fewer trials than the profile's are inconclusive
    (skipped, saying so, never passed), and the search checks batches rather than skipping."""
    # Before the fix the first case ran its 2000 trials (about 60 s) and every later test skipped.
    pytester.makepyfile(sampler=ROW_COST_SAMPLER)
    options = (
        "--specsample-budget",
        f"{BUDGET:g}",
        "--specsample-profile",
        "ci",
        "-rsp",
        "-p",
        "no:cacheprovider",
    )
    began = time.monotonic()
    result = pytester.runpytest_subprocess("--specsample-variant", "sampler.py:PerRow", *options)
    took = time.monotonic() - began
    out = result.stdout.str()
    assert took < BUDGET * 1.1 + STARTUP_GRACE, (took, out)
    spent = re.search(r"specsample: ([0-9.]+) s of --specsample-budget 8 s", out)
    assert spent is not None and float(spent.group(1)) <= BUDGET * 1.1, out
    assert "over budget" not in out, out
    outcomes = result.parseoutcomes()
    assert "failed" not in outcomes, out
    # The search ran and found nothing: it passed, the only test to (the cases lacked the power).
    assert re.search(r"PASSED .*sampler\.py:PerRow\[search\]", out), out
    assert outcomes.get("passed") == 1, out
    assert re.search(r"inconclusive at \d+ of the profile's 2000 trials per request", out), out
    assert "spent before this test" not in out, out
