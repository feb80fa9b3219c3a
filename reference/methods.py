"""The verification methods in one table: each method's rules, and what the harness and kernels need.

The per-position rules are written here once. At position ``i`` of a request, with target law
``p``, draft law ``q`` and draft ``d``:

- a placeholder (``d = -1``) is rejected by every method, and ``y ~ p``;
- a greedy row (``T == 0``, ``p = onehot(argmax)``) accepts iff ``d`` is the argmax, unless the
  method says otherwise (synthetic accepts at its rate), and emits the argmax on rejection;
- otherwise the method decides: `Method.accept_probability` and `Method.rejection_law` are its
  exact law, `Method.decide` its decision from the sampler's uniform (or from the row's sample,
  when it ``decides_by_sampling``).

A method that ``verifies_jointly`` (block verification) has no per-position rule: it decides how
many drafts to keep from all of them at once, by the rules of `reference.block`. A method that
``verifies_tree`` (tree verification) reads its drafts as a tree (``SpecBatch.tree_parent``) and walks
it from the root by the rules of `reference.tree`.

The exact law (`reference.law`), the scalar reference sampler (`reference.sampler`) and the
vectorised walk (`reference.walk`) all take their rules from here. `METHODS` is the table: the
checks, the strategies, the targeted cases, the benchmark grid, the CLI and the kernels' method
codes iterate it. A new method is a new entry here, its kernel branch, and nothing else.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

F64Array = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

MethodName = Literal["strict", "probabilistic", "synthetic", "block", "tree"]


def accepts(target_prob: npt.ArrayLike, draft_prob: npt.ArrayLike, uniform: npt.ArrayLike) -> BoolArray:
    """The probabilistic acceptance test ``p(d) > u * q(d)``.

    Strict ``>``: a token with ``p = 0`` is never accepted, even at ``u = 0``; a token with
    ``q = 0 < p`` always is.
    """
    return np.asarray(np.asarray(target_prob) > np.asarray(uniform) * np.asarray(draft_prob))


def residual_law(target: F64Array, draft: F64Array) -> F64Array:
    """``(p - q)+`` normalised, or ``p`` itself where the residual has no mass (rows ``[..., V]``)."""
    residual = np.maximum(target - draft, 0.0)
    mass = residual.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.where(mass > 0.0, residual / mass, target), dtype=np.float64)


def without_token(target: F64Array, token: npt.ArrayLike) -> F64Array:
    """``p`` restricted to ``x != token``, renormalised; ``p`` itself for ``-1`` or when nothing is left."""
    token = np.asarray(token)[..., None]
    excluded = np.arange(target.shape[-1]) == token
    law = residual_law(target, np.where(excluded, np.inf, 0.0))
    return np.asarray(np.where(token < 0, target, law), dtype=np.float64)


class Method:
    """One verification method: its rules and the facts the harness and the kernels need of it.

    Attributes:
        name: the ``SpecBatch.method`` string.
        kernel_code: the method's code in the Triton kernels (``METHOD`` constexpr).
        lossless: with drafts drawn from ``q``, every emitted position follows ``p`` (the marginal
            check applies).
        greedy_accepts_argmax: a greedy row accepts iff its draft is the argmax (else the method's
            own decision applies to greedy rows too).
        decides_by_sampling: the decision draws the row's sample ``x ~ p`` and accepts iff
            ``x == d``; on rejection that sample is emitted.
        accepts_any_draft: an accepted draft may have target probability 0 (lossy by design).
        exact_decision: the decision compares exact values (no float32 rounding can flip it).
        uses_draft_law: the decision and the token after a rejection read the draft law ``q``
            (``p(d)`` against ``u q(d)`` and the residual ``(p - q)+``, or block verification's
            weights and residual), so the sampler reads the draft logits (and the walk's near-tie
            model follows the rounding of both).
        takes_rates: the method reads ``synthetic_rates``.
        verifies_jointly: the drafts are verified jointly (`reference.block`): the exact law, the
            samplers and the walk take block verification's rules instead of the per-position ones,
            and the marginal check continues each output with the target (a position reached is
            not distributed as ``p`` on its own).
        verifies_tree: the drafts form a tree (`reference.tree`, ``SpecBatch.tree_parent``), verified
            against the target alone from the root: the exact law, the samplers and the walk take the
            tree rules, the output lists the accepted nodes (``SpecOutput.accepted_nodes``), and a
            sampler implements it only where it declares it (`reference.contract.Capabilities`).
        strategy_weight: how often the strategies draw the method, relative to the others.
        targeted: the targeted cases (`fuzz.targeted`) built for the method.
    """

    name: MethodName
    kernel_code: int
    lossless = True
    greedy_accepts_argmax = True
    decides_by_sampling = False
    accepts_any_draft = False
    exact_decision = False
    uses_draft_law = False
    takes_rates = False
    verifies_jointly = False
    verifies_tree = False
    strategy_weight = 1
    targeted: tuple[str, ...] = ()

    def accept_probability(self, target: F64Array, draft: F64Array, token: int, rate: float) -> float:
        """The probability that the sampler accepts ``token`` (a real draft) at a sampled row."""
        raise NotImplementedError

    def rejection_law(self, target: F64Array, draft: F64Array, token: npt.ArrayLike) -> F64Array:
        """The law of ``y`` once ``token`` (a real draft) is rejected at a sampled row (rows ``[..., V]``)."""
        raise NotImplementedError

    def decide(self, target_prob: F64Array, draft_prob: F64Array, u: F64Array, rate: F64Array) -> BoolArray:
        """Whether the drafts are accepted, from the sampler's acceptance uniforms (``[A]`` arrays)."""
        raise NotImplementedError


