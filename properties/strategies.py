"""Hypothesis strategies for speculative-decoding batches: distribution families and batch shapes.

Hypothesis draws parameters (a family, a vocabulary size, draft counts, temperatures, seeds, a numpy
seed); numpy builds the vocab-sized arrays from the drawn seed, never element by element, so a
failing example replays and shrinks on its parameters. Every strategy says which bugs its inputs
expose (the ids are those of docs/bugs.md).

Sizes follow a profile (`properties.profiles`): ``ci`` and ``dev`` keep the vocabularies and grids small
enough for the Triton interpreter; ``gpu`` and ``nightly`` reach 256K-token vocabularies and large
batches. Block sizes are a parameter: vocabulary sizes gather at ``BLOCK - 1``, ``BLOCK`` and
``BLOCK + 1`` of each, where tiling bugs live.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from hypothesis import strategies as st

from specsample.properties import profiles
from specsample.properties.profiles import CPU_BLOCK_SIZES
from specsample.reference.contract import (
    MAX_STEP,
    METHODS,
    Capabilities,
    Method,
    RequestData,
    SpecBatch,
    make_batch,
)
from specsample.reference.filters import FILTER_OFF, FILTERS, FilterParams, filter_logits
from specsample.reference.law import row_probs
from specsample.reference.methods import METHODS as METHOD_TABLE
from specsample.reference.synthetic import conditional_rates, synthetic_params

F64Array = npt.NDArray[np.float64]

FAMILIES = (
    "peaked",
    "flat",
    "zipf",
    "sparse",
    "equal",
    "near_equal",
    "disjoint",
    "draft_zero",
    "ties",
    "tiny",
    "underflow",
    "needle",
    "odd",
    "repeated",
)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DRAFT_KINDS = ("one-hot", "flat", "slotted")
DRAFT_CHOICES = ("from_q", "argmax", "uniform", "zero_prob", "last_id")
# Draft-logit rows made degenerate beside ordinary ones (`degenerate_rows`), in half the requests.
DEGENERATE_ROWS = ("one-hot", "beyond range", "equal")
# The finite logits of "beyond range" rows: a gap no float32 exponential spans, finite in float32
# and bfloat16 (float16 reads them as -inf).
BEYOND_RANGE = (-1e30, -3e38)
# Sampling-parameter mixes a filtering request draws (`filter_settings`).
FILTER_MIXES = ("off", "mild", "extreme", "near pivot")
# Tree shapes (`tree_parents`) and the sibling count past which a fixed-size sibling table overflows.
TREE_SHAPES = ("chain", "star", "bushy", "deep", "wide")
WIDE_SIBLINGS = 33
# Temperatures: greedy, tiny (logits / T overflow float32), cold, 1, hot, huge (nearly uniform).
TEMPERATURES = (0.0, 1e-30, 1e-3, 0.5, 1.0, 2.0, 50.0, 1e4)


def vocab_sizes(
    max_vocab: int = 4097, block_sizes: Sequence[int] = CPU_BLOCK_SIZES
) -> st.SearchStrategy[int]:
    """Vocabulary sizes: 1, 2, 3, the edges ``BLOCK - 1, BLOCK, BLOCK + 1`` of each block, and any size.

    Exposes tiling bugs: a last tile dropped or read unmasked (M16), a split boundary off by one, a
    one-token vocabulary where every draft is the argmax.
    """
    edges = sorted({v for b in block_sizes for v in (b - 1, b, b + 1) if 1 <= v <= max_vocab} | {1, 2, 3})
    return st.one_of(st.sampled_from(edges), st.integers(1, min(64, max_vocab)), st.integers(1, max_vocab))


def temperatures() -> st.SearchStrategy[float]:
    """Temperatures: 0 (greedy), tiny, cold, 1, hot, huge, and any value in between.

    Exposes greedy rows sent through the probabilistic path (M14), temperature applied twice or not
    at all to the drafts (M12, M13), and overflow of ``logits / T`` at tiny temperatures.
    """
    return st.one_of(st.sampled_from(TEMPERATURES), st.floats(0.0625, 16.0, width=32))


def seeds() -> st.SearchStrategy[int]:
    """Request seeds over the whole int64 range: the Philox key's high word and sign matter too."""
    return st.integers(-(2**63), 2**63 - 1)


