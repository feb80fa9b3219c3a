"""Step pairs: a seed's outputs at adjacent steps are independent; their pair law is the product law.

The contract keys a request's randomness by ``(seed, step, position)``: a serving engine keeps one
seed per request and advances the step by one every decoding step, so everything a correct sampler
draws at ``(seed, s, i)`` is independent of what it draws at any other ``(s', i')``. The `steps`
check tests the law of each output over distinct steps, which a sampler whose streams repeat
*shifted* passes: one keyed by ``step + i`` (a sequence position where the contract has a step)
draws at ``(s + 1, i)`` what it drew at ``(s, i + 1)``, so every step's law is exact and only the
independence of a seed's draws across steps and positions is broken (M31).

**Trials.** Trial ``t`` of request ``b`` is a pair: the request with a fresh seed ``k_t`` at its
own step ``s``, and the same request (same inputs, same seed ``k_t``) at the adjacent step ``s + 1``
(``s - 1`` when ``s`` is the last step). The first members are the trials the law checks share
(`properties.checks.base.draw_trials`), so among the other checks this one costs ``N`` more replicas
per request, as `steps` does; the partners are drawn with the same derivation of seeds. Pairs of
different trials have different seeds, so under the contract the ``N`` pairs are independent draws
of ``(o, o')`` from ``L x L``, ``L`` the request's exact law of the outcome ``o = (m, y)``.

One step apart is the difference tested: a stream keyed by ``c * step + i`` reuses a draw between
``(s, i)`` and ``(s + d, j)`` iff ``i - j = c d``, which with positions ``i <= n`` needs
``c d <= n``, so every shift a larger ``d`` reaches ``d = 1`` reaches too (and ``c = 0``, the step
ignored, makes the members of a pair draw alike). A shared acceptance uniform shows in the number
accepted (``m`` and ``m'`` are dependent when the uniforms of positions ``i + 1`` and ``i`` coincide:
probabilistic and synthetic acceptance, block verification's keep decisions); shared noise shows in
the tokens (a Gumbel-max over two rows with the same noise favours the same token, and strict
verification decides by such draws).

**Tests, per request**, combined by Holm at level ``alpha`` (1e-6 by default) over the batch:

- *Pair law of* ``(m, y)``. The outcomes are coarsened into groups, ``m``-major and by decreasing
  probability within each ``m``: a group closes once its mass reaches ``sqrt(20 / N)`` (a trailing
  group short of it joins the one before), so each of the ``K x K`` cells of the product law expects
  at least 20 pairs, the rule of `properties.stats`. A Williams-corrected G-test of the ``N`` pairs'
  cells against ``L x L``; a pair with an outcome of probability 0 (or out of range) rejects.
- *Pair law of* ``m`` (requests with drafts): the same test on the number accepted alone, whose few
  cells give a shared acceptance uniform its full weight.
- *Same token.* A one-sided test of the number of pairs with ``y = y'`` against its law given the
  pairs' ``(m, m')`` (independent pairs colliding with probabilities ``sum_x P(x | m) P(x | m')``):
  Hoeffding's (1956) binomial bound at the mean probability, Chernoff's where fewer than one
  collision is expected. Shared noise raises the count far above that wherever two rows share likely
  tokens, which the coarse groups blur.

``detectable``: the total variation between the pair law of the coarse outcomes ``(m, y)`` and
``L x L`` detected with power 0.999 by its G-test at Holm's first level ``alpha / k``, the largest over
the requests whose law splits into two groups at least (a request with an outcome of probability
above ``1 - sqrt(20 / N)`` keeps the same-token test and the outcomes of probability 0; where no
request splits, the mass on outcomes of probability 0 seen with power 0.999, as for the law of
``y``). At the
``ci`` profile's 2,000 pairs per request it is 0.10 to 0.15; at 300 pairs, 0.25 to 0.28.

**Which variants.** Every variant, unless the scheme it declares says its step is a sequence
position (``streams.step_is_position``, as `reference.schemes.MRV2` does: there ``step`` is the
number of tokens before the first draft, vLLM's convention, so ``(s + 1, i)`` and ``(s, i + 1)``
are the same position by design). A sampler with its own generator (``streams = None``) declares
nothing and is checked.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import numpy.typing as npt
import torch
from scipy import special

from specsample.properties import stats
from specsample.properties.checks.base import (
    CheckedBatch,
    Component,
    Detail,
    Deviation,
    Settings,
    StatisticalCheck,
    Trials,
    Verdict,
    binomial_detail,
    draw_trials,
    fit_detail,
    trial_seeds,
)
from specsample.reference.contract import MAX_STEP, SpecBatch, Variant

F64Array = npt.NDArray[np.float64]
I64Array = npt.NDArray[np.int64]


def adjacent_steps(steps: npt.ArrayLike) -> I64Array:
    """The step each pair's partner runs at: ``s + 1``, or ``s - 1`` where ``s`` is the last step."""
    s = np.asarray(steps, dtype=np.int64)
    return np.where(s + 1 < MAX_STEP, s + 1, s - 1)