class Probabilistic(Method):
    """Speculative sampling: accept with ``min(1, p(d) / q(d))``, else draw from ``(p - q)+``."""

    name = "probabilistic"
    kernel_code = 0
    uses_draft_law = True
    strategy_weight = 2  # the most rules (ratio, residual, fallback), and what engines run by default
    targeted = (
        "verification",
        "zero-mass drafts",
        "greedy and slots",
        "nan rows",
        "underflow",
        "filter order",
        "top-p boundary",
        "filtered drafts",
        "min-p near 1",
        "mixed filters",
        "top-p pivot",
    )

    def accept_probability(self, target: F64Array, draft: F64Array, token: int, rate: float) -> float:
        """``P(p > u * q)`` for ``u ~ U[0, 1)``: ``min(1, p / q)``; 1 if ``q = 0 < p``; 0 if ``p = 0``."""
        p, q = float(target[token]), float(draft[token])
        if p <= 0.0:
            return 0.0
        return 1.0 if q <= 0.0 else min(1.0, p / q)

    def rejection_law(self, target: F64Array, draft: F64Array, token: npt.ArrayLike) -> F64Array:
        """The residual ``(p - q)+`` normalised, ``p`` when it has no mass."""
        return residual_law(target, draft)

    def decide(self, target_prob: F64Array, draft_prob: F64Array, u: F64Array, rate: F64Array) -> BoolArray:
        """``p(d) > u * q(d)``."""
        return accepts(target_prob, draft_prob, u)


class Strict(Method):
    """Strict verification: sample ``x ~ p`` and accept iff ``x == d``; on rejection emit ``x``."""

    name = "strict"
    kernel_code = 1
    decides_by_sampling = True
    targeted = ("verification", "filter order", "top-p boundary")

    def accept_probability(self, target: F64Array, draft: F64Array, token: int, rate: float) -> float:
        """``p(d)``."""
        return float(target[token])

    def rejection_law(self, target: F64Array, draft: F64Array, token: npt.ArrayLike) -> F64Array:
        """``p`` restricted to ``x != d``."""
        return without_token(target, token)


class Synthetic(Method):
    """Synthetic sampling (lossy, for load tests): accept a real draft with rate ``c_i``, else ``y ~ p``."""

    name = "synthetic"
    kernel_code = 2
    lossless = False
    greedy_accepts_argmax = False
    accepts_any_draft = True
    exact_decision = True
    takes_rates = True
    targeted = ("synthetic",)

    def accept_probability(self, target: F64Array, draft: F64Array, token: int, rate: float) -> float:
        """``c_i``, whatever the logits."""
        return rate

    def rejection_law(self, target: F64Array, draft: F64Array, token: npt.ArrayLike) -> F64Array:
        """``p``."""
        return target

    def decide(self, target_prob: F64Array, draft_prob: F64Array, u: F64Array, rate: F64Array) -> BoolArray:
        """``u < c_i``."""
        return np.asarray(u < rate)


class Block(Method):
    """Block verification (Sun et al., ICLR 2025): drafts verified jointly, never fewer kept on average.

    Its rules (weights, keep probabilities, the weighted residual) are `reference.block`'s; the
    per-position hooks do not apply to it.
    """

    name = "block"
    kernel_code = 3
    uses_draft_law = True
    verifies_jointly = True
    strategy_weight = 2  # the most rules (weights, keep probabilities, weighted residual, fallback)
    targeted = (
        "verification",
        "block",
        "zero-mass drafts",
        "greedy and slots",
        "nan rows",
        "underflow",
        "filtered drafts",
    )


class Tree(Method):
    """Tree verification (SGLang's target-only tree kernel, EAGLE's reference code): from the root,
    draw ``x ~ p`` at each node and descend into its first child whose token is ``x``; else emit ``x``.

    Its rules (the walk, the exact law by stop row) are `reference.tree`'s; the per-position hooks do
    not apply to it. A greedy row draws its argmax.
    """

    name = "tree"
    kernel_code = 4
    decides_by_sampling = True
    verifies_tree = True
    targeted = ("tree", "wide tree", "ragged trees")


METHODS: dict[str, Method] = {m.name: m for m in (Strict(), Probabilistic(), Synthetic(), Block(), Tree())}
# The methods every sampler implements unless it declares otherwise: the chain methods (a tree is
# verified only by a sampler that says it takes one).
CHAIN_METHODS: tuple[str, ...] = tuple(name for name, m in METHODS.items() if not m.verifies_tree)
