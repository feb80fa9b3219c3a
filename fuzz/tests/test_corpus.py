"""The committed regression corpus: each reproducer still fails its mutant and passes correct variants."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from specsample.fuzz.cli import EXIT_FAILED, EXIT_INCONCLUSIVE, EXIT_PASSED, main
from specsample.fuzz.mutants import MUTANTS
from specsample.fuzz.reproducer import load_reproducer

CORPUS = Path(__file__).resolve().parent.parent / "corpus"
REPRODUCERS = sorted(CORPUS.glob("*.json"))


def test_corpus_covers_every_cpu_mutant() -> None:
    """The corpus holds a reproducer for each CPU mutant (and shrunk ones found by random search)."""
    cpu_mutants = {m for m in MUTANTS if not MUTANTS[m].gpu_only}
    assert {load_reproducer(path).variant for path in REPRODUCERS} == cpu_mutants


@pytest.mark.parametrize("path", REPRODUCERS, ids=[p.stem for p in REPRODUCERS])
def test_reproducer_still_fails_its_mutant(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Replaying a reproducer against the variant that failed reproduces the failure."""
    assert main(["replay", str(path), "--device", "cpu"]) == EXIT_FAILED
    capsys.readouterr()


@pytest.mark.parametrize("variant", ["torch", "walk"])
def test_corpus_passes_correct_variants(variant: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Replaying the whole corpus against a correct variant passes every reproducer."""
    assert main(["replay", str(CORPUS), "--variant", variant, "--device", "cpu"]) == EXIT_PASSED, (
        capsys.readouterr().out
    )


def test_a_reproducer_outside_a_variants_capabilities_is_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    """A block reproducer replayed against the PyTorch sampler (no block method) is skipped, not run:
    alone it is inconclusive (exit 3), never a pass or a failure."""
    block = [p for p in REPRODUCERS if load_reproducer(p).batch.method == "block"]
    assert block
    assert main(["replay", str(block[0]), "--variant", "torch", "--device", "cpu"]) == EXIT_INCONCLUSIVE
    assert "skipped: method block lies outside its declared capabilities" in capsys.readouterr().out


FOUND = Path(__file__).resolve().parent.parent / "found"


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a CUDA GPU: the split launch plan the failures came from",
)
@pytest.mark.parametrize("path", sorted(FOUND.glob("*.json")), ids=lambda p: p.stem)
def test_what_the_search_found_in_our_sampler_stays_fixed(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Failures the search found in the Triton sampler on a GPU (fuzz/found/README.md), replayed on a
    GPU, where its split launch plan runs: each passes since its fix."""
    assert main(["replay", str(path), "--device", "cuda"]) == EXIT_PASSED, capsys.readouterr().out
