"""The split plan's kernels compiled for sm_90 without a GPU: registers, stack and spills per kernel.

    python -m benchmarks.resources           # compare with benchmarks/baselines/sm90_resources.json
    python -m benchmarks.resources --save    # record it after a deliberate change

A kernel that spills to local memory is slower, and a GPU is not always at hand to time it (CI has
none). Triton's own ``ptxas`` compiles a kernel for a GPU it does not see, so the spills are visible
here: each case's plan (`kernels.rejection.make_plan`) is compiled for sm_90 with the launch options
and the integer and pointer specialisations a CUDA call would get (16-byte aligned buffers, integers
divisible by 16 where they are), and ``cuobjdump``/``nvdisasm`` read the registers, the stack and
the local loads and stores of each kernel; the filters' launches of a filtered call likewise
(`measure_filters`: the call made on meta-device tensors, its launches recorded, not run, with the
chunks an H100 or H200 would cut). The check fails when a kernel's stack or local accesses
grow over the baseline: one such change (a 64-bit division in the statistics pass's first lines)
spilled strict's statistics pass (136 bytes of stack, 34 local loads) and cost 20 % on an H200.
Timing stays the GPU's job (`benchmarks.gate`); this says only where to look before a GPU is lent.

Run it with ``TRITON_INTERPRET`` unset or ``0``: it needs Triton's compiler, not its interpreter.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from specsample.benchmarks.grid import Case, make_inputs
from specsample.kernels import filters, rejection, rejection_kernels

BASELINE = Path(__file__).parent / "baselines" / "sm90_resources.json"
# The shapes whose statistics passes differ most (strict's sample draw, a tree's tickets, block's
# keep pass; the rows read through thresholds, `kernels.rules.TARGET_ROWS` and `ALL_ROWS`), small
# enough to build on a CPU: each case's `Case` and the plan's ``filtered``.
CASES = {
    "strict B=64 n=4": (Case("strict", "fp32", "flat", 1.0, 64, 4, 128256), 0),
    "probabilistic B=64 n=4": (Case("probabilistic", "fp32", "flat", 1.0, 64, 4, 128256), 0),
    "block B=64 n=4": (Case("block", "fp32", "flat", 1.0, 64, 4, 128256), 0),
    "tree B=16 n=64": (Case("tree", "fp32", "one-hot", 1.0, 16, 64, 128256, depth=8), 0),
    "probabilistic B=64 n=4, filtered": (Case("probabilistic", "fp32", "flat", 1.0, 64, 4, 128256), 1),
    "block B=64 n=4, draft_filter": (Case("block", "fp32", "flat", 1.0, 64, 4, 128256), 2),
}
POINTER_TYPES = {
    torch.float32: "*fp32",
    torch.float16: "*fp16",
    torch.bfloat16: "*bf16",
    torch.float64: "*fp64",
    torch.int32: "*i32",
    torch.int64: "*i64",
}
# The output buffers (`rejection.OUTPUT_BUFFERS`) and the call's own records.
OTHER_POINTERS = {
    "token_ids_ptr": "*i64",
    "logprobs_ptr": "*fp32",
    "num_emitted_ptr": "*i32",
    "accepted_nodes_ptr": "*i32",
    "work_ptr": "*i32",
    "geometry_ptr": "*i64",
}
# The filters' launches (`kernels.filters.filter_thresholds`) of the target rows of a filtered call at
# n = 4, V = 128256 (5 rows a request): which parameters, and the rows.
FILTER_CASES = {
    "filters B=64: top-k 50, top-p 0.9, min-p 0.05": (("top_k", "top_p", "min_p"), 320),
    "filters B=64: top-p 0.9": (("top_p",), 320),
    "filters B=1: top-k 50, top-p 0.9, min-p 0.05": (("top_k", "top_p", "min_p"), 5),
}
FILTER_VOCAB = 128256
# An H100's and an H200's SMs: the filters cut a row into chunks by them (`filters.default_chunks`).
SMS = 132
FIELDS = ("registers", "stack", "local_accesses")


@dataclasses.dataclass(frozen=True)
class Resources:
    """What ``ptxas`` gave one kernel: registers per thread, stack bytes, local loads and stores."""

    registers: int
    stack: int
    local_accesses: int


def _tools() -> Path:
    """The folder of Triton's bundled CUDA tools (``ptxas``, ``cuobjdump``, ``nvdisasm``)."""
    import triton.backends.nvidia as nvidia

    return Path(nvidia.__file__).parent / "bin"


