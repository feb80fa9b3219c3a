"""Progress lines: what is done, of how much, and the time left; nothing when disabled."""

from __future__ import annotations

import re
import sys

import pytest

from specsample.fuzz.progress import Progress


def test_plain_lines_give_counts_and_eta_without_tqdm(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without tqdm, each update prints done/total, elapsed and an ETA; close adds nothing new."""
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    with Progress("certify x", 4, "cases", every=0.0) as bar:
        for case in range(4):
            bar.update(case=case)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4
    assert re.fullmatch(r"\[certify x\] 2/4 cases \(50%\), \d+s elapsed, ETA \d+s \(case=1\)", lines[1])
    assert lines[-1].startswith("[certify x] 4/4 cases (100%)")


def test_time_budget_advances_to_seconds_spent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A time budget counts seconds; it never shows more than its total."""
    monkeypatch.setitem(sys.modules, "tqdm", None)
    bar = Progress("fuzz x", 10.0, "s", every=0.0)
    bar.advance_to(25.0, cases=3)
    bar.close()
    assert capsys.readouterr().err.splitlines() == [bar.line(bar.last)]
    assert bar.done == 10.0 and "10/10 s (100%)" in bar.line()


def test_disabled_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """``enabled=False`` (the library default inside checks) writes nothing, with or without tqdm."""
    with Progress("quiet", 3, "cases", enabled=False) as bar:
        bar.update(3, case="last")
    assert capsys.readouterr().err == ""


def test_tqdm_bar_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """With tqdm (a dependency), the bar goes to standard error with its total and postfix."""
    with Progress("mutants", 2, "mutants") as bar:
        bar.update(last="M01 killed")
        bar.update(last="M02 killed")
    err = capsys.readouterr().err
    assert "mutants" in err and "2/2" in err and "M02 killed" in err
