"""``fuzz mutate``: the operators on a synthetic kernel, usage errors, and a kill matrix end to end."""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from specsample.fuzz import mutate
from specsample.fuzz.cli import EXIT_INCONCLUSIVE, EXIT_PASSED, EXIT_USAGE, main
from specsample.fuzz.mutate import OPERATORS, Mutant, end_children, generate_mutants, jit_functions, run_child

TARGET = Path(__file__).with_name("mutate_target.py")
REPOSITORY = Path(__file__).resolve().parents[2]

# One @triton.jit function that every operator has something to change in, a module constant, and
# a plain function that no operator may touch.
SYNTHETIC = '''"""A module of kernels."""
import triton
import triton.language as tl

LIMIT = tl.constexpr(4)


def helper(x):
    """Not a kernel: never mutated."""
    return x - 1 < LIMIT


@triton.jit
def kernel(x_ptr, out_ptr, n, stride_row, stride_col, BLOCK: tl.constexpr):
    """A kernel touching every operator."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    inside = offs < n
    x = tl.load(x_ptr + row * stride_row + offs * stride_col, mask=inside, other=0.0).to(tl.float32)
    top = tl.max(x, axis=0)
    total = tl.sum(tl.where(inside, x - top, 0.0), axis=0)
    tl.store(out_ptr + row, total / 2.0, mask=row < n)
'''


@pytest.fixture(scope="module")
def synthetic_mutants() -> list[Mutant]:
    return generate_mutants(Path("synthetic.py"), SYNTHETIC, "synthetic.py")


def test_every_operator_mutates_the_synthetic_kernel(synthetic_mutants: list[Mutant]) -> None:
    """Each operator yields at least one mutant of the synthetic kernel, and every mutant parses."""
    assert jit_functions(SYNTHETIC) == ["kernel"]
    by_operator = {m.operator for m in synthetic_mutants}
    assert by_operator == set(OPERATORS)
    for mutant in synthetic_mutants:
        ast.parse(mutant.source(SYNTHETIC))
        assert mutant.source(SYNTHETIC) != SYNTHETIC


def test_a_mutant_diff_names_its_line(synthetic_mutants: list[Mutant]) -> None:
    """A mutant's unified diff has a hunk over its line and removes that line's text."""
    lines = SYNTHETIC.splitlines()
    for mutant in synthetic_mutants:
        diff = mutant.diff(SYNTHETIC)
        hunk = re.search(r"^@@ -(\d+),(\d+) ", diff, re.MULTILINE)
        assert hunk is not None, diff
        first, count = int(hunk.group(1)), int(hunk.group(2))
        assert first <= mutant.line < first + count
        assert f"-{lines[mutant.line - 1]}" in diff.splitlines()
        assert diff.startswith("--- a/synthetic.py\n+++ b/synthetic.py\n")


def test_only_kernel_code_is_mutated(synthetic_mutants: list[Mutant]) -> None:
    """No mutant touches a plain function or a docstring; the module constant is a `<module>` one."""
    helper_lines = range(9, 12)
    assert not [m for m in synthetic_mutants if m.line in helper_lines]
    assert all(m.function in ("kernel", "<module>") for m in synthetic_mutants)
    constant = [m for m in synthetic_mutants if m.function == "<module>"]
    assert {m.change for m in constant} == {"4 -> 0", "4 -> 1"}


def test_specific_operators_change_what_they_name(synthetic_mutants: list[Mutant]) -> None:
    """Strictness, a dropped mask, a program_id axis and a stride swap each change the expected text."""
    changes = {(m.operator, m.change) for m in synthetic_mutants}
    assert ("compare-strict", "offs < n -> (offs <= n)") in changes
    assert ("compare-flip", "offs < n -> (offs >= n)") in changes
    assert ("program-id", "0 -> 1") in changes
    assert ("stride-swap", "stride_row -> stride_col") in changes
    assert ("reduction", "tl.max(x, axis=0) -> tl.min(x, axis=0)") in changes
    assert ("dtype", "tl.float32 -> tl.bfloat16") in changes
    dropped = [m for m in synthetic_mutants if m.operator == "mask-drop" and m.line == 19]
    assert (
        len(dropped) == 1 and "mask=" not in dropped[0].replacement and "other=" not in dropped[0].replacement
    )


def test_mutant_ids_are_stable_and_unique(synthetic_mutants: list[Mutant]) -> None:
    """Generating twice gives the same ids, one per mutant."""
    again = generate_mutants(Path("synthetic.py"), SYNTHETIC, "synthetic.py")
    assert [m.id for m in again] == [m.id for m in synthetic_mutants]
    assert len({m.id for m in synthetic_mutants}) == len(synthetic_mutants)


