"""Targeted cases: hand-built batches aimed at the shapes real bugs need, tried before random search.

Each case is small enough for the CPU interpreter and names the bugs it is built to expose; a
campaign screens them first, then explores at random.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from specsample.reference.contract import Capabilities, Method, RequestData, SpecBatch, make_batch
from specsample.reference.methods import METHODS

VOCAB = 20  # past one 16-lane tile: the tail tile holds tokens 16..19


def _rows(rng: np.random.Generator, count: int, scale: float = 1.5) -> np.ndarray:
    """Position-dependent logits with real mass in the tail tile."""
    logits = rng.normal(size=(count, VOCAB)) * scale
    logits[:, 16:] += 1.0
    return logits


def _verification(method: Method) -> SpecBatch:
    """Three drafts at T = 0.7, every row different, plus a placeholder request and a bonus-only request."""
    rng = np.random.default_rng(1)
    target, draft = _rows(rng, 4), _rows(rng, 3)
    ids = [int(np.argmax(draft[0])), int(np.argsort(draft[1])[-2]), 17]
    placeholder_target, placeholder_draft = _rows(rng, 3), _rows(rng, 2)
    return make_batch(
        [
            RequestData(target, ids, draft, temperature=0.7, seed=11),
            RequestData(placeholder_target, [3, -1], placeholder_draft, temperature=1.0, seed=12),
            RequestData(_rows(rng, 1), [], np.zeros((0, VOCAB)), temperature=1.3, seed=13),
        ],
        method=method,
    )


def _zero_mass_drafts(method: Method) -> SpecBatch:
    """Drafts of probability 0 under both p and q, an empty residual with token 0 masked, and
    degenerate draft rows beside ordinary ones in one request and batch.

    The degenerate rows: one equal to its target row (a sampler that takes the request for
    self-drafted then reads every row with ``q = p``: M32), one one-hot at its draft with every other
    logit ``-inf``, and one whose other logits are finite but beyond the float range (``-3e38``).
    """
    rng = np.random.default_rng(2)
    masked = _rows(rng, 2)
    masked[:, [0, 5]] = -np.inf
    same = masked.copy()
    target, draft = _rows(rng, 5), _rows(rng, 4)
    ids = [int(np.argsort(draft[0])[-2]), 9, 12, 3]
    draft[1] = target[1]  # equal to its target row
    draft[2] = -np.inf  # one-hot at the draft
    draft[2, ids[2]] = 0.0
    draft[3] = -3e38  # one-hot in law; every other logit finite, beyond the float range
    draft[3, ids[3]] = 0.0
    return make_batch(
        [
            # p(5) = q(5) = 0: `p > u * q` is 0 > 0, never accepted; `>=` accepts it (M01).
            RequestData(masked, [5], masked[:1], temperature=1.0, seed=21),
            # p == q and the draft is masked: rejected with an empty residual, so y ~ p, never token 0 (M19).
            RequestData(same, [5], same[:1].copy(), temperature=1.0, seed=22),
            # An ordinary first row, then the degenerate ones (M32).
            RequestData(target, ids, draft, temperature=1.0, seed=23),
        ],
        method=method,
    )


def _underflow(method: Method) -> SpecBatch:
    """Drafts whose p and q lie below float32's normal range (1.2e-38), with a ratio near 1, at T = 1.

    Exact (log-space) arithmetic accepts each draft with probability ``min(1, p/q)``, often 1; in
    fp32 probabilities both are 0 and every draft is rejected (M27), which only a sampler that
    declares ``fp32-probs`` may do.
    """
    rng = np.random.default_rng(5)
    target = -rng.uniform(88.0, 700.0, size=(3, VOCAB))
    target[:, :4] = rng.normal(size=(3, 4))  # four ordinary tokens carry the mass, so every law has cells
    draft = target[:2] + rng.uniform(-3.0, 3.0, size=(2, VOCAB))
    return make_batch([RequestData(target, [7, VOCAB - 2], draft, temperature=1.0, seed=51)], method=method)


def _block(method: Method) -> SpecBatch:
    """Two tokens carry most of every row, the target favouring one and the draft the other, so
    ``p(d) / q(d)`` is about 1/2 or 2: weights below 1 that later drafts restore, the paper's example.

    Block verification keeps drafts that token-wise verification rejects, stops past a weight below 1
    (the weighted residual differs from the token-wise one: M28), keeps with ``h_i`` far from ``w_i``
    (M29), and stops one draft short of the end (M30).
    """
    rng = np.random.default_rng(6)
    a, b = 3, 17  # the token the target favours, and the one the draft favours

    def rows(count: int, high: int, low: int) -> np.ndarray:
        logits = rng.normal(size=(count, VOCAB)) * 0.5 - 3.0
        logits[:, high], logits[:, low] = np.log(2.0), 0.0
        return logits

    return make_batch(
        [
            RequestData(rows(4, a, b), [b, a, b], rows(3, b, a), temperature=1.0, seed=61),
            RequestData(rows(3, a, b), [b, b], rows(2, b, a), temperature=0.8, seed=62),
        ],
        method=method,
    )


def _greedy_and_slots(method: Method) -> SpecBatch:
    """Greedy requests with tied maxima beside sampled ones, drafts read through permuted slots."""
    rng = np.random.default_rng(3)
    tied = np.round(_rows(rng, 3, scale=0.8))
    sampled, sampled_draft = _rows(rng, 3), _rows(rng, 2)
    tied_draft = _rows(rng, 2)
    greedy_ids = [int(np.argmax(tied[0])), int(np.argsort(tied[1])[-3])]
    return make_batch(
        [
            RequestData(
                sampled, [int(np.argmax(sampled_draft[0])), 2], sampled_draft, temperature=0.8, seed=31
            ),
            RequestData(tied, greedy_ids, tied_draft, temperature=0.0, seed=32),
            RequestData(_rows(rng, 3), [4, 9], _rows(rng, 2), temperature=1.0, seed=33),
        ],
        slots=[3, 0, 1],
        num_slots=4,
        slot_capacity=3,
        method=method,
    )


def _synthetic() -> SpecBatch:
    """Synthetic sampling over four drafts with decaying conditional rates."""
    rng = np.random.default_rng(4)
    return make_batch(
        [RequestData(_rows(rng, 5), [1, 2, 3, 4], _rows(rng, 4), temperature=1.0, seed=41)],
        method="synthetic",
        synthetic_rates=[0.9, 0.8, 0.7, 0.6],
    )


def _nan_rows(method: Method) -> SpecBatch:
    """A target row that is all NaN and one with NaN entries: NaN counts as -inf."""
    rng = np.random.default_rng(5)
    target = _rows(rng, 3)
    target[1, :] = np.nan
    target[2, ::3] = np.nan
    return make_batch(
        [RequestData(target, [int(np.argmax(target[0])), 7], _rows(rng, 2), seed=51)], method=method
    )


# The shapes, each built for every method whose row in `reference.methods.METHODS` names it, with the
# mutants each is built to expose.
SHAPES: dict[str, Callable[[Method], SpecBatch]] = {
    "verification": _verification,  # M02-M13 M16 M20 M21
    "block": _block,  # M28 M29 M30
    "zero-mass drafts": _zero_mass_drafts,  # M01 M19 M32
    "greedy and slots": _greedy_and_slots,  # M14 M15 M18
    "synthetic": lambda method: _synthetic(),  # M22
    "nan rows": _nan_rows,  # M17
    "underflow": _underflow,  # M27
}


def targeted_batches(
    methods: tuple[str, ...] | None = None, capabilities: Capabilities | None = None
) -> list[tuple[str, SpecBatch]]:
    """The targeted batches of every shape, for each method (of ``methods``, when given) that names it,
    that lie inside a sampler's ``capabilities``."""
    return [(name, batch) for name, batch, reason in targeted_cases(methods, capabilities) if reason is None]


def targeted_cases(
    methods: tuple[str, ...] | None = None, capabilities: Capabilities | None = None
) -> list[tuple[str, SpecBatch, str | None]]:
    """Every targeted batch for ``methods``, and why it lies outside ``capabilities`` (``None``: inside)."""
    caps = capabilities or Capabilities()
    cases = [
        (f"{method}: {shape}", build(method))
        for shape, build in SHAPES.items()
        for method, rules in METHODS.items()
        if shape in rules.targeted and (methods is None or method in methods)
    ]
    return [(name, batch, caps.admits(batch)) for name, batch in cases]
