"""Tree verification timed on a GPU: the Triton sampler on EAGLE-2-like trees against their floor.

``python -m benchmarks.trees [--out PATH]`` times method ``"tree"`` on the grid's tree cases
(`benchmarks.grid.TREES`: 16, 32 and 64 nodes, depth 5, 6 and 8) at ``B`` of ``--batches``, fp32,
``T = 1`` and ``T = 0``, ``V`` of ``--vocabs`` (the grid's inputs, `benchmarks.grid.make_inputs`).
Each call is timed cold (L2 flushed, the GPU held busy while the host enqueues it,
`benchmarks.timing.ColdCallTimer`), median of ``--repeats``, against the floor of reading each
node's target row once (`benchmarks.grid.min_bytes`) at the copy bandwidth measured on the same GPU.
Prints a Markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specsample.benchmarks.filtered import cold_median
from specsample.benchmarks.grid import TREES, Case, make_inputs, min_bytes, specialise
from specsample.benchmarks.timing import cuda_timing, gpu_description
from specsample.kernels.rejection import rejection_sample


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trees", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="write the measurements as JSON here")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[128256])
    args = parser.parse_args(argv)
    timing = cuda_timing()
    if timing is None:
        return 2
    device, timer, ceilings = timing
    rows = []
    for vocab in args.vocabs:
        for b in args.batches:
            for nodes, depth in TREES:
                base = make_inputs(Case("tree", "fp32", "one-hot", 1.0, b, nodes, vocab, depth=depth), device)
                for temperature in (1.0, 0.0):
                    case = Case("tree", "fp32", "one-hot", temperature, b, nodes, vocab, depth=depth)
                    batch = specialise(base, case)
                    output = rejection_sample(batch)
                    seconds = cold_median(timer, lambda batch=batch: rejection_sample(batch), args.repeats)
                    floor = min_bytes(case) / ceilings.copy_bytes_per_s
                    rows.append(
                        {
                            "case": case.id,
                            "batch": b,
                            "nodes": nodes,
                            "depth": depth,
                            "vocab": vocab,
                            "temperature": temperature,
                            "us": seconds * 1e6,
                            "floor_us": floor * 1e6,
                            "x_floor": seconds / floor,
                            "mean_emitted": float(output.num_emitted.float().mean()),
                        }
                    )
                    print(json.dumps(rows[-1]), flush=True)
                del base
    print()
    name = gpu_description(device)["name"]
    print(f"{name}, fp32, no draft logits, EAGLE-2-like trees; cold L2, median of {args.repeats}")
    print(f"copy bandwidth {ceilings.copy_bytes_per_s / 1e9:.0f} GB/s")
    print()
    print("| V | B | nodes | depth | T | tree (us) | floor (us) | x floor | mean emitted |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['vocab']} | {r['batch']} | {r['nodes']} | {r['depth']} | {r['temperature']:g} "
            f"| {r['us']:.1f} | {r['floor_us']:.1f} | {r['x_floor']:.2f} | {r['mean_emitted']:.2f} |"
        )
    if args.out is not None:
        args.out.write_text(json.dumps({"gpu": gpu_description(device), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