def _signature(kernel: Any, values: Sequence[Any], pointers: dict[str, str]) -> tuple:
    """``(signature, constexprs, attributes)`` of a launch of ``kernel`` with ``values`` (in parameter
    order; tensors, or stand-ins for the parameters ``pointers`` types) as `triton.compile` takes them."""
    unspecialised = {
        kernel.arg_names[x] if isinstance(x, int) else x for x in (kernel.do_not_specialize or ())
    }
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    attributes: dict[tuple[int], list[list[Any]]] = {}
    for i, (name, parameter, value) in enumerate(zip(kernel.arg_names, kernel.params, values, strict=True)):
        # Triton makes an integer of 1 a constant, unless told not to specialise it.
        one = type(value) is int and value == 1 and name not in unspecialised
        if parameter.is_constexpr or one:
            signature[name] = "constexpr"
            constexprs[name] = value
            continue
        if isinstance(value, torch.Tensor):
            signature[name] = POINTER_TYPES[value.dtype]
        elif name in pointers:
            signature[name] = pointers[name]
        else:
            signature[name] = "i64" if abs(value) >= 2**31 else "i32"
        pointer = signature[name].startswith("*")
        divisible = not pointer and name not in unspecialised and value != 0 and value % 16 == 0
        if pointer or divisible:
            attributes[(i,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attributes


def _read(cubin: bytes) -> Resources:
    """Registers and stack (``cuobjdump -res-usage``) and local accesses (``nvdisasm``) of a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        usage = subprocess.run(
            [_tools() / "cuobjdump", "-res-usage", handle.name], capture_output=True, text=True, check=True
        ).stdout
        sass = subprocess.run(
            [_tools() / "nvdisasm", handle.name], capture_output=True, text=True, check=True
        ).stdout
    match = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    if match is None:
        raise RuntimeError(f"cuobjdump -res-usage printed no REG/STACK line: {usage!r}")
    local = len(re.findall(r"\b(?:LDL|STL)\b", sass))
    return Resources(int(match.group(1)), int(match.group(2)), local)


def _compile(
    kernel: Any, values: Sequence[Any], options: dict[str, Any], pointers: dict[str, str]
) -> Resources:
    """The `Resources` of ``kernel`` compiled for sm_90 with ``values`` and launch ``options``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("TRITON_INTERPRET is set: compiling for sm_90 needs Triton's compiler")
    source = ASTSource(kernel, *_signature(kernel, values, pointers))
    return _read(triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["cubin"])


def measure(case: Case, filtered: int = 0) -> dict[str, Resources]:
    """Each kernel of ``case``'s split plan (``filtered`` as `kernels.rejection.make_plan` takes it)
    compiled for sm_90: its `Resources`, by kernel name."""
    batch = make_inputs(case, torch.device("cpu"))
    batch = dataclasses.replace(batch, max_num_drafts=batch.resolved_max_num_drafts())
    plan = rejection.make_plan(batch, filtered)
    buffers = dict(zip(rejection.INPUT_BUFFERS, rejection._batch_tensors(batch), strict=True))
    pointers = {record.parameter: POINTER_TYPES[record.dtype] for record in plan.records if record.parameter}
    pointers.update(OTHER_POINTERS)
    method = rejection.METHODS[batch.method].kernel_code
    out = {}
    for item in plan.launches:
        values = [
            buffers.get(name, value) for name, value in zip(item.kernel.arg_names, item.template, strict=True)
        ]
        options = {key: value for key, value in item.options.items() if key == "num_warps"}
        # The register caps a CUDA call gets (`make_plan` sets them on a GPU only).
        if item.kernel is rejection_kernels.row_stats_kernel:
            options["maxnreg"] = rejection.STATS_MAX_REGISTERS[method]
        elif item.kernel is rejection_kernels.sample_kernel:
            options["maxnreg"] = rejection.SAMPLE_MAX_REGISTERS
        out[item.kernel.__name__] = _compile(item.kernel, values, options, pointers)
    return out


def measure_filters(params: Sequence[str], rows: int) -> dict[str, Resources]:
    """Each launch of `kernels.filters.filter_thresholds` on ``rows`` rows of `FILTER_VOCAB` with the
    sampling parameters ``params``, as a GPU of `SMS` SMs would make it, compiled for sm_90: its
    `Resources`, by kernel name (a second launch of a kernel ``name#2``). The call runs on tensors
    of the meta device (no data, and the GPU's tile sizes), its launches recorded, not run."""
    from triton.runtime.jit import JITFunction

    meta = torch.device("meta")
    launches: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def record(kernel: Any, grid: Any) -> Any:
        return lambda *args, **kwargs: launches.append((kernel, args, kwargs))

    tensors = {
        "top_k": torch.empty(rows, dtype=torch.int32, device=meta),
        "top_p": torch.empty(rows, device=meta),
        "min_p": torch.empty(rows, device=meta),
    }
    logits = torch.empty(rows, FILTER_VOCAB, device=meta)
    block_v = filters.default_block_v(FILTER_VOCAB)
    chunks = filters.default_chunks_for(rows, filters.segments_of(FILTER_VOCAB, block_v), SMS)
    original = JITFunction.__getitem__
    JITFunction.__getitem__ = record  # type: ignore[method-assign]
    try:
        filters.filter_thresholds(
            logits, torch.empty(rows, device=meta), **{name: tensors[name] for name in params},
            check_values=False, plan="split", block_v=block_v, chunks=chunks,
        )  # fmt: skip
    finally:
        JITFunction.__getitem__ = original  # type: ignore[method-assign]
    out = {}
    for kernel, args, kwargs in launches:
        options = {key: kwargs.pop(key) for key in ("num_warps",) if key in kwargs}
        # The register cap a CUDA call gets (`filters._split_plan` sets it on a GPU only).
        if kernel is filters.filter_select_kernel:
            options.update(filters.select_registers(rows, SMS))
        # The arguments after the positional ones come by name.
        named = {**dict(zip(kernel.arg_names, args, strict=False)), **kwargs}
        name = kernel.__name__ if kernel.__name__ not in out else f"{kernel.__name__}#2"
        out[name] = _compile(kernel, [named[arg] for arg in kernel.arg_names], options, {})
    return out


def regressions(measured: dict[str, dict[str, Resources]], baseline: dict[str, Any]) -> list[str]:
    """A line for each kernel whose stack or local accesses grew over ``baseline`` (or is missing
    from it); registers are reported, not gated (a cap decides them)."""
    lines = []
    for case, kernels in measured.items():
        for kernel, resources in kernels.items():
            recorded = baseline.get(case, {}).get(kernel)
            if recorded is None:
                lines.append(f"{case}: {kernel} has no baseline (record one with --save)")
                continue
            for field in ("stack", "local_accesses"):
                now, then = getattr(resources, field), recorded[field]
                if now > then:
                    lines.append(f"{case}: {kernel} {field} {then} -> {now}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--save", action="store_true", help=f"record {BASELINE.name}")
    parser.add_argument("--baseline", type=Path, default=BASELINE, help="the baseline file")
    parser.add_argument("--cases", nargs="*", choices=sorted({*CASES, *FILTER_CASES}), help="a subset")
    args = parser.parse_args(argv)
    names = args.cases or [*CASES, *FILTER_CASES]
    measured = {
        name: measure(*CASES[name]) if name in CASES else measure_filters(*FILTER_CASES[name])
        for name in names
    }
    for name, kernels in measured.items():
        for kernel, resources in kernels.items():
            print(f"{name:34} {kernel:18} " + "  ".join(f"{f} {getattr(resources, f)}" for f in FIELDS))
    table = {
        name: {kernel: dataclasses.asdict(r) for kernel, r in kernels.items()}
        for name, kernels in measured.items()
    }
    if args.save:
        args.baseline.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"recorded {args.baseline}")
        return 0
    lines = regressions(measured, json.loads(args.baseline.read_text()))
    for line in lines:
        print(f"REGRESSED {line}", file=sys.stderr)
    print("FAILED" if lines else "PASSED", f"({len(lines)} regressions against {args.baseline})")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