def steps() -> st.SearchStrategy[int]:
    """Steps: 0, small, and up to ``2**32 - 1``, where the offset layout's high bits are used."""
    return st.one_of(st.just(0), st.integers(0, 100), st.integers(0, MAX_STEP - 1))


def family_logits(
    rng: np.random.Generator,
    family: str,
    num_drafts: int,
    vocab_size: int,
    block_size: int = 4096,
    temperature: float = 1.0,
) -> tuple[F64Array, F64Array]:
    """``(target [n + 1, V], draft [n, V])`` logits of one family, built with numpy from ``rng``.

    ``temperature`` is the request's; only ``underflow`` uses it, to scale its logits to it.
    ``block_size`` is the tile width whose last tile ``needle`` aims at.

    Families (and the bugs they expose):

    - ``peaked``: one dominant token per row. Acceptance near 1, residual mass in a sliver: an
      unnormalised or mis-normalised residual (M05) and catastrophic cancellation in ``p - q``.
    - ``flat``: nearly equal logits. Many tokens of similar mass: inverse-CDF off-by-one errors and
      wrong residual normalisers (M05) move visible mass.
    - ``zipf``: logits ``-s log(rank)`` over a random permutation, the shape of a language model's
      law: a heavy head and a long tail, so tail bugs (M16) and head bugs both show.
    - ``sparse``: ``-inf`` masks over most of the vocabulary (whole rows now and then). Zero-probability
      ids must never be emitted or accepted (M01, M19); masked lanes must not win ties (M16).
    - ``equal``: ``q == p`` exactly. Every draft is accepted and the residual has no mass: division by
      a zero residual mass, NaN fallbacks (M05, M19).
    - ``near_equal``: ``q == p`` up to rounding-sized noise. The residual is rounding noise: its sign
      handling (M03) and normalisation (M05) decide the output.
    - ``disjoint``: the supports of ``p`` and ``q`` are disjoint. Every draft is rejected and the
      residual is ``p`` itself: an unclamped residual (M03) or one that subtracts ``q`` at the draft
      only (M04) is badly wrong.
    - ``draft_zero``: ``q = 0`` on part of ``p``'s support. ``p / q`` is infinite there: ratio tests
      that divide instead of multiply, and residuals that assume ``q > 0``.
    - ``ties``: integer logits, so exact ties everywhere. Tie breaking (lowest index), greedy chains
      (M14) and Gumbel-max ties.
    - ``tiny``: logit gaps of 80 to 110, so most probabilities lie near or below float32 subnormals.
    - ``underflow``: ``q`` within a few nats of ``p``, every token but one 88 to 700 nats (at the
      request's temperature) below the top: probabilities that float64 holds and float32 flushes to
      zero, with ratios near 1. A draft there must be accepted about as often as not; a sampler in
      fp32 probabilities that declares log-space arithmetic rejects it every time (M27).
      Underflow to zero, flush-to-zero on the GPU, ``log(0)`` and mass lost in the tail.
    - ``needle``: all mass on a few adversarial ids (0, ``V - 1``, the last tile, block edges) in a
      vocabulary that is otherwise ``-inf``: a dropped last tile (M16), a wrong row offset (M11),
      an out-of-vocabulary lane that wins a tie.
    - ``odd``: NaN, ``+inf`` and ``-inf`` sprinkled in. NaN must count as ``-inf`` and never yield an
      id ``>= V`` (M17); ``+inf`` rows are uniform over their ``+inf`` entries.
    - ``repeated``: one target row and one draft row (the target's plus a little noise, so drafts are
      often accepted) at every position: a model that predicts the same law at consecutive positions.
      A stream reused one position over at the next step (M31) then repeats a decision on the same
      row, and the outputs of adjacent steps of one seed coincide far more often than chance.
    """
    rows, vocab = num_drafts + 1, vocab_size
    target = rng.normal(size=(rows, vocab)) * 2.0
    draft = rng.normal(size=(num_drafts, vocab)) * 2.0
    if family == "peaked":
        for logits in (target, draft):
            peak = logits.max(axis=1, initial=0.0) + rng.uniform(6, 15, size=logits.shape[0])
            logits[np.arange(logits.shape[0]), rng.integers(0, vocab, logits.shape[0])] = peak
    elif family == "flat":
        target = rng.normal(size=(rows, vocab)) * 0.05
        draft = rng.normal(size=(num_drafts, vocab)) * 0.05
    elif family == "zipf":
        exponent = rng.uniform(0.6, 1.6)
        for logits in (target, draft):
            ranks = np.argsort(rng.random(size=logits.shape), axis=1) + 1
            logits[...] = -exponent * np.log(ranks)
    elif family == "sparse":
        keep = rng.uniform(0.05, 0.5)
        for logits in (target, draft):
            logits[rng.random(size=logits.shape) > keep] = -np.inf
            full_mask = rng.random(logits.shape[0]) < 0.05
            logits[full_mask] = -np.inf
    elif family == "equal":
        draft = target[:num_drafts].copy()
    elif family == "near_equal":
        draft = target[:num_drafts] * (1 + rng.normal(size=(num_drafts, vocab)) * 1e-7)
    elif family == "disjoint":
        half = rng.random(vocab) < 0.5
        target[:, half] = -np.inf
        draft[:, ~half] = -np.inf
    elif family == "draft_zero":
        hole = rng.random(size=draft.shape) < rng.uniform(0.2, 0.8)
        if vocab > 1:
            hole[np.arange(num_drafts), rng.integers(1, vocab, num_drafts)] = True
        hole[:, 0] = False  # q keeps some mass
        draft[hole] = -np.inf
    elif family == "ties":
        target = np.round(rng.normal(size=(rows, vocab)))
        draft = np.round(rng.normal(size=(num_drafts, vocab)))
    elif family == "tiny":
        for logits in (target, draft):
            logits[...] = -rng.uniform(80, 110, size=logits.shape)
            logits[np.arange(logits.shape[0]), rng.integers(0, vocab, logits.shape[0])] = 0.0
    elif family == "underflow":
        scale = temperature if 0.0 < temperature < np.inf else 1.0
        target = -rng.uniform(88, 700, size=(rows, vocab))
        target[np.arange(rows), rng.integers(0, vocab, rows)] = 0.0
        draft = target[:num_drafts] + rng.uniform(-3, 3, size=(num_drafts, vocab))
        target, draft = target * scale, draft * scale
    elif family == "needle":
        last_tile = vocab - (vocab % block_size or block_size)
        candidates = np.unique(
            np.clip([0, vocab - 1, last_tile, last_tile - 1, block_size - 1, block_size], 0, vocab - 1)
        )
        for logits in (target, draft):
            logits[...] = -np.inf
            for row in range(logits.shape[0]):
                chosen = rng.choice(candidates, size=rng.integers(1, candidates.size + 1), replace=False)
                logits[row, chosen] = rng.normal(size=chosen.size) * 2.0
    elif family == "odd":
        for logits in (target, draft):
            pick = rng.random(size=logits.shape)
            logits[pick < 0.15] = np.nan
            logits[(pick >= 0.15) & (pick < 0.3)] = -np.inf
            logits[pick > 0.95] = np.inf
    elif family == "repeated":
        row = rng.normal(size=vocab) * 2.0
        target = np.tile(row, (rows, 1))
        draft = np.tile(row + rng.normal(size=vocab) * 0.5, (num_drafts, 1))
    elif family != "normal":
        raise ValueError(f"family is {family!r}; expected one of {', '.join(FAMILIES)}")
    return target, draft


