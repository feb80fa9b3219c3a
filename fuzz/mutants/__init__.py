"""Sampler variants with real bugs planted (docs/bugs.md); the harness self-test must kill each one.

Each mutant is the walk (`reference.walk.WalkSampler`, exact on the canonical streams) with one
stage overridden the way a shipped bug changed it; M23 plants its bug in the Triton kernel's
source. M28-M30 plant block-verification bugs (`reference.block`) in the walk's block stages. M31
runs the walk on streams of its own that repeat shifted across steps, M32 mishandles a degenerate
draft row (one equal to its target row) and nothing else. M33-M40 plant filtered-verification bugs
(`reference.filters`): each declares every filter, as the walk does, and is the walk on a batch
without sampling parameters; most read the rows through a `reference.law.BatchRows` whose filtering
misbehaves. M41-M46 plant tree-verification bugs (`reference.tree`) in the walk's tree stages and
declare method ``"tree"`` alone; the others plant chain bugs and are checked on the chain methods.
`MUTANTS` maps the id to where it lives and which checks are expected to kill it; docs/bugs.md lists
each bug with its public source.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass

from specsample.reference.contract import Variant, capabilities
from specsample.reference.methods import CHAIN_METHODS


@dataclass(frozen=True)
class Mutant:
    """A planted bug: its id, the class that plants it, what it is, the checks expected to kill it,
    and the methods it is checked on (``None``: those its class declares)."""

    id: str
    spec: str  # MODULE:NAME of the class that plants it
    bug: str
    expected: tuple[str, ...]
    gpu_only: bool = False
    methods: tuple[str, ...] | None = None

    def load(self) -> Variant:
        """A fresh instance of the mutant, its capabilities narrowed to ``methods``."""
        module, _, cls = self.spec.rpartition(":")
        variant: Variant = getattr(importlib.import_module(module), cls)()
        if self.methods is not None:
            declared = capabilities(variant)
            narrowed = tuple(m for m in declared.methods if m in self.methods)
            variant.capabilities = dataclasses.replace(declared, methods=narrowed)  # type: ignore[attr-defined]
        return variant


# MODULE:CLASS under `specsample.fuzz.mutants` (the module's prefix is the id): the bug, the checks
# expected to kill it.
_PLANTED = {
    "m01_nonstrict_accept:NonStrictAccept": ("acceptance test p >= u*q", "invariants"),
    "m02_zero_uniform:ZeroUniform": ("acceptance uniform hard-coded to 0", "law_of_m"),
    "m03_unclamped_residual:UnclampedResidual": ("residual not clamped", "law_of_y"),
    "m04_residual_at_draft_only:ResidualAtDraftOnly": ("residual subtracts q at the draft only", "law_of_y"),
    "m05_unnormalised_residual:UnnormalisedResidual": ("residual not renormalised", "law_of_y"),
    "m06_bonus_from_last_draft_row:BonusFromLastDraftRow": (
        "bonus drawn from the last draft row",
        "law_of_y",
    ),
    "m07_bonus_after_rejection:BonusAfterRejection": ("bonus emitted after a rejection", "invariants"),
    "m08_no_stop_at_rejection:NoStopAtRejection": ("no stop at the first rejection", "invariants law_of_m"),
    "m09_reused_uniform:ReusedUniform": ("acceptance uniform reused for the residual", "law_of_y coupled"),
    "m10_shared_uniform:SharedUniform": ("one uniform shared by every position", "law_of_m"),
    "m11_residual_from_row_zero:ResidualFromRowZero": ("residual read from row 0", "law_of_y"),
    "m12_draft_temperature_twice:DraftTemperatureTwice": (
        "temperature twice on the draft",
        "law_of_m law_of_y",
    ),
    "m13_draft_temperature_missing:DraftTemperatureMissing": ("temperature missing on the draft", "law_of_m"),
    "m14_greedy_as_random:GreedyAsRandom": ("greedy rows sampled at T = 1", "invariants"),
    "m15_draft_by_batch_index:DraftByBatchIndex": (
        "drafts read by batch index, not draft_slot",
        "law_of_m law_of_y composition",
    ),
    "m16_dropped_last_tile:DroppedLastTile": ("last vocabulary tile dropped", "invariants law_of_y"),
    "m17_nan_gives_out_of_range:NanGivesOutOfRange": ("NaN logits give an id >= V", "invariants"),
    "m18_seed_of_first_request:SeedOfFirstRequest": ("per-request seed ignored", "composition"),
    "m19_degenerate_residual_token_zero:DegenerateResidualTokenZero": (
        "empty residual falls back to token 0",
        "invariants",
    ),
    "m20_placeholder_as_index:PlaceholderAsIndex": ("placeholder -1 used as an index", "invariants"),
    "m21_strict_for_probabilistic:StrictForProbabilistic": ("strict run for probabilistic", "law_of_m"),
    "m22_unconditional_synthetic_rates:UnconditionalSyntheticRates": (
        "unconditional synthetic rates used as conditional",
        "law_of_m",
    ),
    "m23_int32_offsets:Int32Offsets": ("int32 row offsets overflow past 2**31 logits", "invariants law_of_y"),
    "m24_step_ignored:StepIgnored": ("step not mixed into the random stream", "steps step_pairs"),
    "m25_uninitialised_tail:UninitialisedTail": (
        "padding after num_emitted left uninitialised",
        "determinism invariants",
    ),
    "m26_softmax_without_max:SoftmaxWithoutMax": ("softmax without max subtraction", "invariants law_of_y"),
    "m27_fp32_probs_declared_log:Fp32ProbsDeclaredLog": (
        "fp32 probabilities while declaring log space",
        "law_of_m",
    ),
    "m28_token_residual_after_block:TokenResidualAfterBlock": (
        "block: token-wise residual after a stop",
        "law_of_y marginal",
    ),
    "m29_keep_probability_is_weight:KeepProbabilityIsWeight": (
        "block: keep probability h_i = w_i",
        "law_of_m",
    ),
    "m30_bonus_after_partial_block:BonusAfterPartialBlock": (
        "block: bonus row sampled when m = n - 1",
        "invariants law_of_y marginal",
    ),
    "m31_streams_keyed_by_step_plus_position:StreamsKeyedByStepPlusPosition": (
        "own streams keyed by step + i: they repeat shifted at the next step",
        "step_pairs",
    ),
    "m32_equal_row_self_drafted:EqualRowSelfDrafted": (
        "one draft row equal to its target row: the request read as self-drafted",
        "law_of_m law_of_y marginal",
    ),
    "m33_raw_draft_law_in_ratio:RawDraftLawInRatio": (
        "filtered drafts verified with the raw draft law q",
        "law_of_m",
    ),
    "m34_min_p_at_bonus_only:MinPAtBonusOnly": ("min-p applied to the bonus row only", "invariants"),
    "m35_top_p_before_top_k:TopPBeforeTopK": ("top-p applied before top-k", "invariants"),
    "m36_zero_mass_draft_at_zero_coin:ZeroMassDraftAtZeroCoin": (
        "filtered path: draft of zero filtered mass accepted at a zero coin",
        "invariants",
    ),
    "m37_top_p_boundary_dropped:TopPBoundaryDropped": ("top-p boundary token dropped", "invariants law_of_y"),
    "m38_argmax_on_filtered_batches:ArgmaxOnFilteredBatches": (
        "filtered path: argmax where the law should be sampled",
        "law_of_y",
    ),
    "m39_filters_dropped:FiltersDropped": ("sampling parameters dropped", "invariants"),
    "m40_truncated_top_p_search:TruncatedTopPSearch": (
        "top-p by a threshold search cut after 18 halvings",
        "invariants coupled",
    ),
    "m41_tree_residual_from_draft_law:TreeResidualFromDraftLaw": (
        "tree: token after a miss drawn from the draft law",
        "law_of_y",
    ),
    "m42_siblings_past_32_dropped:SiblingsPast32Dropped": (
        "tree: children past the 32nd dropped",
        "invariants law_of_m",
    ),
    "m43_tree_as_chain:TreeAsChain": ("tree verified as a chain (first child only)", "invariants law_of_m"),
    "m44_ancestors_past_request:AncestorsPastRequest": (
        "tree: parents read past the request, into the next one's",
        "invariants law_of_m",
    ),
    "m45_tree_argmax_at_temperature:TreeArgmaxAtTemperature": (
        "tree: argmax at every node at T > 0",
        "law_of_m law_of_y",
    ),
    "m46_children_by_ratio:ChildrenByRatio": (
        "tree: children accepted one by one by min(1, p / q)",
        "law_of_m",
    ),
}
# The tree-verification mutants: every other one plants a chain bug, checked on the chain methods.
_TREE = ("M41", "M42", "M43", "M44", "M45", "M46")
# Mutants whose bug needs a batch past 2**31 logits in one call: they run in the GPU tier only.
_GPU_TIER = ("M23",)


def _mutant(spec: str, bug: str, expected: str) -> Mutant:
    """The `Mutant` of a row of `_PLANTED`."""
    id_ = spec[:3].upper()
    methods = None if id_ in _TREE else CHAIN_METHODS
    return Mutant(
        id_, f"specsample.fuzz.mutants.{spec}", bug, tuple(expected.split()), id_ in _GPU_TIER, methods
    )


MUTANTS: dict[str, Mutant] = {m.id: m for m in (_mutant(spec, *row) for spec, row in _PLANTED.items())}
