"""How many more drafts block verification keeps than token-wise verification, computed exactly.

For each request, the expected number of drafts kept ``E[m]`` comes from the exact float64 law
(`reference.law.exact_law`) of block verification and of probabilistic (token-wise) verification on
the same inputs: no sampling, so every figure is exact for its inputs. Two sets of inputs:

- the benchmark grid's (`benchmarks.grid.make_inputs`: Gaussian target logits, draft logits the
  target's plus noise), three ways: its drafts (each the argmax of its draft row) verified against
  ``q`` as the grid does; the same drafts verified against ``onehot(d)``, what a greedy drafter
  declares; and drafts drawn from ``q``, a few sequences per request. The paper's theorem holds in
  the last two (drafts drawn from the law the verifier is given): averaged over the drafts, block
  verification's ``E[m]`` is never below token-wise verification's; for one draft sequence it may
  be, so the mean over the drawn sequences estimates that average. In the first, the drafts are not
  drawn from ``q`` and nothing is promised;
- batches drawn by the Hypothesis strategies (`properties.strategies.spec_batches`, profile ``ci``)
  with a fixed seed, grouped by the distribution family of each request (their drafts are the
  strategies': drawn from ``q``, the argmax, uniform, of target probability 0, or ``V - 1``).

    python -m benchmarks.block_accepted [--shapes 64x4x128256,16x8x32000] [--batches 300] [--seed 0]

CPU only; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections import defaultdict
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, given, seed, settings

from specsample.benchmarks.grid import Case, make_inputs
from specsample.properties import strategies
from specsample.properties.batching import select_requests
from specsample.reference.contract import SpecBatch
from specsample.reference.law import exact_law, request_inputs

DEFAULT_SHAPES = ("64x4x128256", "16x8x32000", "64x1x128256", "16x4x151936")


def accepted(batch: SpecBatch, method: str) -> np.ndarray:
    """``[B]`` the exact ``E[m]`` of every request of ``batch`` under ``method``."""
    laws = exact_law(dataclasses.replace(batch, method=method))  # type: ignore[arg-type]
    return np.array([float(np.dot(np.arange(law.stop_probs.size), law.stop_probs)) for law in laws])


def drafts_from_q(batch: SpecBatch, draws: int, rng: np.random.Generator) -> SpecBatch:
    """``draws`` copies of every request of ``batch``, each with its drafts redrawn from its draft
    rows' laws ``q`` (float64 inverse CDF)."""
    ids = []
    for inputs in request_inputs(batch):
        for _ in range(draws):
            for q in inputs.draft_probs():
                cdf = np.cumsum(q)
                ids.append(min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), q.size - 1))
    index = np.repeat(np.arange(batch.num_requests), draws)
    tensor = torch.tensor(ids, dtype=torch.int64, device=batch.draft_token_ids.device)
    return select_requests(batch, index, draft_token_ids=tensor)


def row(what: str, requests: int, block: np.ndarray, token: np.ndarray) -> str:
    """A Markdown row: mean E[m] of each method, the mean gain, the share of requests block keeps more
    on, and the smallest per-request difference."""
    gain = block - token
    return (
        f"| {what} | {requests} | {token.mean():.4f} | {block.mean():.4f} | {gain.mean():+.4f} | "
        f"{np.mean(gain > 1e-12):.2f} | {gain.min():+.2e} |"
    )


def grid_rows(shapes: list[str], temperature: float, draws: int, rng: np.random.Generator) -> list[str]:
    """Rows for the grid's inputs at each shape ``BxNxV``, the three ways the module docstring lists
    (``draws`` sequences per request drawn from ``q``)."""
    rows = []
    for shape in shapes:
        b, n, v = (int(x) for x in shape.split("x"))
        batch = make_inputs(Case("probabilistic", "fp32", "flat", temperature, b, n, v), "cpu")
        cases = (
            ("grid drafts (argmax of q), verified against q", batch),
            ("grid drafts, one-hot q (a greedy drafter)", dataclasses.replace(batch, draft_logits=None)),
            (f"drafts from q ({draws} per request)", drafts_from_q(batch, draws, rng)),
        )
        for label, drafted in cases:
            what = f"grid B={b} n={n} V={v} T={temperature:g}, {label}"
            count = drafted.num_requests
            rows.append(row(what, count, accepted(drafted, "block"), accepted(drafted, "probabilistic")))
    return rows


def drawn_batches(count: int, search_seed: int) -> list[tuple[SpecBatch, dict[str, Any]]]:
    """``count`` batches of the strategies (profile ``ci``), drawn with a fixed seed, each with its
    description (the family of each request)."""
    drawn: list[tuple[SpecBatch, dict[str, Any]]] = []
    description: dict[str, Any] = {}

    @seed(search_seed)
    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategies.spec_batches(profile="ci", methods=("probabilistic",), describe=description.update))
    def collect(batch: SpecBatch) -> None:
        drawn.append((batch, dict(description)))

    collect()
    return drawn


def strategy_rows(count: int, search_seed: int) -> list[str]:
    """Rows for Hypothesis-drawn batches: every request, and the requests of each family."""
    by_family: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for batch, description in drawn_batches(count, search_seed):
        pairs = zip(accepted(batch, "block"), accepted(batch, "probabilistic"), strict=True)
        for request, (block, token) in zip(description["requests"], pairs, strict=True):
            by_family[request["family"]].append((block, token))
    everything = [pair for pairs in by_family.values() for pair in pairs]
    rows = []
    for name, pairs in [("all", everything), *sorted(by_family.items())]:
        block, token = (np.array(column) for column in zip(*pairs, strict=True))
        rows.append(row(f"strategies (ci, seed {search_seed}): {name}", len(pairs), block, token))
    return rows


def main(argv: list[str] | None = None) -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma list of BxNxV")
    parser.add_argument("--temperatures", default="1", help="comma list of grid temperatures")
    parser.add_argument("--draws", type=int, default=4, help="draft sequences from q per grid request")
    parser.add_argument("--batches", type=int, default=300, help="Hypothesis-drawn batches")
    parser.add_argument("--seed", type=int, default=0, help="seed of the drafts from q and of the draws")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    print("| inputs | requests | E[m] probabilistic | E[m] block | gain | block keeps more | smallest gain |")
    print("|---|---|---|---|---|---|---|")
    for temperature in (float(t) for t in args.temperatures.split(",")):
        for line in grid_rows([s for s in args.shapes.split(",") if s], temperature, args.draws, rng):
            print(line, flush=True)
    for line in strategy_rows(args.batches, args.seed):
        print(line)
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