@dataclasses.dataclass(frozen=True)
class Coarse:
    """A law over outcomes ``(m, y)`` coarsened into groups for a pair test of ``N`` pairs.

    Attributes:
        groups: ``[(n + 1) V]`` the group of each outcome (``m``-major), ``-1`` for probability 0.
        masses: ``[K]`` each group's probability.
        vocab_size: ``V``, to name the outcomes.
    """

    groups: I64Array
    masses: F64Array
    vocab_size: int

    @classmethod
    def of(cls, law: npt.ArrayLike, num_pairs: int) -> Coarse:
        """The groups of ``law`` (``[n + 1, V]``): outcomes of positive probability ``m``-major and,
        within each ``m``, by decreasing probability (ties by token); a group closes once its mass
        reaches ``sqrt(20 / num_pairs)``, and a trailing group short of it joins the one before, so
        every product cell of two groups expects at least 20 of ``num_pairs`` pairs."""
        probs = np.asarray(law, dtype=np.float64)
        p = probs.reshape(-1) / probs.sum()
        rows = np.repeat(np.arange(probs.shape[0]), probs.shape[1])
        order = np.lexsort((np.arange(p.size), -p, rows))
        order = order[p[order] > 0]
        mass = np.cumsum(p[order])
        threshold = math.sqrt(stats.MIN_EXPECTED / num_pairs) * (1 - 1e-12)
        starts = [0]
        while True:
            before = mass[starts[-1] - 1] if starts[-1] > 0 else 0.0
            end = int(np.searchsorted(mass, before + threshold, side="left")) + 1
            if end >= order.size:
                break
            starts.append(end)
        if len(starts) > 1 and mass[-1] - mass[starts[-1] - 1] < threshold:
            starts.pop()  # the trailing group falls short: it joins the one before
        labels = np.zeros(order.size, dtype=np.int64)
        labels[starts[1:]] = 1
        groups = np.full(p.size, -1, dtype=np.int64)
        groups[order] = np.cumsum(labels)
        masses = np.asarray(np.bincount(groups[order], weights=p[order]), dtype=np.float64)
        return cls(groups, masses, int(probs.shape[1]))

    def cells(self, outcomes: I64Array) -> I64Array:
        """The group of each outcome index (``-1``: out of range); ``K`` for probability 0."""
        k = self.masses.size
        group = np.append(self.groups, -1)[outcomes]  # index -1 reads the appended -1
        return np.where(group >= 0, group, k)

    def name(self, group: int) -> str:
        """Group ``group`` in words: ``"m=1: token 4"``, ``"m=0: 7 tokens"``, ``"m=0-1: 12 outcomes"``,
        or ``"an outcome of probability 0"`` for group ``K``."""
        members = np.nonzero(self.groups == group)[0]
        if members.size == 0:
            return "an outcome of probability 0"
        stops, tokens = np.divmod(members, self.vocab_size)
        where = f"m={stops.min()}" if stops.min() == stops.max() else f"m={stops.min()}-{stops.max()}"
        if self.vocab_size == 1:
            return where
        if members.size == 1:
            return f"{where}: token {tokens[0]}"
        kind = "tokens" if stops.min() == stops.max() else "outcomes"
        return f"{where}: {members.size} {kind}"


@dataclasses.dataclass(frozen=True)
class PairedTrials(Trials):
    """Trials whose every trial has a partner: ``partner`` holds the same requests with the same
    seeds at the adjacent step (`adjacent_steps`)."""

    partner: Trials | None = None