def test_usage_errors_name_the_argument(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A variant without kernels, an unknown operator, a missing or kernel-free source, an unknown
    mutant id: exit 2 with one line naming the argument and the value."""
    assert main(["mutate", "--variant", "torch", "--device", "cpu"]) == EXIT_USAGE
    assert "--variant is 'torch'" in capsys.readouterr().err
    assert main(["mutate", "--variant", "triton", "--operators", "frobnicate"]) == EXIT_USAGE
    assert "--operators has ['frobnicate']" in capsys.readouterr().err
    spec = f"{TARGET}:PaddedReference"
    assert main(["mutate", "--variant", spec, "--source", str(tmp_path / "none.py")]) == EXIT_USAGE
    assert "--source is" in capsys.readouterr().err
    plain = tmp_path / "plain.py"
    plain.write_text("x = 1\n")
    assert main(["mutate", "--variant", spec, "--source", str(plain)]) == EXIT_USAGE
    assert "defines no @triton.jit function" in capsys.readouterr().err
    assert main(["mutate", "--variant", spec, "--mutant", "nope:1:abcdef", "--device", "cpu"]) == EXIT_USAGE
    assert "--mutant has ['nope:1:abcdef']" in capsys.readouterr().err


def _digests() -> dict[str, str]:
    """The bytes of the test target and of every kernel and example file."""
    files = [
        TARGET,
        *sorted((REPOSITORY / "kernels").glob("*.py")),
        *sorted((REPOSITORY / "examples").glob("*.py")),
    ]
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def test_kill_matrix_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On the small sampler a strictness change is killed, a masked lane's other= is likely
    equivalent and bfloat16 arithmetic is a compile error; the files on disk are unchanged."""
    mutants = generate_mutants(TARGET, TARGET.read_text(), "mutate_target.py")
    by_change = {(m.operator, m.change): m.id for m in mutants}
    killed = by_change[("compare-strict", "columns < emitted -> (columns <= emitted)")]
    equivalent = by_change[("other", "0 -> 1")]
    compile_error = by_change[("dtype", "tl.float32 -> tl.bfloat16")]
    before = _digests()
    out, report = tmp_path / "matrix.md", tmp_path / "matrix.json"
    # 10 s: a CI run whose machine ran 20 to 50 % slower reached 4 batches in 3 s, and not the kill.
    argv = ["mutate", "--variant", f"{TARGET}:PaddedReference", "--device", "cpu"]
    argv += ["--budget-per-mutant", "10"]
    for mutant in (killed, equivalent, compile_error):
        argv += ["--mutant", mutant]
    code = main([*argv, "--out", str(out), "--json", str(report)])
    printed = capsys.readouterr().out
    assert _digests() == before
    assert code == EXIT_PASSED, printed
    verdicts = {m["id"]: m for m in json.loads(report.read_text())["mutants"]}
    assert verdicts[killed]["verdict"] == "killed" and verdicts[killed]["check"]
    assert verdicts[killed]["time_to_kill"] is not None
    assert verdicts[equivalent]["verdict"] == "likely equivalent"
    assert verdicts[equivalent]["details"]["calls"] == verdicts[equivalent]["details"]["equal_calls"] > 0
    assert verdicts[compile_error]["verdict"] == "compile error"
    assert "bf16" in verdicts[compile_error]["message"]
    assert "-m specsample.fuzz mutate --variant" in verdicts[killed]["replay"]
    assert f"--mutant {killed}" in verdicts[killed]["replay"]
    matrix = out.read_text()
    assert "**Score: 1 killed of 1 non-equivalent (100 %)**" in matrix
    assert matrix == printed.rstrip("\n") + "\n"


def test_two_mutants_at_a_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--jobs 2 runs the equivalent and the compile-error mutant side by side (verdicts that do not
    hang on how many trials a shared CPU buys: a kill in 3 s does, so the kill is the test above's);
    the report says so, and nothing scored is exit 3."""
    mutants = generate_mutants(TARGET, TARGET.read_text(), "mutate_target.py")
    by_change = {(m.operator, m.change): m.id for m in mutants}
    equivalent, compile_error = (
        by_change[("other", "0 -> 1")],
        by_change[("dtype", "tl.float32 -> tl.bfloat16")],
    )
    report = tmp_path / "matrix.json"
    argv = ["mutate", "--variant", f"{TARGET}:PaddedReference", "--device", "cpu", "--budget-per-mutant", "3"]
    argv += ["--jobs", "2", "--mutant", equivalent, "--mutant", compile_error, "--json", str(report)]
    assert main(argv) == EXIT_INCONCLUSIVE, capsys.readouterr().out
    written = json.loads(report.read_text())
    assert written["jobs"] == 2 and "2 mutants at a time" in capsys.readouterr().out
    verdicts = {m["id"]: m["verdict"] for m in written["mutants"]}
    assert verdicts == {equivalent: "likely equivalent", compile_error: "compile error"}


def test_a_stop_ends_every_child_of_every_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`end_children` (what a Ctrl-C calls with --jobs) ends the children that threads wait on, and
    any started after it: each comes back crashed by signal 9 within seconds, none is left running."""
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nexec sleep 120\n")
    hang.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(hang))
    monkeypatch.setattr(mutate, "_STOPPING", threading.Event())  # the stop stays in this test
    verdicts: list[dict[str, object]] = []
    threads = [threading.Thread(target=lambda: verdicts.append(run_child({}, 100.0))) for _ in range(3)]
    start = time.monotonic()
    for thread in threads[:2]:
        thread.start()
    deadline = time.monotonic() + 10
    while len(mutate._LIVE) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    end_children()
    threads[2].start()  # started after the stop: ended at once
    for thread in threads:
        thread.join(timeout=20)
    assert not any(thread.is_alive() for thread in threads)
    assert time.monotonic() - start < 20
    assert [v["verdict"] for v in verdicts] == ["crashed"] * 3
    assert all("signal 9" in str(v["message"]) for v in verdicts)
    assert not mutate._LIVE