def choose_drafts(
    rng: np.random.Generator,
    choice: str,
    target: F64Array,
    draft: F64Array,
    temperature: float,
    placeholder_rate: float,
) -> npt.NDArray[np.int64]:
    """Draft ids for one request: drawn from ``q``, the target's argmax, uniform, of ``p = 0``, or ``V - 1``.

    Then each position becomes a placeholder ``-1`` with probability ``placeholder_rate`` (and, one
    time in ten of those, an out-of-range id, which the contract reads as a placeholder). Drafts of
    probability 0 under ``p`` bait a non-strict acceptance test (M01); placeholders bait M20.
    """
    n, vocab = draft.shape
    if choice == "from_q" and temperature > 0:
        ids = np.array([rng.choice(vocab, p=row_probs(row, temperature)) for row in draft], dtype=np.int64)
    elif choice == "argmax":
        ids = np.argmax(np.where(np.isnan(target[:n]), -np.inf, target[:n]), axis=1).astype(np.int64)
    elif choice == "zero_prob":
        ids = rng.integers(0, vocab, n)
        for i in range(n):
            zeros = np.nonzero(~(target[i] > -np.inf))[0]  # -inf and NaN logits: probability 0
            if zeros.size:
                ids[i] = rng.choice(zeros)
    elif choice == "last_id":
        ids = np.full(n, vocab - 1, dtype=np.int64)
    else:
        ids = rng.integers(0, vocab, n)
    placeholder = rng.random(n) < placeholder_rate
    odd = placeholder & (rng.random(n) < 0.1)
    ids = np.where(placeholder, -1, ids)
    return np.where(odd, vocab + rng.integers(0, 3, n), ids).astype(np.int64)


