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
    """Three drafts at T = 0.7, every row different, plus a placeholder request, a bonus-only request
    and a request whose draft is the id ``V`` (out of range by one: a placeholder, which a bound
    written ``<= V`` reads as a token)."""
    rng = np.random.default_rng(1)
    target, draft = _rows(rng, 4), _rows(rng, 3)
    ids = [int(np.argmax(draft[0])), int(np.argsort(draft[1])[-2]), 17]
    placeholder_target, placeholder_draft = _rows(rng, 3), _rows(rng, 2)
    return make_batch(
        [
            RequestData(target, ids, draft, temperature=0.7, seed=11),
            RequestData(placeholder_target, [3, -1], placeholder_draft, temperature=1.0, seed=12),
            RequestData(_rows(rng, 1), [], np.zeros((0, VOCAB)), temperature=1.3, seed=13),
            RequestData(_rows(rng, 2), [VOCAB], _rows(rng, 1), temperature=1.0, seed=14),
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
    (M29), and stops one draft short of the end (M30). The drafts are read through slots, the first
    request's from slot 2 (a keep pass that reads slot rows with the row stride reads another
    request's), and the last request's keep decision at ``i = 1`` is far from ``w_1`` (a bound bug
    that drops the batch's last draft id moves its ``P(m = 1)`` by about 0.34).
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
        slots=[2, 0],
        num_slots=3,
        slot_capacity=4,
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


# ---------------------------------------------------------------------------------------------
# Filtered verification (`reference.filters`): each shape lies inside a sampler's capabilities only
# when it declares the sampling parameters the batch carries.

# SGLang #36173's regression vector: top-k 4 then top-p 0.82 over the renormalised mass keeps three
# tokens; top-p first, over the raw mass (0.80 < 0.82 above the fourth), keeps four.
SGLANG_36173 = (0.35, 0.25, 0.20, 0.05, 0.03, 0.03, 0.03, 0.03, 0.03)
# A law whose top-p 0.9 boundary token carries 7% of the mass: the mass above it is 0.89 < 0.9, with
# it 0.96 (FlashInfer #2202 dropped such a token: kept mass 0.89999 against top_p = 0.9). A tail of
# sixteen decreasing tokens gives top-p near 1 a cut between distinct tokens.
BOUNDARY_HEAD = (0.5, 0.25, 0.14, 0.07)
BOUNDARY_TAIL_RATIO = 0.7
# The top-p pivot row: a plateau of many tokens whose logits step by PLATEAU_STEP, far more finely than
# a threshold search cut after 18 halvings of a log-probability range of about 43 resolves (1.6e-4),
# and far more coarsely than float32 rounding of a log-probability (a few 1e-7).
PIVOT_VOCAB = 256
PLATEAU_STEP = 1e-5


def _log(probs: tuple[float, ...] | np.ndarray) -> np.ndarray:
    """Logits of a law (``log p``; its softmax at ``T = 1`` is the law)."""
    return np.log(np.asarray(probs, dtype=np.float64))


def _filter_order(method: Method) -> SpecBatch:
    """SGLang #36173's regression vector at ``top_k = 4``, ``top_p = 0.82`` (``T = 1``): a draft on the
    fourth token, which only top-p applied first keeps, and a bonus-only request emitting from ``p'``.

    Exact verification never accepts or emits token 3; top-p applied before top-k (M35) gives it
    ``0.05 / 0.85`` of ``p'``, and a sampler that drops the filters (M39) gives tokens 3-8 mass.
    """
    target = np.tile(_log(SGLANG_36173), (3, 1))
    draft = np.tile(_log((0.1, 0.1, 0.1, 0.5, 0.04, 0.04, 0.04, 0.04, 0.04)), (2, 1))
    empty = np.zeros((0, len(SGLANG_36173)))
    return make_batch(
        [
            RequestData(target, [3, 0], draft, temperature=1.0, seed=71, top_k=4, top_p=0.82),
            RequestData(target[:1], [], empty, temperature=1.0, seed=72, top_k=4, top_p=0.82),
        ],
        method=method,
    )


def _boundary_row() -> np.ndarray:
    """The logits of `BOUNDARY_HEAD` followed by its decreasing tail (20 tokens, mass 0.04 in the tail)."""
    tail = BOUNDARY_TAIL_RATIO ** np.arange(VOCAB - len(BOUNDARY_HEAD))
    return _log(np.concatenate([BOUNDARY_HEAD, 0.04 * tail / tail.sum()]))


def _top_p_boundary(method: Method) -> SpecBatch:
    """The top-p boundary token, and top-p near 0 and near 1, at ``T = 1``.

    Request 0 drafts the boundary token (token 3, ``p'(3) = 0.07 / 0.96``) from a draft law that
    favours it, request 1 emits from ``p'`` alone: a sampler that drops the token that crosses
    ``top_p`` (M37) never accepts or emits it. Request 2 keeps only the argmax (``top_p = 1e-6``);
    request 3 cuts the tail between two distinct tokens (``top_p = 0.9992``).
    """
    row = _boundary_row()
    target = np.tile(row, (3, 1))
    favours_3 = np.full(VOCAB, np.log(0.1 / (VOCAB - 4)))
    favours_3[:4] = _log((0.1, 0.1, 0.1, 0.6))
    draft = np.stack([favours_3, row + np.linspace(0.0, 1.0, VOCAB)])
    return make_batch(
        [
            RequestData(target, [3, 1], draft, temperature=1.0, seed=81, top_p=0.9),
            RequestData(target[:1], [], np.zeros((0, VOCAB)), temperature=1.0, seed=82, top_p=0.9),
            RequestData(target[:2], [1], draft[1:], temperature=1.0, seed=83, top_p=1e-6),
            RequestData(target[:2], [4], draft[1:], temperature=1.0, seed=84, top_p=0.9992),
        ],
        method=method,
    )


def _argmax_of_neither(target_row: np.ndarray, draft_row: np.ndarray) -> int:
    """The draft row's most likely token that is the argmax of neither row (``top_k = 1`` drops it
    from both filtered laws)."""
    argmaxes = {int(np.argmax(target_row)), int(np.argmax(draft_row))}
    return next(int(t) for t in np.argsort(-draft_row) if int(t) not in argmaxes)


def _filtered_drafts(method: Method) -> SpecBatch:
    """``draft_filter`` on: the sampler filters the draft logits with each request's parameters.

    Request 0 (``top_k = 1``) drafts tokens that are the argmax of neither the target nor the draft
    row: zero filtered mass under ``p'`` and ``q'``, so ``p'(d) > u q'(d)`` is ``0 > 0`` at every
    ``u``, never accepted; a non-strict test accepts them (M36). Request 1 (``top_k = 3``) drafts
    from inside the draft's kept set, which holds 0.24 of the raw draft mass: the ratio with the
    filtered ``q'`` accepts with probability 0.67, with the raw ``q`` (M33) always. Request 2 filters
    by top-p.
    """
    rng = np.random.default_rng(7)
    zero_target, zero_draft = _rows(rng, 3), _rows(rng, 2)
    zero_ids = [_argmax_of_neither(zero_target[i], zero_draft[i]) for i in range(2)]
    target = np.full((3, VOCAB), -0.5)
    target[:, [2, 7, 5]] = (1.6, 0.9, 1.3)
    target += rng.normal(size=target.shape) * 0.01
    draft = np.full((2, VOCAB), 0.3)
    draft[:, [2, 7, 11]] = (1.0, 0.9, 0.8)
    top_p_target, top_p_draft = _rows(rng, 2), _rows(rng, 1)
    top_p_id = int(np.argmax(top_p_draft[0]))  # inside the draft's kept set
    return make_batch(
        [
            RequestData(zero_target, zero_ids, zero_draft, temperature=1.0, seed=91, top_k=1),
            RequestData(target, [7, 7], draft, temperature=1.0, seed=92, top_k=3),
            RequestData(top_p_target, [top_p_id], top_p_draft, temperature=0.9, seed=93, top_p=0.6),
        ],
        method=method,
        draft_filter=True,
    )


def _min_p_near_one(method: Method) -> SpecBatch:
    """``min_p = 0.9`` at ``T = 0.8``: two near-equal tokens survive at every row (``e**(-0.05 / 0.8) =
    0.94``), the next lies at 0.54 of the largest. Drafts on dropped tokens and a residual over the
    raw law show a sampler that applies min-p to the bonus row only (M34)."""
    rng = np.random.default_rng(8)
    target = rng.normal(size=(4, VOCAB)) * 0.3 - 1.0
    target[:, [4, 13]] = (2.0, 1.95)
    target[:, 9] = 1.5
    draft = rng.normal(size=(3, VOCAB)) * 0.5
    draft[:, 9] = 2.0
    return make_batch(
        [RequestData(target, [9, 13, 0], draft, temperature=0.8, seed=101, min_p=0.9)], method=method
    )


def _mixed_filters(method: Method) -> SpecBatch:
    """Requests that filter beside ones that do not: no filter, top-k alone, a greedy row with top-p
    (unaffected: every filter keeps the argmax), all three filters at once, and a bonus-only request
    with top-p. A sampler that routes a batch with sampling parameters to a path that takes the
    argmax (M38) or drops them (M39) changes the law of every sampled request."""
    rng = np.random.default_rng(9)
    greedy = _rows(rng, 3)
    greedy_draft = _rows(rng, 2)
    greedy_ids = [int(np.argmax(greedy[0])), int(np.argsort(greedy[1])[-2])]
    requests = [
        RequestData(_rows(rng, 3), [2, 17], _rows(rng, 2), temperature=1.0, seed=111),
        RequestData(_rows(rng, 3), [16, 5], _rows(rng, 2), temperature=0.7, seed=112, top_k=5),
        RequestData(greedy, greedy_ids, greedy_draft, temperature=0.0, seed=113, top_p=0.5),
        RequestData(
            _rows(rng, 2), [18], _rows(rng, 1), temperature=1.2, seed=114, top_k=6, top_p=0.8, min_p=0.2
        ),
        RequestData(_rows(rng, 1), [], np.zeros((0, VOCAB)), temperature=1.0, seed=115, top_p=0.7),
    ]
    return make_batch(requests, method=method)


def _pivot_row() -> tuple[np.ndarray, float]:
    """The top-p pivot row (`PIVOT_VOCAB` tokens) and a ``top_p`` near 0.5, halfway through a plateau
    token: four heavy tokens, a plateau stepping down by `PLATEAU_STEP`, and eight tokens at ``-40``
    that widen the log-probability range a threshold search halves."""
    logits = np.zeros(PIVOT_VOCAB)
    logits[:4] = (3.0, 2.5, 2.0, 1.5)
    plateau = PIVOT_VOCAB - 12
    logits[4 : 4 + plateau] = -PLATEAU_STEP * np.arange(plateau)
    logits[-8:] = -40.0
    logits = logits.astype(np.float32).astype(np.float64)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    above = np.cumsum(probs) - probs  # the row decreases: the mass above each token
    crossing = int(np.searchsorted(above, 0.5))
    return logits, float(np.float32(above[crossing] + probs[crossing] / 2))


def _top_p_pivot(method: Method) -> SpecBatch:
    """A bonus-only request on a row whose 244 plateau tokens lie within 0.25% of the top-p pivot's
    probability, ``top_p`` halfway through the plateau token that crosses it (no token lies near a
    pivot at float32's rounding).

    A float32 sort-and-cumsum top-p keeps the exact set (105 tokens); a threshold search cut after 18
    halvings (M40) also keeps the plateau tokens its last interval cannot separate from the pivot: 12
    here, 7.6% of ``p'``, from 149 to 1,789 float32 ulps of a probability below the pivot's (the mass
    above them 3e4 to 7e5 ulps past ``top_p``).
    """
    row, top_p = _pivot_row()
    return make_batch(
        [RequestData(row[None], [], np.zeros((0, PIVOT_VOCAB)), temperature=1.0, seed=121, top_p=top_p)],
        method=method,
    )


# ---------------------------------------------------------------------------------------------
# Tree verification (`reference.tree`): shapes for method "tree" only.

# A star wider than a 32-entry sibling table: the children past it must still be accepted.
WIDE_CHILDREN = 40


def _likely_children(rng: np.random.Generator, row: np.ndarray, count: int) -> list[int]:
    """``count`` distinct tokens that carry most of ``row``'s mass (its most likely first)."""
    order = np.argsort(-row, kind="stable")
    return [int(t) for t in order[:count]]


def _tree(method: Method) -> SpecBatch:
    """A bushy tree whose nodes hold their parents' likely tokens, two siblings repeating one token
    (only the first is ever accepted) and a placeholder child; a greedy request's star beside it; a
    request without drafts. Draft logits are given, a law far from the target's, which target-only
    verification never reads.

    Exposes a tree verified as a chain (M43: the root's second child and node 1's children are then
    never accepted), a residual built from the draft law (M41), every node verified by argmax at
    ``T > 0`` (M45), children accepted by ``min(1, p / q)`` (M46)."""
    rng = np.random.default_rng(131)
    target = _rows(rng, 8, 1.0)
    parents = [-1, -1, 0, 0, 1, 1, 1]
    first, second = _likely_children(rng, target[0], 2)
    a, b = _likely_children(rng, target[1], 2)
    (c,) = _likely_children(rng, target[2], 1)
    ids = [first, second, a, b, c, c, -1]  # nodes 4 and 5 repeat token c under node 1
    draft = -_rows(rng, 7, 1.0)
    greedy = _rows(rng, 4)
    greedy_ids = _likely_children(rng, greedy[0], 3)
    return make_batch(
        [
            RequestData(target, ids, draft, temperature=1.0, seed=141, tree_parent=parents),
            RequestData(
                greedy, greedy_ids, _rows(rng, 3), temperature=0.0, seed=142, tree_parent=[-1, -1, -1]
            ),
            RequestData(_rows(rng, 1), [], np.zeros((0, VOCAB)), temperature=0.8, seed=143, tree_parent=[]),
        ],
        method=method,
    )


def _wide_tree(method: Method) -> SpecBatch:
    """A root with `WIDE_CHILDREN` children over a vocabulary of 64, the likeliest tokens last (from the
    33rd child on): a sibling table of 32 entries drops the children that carry most of the mass
    (M42)."""
    rng = np.random.default_rng(151)
    vocab = 64
    target = rng.normal(size=(WIDE_CHILDREN + 1, vocab))
    order = [int(t) for t in np.argsort(-target[0], kind="stable")[:WIDE_CHILDREN]]
    ids = order[8:] + order[:8]  # the eight likeliest tokens are children 32 to 39
    return make_batch(
        [RequestData(target, ids, None, temperature=1.0, seed=152, tree_parent=[-1] * WIDE_CHILDREN)],
        method=method,
    )


def _ragged_trees(method: Method) -> SpecBatch:
    """Deep trees of different sizes in one batch, each node holding its parent's likeliest token, so
    walks run deep: an ancestor walk that reads past its request into the next one's nodes (M44)
    takes another request's parents for its own."""
    rng = np.random.default_rng(161)
    requests = []
    for seed, parents in enumerate([[-1, 0, 1, 2, 0], [-1, 0, 0, 1, 3, 4], [-1, -1, 1], [-1, 0, 1, 2]]):
        target = _rows(rng, len(parents) + 1, 2.0)
        ids = [_likely_children(rng, target[p + 1], 1)[0] for p in parents]
        requests.append(RequestData(target, ids, None, temperature=1.0, seed=171 + seed, tree_parent=parents))
    return make_batch(requests, method=method)


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
    "filter order": _filter_order,  # M35 M39
    "top-p boundary": _top_p_boundary,  # M37
    "filtered drafts": _filtered_drafts,  # M33 M36
    "min-p near 1": _min_p_near_one,  # M34
    "mixed filters": _mixed_filters,  # M38 M39
    "top-p pivot": _top_p_pivot,  # M40
    "tree": _tree,  # M41 M43 M45 M46
    "wide tree": _wide_tree,  # M42
    "ragged trees": _ragged_trees,  # M44
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
