"""Filtered verification timed on a GPU: what the sampling parameters cost the Triton sampler.

``python -m benchmarks.filtered [--out PATH]`` times probabilistic verification at ``n = 4``,
``V = 128256``, fp32, ``T = 1``, flat drafts (the grid's inputs, `benchmarks.grid.make_inputs`) at
``B = 1`` and ``B = 64``, with: no filter; top-k 50, top-p 0.9 and min-p 0.05 on every request; top-p
0.9 alone; the three filters on half the requests (a mixed batch); and the three filters with
``draft_filter`` (the draft rows filtered too). Each call is timed cold (L2 flushed, the GPU held busy
while the host enqueues it, `benchmarks.timing.ColdCallTimer`), median of ``--repeats``, against the
floor of reading the target and draft logits once at the copy bandwidth measured on the same GPU. It
also times the filter alone (`kernels.filters.filter_thresholds` on the target rows), so the table says
where the time goes. Prints a Markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from specsample.benchmarks.grid import Case, make_inputs, min_bytes
from specsample.benchmarks.timing import ColdCallTimer, cuda_timing, gpu_description
from specsample.kernels.filters import filter_thresholds
from specsample.kernels.rejection import rejection_sample
from specsample.reference.contract import SpecBatch

FILTERS = {
    "none": {},
    "top-k 50, top-p 0.9, min-p 0.05": {"top_k": 50, "top_p": 0.9, "min_p": 0.05},
    "top-p 0.9": {"top_p": 0.9},
    "half the requests: top-k 50, top-p 0.9, min-p 0.05": {
        "top_k": 50,
        "top_p": 0.9,
        "min_p": 0.05,
        "half": True,
    },
    "top-k 50, top-p 0.9, min-p 0.05, draft_filter": {
        "top_k": 50,
        "top_p": 0.9,
        "min_p": 0.05,
        "drafts": True,
    },
}


def filtered(batch: SpecBatch, settings: dict[str, Any]) -> SpecBatch:
    """``batch`` with the sampling parameters of ``settings`` (on every request, or on every other one)."""
    if not settings:
        return batch
    b, device = batch.num_requests, batch.device
    on = torch.ones(b, dtype=torch.bool, device=device)
    if settings.get("half"):
        on[1::2] = False
    params: dict[str, torch.Tensor | None] = {"top_k": None, "top_p": None, "min_p": None}
    if "top_k" in settings:
        params["top_k"] = torch.where(on, settings["top_k"], 0).to(torch.int32)
    if "top_p" in settings:
        params["top_p"] = torch.where(on, settings["top_p"], 1.0).to(torch.float32)
    if "min_p" in settings:
        params["min_p"] = torch.where(on, settings["min_p"], 0.0).to(torch.float32)
    return dataclasses.replace(batch, draft_filter=bool(settings.get("drafts")), **params)  # type: ignore[arg-type]


def cold_median(timer: ColdCallTimer, fn: Any, repeats: int) -> float:
    """The median GPU time of ``repeats`` cold calls of ``fn``, in seconds (after two warm-up calls)."""
    fn()
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        seconds, dispatch, _ = timer.probe(fn)
        timer.hold_for_dispatch(dispatch)
        times.append(seconds)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.filtered", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=None, help="write the measurements as JSON here")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    args = parser.parse_args(argv)
    timing = cuda_timing()
    if timing is None:
        return 2
    device, timer, ceilings = timing
    rows = []
    for b in args.batches:
        case = Case("probabilistic", "fp32", "flat", 1.0, b, 4, 128256)
        base = make_inputs(case, device)
        floor = min_bytes(case) / ceilings.copy_bytes_per_s
        for name, settings in FILTERS.items():
            batch = filtered(base, settings)
            seconds = cold_median(timer, lambda batch=batch: rejection_sample(batch), args.repeats)
            filter_seconds = None
            if batch.filtered:
                rows_t = base.target_logits.shape[0]
                owner = torch.arange(b, device=device).repeat_interleave(5)
                kwargs = {
                    k: None if getattr(batch, k) is None else getattr(batch, k)[owner]
                    for k in ("top_k", "top_p", "min_p")
                }
                temperature = batch.temperature[owner]
                assert owner.shape[0] == rows_t
                filter_seconds = cold_median(
                    timer,
                    lambda logits=base.target_logits, t=temperature, kw=kwargs: filter_thresholds(
                        logits, t, **kw, check_values=False
                    ),
                    args.repeats,
                )
            rows.append(
                {
                    "batch": b,
                    "filters": name,
                    "us": seconds * 1e6,
                    "filter_us": None if filter_seconds is None else filter_seconds * 1e6,
                    "floor_us": floor * 1e6,
                    "x_floor": seconds / floor,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    print()
    name = gpu_description(device)["name"]
    print(f"{name}, n=4, V=128256, fp32, T=1, flat drafts; cold L2, median of {args.repeats}")
    print()
    print("| B | filters | sampler (us) | of it, thresholds of the target rows (us) | floor (us) | x floor |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        filt = "" if r["filter_us"] is None else f"{r['filter_us']:.1f}"
        cells = [
            str(r["batch"]),
            r["filters"],
            f"{r['us']:.1f}",
            filt,
            f"{r['floor_us']:.1f}",
            f"{r['x_floor']:.2f}",
        ]
        print("| " + " | ".join(cells) + " |")
    if args.out is not None:
        args.out.write_text(json.dumps({"gpu": gpu_description(device), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
