"""What the test modules share: the variants under test, per-profile budgets, and replayable assertions.

The Hypothesis profile (``HYPOTHESIS_PROFILE``: ``ci``, ``dev``, ``gpu``, ``nightly``; see
``properties/conftest.py``) also picks the sample budgets here, so one switch scales the whole suite.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels import registry
from properties.checks import Verdict
from reference.contract import Variant
from reference.sampler import ReferenceSampler

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")


@dataclass(frozen=True)
class Budget:
    """How much work a profile puts into the variant tests.

    Attributes:
        num_samples: trials per request for the statistical checks of a compiled or plain-Python
            variant.
        interpreted_trials: trials per request for a Triton variant running under the interpreter,
            which only gets the exact checks there (a few milliseconds per program).
        examples: Hypothesis examples of the generated-batch variant tests.
        interpreted_examples: the same for an interpreted Triton variant.
    """

    num_samples: int
    interpreted_trials: int
    examples: int
    interpreted_examples: int


BUDGETS = {
    "ci": Budget(num_samples=2000, interpreted_trials=2, examples=8, interpreted_examples=6),
    "dev": Budget(num_samples=4000, interpreted_trials=4, examples=20, interpreted_examples=10),
    "gpu": Budget(num_samples=20000, interpreted_trials=4, examples=25, interpreted_examples=10),
    "nightly": Budget(num_samples=100000, interpreted_trials=8, examples=250, interpreted_examples=50),
}
BUDGET = BUDGETS.get(PROFILE, BUDGETS["dev"])


def cuda_available() -> bool:
    """Whether a CUDA GPU is present (GPU-marked tests skip without one)."""
    return torch.cuda.is_available()


def interpreted() -> bool:
    """Whether Triton kernels run under the CPU interpreter in this process."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def variant_names() -> list[str]:
    """The reference sampler and every registered variant, as kernels land in the registry."""
    return ["reference", *registry.names()]


def load_variant(name: str) -> Variant:
    """A fresh instance of the variant called ``name``."""
    return ReferenceSampler() if name == "reference" else registry.get(name)


def slow_under_interpreter(name: str) -> bool:
    """Whether ``name`` runs Triton programs one at a time here (under the CPU interpreter)."""
    return name == "triton" and interpreted()


def replay_hint(seed: int, variant: str) -> str:
    """How to replay the current test: the node, the profile, the variant and the check seed."""
    node = os.environ.get("PYTEST_CURRENT_TEST", "this test").rsplit(" ", 1)[0]
    return (
        f"replay: HYPOTHESIS_PROFILE={PROFILE} python -m pytest '{node}' (variant {variant}, check seed "
        f"{seed}); a Hypothesis test prints its @reproduce_failure blob below"
    )


def assert_verdicts(verdicts: Sequence[Verdict], *, seed: int) -> None:
    """Fail with every failed verdict's message and the replay instructions; pass if all passed."""
    assert verdicts, "no verdict: no check applied"
    failed = [v for v in verdicts if not v.passed]
    if failed:
        lines = [f"[{v.variant}] {v.message}" for v in failed]
        raise AssertionError("\n".join([*lines, replay_hint(seed, failed[0].variant)]))
