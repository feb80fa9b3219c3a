"""What the test modules share: the variants under test, the profile, and replayable assertions.

The profile (``HYPOTHESIS_PROFILE``: ``ci``, ``dev``, ``gpu``, ``nightly``; `properties.profiles`)
sets the Hypothesis settings and the sample budgets alike, so one switch scales the whole suite.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from specsample.kernels import registry
from specsample.properties import profiles
from specsample.properties.checks import Verdict
from specsample.reference.contract import Variant
from specsample.reference.sampler import ReferenceSampler

PROFILE = profiles.get()


def cuda_available() -> bool:
    """Whether a CUDA GPU is present (GPU-marked tests skip without one)."""
    return torch.cuda.is_available()


def variant_names() -> list[str]:
    """The reference sampler and every registered variant, as kernels land in the registry."""
    return ["reference", *registry.names()]


def load_variant(name: str) -> Variant:
    """A fresh instance of the variant called ``name``."""
    return ReferenceSampler() if name == "reference" else registry.get(name)


def slow_under_interpreter(name: str) -> bool:
    """Whether ``name`` runs Triton programs one at a time here (under the CPU interpreter)."""
    return name == "triton" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def replay_hint(seed: int, variant: str) -> str:
    """How to replay the current test: the node, the profile, the variant and the check seed."""
    node = os.environ.get("PYTEST_CURRENT_TEST", "this test").rsplit(" ", 1)[0]
    return (
        f"replay: HYPOTHESIS_PROFILE={PROFILE.name} python -m pytest '{node}' (variant {variant}, check seed "
        f"{seed}); a Hypothesis test prints its @reproduce_failure blob below"
    )


def assert_verdicts(verdicts: Sequence[Verdict], *, seed: int) -> None:
    """Fail with every failed verdict's message and the replay instructions; pass if none failed.

    An inconclusive verdict (a generated batch whose law leaves a check no power, such as a
    near-certain token) fails nothing: it claims nothing.
    """
    assert verdicts, "no verdict: no check applied"
    failed = [v for v in verdicts if v.failed]
    if failed:
        lines = [f"[{v.variant}] {v.message}" for v in failed]
        raise AssertionError("\n".join([*lines, replay_hint(seed, failed[0].variant)]))
