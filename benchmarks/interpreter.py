"""Requests per second of the Triton sampler under the Triton interpreter, per method and launch plan.

    TRITON_INTERPRET=1 python3 -m benchmarks.interpreter [--plans rows split] [--repeats 5]

Each batch holds 200 requests of n = 3 drafts with flat draft logits at T = 1 (the shape of the
interpreter's target: at least 500 requests per second at V <= 1000); each figure is 200 over the
median time of ``--repeats`` calls after one untimed call. The split plan, the GPU's, takes about
16 s a call: ask for it with ``--plans rows split``. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from specsample.kernels.rejection import KERNEL_METHODS, LAUNCH_PLANS, rejection_sample
from specsample.reference.contract import RequestData, SpecBatch, make_batch

NUM_REQUESTS, NUM_DRAFTS = 200, 3
VOCAB_SIZES = (12, 100, 1000)


def batch(method: str, vocab_size: int) -> SpecBatch:
    """200 requests of 3 drafts drawn uniformly, Gaussian logits, distinct seeds."""
    rng = np.random.default_rng(vocab_size)
    requests = [
        RequestData(
            rng.normal(size=(NUM_DRAFTS + 1, vocab_size)) * 2,
            rng.integers(0, vocab_size, NUM_DRAFTS),
            rng.normal(size=(NUM_DRAFTS, vocab_size)) * 2,
            1.0,
            seed=seed,
        )
        for seed in range(NUM_REQUESTS)
    ]
    return make_batch(requests, method=method, synthetic_rates=[0.8] * NUM_DRAFTS)  # type: ignore[arg-type]


def requests_per_second(spec: SpecBatch, plan: str, repeats: int) -> float:
    """200 over the median time of ``repeats`` calls, after one untimed call."""
    rejection_sample(spec, plan=plan)
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        rejection_sample(spec, plan=plan)
        times.append(time.perf_counter() - begin)
    return spec.num_requests / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", nargs="+", choices=LAUNCH_PLANS, default=["rows"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        print("set TRITON_INTERPRET=1: this measures the Triton interpreter", file=sys.stderr)
        return 2
    print(f"B={NUM_REQUESTS}, n={NUM_DRAFTS}, flat drafts, T=1; requests a second, median of {args.repeats}")
    print()
    print("| plan | method | " + " | ".join(f"V={v}" for v in VOCAB_SIZES) + " |")
    print("|---|---|" + "---:|" * len(VOCAB_SIZES))
    for plan in args.plans:
        for method in KERNEL_METHODS:
            rates = [requests_per_second(batch(method, v), plan, args.repeats) for v in VOCAB_SIZES]
            print(f"| {plan} | {method} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
