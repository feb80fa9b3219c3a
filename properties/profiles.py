"""The profiles: one registry of how hard the suite and the fuzzer work, chosen by ``HYPOTHESIS_PROFILE``.

A profile sets the Hypothesis settings of the property suite, the trials per request of the
statistical checks, the sizes of generated batches, and the fuzzer's budgets. ``ci`` runs in tox on
a CPU (derandomized, no example database); ``dev`` is a developer's CPU run; ``gpu`` and ``nightly``
run on a CUDA GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, settings

# Tiles of the production kernel: 16 lanes at least, 4096 at most; 32 splits of 4096 = 131072.
CPU_BLOCK_SIZES = (16, 4096)
GPU_BLOCK_SIZES = (16, 4096, 131072)
ENV = "HYPOTHESIS_PROFILE"
DEFAULT = "dev"


@dataclass(frozen=True)
class Sizes:
    """How large a profile's batches get: the largest vocabulary size drawn, the most requests in a
    batch, the most drafts of one request, and the tile widths whose edges vocabulary sizes gather at."""

    max_vocab: int
    max_requests: int
    max_drafts: int
    block_sizes: tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """How hard one profile works.

    Attributes:
        name: the ``HYPOTHESIS_PROFILE`` value.
        examples: Hypothesis examples per property test.
        variant_examples, interpreted_examples: examples of the generated-batch variant tests (each
            draws thousands of trials), and of those for a Triton variant under the CPU interpreter.
        num_samples, interpreted_trials: trials per request of the statistical checks, and for a
            Triton variant under the interpreter.
        alpha: the false-failure rate of each assertion.
        sizes: the sizes of generated batches.
        fuzz_examples_per_round: Hypothesis examples per fuzz search round.
        fuzz_seconds: a campaign's default time budget.
        screen_trials: trials per request with which the fuzz search screens a batch; a batch that
            looks suspicious is confirmed with ``num_samples`` fresh ones.
        derandomize: whether Hypothesis runs derandomized, without an example database.
    """

    name: str
    examples: int
    variant_examples: int
    interpreted_examples: int
    num_samples: int
    interpreted_trials: int
    alpha: float
    sizes: Sizes
    fuzz_examples_per_round: int
    fuzz_seconds: float
    screen_trials: int
    derandomize: bool = False


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "ci", 25, 8, 6, 2000, 2, 1e-6, Sizes(4097, 4, 4, CPU_BLOCK_SIZES), 4, 60.0, 200, derandomize=True
        ),
        Profile("dev", 25, 20, 10, 4000, 4, 1e-6, Sizes(4097, 6, 6, CPU_BLOCK_SIZES), 25, 300.0, 300),
        Profile("gpu", 100, 25, 10, 20000, 4, 1e-6, Sizes(262144, 64, 8, GPU_BLOCK_SIZES), 50, 600.0, 2000),
        Profile(
            "nightly",
            1000,
            250,
            50,
            100000,
            8,
            1e-6,
            Sizes(262144, 256, 16, GPU_BLOCK_SIZES),
            200,
            3600.0,
            10000,
        ),
    )
}


def get(name: str | None = None) -> Profile:
    """The profile called ``name`` (default: ``HYPOTHESIS_PROFILE``, else ``dev``)."""
    name = name or os.environ.get(ENV, DEFAULT)
    if name not in PROFILES:
        raise ValueError(f"profile is {name!r}; expected one of {', '.join(PROFILES)}")
    return PROFILES[name]


def register_hypothesis_profiles() -> None:
    """Register every profile's Hypothesis settings and load the current one."""
    # Generating vocab-sized batches is slow by Hypothesis's measure, and rightly so.
    slow_ok = [HealthCheck.too_slow, HealthCheck.data_too_large]
    for p in PROFILES.values():
        parent = settings.get_profile("ci") if p.derandomize else settings.default
        settings.register_profile(
            p.name,
            parent=parent,
            max_examples=p.examples,
            deadline=None,
            print_blob=True,
            suppress_health_check=slow_ok,
        )
    settings.load_profile(get().name)