def _outcomes(trials: Trials, request: int, vocab_size: int) -> I64Array:
    """``m * V + y`` of each trial of ``request`` (on a tree, ``m`` its stop row: `Trials.outcomes`);
    ``-1`` where ``m`` or ``y`` is out of range."""
    m, y = trials.outcomes(request)
    return np.where((m >= 0) & (y >= 0), m * vocab_size + y, -1)


def pair_fit(coarse: Coarse, num_pairs: int, alpha: float = stats.DEFAULT_ALPHA) -> stats.GoodnessOfFit:
    """The G-test of ``num_pairs`` pairs against the product law on ``coarse``'s ``(K + 1)**2`` cells:
    ``(g, h)`` for ``K`` groups and one more, of probability 0, holding every outcome of probability 0
    or out of range (one pair there rejects)."""
    extended = np.append(coarse.masses, 0.0)
    return stats.GoodnessOfFit(np.outer(extended, extended).reshape(-1), num_pairs, alpha=alpha)


def pair_counts(coarse: Coarse, first: I64Array, second: I64Array) -> I64Array:
    """The pairs' counts on the cells of `pair_fit`."""
    k = coarse.masses.size + 1
    return np.bincount(coarse.cells(first) * k + coarse.cells(second), minlength=k * k)


def _pair_detail(coarse: Coarse, first: I64Array, second: I64Array) -> Detail:
    """The detail of a pair-law G-test: its heaviest cells, each a pair of groups."""
    k = coarse.masses.size + 1

    def label(cell: stats.FitCell) -> str:
        pairs = [divmod(int(i), k) for i in cell.members[:2]]
        named = "; ".join(f"({coarse.name(g)}) then ({coarse.name(h)})" for g, h in pairs)
        return named + (f" and {cell.members.size - 2} more" if cell.members.size > 2 else "")

    return fit_detail(pair_fit(coarse, first.size), pair_counts(coarse, first, second), label)


def collision_pvalue(hits: int, chances: F64Array) -> float:
    """A one-sided p-value for ``hits`` or more collisions among independent pairs that collide with
    probabilities ``chances``: Hoeffding's (1956) bound by the binomial at their mean where ``hits``
    lies at least one past the expected count (itself at least 1), Chernoff's elsewhere past it."""
    size, expected = chances.size, float(chances.sum())
    if hits <= expected:
        return 1.0
    if expected >= 1.0 and hits >= expected + 1.0:
        return float(special.bdtrc(hits - 1, size, expected / size))
    return float(min(1.0, math.exp(hits - expected + hits * math.log(expected / hits))))


