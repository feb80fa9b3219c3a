"""Compile the Triton specialisations a benchmark grid needs, in parallel processes, before timing it.

    python3 -m benchmarks.precompile --grid full [--jobs 16]

The full grid needs a few hundred specialisations of the sampler's kernels (Triton specialises
integer arguments on ``== 1`` and ``% 16 == 0``, on top of the constexpr method, layout and vocab
tiling); compiled one after another they would take longer than the timing itself. Each worker
calls the ``triton`` variant once per compile-equivalent case, and Triton's on-disk cache
(``TRITON_CACHE_DIR``, default ``~/.triton/cache``) hands the results to the timed run, which then
only loads them. Nothing is timed here, and skipping this step changes no result, only how long
the run takes.

Compile-equivalent cases shrink every batch above 1 to 16 requests: the row, draft and slot counts
stay multiples of 16 and the vocabulary and draft count are unchanged, so the launcher passes the
same specialisation with a fraction of the memory. A launcher that chose its configuration from
the batch size would make some of these miss, which costs time in the timed run, never correctness.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch

from specsample.benchmarks.grid import GATE_CASES, SMOKE_CASES, Case, full_grid, make_inputs
from specsample.kernels import registry

COMPILE_BATCH = 16
GRIDS = {"gate": GATE_CASES, "full": None, "smoke": SMOKE_CASES}


def compile_equivalent(case: Case) -> Case:
    """``case`` with a batch of 1 kept and any larger batch shrunk to 16 requests."""
    return dataclasses.replace(case, batch=1 if case.batch == 1 else COMPILE_BATCH)


def _warm(cases: Sequence[Case], variant_name: str) -> int:
    variant = registry.get(variant_name)
    for case in cases:
        variant(make_inputs(case, "cuda"))
    torch.cuda.synchronize()
    return len(cases)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python3 -m benchmarks.precompile", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--grid", choices=sorted(GRIDS), default="gate")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--variant", default="triton")
    args = parser.parse_args(argv)
    cases = GRIDS[args.grid] or full_grid()
    unique = list(dict.fromkeys(compile_equivalent(case) for case in cases))
    jobs = max(1, min(args.jobs, len(unique)))
    # Contiguous slices of the grid's order share dtype, batch and vocab, so the kernels that depend
    # on little else (the final-row sampling) compile in few workers rather than in all of them.
    size = -(-len(unique) // jobs)
    chunks = [unique[i : i + size] for i in range(0, len(unique), size)]
    start = time.perf_counter()
    # spawn: a forked child would inherit the parent's CUDA state, which CUDA forbids.
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        warmed = sum(pool.map(_warm, chunks, [args.variant] * len(chunks)))
    seconds = time.perf_counter() - start
    print(f"precompiled {warmed} compile-equivalent cases in {seconds:.1f} s with {jobs} jobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
