"""Every misuse of ``python -m fuzz`` exits 2 with a message naming what is wrong, never a traceback;
a machine that fails a call is an environment error, not a sampler failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsample.fuzz.cli import EXIT_USAGE, main

BROKEN_VARIANT = "raise RuntimeError('this module does not import')\n"
MEMORY_VARIANT = """
from specsample.reference.walk import WalkSampler


class OutOfMemory(WalkSampler):
    name = "oom"

    def __call__(self, batch):
        raise MemoryError("out of memory: tried to allocate 270.00 GiB")
"""


CORPUS = Path(__file__).resolve().parent.parent / "corpus"


def _tampered(change: str) -> str:
    """A committed reproducer, changed: an unknown check, a shape its data does not fill, draft logits
    of another vocabulary than the target's."""
    data = json.loads(next(CORPUS.glob("M03-*.json")).read_text())
    if change == "check":
        data["check"] = "law_of_z"
    elif change == "shape":
        data["batch"]["target_logits"]["shape"][0] += 1
    elif change == "vocab":
        draft = data["batch"]["draft_logits"]
        rows, vocab = draft["shape"]
        draft["data"] = [x for r in range(rows) for x in [*draft["data"][r * vocab : (r + 1) * vocab], 0.0]]
        draft["shape"] = [rows, vocab + 1]
    return json.dumps(data)


def _files(tmp_path: Path) -> dict[str, str]:
    """The files the cases name, by placeholder: ``{broken}`` is a variant file that fails to import."""
    contents = {
        "broken.py": BROKEN_VARIANT,
        "oom.py": MEMORY_VARIANT,
        "malformed.json": "{not json",
        "empty.json": "{}",
        "list.json": "[1, 2]",
        "unknown_check.json": _tampered("check"),
        "bad_shape.json": _tampered("shape"),
        "two_vocabs.json": _tampered("vocab"),
        "a_file": "",
    }
    for name, text in contents.items():
        (tmp_path / name).write_text(text)
    return {name.split(".")[0]: str(tmp_path / name) for name in contents}


# (argv with {file} placeholders, a word the message must contain)
USAGE_CASES = [
    (["run", "--variant", "torch", "--budget", "-1"], "--budget"),
    (["run", "--variant", "torch", "--budget", "nan"], "--budget"),
    (["run", "--variant", "torch", "--device", "tpu"], "--device"),
    (["run", "--variant", "torch", "--device", "cuda:x"], "--device"),
    (["run", "--variant", "torch", "--workers", "0"], "--workers"),
    (["run", "--variant", "no_such_variant"], "no_such_variant"),
    (["run", "--variant", "{broken}:Sampler"], "fails to import"),
    (["run", "--variant", "specsample.reference.walk:NoSuchName"], "NoSuchName"),
    (["run", "--variant", "torch", "--methods", "greedy"], "--methods"),
    (["run", "--variant", "torch", "--profile", "weekly"], "--profile"),
    (["replay", "{malformed}"], "not a reproducer"),
    (["replay", "{empty}"], "not a reproducer"),
    (["replay", "/no/such/reproducer.json"], "does not exist"),
    (["mutants", "M99"], "M99"),
    (["mutants", "--rounds", "-2"], "--rounds"),
    (["certify", "--methods", "bogus"], "--methods"),
    (["certify", "--check-budget", "0"], "--check-budget"),
    (["certify", "--variant", "{broken}:Sampler"], "fails to import"),
    # Methods outside the sampler's declared capabilities: nothing to check is a usage error for run.
    (["run", "--variant", "examples/engine_adapter.py:EngineAdapter", "--methods", "strict"], "--methods"),
    (["run", "--variant", "torch", "--methods", "block"], "declares only"),
    # Reproducers that are not: a JSON list, an unknown check, a tampered shape, two vocabularies.
    (["replay", "{list}"], "JSON list"),
    (["replay", "{unknown_check}"], "law_of_z"),
    (["replay", "{bad_shape}"], "batch field target_logits: shape ["),
    (["replay", "{two_vocabs}"], "vocab size"),
    # Outputs that cannot be written are refused before any work.
    (["certify", "--variant", "torch", "--out", "{a_file}"], "--out"),
    (["certify", "--variant", "torch", "--out", "/proc/no/such/dir"], "--out"),
    (["run", "--variant", "torch", "--corpus", "{a_file}"], "--corpus"),
    (["mutants", "M01", "--json", "/proc/no/such/file.json"], "--json"),
]


@pytest.mark.parametrize(("argv", "word"), USAGE_CASES, ids=[" ".join(a) for a, _ in USAGE_CASES])
def test_misuse_exits_2_naming_the_problem(
    argv: list[str], word: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command exits 2 and its message names the argument or value at fault."""
    files = _files(tmp_path)
    assert main([arg.format(**files) for arg in argv]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert word in captured.err + captured.out
    assert "Traceback" not in captured.err


def test_an_environment_error_is_not_a_sampler_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A call that runs out of memory exits 2, says it is the environment's, and writes no reproducer."""
    files = _files(tmp_path)
    corpus = tmp_path / "corpus"
    code = main(["run", "--variant", f"{files['oom']}:OutOfMemory", "--corpus", str(corpus), "--budget", "5"])
    assert code == EXIT_USAGE
    assert "environment error" in capsys.readouterr().err
    assert not corpus.exists() or not any(corpus.iterdir())


def test_the_issue_spelling_of_the_search_alone_parses() -> None:
    """``mutants --blind --no-targeted`` is accepted (every mutant's campaign is blind already): the
    spelling the self-test's documentation and issues use for the search alone."""
    from specsample.fuzz.cli import build_parser

    args = build_parser().parse_args(["mutants", "M31", "--blind", "--no-targeted", "--budget", "5"])
    assert args.blind and args.no_targeted and args.ids == ["M31"]


def test_an_interrupted_campaign_says_so_and_not_that_the_budget_ran_out() -> None:
    """Ctrl-C before any search batch: the reason given is the interrupt, not a budget the targeted
    cases took; without the interrupt, the budget is the reason."""
    from specsample.fuzz.campaign import CampaignResult

    stopped = CampaignResult("v", screen_trials=[32, 32], seconds=4.0, budget=60.0, interrupted=True)
    reasons = stopped.inconclusive_reasons()
    assert reasons[0] == "interrupted after 4 s of a 60 s budget"
    assert not any("no search batch" in r for r in reasons)
    spent = CampaignResult("v", screen_trials=[32, 32], seconds=60.0, budget=60.0)
    assert any("no search batch was checked" in r for r in spent.inconclusive_reasons())
