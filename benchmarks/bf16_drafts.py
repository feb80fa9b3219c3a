"""What storing draft logits in bf16 does to the output law, computed exactly.

A verifier that keeps the draft model's logits in bf16 (half the bytes of fp32) verifies against
``q' = softmax(round_bf16(draft) / T)`` instead of ``q``. The drafts themselves were proposed from
``q`` (the proposer samples from its own fp32 logits). For each request this computes, with the exact
float64 law (`reference.law.exact_law`), the total variation between the law of ``(m, y)`` under ``q``
and under ``q'`` for the same drafts, and the expected number accepted under each; drafts are drawn
from ``q``, requests from realistic and adversarial families.

    python -m benchmarks.bf16_drafts [--requests 64] [--vocab 128256] [--drafts 4]

CPU only; prints a Markdown table (RESULTS.md holds the run).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from specsample.properties import strategies
from specsample.reference.contract import RequestData, make_batch
from specsample.reference.law import exact_law

# (family, temperature, logit offset added to both models, draft noise, what). Family "close" is a
# draft model near the target: zipf target logits (a language model's long tail), draft logits the
# target's plus N(0, noise) per token. Large logits lose bf16 precision (spacing 0.125 at 30, 0.5 at
# 100); the adversarial families are the strategies' own.
CASES = (
    ("close", 1.0, 0.0, 0.5, "realistic: zipf target, draft = target + N(0, 0.5)"),
    ("close", 1.0, 0.0, 1.0, "realistic: zipf target, draft = target + N(0, 1)"),
    ("close", 0.7, 0.0, 0.5, "realistic, T = 0.7"),
    ("close", 1.0, 30.0, 0.5, "realistic, logits around 30"),
    ("close", 1.0, 100.0, 0.5, "realistic, logits around 100"),
    ("near_equal", 1.0, 0.0, 0.0, "adversarial: q = p up to 1e-7"),
    ("equal", 1.0, 0.0, 0.0, "adversarial: q = p exactly"),
    ("flat", 1.0, 0.0, 0.0, "adversarial: nearly uniform"),
    ("tiny", 1.0, 0.0, 0.0, "adversarial: gaps of 80-110 nats"),
)


def logits(
    rng: np.random.Generator, family: str, n: int, vocab: int, noise: float
) -> tuple[np.ndarray, np.ndarray]:
    """``(target [n + 1, V], draft [n, V])`` of a case."""
    if family != "close":
        return strategies.family_logits(rng, family, n, vocab)
    target, _ = strategies.family_logits(rng, "zipf", n, vocab)
    return target, target[:n] + rng.normal(size=(n, vocab)) * noise


def bf16(logits: np.ndarray) -> np.ndarray:
    """``logits`` rounded to bf16 and back."""
    return torch.as_tensor(logits, dtype=torch.float32).to(torch.bfloat16).double().numpy()


def measure(
    family: str, temperature: float, offset: float, noise: float, requests: int, vocab: int, n: int, seed: int
) -> tuple[float, float, float, float]:
    """``(mean TV, max TV, E[m] with fp32 drafts, E[m] with bf16 drafts)`` over ``requests``."""
    rng = np.random.default_rng(seed)
    tvs, accepted = [], np.zeros(2)
    for _ in range(requests):
        target, draft = logits(rng, family, n, vocab, noise)
        target, draft = target + offset, draft + offset
        ids = strategies.choose_drafts(rng, "from_q", target, draft, temperature, placeholder_rate=0.0)
        laws = []
        for stored in (draft, bf16(draft)):
            batch = make_batch([RequestData(target, ids, stored, temperature)], method="probabilistic")
            laws.append(exact_law(batch)[0])
        # The joint law P(m = j, y), [n + 1, V].
        a, b = (law.stop_probs[:, None] * law.token_probs for law in laws)
        tvs.append(0.5 * float(np.abs(a - b).sum()))
        accepted += [float(np.dot(np.arange(n + 1), law.stop_probs)) for law in laws]
    return float(np.mean(tvs)), float(np.max(tvs)), accepted[0] / requests, accepted[1] / requests


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64, help="requests per case (default: 64)")
    parser.add_argument("--vocab", type=int, default=128256, help="vocabulary size (default: 128256)")
    parser.add_argument("--drafts", type=int, default=4, help="drafts per request (default: 4)")
    args = parser.parse_args()
    print(f"V = {args.vocab}, n = {args.drafts}, {args.requests} requests per case, drafts from fp32 q\n")
    print("| case | T | mean TV of (m, y) | max TV | E[m] fp32 drafts | E[m] bf16 drafts |")
    print("|---|---|---|---|---|---|")
    for index, (family, temperature, offset, noise, what) in enumerate(CASES):
        mean_tv, max_tv, fp32, rounded = measure(
            family, temperature, offset, noise, args.requests, args.vocab, args.drafts, seed=index
        )
        print(f"| {what} | {temperature:g} | {mean_tv:.2e} | {max_tv:.2e} | {fp32:.4f} | {rounded:.4f} |")


if __name__ == "__main__":
    main()
