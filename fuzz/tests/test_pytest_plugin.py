"""The pytest plugin: an engine's test run gains the harness's tests of its sampler with one option."""

from __future__ import annotations

import re

import pytest


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

    expected = len(targeted_batches()) + 1  # one test per targeted case, and the search
    assert outcomes.get("passed", 0) == expected and "failed" not in outcomes, correct.stdout.str()
    planted = pytester.runpytest_subprocess("--specsample-variant", "M03", "-x", *options)
    assert planted.parseoutcomes().get("failed") == 1, planted.stdout.str()
    assert "law_of_y FAILS" in planted.stdout.str()
    # The failure names the command that replays it; that command selects exactly the failed test.
    replay = re.search(r"replay: pytest --specsample-variant M03 -k '([^']+)'", planted.stdout.str())
    assert replay is not None, planted.stdout.str()
    again = pytester.runpytest_subprocess("--specsample-variant", "M03", "-k", replay.group(1), *options)
    assert again.parseoutcomes().get("failed") == 1 and "passed" not in again.parseoutcomes()