def tree_parents(rng: np.random.Generator, shape: str, num_nodes: int) -> list[int]:
    """The parents of a tree of ``num_nodes`` draft nodes (``-1``: the root), each before its children.

    Shapes: ``chain`` (each node the child of the one before: strict verification's law, so a tree
    verified as a chain passes only there), ``star`` (every node a child of the root: the most
    siblings, where a tree verified as a chain and a residual built from the wrong law differ most),
    ``bushy`` (each node's parent one of the few nodes before it, EAGLE-2's shape), ``deep`` (a chain
    with leaves hanging off it: deep paths where an ancestor walk reads past its request),
    ``wide`` (a star of at least `WIDE_SIBLINGS` children, past a 32-entry table).
    """
    if shape == "chain":
        return list(range(-1, num_nodes - 1))
    if shape == "star":
        return [-1] * num_nodes
    if shape == "bushy":
        return [int(rng.integers(max(-1, node - 4), node)) for node in range(num_nodes)]
    if shape == "deep":
        spine, parents = -1, []
        for node in range(num_nodes):
            parents.append(spine)
            if rng.random() < 0.6:
                spine = node
        return parents
    if shape == "wide":
        return [-1] * num_nodes
    raise ValueError(f"shape is {shape!r}; expected one of {', '.join(TREE_SHAPES)}")