def components(
    checked: CheckedBatch, trials: PairedTrials, alpha: float
) -> tuple[list[Component], Deviation]:
    """The tests of every request's pairs (the module docstring), and the deviation they detect."""
    if trials.partner is None:
        raise ValueError("trials has no partner trials; expected PairedTrials from StepPairs.pair")
    vocab_size = checked.batch.vocab_size
    num_pairs = trials.num_trials
    tests: list[Component] = []
    joint_coarse: list[Coarse] = []
    for b, law in enumerate(checked.laws):
        n = law.accept_probs.shape[0]
        if (n + 1) * vocab_size == 1 or checked.ambiguous[b]:
            continue  # one possible outcome: nothing to get wrong
        first, second = (_outcomes(t, b, vocab_size) for t in (trials, trials.partner))
        coarse = Coarse.of(law.joint_probs(), num_pairs)
        fit, counts = pair_fit(coarse, num_pairs), pair_counts(coarse, first, second)
        what = f"(m, y) at adjacent steps: G over {fit.num_groups} cells of the product law, N={num_pairs}"
        explain = functools.partial(_pair_detail, coarse, first, second)
        tests.append(
            Component(b, None, float(fit.pvalues(counts)), float(fit.statistics(counts)), what, explain)
        )
        joint_coarse.append(coarse)
        if n > 0:
            m_first, m_second = (np.where(o >= 0, o // vocab_size, -1) for o in (first, second))
            stops = Coarse.of(law.stop_probs[:, None], num_pairs)
            fit, counts = pair_fit(stops, num_pairs), pair_counts(stops, m_first, m_second)
            if fit.num_groups >= 2:
                what = f"m at adjacent steps: G over {fit.num_groups} cells of the product law"
                explain = functools.partial(_pair_detail, stops, m_first, m_second)
                pvalue = float(fit.pvalues(counts))
                tests.append(Component(b, None, pvalue, float(fit.statistics(counts)), what, explain))
        valid = (first >= 0) & (second >= 0)
        chances = (law.token_probs @ law.token_probs.T)[
            first[valid] // vocab_size, second[valid] // vocab_size
        ]
        if chances.size and chances.max() < 1.0:
            hits = int(np.sum(first[valid] % vocab_size == second[valid] % vocab_size))
            mean = float(chances.mean())
            what = (
                f"same token at adjacent steps: {hits}/{chances.size}, {chances.sum():.1f} expected given m"
            )
            labels = ("the same token", "different tokens")
            explain = functools.partial(binomial_detail, labels, hits, chances.size, mean)
            tests.append(
                Component(b, None, collision_pvalue(hits, chances), hits / chances.size, what, explain)
            )
    level = alpha / max(len(tests), 1)
    # The requests whose law splits into two groups or more speak for the check; where none does, a
    # pair can only deviate by an outcome of probability 0 (as for the law of y).
    split = [c for c in joint_coarse if c.masses.size >= 2] or joint_coarse
    detectable = max((pair_fit(c, num_pairs, level).detectable_tv for c in split), default=math.inf)
    return tests, Deviation(detectable, "total variation")


class StepPairs(StatisticalCheck):
    """Outputs at adjacent steps of one seed are independent (the module docstring says how)."""

    name = "step_pairs"
    trial_calls = 1  # the shared trials' partners at the adjacent step
    varies = "each trial a pair: a fresh seed at the request's step and at the adjacent step"

    def applies(self, variant: Variant, batch: SpecBatch) -> bool:
        """The variant's scheme does not key draws by a sequence position, and some request has more
        than one possible outcome ``(m, y)``."""
        if getattr(getattr(variant, "streams", None), "step_is_position", False):
            return False
        return batch.vocab_size > 1 or any(n > 0 for n in batch.num_drafts())

    def verdict(
        self, variant: Variant, checked: CheckedBatch, settings: Settings, trials: Trials | None
    ) -> Verdict:
        """Holm's combination of the tests on the pairs; the verdict counts both members of each."""
        verdict = super().verdict(variant, checked, settings, self.pair(variant, checked, settings, trials))
        return dataclasses.replace(verdict, num_samples=2 * verdict.num_samples)

    def pair(
        self, variant: Variant, checked: CheckedBatch, settings: Settings, trials: Trials | None
    ) -> PairedTrials:
        """The shared trials (drawn here when none match them) and their partners at the adjacent step."""
        batch = checked.batch
        if trials is None or not _shared(trials, batch, settings):
            trials = self.draw(variant, checked, settings)
        step = adjacent_steps(batch.step.detach().cpu().numpy())
        shifted = dataclasses.replace(
            batch, step=torch.as_tensor(step, dtype=batch.step.dtype, device=batch.device)
        )
        partner = draw_trials(variant, shifted, settings.num_samples, settings.seed)  # the seeds of `trials`
        fields = {f.name: getattr(trials, f.name) for f in dataclasses.fields(Trials)}
        return PairedTrials(**fields, partner=partner)

    def components(
        self, checked: CheckedBatch, trials: Trials, settings: Settings
    ) -> tuple[list[Component], Deviation]:
        """The tests of the pairs, and the deviation they detect."""
        if not isinstance(trials, PairedTrials):
            raise TypeError(f"trials is {type(trials).__name__}; expected PairedTrials")
        return components(checked, trials, settings.alpha)


def _shared(trials: Trials, batch: SpecBatch, settings: Settings) -> bool:
    """Whether ``trials`` are those `draw_trials` gives ``batch`` by default at ``settings`` (the
    trials the law checks share): its seeds, the requests' own steps and drafts."""
    count = batch.num_requests * settings.num_samples
    return (
        trials.batch is batch
        and trials.num_trials == settings.num_samples
        and trials.steps is None
        and trials.draft_token_ids is None
        and np.array_equal(trials.seeds, trial_seeds(settings.seed, "trials", count))
    )


CHECK = StepPairs()
