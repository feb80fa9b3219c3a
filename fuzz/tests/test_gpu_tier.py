"""GPU tier of the self-test: M23 (int32 row offsets) dies past 2**31 logits; the real kernel does not."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import pytest
import torch

from specsample.fuzz.mutants.m23_int32_offsets import PLANTED

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU and ~9 GB of its memory"
)

# Rows of V = 262144 fp16 logits; rows from 8192 on start past 2**31 elements. Row r peaks at a token of
# its own by 40 nats, so a row read from the wrong place emits the wrong token (with near certainty at
# T = 1, with certainty at T = 0).
PROBE = textwrap.dedent(
    """
    import sys
    import torch
    import specsample.kernels
    from specsample.reference.contract import SpecBatch

    def big_batch():
        rows, vocab = 8192 + 256, 262144
        peaks = (torch.arange(rows, device="cuda") * 7919) % vocab
        logits = torch.zeros(rows, vocab, dtype=torch.float16, device="cuda")
        logits[torch.arange(rows, device="cuda"), peaks] = 40.0
        temperature = torch.where(torch.arange(rows, device="cuda") % 2 == 0, 0.0, 1.0).float()
        batch = SpecBatch(
            target_logits=logits, draft_logits=None,
            draft_token_ids=torch.zeros(0, dtype=torch.int64, device="cuda"),
            cu_num_drafts=torch.zeros(rows + 1, dtype=torch.int32, device="cuda"),
            temperature=temperature, seed=torch.arange(rows, device="cuda"),
            step=torch.zeros(rows, dtype=torch.int64, device="cuda"), max_num_drafts=0)
        return batch, peaks

    batch, peaks = big_batch()
    if sys.argv[1] == "M23":
        from specsample.fuzz.mutants.m23_int32_offsets import Int32Offsets
        variant = Int32Offsets()
    else:
        from specsample.kernels.registry import get
        variant = get("triton")
    tokens = variant(batch).token_ids[:, 0]
    torch.cuda.synchronize()
    wrong = (tokens != peaks).nonzero().flatten()
    print(f"wrong={wrong.numel()} first={wrong[:1].tolist()} past_2_31_from_row=8192")
    """
)


def _probe(variant: str) -> subprocess.CompletedProcess[str]:
    # The probe's 4.4 GB batch needs the memory this process's caching allocator still holds from
    # earlier GPU tests.
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return subprocess.run([sys.executable, "-c", PROBE, variant], capture_output=True, text=True, timeout=600)


def test_m23_plants_on_the_current_kernel() -> None:
    """The production kernel still holds the lines M23 mutates, so the mutant tracks the real code."""
    from specsample.fuzz.mutants.m23_int32_offsets import mutated_launcher

    assert PLANTED
    assert hasattr(mutated_launcher(), "rejection_sample")


@pytest.mark.gpu
@needs_gpu
def test_m23_dies_past_2_31_elements_and_the_kernel_does_not() -> None:
    """Past 2**31 logits the int32 mutant reads the wrong rows (or faults); the production kernel is exact."""
    kernel = _probe("triton")
    assert kernel.returncode == 0, kernel.stderr[-2000:]
    assert "wrong=0 " in kernel.stdout, kernel.stdout
    mutant = _probe("M23")
    faulted = mutant.returncode != 0
    wrong_rows = not faulted and "wrong=0 " not in mutant.stdout
    assert faulted or wrong_rows, mutant.stdout
    if wrong_rows:
        first = int(mutant.stdout.split("first=[")[1].split("]")[0])
        assert first >= 8192, mutant.stdout  # only rows past 2**31 elements go wrong
