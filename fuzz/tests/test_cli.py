"""``python -m fuzz``: exit codes, reproducers that replay, and the listing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsample.fuzz import command as cmdline
from specsample.fuzz.cli import (
    EXIT_FAILED,
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    EXIT_PASSED,
    EXIT_USAGE,
    main,
)


def test_help_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """--help exits 0 on every command; a bad command, option or variant exits 2."""
    for command in ([], ["run"], ["replay"], ["list"], ["mutants"], ["certify"]):
        assert main([*command, "--help"]) == EXIT_PASSED
    assert main(["frobnicate"]) == EXIT_USAGE
    assert main(["run", "--variant", "reference", "--methods", "typical"]) == EXIT_USAGE
    assert main(["run", "--variant", "no_such_variant"]) == EXIT_USAGE
    assert main(["mutants", "M99"]) == EXIT_USAGE
    assert main(["replay", "/no/such/dir/"]) == EXIT_USAGE
    capsys.readouterr()


def test_list_shows_variants_and_mutants(capsys: pytest.CaptureFixture[str]) -> None:
    """`list` names the registered variants and every mutant."""
    assert main(["list"]) == EXIT_PASSED
    out = capsys.readouterr().out
    assert "triton" in out and "torch" in out
    assert all(f"M{i:02d}" in out for i in range(1, 23))


def test_failure_writes_a_reproducer_that_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A mutant's campaign exits 1 with a reproducer; replay fails the same way, and passes on the fix."""
    corpus = tmp_path / "corpus"
    code = main(
        [
            "run",
            "--variant",
            "M04",
            "--methods",
            "probabilistic",
            "--budget",
            "60",
            "--corpus",
            str(corpus),
            "--device",
            "cpu",
            "--no-shrink",
        ]
    )
    assert code == EXIT_FAILED
    files = sorted(corpus.glob("*.json"))
    assert len(files) == 1
    recorded = json.loads(files[0].read_text())
    assert recorded["check"] == "coupled"  # same random numbers: the sample-level check kills first
    assert recorded["replay"] == cmdline.replay(files[0])  # the program as the user ran it
    capsys.readouterr()
    assert main(["replay", str(files[0]), "--device", "cpu"]) == EXIT_FAILED
    assert "FAILED coupled" in capsys.readouterr().out
    assert main(["replay", str(corpus), "--variant", "walk", "--device", "cpu"]) == (EXIT_PASSED)


def test_correct_variant_passes(capsys: pytest.CaptureFixture[str]) -> None:
    """A correct variant's campaign exits 0 when its budget runs out. The search alone
    (``--no-targeted``): on a loaded 2-core machine one run of the targeted cases' checks took 7 s,
    more than the 5 s budget, which leaves no search batch checked and the verdict, rightly,
    INCONCLUSIVE (`test_a_run_that_checks_no_search_batch_is_inconclusive` covers that)."""
    assert main(
        ["run", "--variant", "reference", "--methods", "strict", "--budget", "5", "--device", "cpu",
         "--no-targeted"]
    ) == (EXIT_PASSED)  # fmt: skip
    assert "PASSED: reference" in capsys.readouterr().out


def test_certify_says_when_its_campaign_ran_screens_only(tmp_path: Path) -> None:
    """A campaign too short for any check at the profile's power does not read as a plain PASSED."""
    main(
        ["certify", "--variant", "reference", "--methods", "strict", "--no-mutants", "--budget", "1",
         "--check-budget", "2", "--device", "cpu", "--out", str(tmp_path)]
    )  # fmt: skip
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    campaign = next(line for line in report.splitlines() if line.startswith("Fuzz campaign:"))
    assert "0 checks passed at full power" in campaign
    assert campaign.startswith("Fuzz campaign: PASSED (screens only: no failure found")


def test_certify_over_no_method_it_implements_is_inconclusive(tmp_path: Path) -> None:
    """``certify --variant torch --methods block`` (the PyTorch sampler has no block verification)
    checks nothing: INCONCLUSIVE (exit 3) saying why, never PASSED, and no campaign over methods the
    report lists as not asked for."""
    argv = ["certify", "--variant", "torch", "--methods", "block", "--no-mutants", "--device", "cpu"]
    assert main([*argv, "--out", str(tmp_path)]) == EXIT_INCONCLUSIVE
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert report.startswith("# Certification: INCONCLUSIVE") and "PASSED" not in report
    assert "none of the methods asked for is in its declared capabilities" in report
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["variants"][0]["campaign"]["cases"] == 0