def tree_drafts(
    rng: np.random.Generator, parents: Sequence[int], target: F64Array, ids: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """The draft tokens of a tree: ``ids`` (a chain request's choice, placeholders included) with about
    half the nodes' tokens drawn from their parent's target row (so the walk accepts them often and
    goes deep), and some nodes given a sibling's token (a repeated token: only its first sibling is
    ever accepted, where a sampler that adds each copy's probability over-accepts). In a third of the
    requests each node's children then hold their tokens likeliest last, where a sampler that reads a
    fixed number of siblings, or the first child only, loses the most."""
    ids = ids.copy()
    vocab = target.shape[1]
    for node, parent in enumerate(parents):
        if ids[node] < 0 or ids[node] >= vocab:
            continue  # a placeholder stays one
        row = target[parent + 1]
        if rng.random() < 0.5 and np.isfinite(row).any():
            ids[node] = int(rng.choice(vocab, p=row_probs(row, 1.0)))
        siblings = [s for s in range(node) if parents[s] == parent and 0 <= ids[s] < vocab]
        if siblings and rng.random() < 0.15:
            ids[node] = ids[int(rng.choice(siblings))]
    if rng.random() < 1 / 3:
        for parent in set(parents):
            kids = [node for node, p in enumerate(parents) if p == parent and 0 <= ids[node] < vocab]
            mass = row_probs(target[parent + 1], 1.0)[ids[kids]]
            ids[kids] = ids[kids][np.argsort(mass, kind="stable")]
    return ids


def degenerate_rows(
    rng: np.random.Generator, kind: str, target: F64Array, draft: F64Array, ids: npt.NDArray[np.int64]
) -> tuple[F64Array, F64Array, npt.NDArray[np.int64]]:
    """Some draft-logit rows of one request made degenerate beside ordinary ones: ``(target, draft,
    ids)`` with 1 to ``n - 1`` of the ``n`` draft rows replaced (the one row when ``n = 1``, whose
    ordinary neighbours are then the other requests').

    Kinds (a placeholder keeps its id, and its row is built at a random token):

    - ``one-hot``: one-hot at the draft, every other logit ``-inf``: ``q(d) = 1``, a row a sampler
      may take for a one-hot draft.
    - ``beyond range``: the draft's logit 0 and every other one finite but past any float32
      exponential (`BEYOND_RANGE`): one-hot in law, not in its logits.
    - ``equal``: the row equal to its target row (``q = p``); half the time part of the row masked
      (``-inf``) in both and the draft moved onto a masked token, ``p(d) = q(d) = 0``: a ratio
      ``0 / 0`` that must reject.

    Engines meet all three (greedy and n-gram proposers, masks written as finite sentinels,
    self-drafting), and a fast path for such rows that is taken for more than the row itself
    misreads the ordinary rows beside it: M32 reads a request with one row equal to its target row
    as self-drafted. The families alone make such rows rarely (a ``needle`` row of one candidate),
    in whole requests only (``equal``), or never (finite logits beyond the float range).
    """
    n, vocab = draft.shape
    if n == 0 or kind == "none":
        return target, draft, ids
    if kind not in DEGENERATE_ROWS:
        raise ValueError(f"kind is {kind!r}; expected 'none' or one of {', '.join(DEGENERATE_ROWS)}")
    target, draft, ids = target.copy(), draft.copy(), ids.copy()
    chosen = rng.choice(n, size=rng.integers(1, max(n - 1, 1) + 1), replace=False)
    for i in chosen:
        real = 0 <= ids[i] < vocab
        token = int(ids[i]) if real else int(rng.integers(0, vocab))
        if kind == "one-hot":
            kept = draft[i, token] if np.isfinite(draft[i, token]) else 0.0
            draft[i] = -np.inf
            draft[i, token] = kept
        elif kind == "beyond range":
            draft[i] = rng.choice(BEYOND_RANGE)
            draft[i, token] = 0.0
        else:
            finite = np.nonzero(np.isfinite(target[i]))[0]
            if finite.size > 1 and rng.random() < 0.5:
                masked = np.asarray(rng.random(vocab) < rng.uniform(0.2, 0.8))
                masked[rng.choice(finite)] = False  # the row keeps a finite logit
                if masked.any():
                    target[i, masked] = -np.inf
                    if real:
                        ids[i] = rng.choice(np.nonzero(masked)[0])
            draft[i] = target[i]
    return target, draft, ids


@st.composite
def filter_settings(draw: st.DrawFn, mix: str, vocab_size: int, taken: Sequence[str]) -> dict[str, Any]:
    """One request's sampling parameters of a mix, only those in ``taken`` (the others off).

    Mixes: ``off``; ``mild`` (what serving defaults look like: top-k 20 to 100, top-p 0.8 to 0.99,
    min-p 0.01 to 0.1); ``extreme`` (top-k 1 or 2, top-p near 0 or near 1, min-p near 1); ``near
    pivot`` (top-k of 2 to 8 and top-p 0.25 to 0.75 over a flat row: many tokens of similar mass at the
    cut-off, where a threshold found approximately or a boundary token dropped moves visible mass).

    Exposes filters applied in the wrong order (SGLang #36173), a boundary token dropped (FlashInfer
    #2202), an approximate threshold (vLLM's bisection cut after 18 halvings), parameters dropped
    on the speculative path (TensorRT-LLM #17955) and filters on the bonus row only (vLLM #42744).
    """
    settings: dict[str, Any] = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
    if mix == "mild":
        settings = {
            "top_k": draw(st.sampled_from([0, 20, 50, 100, vocab_size])),
            "top_p": draw(st.sampled_from([1.0, 0.8, 0.9, 0.95, 0.99]) | st.floats(0.8125, 1.0, width=32)),
            "min_p": draw(st.sampled_from([0.0, 0.01, 0.05, 0.1])),
        }
    elif mix == "extreme":
        settings = {
            "top_k": draw(st.sampled_from([0, 1, 2])),
            "top_p": draw(st.sampled_from([1.0, 1e-6, 0.01, 0.999, 1.0 - 2.0**-20])),
            "min_p": draw(st.sampled_from([0.0, 0.9, 0.99, 1.0 - 2.0**-20])),
        }
    elif mix == "near pivot":
        settings = {
            "top_k": draw(st.sampled_from([0, 2, 3, 5, 8])),
            "top_p": draw(st.floats(0.25, 0.75, width=32)),
            "min_p": draw(st.sampled_from([0.0, 0.5, 0.8])),
        }
    return {name: settings[name] if name in taken else FILTER_OFF[name] for name in FILTERS}


def _filter_params(settings: dict[str, Any], rows: int) -> FilterParams:
    return FilterParams(
        np.full(rows, settings["top_k"], dtype=np.int64),
        np.full(rows, float(np.float32(settings["top_p"]))),
        np.full(rows, float(np.float32(settings["min_p"]))),
    )


def break_ties(rng: np.random.Generator, logits: F64Array) -> F64Array:
    """``logits`` with every exact tie among finite values broken by a small jitter (for a sampler
    whose filters break ties at a pivot by index, which the strategies never put there)."""
    jitter = rng.permutation(logits.shape[-1]) * 1e-3 / max(logits.shape[-1], 1)
    return np.where(np.isfinite(logits), logits + jitter, logits)


def in_domain(logits: F64Array, capabilities: Capabilities) -> F64Array:
    """``logits`` moved inside a sampler's declared domain: NaN read as ``-inf`` where it takes no NaN;
    ``+inf`` made the row's largest finite value plus 20, and a row with no finite logit given one
    (token 0 at 0), where it takes no infinities."""
    out = np.where(np.isnan(logits), -np.inf, logits) if not capabilities.nan_logits else logits.copy()
    if not capabilities.infinite_logits and out.size:
        finite = np.isfinite(out)
        top = np.where(finite, out, -np.inf).max(axis=-1, initial=-np.inf)
        out = np.where(np.isposinf(out), np.where(np.isfinite(top), top, 0.0)[:, None] + 20.0, out)
        out[~np.isfinite(out).any(axis=-1), 0] = 0.0
    return out


@st.composite
def spec_batches(
    draw: st.DrawFn,
    *,
    methods: Sequence[str] = METHODS,
    profile: str | None = None,
    max_vocab: int | None = None,
    max_requests: int | None = None,
    max_drafts: int | None = None,
    block_sizes: Sequence[int] | None = None,
    families: Sequence[str] = FAMILIES,
    dtypes: Sequence[torch.dtype] = DTYPES,
    draft_kinds: Sequence[str] = DRAFT_KINDS,
    greedy: bool = True,
    placeholders: bool = True,
    device: str | torch.device = "cpu",
    capabilities: Capabilities | None = None,
    describe: Callable[[dict[str, Any]], None] | None = None,
) -> SpecBatch:
    """Valid `SpecBatch` objects mixing every family, shape and odd case of docs/design.md.

    One batch draws a method, a vocabulary size (block edges included), a logit dtype and a kind of
    draft logits (one-hot, flat ``[D, V]`` or slotted ``[S, K, V]`` under a random slot permutation
    with spare slots), then 1 to ``max_requests`` requests, each with its own draft count (0
    included: ragged batches), family, temperature (greedy rows mixed with sampled ones), draft
    choice, placeholders, seed and step; synthetic batches get conditional rates from a mean target
    or explicit ones (0 and 1 included).

    Half the requests with draft logits get degenerate draft rows beside their ordinary ones (one-hot
    at the draft, a gap beyond the float range, a row equal to its target row: `degenerate_rows`):
    about two batches in five with draft logits hold one beside an ordinary row of its request.

    A tree batch (method ``"tree"``) gives each request a tree of a shape (`tree_parents`: chains,
    stars, bushy and deep trees, and stars of more than 32 siblings) and drafts from its parents'
    rows, some repeated among siblings (`tree_drafts`); its requests are ragged too (no drafts
    beside trees).

    Exposes: per-request parameters read from the wrong request (M15 slots, M18 seeds), ragged
    offsets (M11), greedy rows on the sampling path (M14), placeholders accepted (M20), fast paths
    for degenerate draft rows taken wrongly (M32), every family's bugs (see `family_logits`), and
    the tree bugs (M41-M46: `tree_parents`, `tree_drafts`).

    Args:
        methods, families, dtypes, draft_kinds: what to draw from (``draft_kinds`` a subset of
            `DRAFT_KINDS`).
        profile: a profile name (default: ``HYPOTHESIS_PROFILE``, else ``dev``); the explicit
            size arguments (``max_vocab``, ``max_requests``, ``max_drafts``, ``block_sizes``) override it.
        greedy, placeholders: whether requests may be greedy (``T = 0``), drafts placeholders.
        device: where the batch's tensors live.
        capabilities: a sampler's declared capabilities: every batch lies inside them (`in_domain`).
        describe: called with each drawn batch's description (method, vocab_size, dtype, layout,
            placeholders, and per request its family, temperature and num_drafts), for coverage.
    """
    sizes = profiles.get(profile).sizes
    caps = capabilities or Capabilities()
    methods = [m for m in methods if m in caps.methods]
    dtypes = [d for d in dtypes if d in caps.dtypes]
    draft_kinds = [k for k in draft_kinds if k in caps.draft_kinds]
    vocab_cap = min(max_vocab or sizes.max_vocab, caps.max_vocab)
    blocks = tuple(block_sizes or sizes.block_sizes)
    # Each method is drawn as often as its strategy weight in the method table says.
    method: Method = draw(
        st.sampled_from([m for m in methods for _ in range(METHOD_TABLE[m].strategy_weight)])
    )
    vocab_size = draw(vocab_sizes(vocab_cap, blocks))
    dtype = draw(st.sampled_from(list(dtypes)))
    kind = draw(st.sampled_from(list(draft_kinds)))
    block_size = draw(st.sampled_from(blocks))
    num_requests = draw(st.integers(1, max_requests or sizes.max_requests))
    drafts_cap = max_drafts if max_drafts is not None else sizes.max_drafts
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    placeholder_rate = draw(st.sampled_from([0.0, 0.2])) if placeholders else 0.0
    # Sampling parameters: in half the batches of a sampler that takes them; draft_filter in half of those.
    taken = [name for name in FILTERS if name in caps.filters]
    filtering = bool(taken) and draw(st.booleans())
    draft_filter = filtering and kind != "one-hot" and "draft_filter" in caps.filters and draw(st.booleans())
    temperature_choices = temperatures() if greedy else temperatures().filter(lambda t: t > 0)
    is_tree = METHOD_TABLE[method].verifies_tree
    requests, described = [], []
    for index in range(num_requests):
        # One request a batch at most holds a wide star (tens of rows): the others keep batches cheap.
        shapes = TREE_SHAPES if index == 0 else tuple(s for s in TREE_SHAPES if s != "wide")
        shape = draw(st.sampled_from(shapes)) if is_tree else None
        n = draw(
            st.integers(WIDE_SIBLINGS, WIDE_SIBLINGS + 4) if shape == "wide" else st.integers(0, drafts_cap)
        )
        family = draw(st.sampled_from(list(families)))
        temperature = draw(temperature_choices)
        temperature = 0.0 if temperature < caps.greedy_below else temperature
        mix = draw(st.sampled_from(FILTER_MIXES)) if filtering else "off"
        settings = draw(filter_settings(mix, vocab_size, taken))
        if mix == "near pivot" and draw(st.booleans()):
            family = "flat"  # many tokens of similar mass at the cut-off
        target, draft = (
            in_domain(logits, caps)
            for logits in family_logits(rng, family, n, vocab_size, block_size, temperature)
        )
        if mix != "off" and caps.pivot_ties == "index":
            target, draft = break_ties(rng, target), break_ties(rng, draft)
        # The law the drafts come from: the request's filters on the draft logits, applied by the
        # sampler (draft_filter) or, half the time otherwise, by the engine before the call.
        params = _filter_params(settings, n)
        if mix != "off" and not draft_filter and draw(st.booleans()):
            draft = filter_logits(draft, np.full(n, temperature), params)
        drawn_from = filter_logits(draft, np.full(n, temperature), params) if draft_filter else draft
        choice = draw(st.sampled_from(DRAFT_CHOICES))
        ids = choose_drafts(rng, choice, target, drawn_from, temperature, placeholder_rate)
        degenerate = "none"
        if kind != "one-hot" and draw(st.booleans()):
            degenerate = draw(st.sampled_from(DEGENERATE_ROWS))
        target, draft, ids = degenerate_rows(rng, degenerate, target, draft, ids)
        parents = None
        if shape is not None:
            parents = tree_parents(rng, shape, n)
            ids = tree_drafts(rng, parents, target, ids)
        if not caps.out_of_range_ids:
            ids = np.where(ids >= vocab_size, -1, ids)
        described.append(
            {
                "family": family,
                "temperature": temperature,
                "num_drafts": n,
                "degenerate rows": degenerate,
                "filters": mix,
                "tree": shape,
            }
        )
        requests.append(
            RequestData(
                target_logits=target,
                draft_token_ids=ids,
                draft_logits=None if kind == "one-hot" else draft,
                temperature=temperature,
                seed=draw(seeds()),
                step=draw(steps()),
                tree_parent=parents,
                **settings,
            )
        )
    width = max(1, *(len(r.draft_token_ids) for r in requests))
    rates = None
    if METHOD_TABLE[method].takes_rates:
        if draw(st.booleans()):
            rates = conditional_rates(*synthetic_params(draw(st.floats(0.0, 1.0)), width), width)
        else:
            explicit = st.sampled_from([0.0, 0.3, 0.7, 1.0]) | st.floats(0, 1)
            rates = np.array(draw(st.lists(explicit, min_size=width, max_size=width)))
    slots, num_slots, capacity = None, None, None
    if kind == "slotted":
        num_slots = num_requests + draw(st.integers(0, 3))
        slots = [int(s) for s in rng.permutation(num_slots)[:num_requests]]
        capacity = width + draw(st.integers(0, 2))
    if describe is not None:
        describe(
            {
                "method": method,
                "vocab_size": vocab_size,
                "dtype": str(dtype).removeprefix("torch."),
                "layout": kind,
                "placeholders": placeholder_rate > 0,
                "draft_filter": draft_filter,
                "requests": described,
            }
        )
    return make_batch(
        requests,
        method=method,
        dtype=dtype,
        synthetic_rates=rates,
        slots=slots,
        num_slots=num_slots,
        slot_capacity=capacity,
        device=device,
        draft_filter=draft_filter,
    )
