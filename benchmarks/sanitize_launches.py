"""Calls of every method, layout and dtype, first through Triton's dispatch, then twice through the
cached launch (on a workspace kept for the plan, then on it again), then under the rows launch plan,
for compute-sanitizer.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool initcheck --show-backtrace no \\
        --error-exitcode 9 python3 -m benchmarks.sanitize_launches [--filtered | --unfiltered]

``--filtered`` runs only the filtered batches at the benchmarks' vocabulary (`FILTERED_CASES`),
which take most of a sanitizer's time; ``--unfiltered`` only the unfiltered ones (`CASES`).

The inputs come from `benchmarks.grid.make_inputs` (normal logits, argmax drafts, a permutation of
slots), which runs no PyTorch kernel that initcheck flags, so the run needs no kernel filter: a
filter that leaves out PyTorch's kernels also leaves out their writes (the counters' zero fill),
and initcheck then reports the reads of those writes.
"""

from __future__ import annotations

import sys

import torch

from specsample.benchmarks.filtered import FILTERS, filtered
from specsample.benchmarks.grid import Case, make_inputs
from specsample.kernels.rejection import rejection_sample

CASES = (
    Case("probabilistic", "fp32", "flat", 1.0, 4, 4, 32000),
    Case("probabilistic", "bf16", "slotted", 1.0, 3, 2, 4097),
    Case("strict", "fp32", "flat", 1.0, 4, 4, 32000),
    Case("synthetic", "fp32", "flat", 1.0, 4, 4, 32000),
    Case("block", "fp32", "flat", 1.0, 4, 4, 32000),
    Case("block", "bf16", "slotted", 1.0, 3, 2, 4097),
    Case("probabilistic", "fp32", "flat", 0.0, 4, 4, 32000),
    Case("probabilistic", "fp32", "flat", 1.0, 1, 4, 128256),
)
# Filtered only: top-p's candidates narrowed before their sort take many rows of many tokens.
FILTERED_CASES = (
    Case("probabilistic", "fp32", "flat", 1.0, 1, 4, 128256),
    Case("probabilistic", "fp32", "flat", 1.0, 16, 4, 128256),
)


def main(argv: list[str] | None = None) -> int:
    """Run each case three times (dispatched, then cached twice) and once under the rows plan, and
    print the tokens emitted per request."""
    arguments = sys.argv[1:] if argv is None else argv
    only_filtered, unfiltered = "--filtered" in arguments, "--unfiltered" in arguments
    for case in () if only_filtered else CASES:
        batch = make_inputs(case, "cuda")
        for _ in range(3):
            output = rejection_sample(batch, plan="split")
        rows = rejection_sample(batch, plan="rows")
        torch.cuda.synchronize()
        print(case.id, output.num_emitted.tolist(), rows.num_emitted.tolist())
    # Filtered batches: the threshold kernel on target rows and, with draft_filter, on draft rows
    # (flat and slotted), with a vocabulary off the tile width; and at the benchmarks' vocabulary,
    # where top-p's first pass is placed and its second skipped (`kernels.filters._few_left`).
    filtered_cases = FILTERED_CASES if only_filtered else (CASES[0], CASES[1], CASES[4], *FILTERED_CASES)
    for case in () if unfiltered else filtered_cases:
        for name, settings in FILTERS.items():
            batch = filtered(make_inputs(case, "cuda"), settings)
            output = rejection_sample(batch, plan="split")
            rows = rejection_sample(batch, plan="rows")
            torch.cuda.synchronize()
            print(case.id, name, output.num_emitted.tolist(), rows.num_emitted.tolist())
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