SLOW_SAMPLER = """
import time

from specsample.reference.walk import WalkSampler


class Slow(WalkSampler):
    # The walk, 0.5 s a call whatever its size: a sampler far too slow for a three-second budget.

    def __call__(self, batch):
        time.sleep(0.5)
        return super().__call__(batch)
"""


def test_a_run_that_checks_no_search_batch_is_inconclusive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sampler too slow for its budget checks no search batch: INCONCLUSIVE (exit 3) saying so, never
    PASSED on the targeted cases alone or on nothing; the probe before the first screen sizes the
    screens, so the campaign keeps to its budget instead of running one screen blind."""
    sampler = tmp_path / "slow.py"
    sampler.write_text(SLOW_SAMPLER)
    argv = ["run", "--variant", f"{sampler}:Slow", "--budget", "3", "--device", "cpu"]
    code = main([*argv, "--corpus", str(tmp_path / "corpus")])
    out = capsys.readouterr().out
    assert code == EXIT_INCONCLUSIVE, out
    assert "coverage: no search batch was checked" in out and "INCONCLUSIVE:" in out
    assert "inconclusive: no batch was checked" in out or "inconclusive: no search batch" in out
    assert "over budget" not in out, out


INTERRUPTED_SAMPLER = """
from specsample.reference.walk import WalkSampler


class Interrupted(WalkSampler):
    '''The walk, until its {calls}th call, where the user presses Ctrl-C.'''

    calls = 0

    def __call__(self, batch):
        type(self).calls += 1
        if type(self).calls == {calls}:
            raise KeyboardInterrupt
        return super().__call__(batch)
"""


def test_ctrl_c_keeps_the_work_and_exits_130(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C during ``run`` prints what the campaign did (exit 130, no traceback); during ``certify``
    it writes the partial report, naming where it stopped."""
    sampler = tmp_path / "sampler.py"
    sampler.write_text(INTERRUPTED_SAMPLER.replace("{calls}", "40"))
    run = ["run", "--variant", f"{sampler}:Interrupted", "--budget", "60", "--device", "cpu"]
    assert main([*run, "--corpus", str(tmp_path / "corpus")]) == EXIT_INTERRUPTED
    assert "INTERRUPTED:" in capsys.readouterr().out
    sampler.write_text(INTERRUPTED_SAMPLER.replace("{calls}", "400"))
    out = tmp_path / "report"
    certify = [
        "certify",
        "--variant",
        f"{sampler}:Interrupted",
        "--methods",
        "probabilistic",
        "--device",
        "cpu",
    ]
    assert main([*certify, "--out", str(out), "--check-budget", "5"]) == EXIT_INTERRUPTED
    report = (out / "report.md").read_text()
    assert report.startswith("# Certification: INTERRUPTED") and "Interrupted during" in report
    assert "| invariants |" in report or "the table holds the cases that finished" in report
    # It says what it did not do: here the self-test (certify runs it unless --no-mutants).
    assert "**Interrupted** (Ctrl-C): the self-test did not run." in report
    # --out naming a Markdown file: the report there, its JSON beside it.
    partial = tmp_path / "reports" / "partial.md"
    assert main([*certify, "--out", str(partial), "--check-budget", "5", "--no-mutants"]) == EXIT_INTERRUPTED
    assert "**Interrupted** (Ctrl-C): the tables above hold what finished." in partial.read_text()
    assert json.loads(partial.with_suffix(".json").read_text())["status"] == "interrupted"
    assert sorted(p.name for p in partial.parent.iterdir()) == ["partial.json", "partial.md"]


def test_certify_out_is_a_folder_or_a_markdown_file(tmp_path: Path) -> None:
    """--out names a folder (report.md and report.json in it) or a ``.md`` file (the JSON beside it); a
    folder named like a Markdown file is a usage error before any work."""
    from specsample.fuzz.certify import report_paths

    assert report_paths(Path("ci/report")) == (Path("ci/report/report.md"), Path("ci/report/report.json"))
    assert report_paths(Path("ci/pr-42.md")) == (Path("ci/pr-42.md"), Path("ci/pr-42.json"))
    (tmp_path / "taken.md").mkdir()
    assert main(["certify", "--variant", "torch", "--out", str(tmp_path / "taken.md")]) == EXIT_USAGE
