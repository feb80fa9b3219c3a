"""The GPU agreement tier of the Triton sampler at large sizes, and a set for compute-sanitizer.

Run from the repository root on a CUDA machine::

    python3 -m properties.gpu_tier                 # large sizes and the case past 2**31 logits
    python3 -m properties.gpu_tier --sanitize      # a small representative set for compute-sanitizer

Each large case draws LLM-like logits on the GPU (Gaussian bulk, a heavy head of a few dozen
tokens, drafts from a perturbed copy of the target, a few NaN, ``-inf`` and ``+inf`` rows,
placeholders and out-of-range ids, greedy and sampled requests mixed), samples once, and checks
every request with the harness: the hard invariants (`properties.checks.invariants`) and coupled
agreement with the walk (`properties.checks.coupled`); it prints one line of counts per case.
Latency lives in `benchmarks/`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import triton

from specsample.kernels.rejection import KERNEL_METHODS as METHODS
from specsample.kernels.rejection import rejection_sample
from specsample.properties.batching import select_requests
from specsample.properties.checks.coupled import Agreement, agreement
from specsample.properties.checks.invariants import violations
from specsample.reference.contract import SpecBatch, SpecOutput

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Case:
    """One batch shape: method, draft layout (``one-hot``, ``flat`` or ``slotted``), dtype, sizes."""

    method: str
    layout: str
    dtype: str
    vocab_size: int
    num_requests: int
    num_drafts: int
    greedy_share: float = 0.25
    odd_rows: bool = True
    ragged: bool = True

    @property
    def label(self) -> str:
        """A short name for tables."""
        return (
            f"{self.method[:5]:5} {self.layout:7} {self.dtype} V={self.vocab_size:<6} "
            f"B={self.num_requests:<3} n={self.num_drafts:<2}"
        )


def make_case_batch(case: Case, seed: int) -> SpecBatch:
    """A batch of ``case``'s shape with LLM-like logits, ragged draft counts and odd values."""
    device = "cuda"
    gen = torch.Generator(device=device).manual_seed(seed)
    cpu = torch.Generator().manual_seed(seed)
    vocab_size, num_requests, max_n = case.vocab_size, case.num_requests, case.num_drafts
    counts = torch.randint(0, max_n + 1, (num_requests,), generator=cpu)
    if not case.ragged:
        counts[:] = max_n
    counts[0] = max_n
    cu = torch.zeros(num_requests + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(counts, 0)
    num_rows, num_draft_rows = int(cu[-1]) + num_requests, int(cu[-1])
    target = torch.randn(num_rows, vocab_size, generator=gen, device=device) * 2.0
    head = torch.randint(0, vocab_size, (num_rows, 32), generator=gen, device=device)
    target.scatter_add_(1, head, torch.rand(num_rows, 32, generator=gen, device=device) * 12.0)
    request_of_row = torch.repeat_interleave(torch.arange(num_requests), counts + 1)
    first_row = torch.repeat_interleave(cu[:-1].long() + torch.arange(num_requests), counts + 1)
    position_of_row = torch.arange(num_rows) - first_row
    is_draft_row = position_of_row < counts[request_of_row]
    draft_rows = is_draft_row.nonzero().squeeze(1).to(device)
    draft = target[draft_rows] + torch.randn(num_draft_rows, vocab_size, generator=gen, device=device)
    temperature = torch.rand(num_requests, generator=cpu) * 1.3 + 0.2
    temperature[torch.rand(num_requests, generator=cpu) < case.greedy_share] = 0.0
    # Drafts drawn from q (at a floor temperature for greedy requests), as a drafter would.
    draft_temperature = temperature.clamp(min=0.05)[request_of_row[is_draft_row]].to(device)
    ids = torch.multinomial(torch.softmax(draft / draft_temperature[:, None], 1), 1, generator=gen).squeeze(1)
    if case.odd_rows and num_draft_rows:
        odd = torch.rand(num_draft_rows, generator=cpu)
        ids[(odd < 0.04).to(device)] = -1
        ids[((odd >= 0.04) & (odd < 0.05)).to(device)] = vocab_size + 3
    if case.odd_rows:
        target[0, :7] = float("nan")
        target[min(1, num_rows - 1), 5] = float("inf")
        target[num_rows - 1] = float("-inf")
        if num_draft_rows:
            draft[0, 3] = float("nan")
            draft[num_draft_rows - 1, : vocab_size // 2] = float("-inf")
    dtype = DTYPES[case.dtype]
    draft_logits: torch.Tensor | None = draft.to(dtype)
    draft_slot = None
    if case.layout == "one-hot":
        draft_logits = None
    elif case.layout == "slotted":
        capacity = max_n + 1
        slots = torch.randperm(num_requests + 3, generator=cpu)[:num_requests]
        buffer = torch.full((num_requests + 3, capacity, vocab_size), -3.0, dtype=dtype, device=device)
        for b in range(num_requests):
            start, end = int(cu[b]), int(cu[b + 1])
            buffer[int(slots[b]), : end - start] = draft_logits[start:end]  # type: ignore[index]
        draft_logits, draft_slot = buffer, slots.to(device)
    return SpecBatch(
        target_logits=target.to(dtype),
        draft_logits=draft_logits,
        draft_token_ids=ids.to(torch.int64),
        cu_num_drafts=cu.to(device),
        temperature=temperature.to(device),
        seed=torch.randint(-(2**62), 2**62, (num_requests,), generator=cpu).to(device),
        step=torch.randint(0, 2**32, (num_requests,), generator=cpu).to(device),
        method=case.method,  # type: ignore[arg-type]
        synthetic_rates=torch.linspace(0.9, 0.5, max(max_n, 1), dtype=torch.float64, device=device),
        draft_slot=draft_slot,
        max_num_drafts=max_n,
    )


def large_cases() -> Iterator[Case]:
    """Every method and layout at vocabularies 32000 to 262144, B up to 256, n up to 16."""
    layouts = ("flat", "slotted", "one-hot")
    dtypes = ("fp32", "bf16", "fp16")
    shapes = ((32000, 256, 16), (128256, 64, 8), (151936, 32, 4), (262144, 16, 16))
    k = 0
    for vocab_size, num_requests, num_drafts in shapes:
        for method in METHODS:
            layout = layouts[k % 3] if method == "probabilistic" else layouts[(k + 1) % 3]
            yield Case(method, layout, dtypes[k % 3], vocab_size, num_requests, num_drafts)
            k += 1
    for layout in layouts:
        yield Case("probabilistic", layout, "fp32", 128256, 64, 4)


def sanitize_cases() -> Iterator[Case]:
    """A small set touching every kernel path: methods, layouts, dtypes, split and tile edges."""
    for method in METHODS:
        for layout in ("flat", "slotted", "one-hot"):
            yield Case(method, layout, "bf16" if layout == "slotted" else "fp32", 5000, 4, 3)
    yield Case("probabilistic", "flat", "fp16", 4096 * 33 + 5, 2, 2)
    yield Case("strict", "flat", "fp32", 4096 * 33 + 5, 2, 2)
    yield Case("probabilistic", "slotted", "fp32", 1, 3, 2, odd_rows=False)
    yield Case("probabilistic", "flat", "fp32", 33, 5, 20)


def garbage_batch() -> SpecBatch:
    """Unchecked, inconsistent values: bad slots, counts, temperatures and ids (no OOB access allowed)."""
    device = "cuda"
    vocab_size = 300
    target = torch.randn(9, vocab_size, device=device)
    draft = torch.randn(3, 4, vocab_size, device=device)
    return SpecBatch(
        target_logits=target,
        draft_logits=draft,
        draft_token_ids=torch.tensor([1, 2, 3, 2**40, -9, 0], device=device),
        cu_num_drafts=torch.tensor([0, 5, 2, 600], dtype=torch.int32, device=device),
        temperature=torch.tensor([float("nan"), -1.0, float("inf")], device=device),
        seed=torch.tensor([1, 2, 3], device=device),
        step=torch.tensor([-1, 2**40, 3], device=device),
        method="probabilistic",
        draft_slot=torch.tensor([-4, 1, 99], device=device),
        max_num_drafts=5,
    )


@dataclass
class CaseResult:
    """The counts of one case."""

    label: str
    requests: int
    decisions: int
    near_ties: int
    mismatches: int
    unexplained: int
    violations: int
    mean_emitted: float
    seconds: float
    notes: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def of(
        cls, label: str, found: Agreement, broken: list[str], output: SpecOutput, seconds: float
    ) -> CaseResult:
        """The counts of ``found`` (agreement with the walk) and ``broken`` (violations) of ``output``."""
        return cls(
            label,
            found.num_samples,
            found.num_decisions,
            found.near_ties,
            found.mismatches,
            len(found.unexplained),
            len(broken),
            float(output.num_emitted.float().mean()),
            seconds,
            (broken + found.unexplained)[:5],
        )


def _timed_sample(batch: SpecBatch, check_values: bool | None = None) -> tuple[SpecOutput, float]:
    """The Triton sampler's output on ``batch`` and the call's wall time."""
    begin = time.perf_counter()
    output = rejection_sample(batch, check_values=check_values)
    torch.cuda.synchronize()
    return output, time.perf_counter() - begin


def check_case(case: Case, seed: int) -> CaseResult:
    """Sample one batch of ``case`` and count invariant violations, near ties and mismatches."""
    batch = make_case_batch(case, seed)
    output, seconds = _timed_sample(batch, check_values=True)
    return CaseResult.of(case.label, agreement(batch, output), violations(batch, output), output, seconds)


def check_past_int32() -> CaseResult:
    """A batch whose last rows start past 2**31 elements: those requests match the same requests alone."""
    vocab_size, num_requests, n = 262144, 1640, 4
    gen = torch.Generator(device="cuda").manual_seed(23)
    target = (torch.randn(num_requests * (n + 1), vocab_size, generator=gen, device="cuda") * 3).half()
    draft = (torch.randn(num_requests * n, vocab_size, generator=gen, device="cuda") * 3).half()
    ids = torch.randint(0, vocab_size, (num_requests * n,), generator=gen, device="cuda")
    batch = SpecBatch(
        target_logits=target,
        draft_logits=draft,
        draft_token_ids=ids,
        cu_num_drafts=torch.arange(0, num_requests * n + 1, n, dtype=torch.int32, device="cuda"),
        temperature=torch.ones(num_requests, device="cuda"),
        seed=torch.arange(num_requests, device="cuda"),
        step=torch.zeros(num_requests, dtype=torch.int64, device="cuda"),
        max_num_drafts=n,
    )
    output, seconds = _timed_sample(batch)
    first = num_requests - 4
    small = select_requests(batch, range(first, num_requests))
    alone = rejection_sample(small)
    notes = []
    if not torch.equal(alone.token_ids, output.token_ids[first:]):
        notes.append("tail requests differ from the same requests sampled alone")
    emitted = output.num_emitted
    in_vocab = (output.token_ids >= 0) & (output.token_ids < vocab_size)
    columns = torch.arange(n + 1, device="cuda")[None, :]
    layout_ok = torch.where(columns < emitted[:, None], in_vocab, output.token_ids == -1).all()
    if not bool(layout_ok):
        notes.append("ids outside [0, V) or bad padding in the large batch")
    found = agreement(small, alone)
    label = f"prob  flat    fp16 V={vocab_size} B={num_requests} n={n} (rows past 2**31)"
    result = CaseResult.of(label, found, notes, output, seconds)
    return dataclasses.replace(result, notes=notes + found.unexplained[:5])


def _print_table(results: list[CaseResult]) -> None:
    columns = ("reqs", "decisions", "near", "mism", "unexpl", "viol", "E[emit]", "call s")
    print(f"{'case':58} " + " ".join(f"{c:>9}" for c in columns))
    for r in results:
        counts = (r.requests, r.decisions, r.near_ties, r.mismatches, r.unexplained, r.violations)
        print(
            f"{r.label:58} " + " ".join(f"{c:9}" for c in counts) + f" {r.mean_emitted:9.2f} {r.seconds:9.3f}"
        )
        for note in r.notes:
            print(f"    {note}")


def main(argv: list[str] | None = None) -> int:
    """Run the checks; exit status 1 when any invariant fails or any mismatch is unexplained."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sanitize", action="store_true", help="run the small sanitizer set only")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("the GPU tier needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    results = []
    cases = sanitize_cases() if args.sanitize else large_cases()
    for k, case in enumerate(cases):
        results.append(check_case(case, seed=1000 + k))
        print(f"done {case.label}", flush=True)
    if args.sanitize:
        output = rejection_sample(garbage_batch(), check_values=False)
        torch.cuda.synchronize()
        print(f"garbage batch: num_emitted {output.num_emitted.tolist()}, tokens {output.token_ids.tolist()}")
    else:
        results.append(check_past_int32())
    _print_table(results)
    report = {"results": [dataclasses.asdict(r) for r in results]}
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=1)
    failed = any(r.violations or r.unexplained for r in results)
    print("FAILED" if failed else "OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
