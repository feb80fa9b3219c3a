"""The checks applied to every variant (the reference, Triton, PyTorch) across methods and batch shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specsample.properties import strategies
from specsample.properties.checks import CHECKS, compare_variants, run_checks
from specsample.properties.checks.base import draw_trials
from specsample.properties.suite import (
    PROFILE,
    assert_verdicts,
    load_variant,
    slow_under_interpreter,
    variant_names,
)
from specsample.reference.contract import METHODS, RequestData, SpecBatch, capabilities, make_batch
from specsample.reference.synthetic import conditional_rates, synthetic_params
from specsample.reference.walk import WalkSampler

# Every statistical verdict has alpha 1e-6 (Holm-split across its tests, requests and positions) and
# states its detectable deviation; at 2,000 trials per request the law of m detects a shift of about
# 0.07-0.1 in any P(m = j), the law of y about 0.15 TV on the joint law of (m, y), the marginal about
# 0.12 TV at position 0, the step pairs 0.10-0.15 TV between the pair law and the product law (power
# 0.999). The exact checks detect a per-sample violation rate of 6.9 / N.
EXACT = ("invariants", "coupled", "composition", "determinism")
STATISTICAL = ("law_of_m", "law_of_y", "marginal", "step_pairs")
VARIANTS = variant_names()
GPU_VARIANTS = [name for name in VARIANTS if name != "reference"]  # the reference is float64 on the CPU


def _implements(name: str, method: str) -> bool:
    """Whether the variant called ``name`` declares ``method`` (only those pairs are parametrised)."""
    return method in capabilities(load_variant(name)).methods


# The reference sampler walks requests in Python: it gets a quarter of the statistical budget.
REFERENCE_SHARE = 4


def _num_samples(name: str) -> int:
    return PROFILE.num_samples // REFERENCE_SHARE if name == "reference" else PROFILE.num_samples


def _seeds() -> st.SearchStrategy[int]:
    return st.integers(0, 2**31 - 1)


# ---------------------------------------------------------------------------------------------
# Generated batches, CPU


@pytest.mark.parametrize("name", VARIANTS)
def test_exact_checks_hold_on_generated_batches(name: str) -> None:
    """Every generated batch keeps the invariants, coupling, batch-composition invariance and determinism."""
    variant = load_variant(name)
    slow = slow_under_interpreter(name)
    sizes = {"max_requests": 2, "max_drafts": 3} if slow else {}
    trials = PROFILE.interpreted_trials if slow else 20
    caps = capabilities(variant)

    @settings(max_examples=PROFILE.interpreted_examples if slow else PROFILE.variant_examples)
    @given(batch=strategies.spec_batches(profile="ci", capabilities=caps, **sizes), seed=_seeds())
    def check(batch: SpecBatch, seed: int) -> None:
        assert_verdicts(run_checks(variant, batch, checks=EXACT, num_samples=trials, seed=seed), seed=seed)

    check()


@pytest.mark.parametrize("name", VARIANTS)
def test_statistical_checks_hold_on_generated_batches(name: str) -> None:
    """On generated batches of every family, m, y given m and each position's marginal follow the law."""
    variant = load_variant(name)
    num_samples = _num_samples(name) // 2

    @settings(max_examples=PROFILE.variant_examples)
    @given(
        batch=strategies.spec_batches(
            profile="ci", max_requests=3, max_vocab=1100, capabilities=capabilities(variant)
        ),
        seed=_seeds(),
    )
    def check(batch: SpecBatch, seed: int) -> None:
        verdicts = run_checks(variant, batch, checks=STATISTICAL, num_samples=num_samples, seed=seed)
        assert_verdicts(verdicts, seed=seed)

    check()


# ---------------------------------------------------------------------------------------------
# Fixed shapes, CPU: every method and draft layout at the full statistical budget


def _rows(rng: np.random.Generator, count: int, vocab_size: int, scale: float = 1.5) -> np.ndarray:
    return rng.normal(size=(count, vocab_size)) * scale


def fixed_batch(case: str, device: str = "cpu") -> SpecBatch:
    """A named batch: one per method and draft layout, plus greedy rows and a needle at the last tile."""
    rng = np.random.default_rng(sum(map(ord, case)))
    vocab_size = 4097 if case == "needle at the last tile" else 48
    counts, temperatures = [3, 0, 2], [1.0, 0.7, 1.0]
    if case == "greedy rows mixed in":
        temperatures = [0.0, 1.0, 0.0]
    method = _case_method(case)
    one_hot = case == "one-hot drafts"
    requests = []
    for b, (n, temperature) in enumerate(zip(counts, temperatures, strict=True)):
        if case == "needle at the last tile":
            target, draft = strategies.family_logits(rng, "needle", n, vocab_size, block_size=4096)
        else:
            target, draft = _rows(rng, n + 1, vocab_size), _rows(rng, n, vocab_size)
        ids = strategies.choose_drafts(rng, "from_q", target, draft, temperature or 1.0, placeholder_rate=0.0)
        if b == 2 and n:
            ids[-1] = -1  # a placeholder
        requests.append(RequestData(target, ids, None if one_hot else draft, temperature, seed=b, step=3 * b))
    slots = [3, 0, 1] if case == "slotted drafts" else None
    rates = conditional_rates(*synthetic_params(0.6, 3), 3)
    return make_batch(
        requests,
        method=method,  # type: ignore[arg-type]
        synthetic_rates=rates,
        slots=slots,
        num_slots=5 if slots else None,
        slot_capacity=4 if slots else None,
        device=device,
    )


FIXED_CASES = (
    "flat drafts",
    "one-hot drafts",
    "slotted drafts",
    "strict",
    "synthetic",
    "greedy rows mixed in",
    "needle at the last tile",
    "block",
)


def _case_method(case: str) -> str:
    """The method of the fixed case ``case``."""
    return {"strict": "strict", "synthetic": "synthetic", "block": "block"}.get(case, "probabilistic")


@pytest.mark.parametrize(
    ("name", "case"), [(n, c) for c in FIXED_CASES for n in VARIANTS if _implements(n, _case_method(c))]
)
def test_all_checks_hold_on_fixed_shapes(name: str, case: str) -> None:
    """Every check passes on each method and draft layout at the profile's full statistical budget."""
    batch = fixed_batch(case)
    seed = FIXED_CASES.index(case)
    # The needle puts all mass on six ids of 4097, so a quarter of the trials keeps its power.
    num_samples = _num_samples(name) // (4 if case == "needle at the last tile" else 1)
    verdicts = run_checks(load_variant(name), batch, num_samples=num_samples, seed=seed)
    assert_verdicts(verdicts, seed=seed)


@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_draws_what_the_walk_draws(name: str) -> None:
    """Compared with the walk by a two-sample G-test, each variant draws the same (m, y)."""
    # alpha 1e-6 Holm-split over the requests; the result states the TV it detects (about 0.2 here).
    result = compare_variants(load_variant(name), WalkSampler(), fixed_batch("flat drafts"), seed=5)
    assert result.passed, result.message


# ---------------------------------------------------------------------------------------------
# GPU tiers


def _gpu_trials(batch: SpecBatch, budget: int) -> int:
    """Trials per request: the profile's budget, fewer where the logits would pass 2**31 elements."""
    rows = sum(n + 1 for n in batch.num_drafts()) * batch.vocab_size
    return max(200, min(budget, (1 << 31) // rows))


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_VARIANTS)
def test_gpu_all_checks_hold_on_generated_batches(name: str) -> None:
    """On the GPU, every check passes on generated batches up to 256K-token vocabularies."""
    variant = load_variant(name)
    caps = capabilities(variant)

    @given(
        batch=strategies.spec_batches(profile="gpu", max_requests=8, device="cuda", capabilities=caps),
        seed=_seeds(),
    )
    def check(batch: SpecBatch, seed: int) -> None:
        num_samples = _gpu_trials(batch, PROFILE.num_samples)
        assert_verdicts(run_checks(variant, batch, num_samples=num_samples, seed=seed), seed=seed)

    check()


LARGE_VOCABULARIES = (32000, 128256, 151936, 262144)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("name", "vocab_size", "method"),
    [(n, v, m) for m in METHODS for v in LARGE_VOCABULARIES for n in GPU_VARIANTS if _implements(n, m)],
)
def test_gpu_checks_hold_at_production_vocabularies(name: str, vocab_size: int, method: str) -> None:
    """At production vocabulary sizes, Zipf-shaped laws pass every check (of the methods it implements)."""
    rng = np.random.default_rng(vocab_size)
    requests = []
    for b, n in enumerate([4, 1, 0, 3]):
        target, draft = strategies.family_logits(rng, "zipf", n, vocab_size)
        ids = strategies.choose_drafts(rng, "from_q", target, draft, 1.0, placeholder_rate=0.0)
        requests.append(RequestData(target, ids, draft, [1.0, 0.7, 1.0, 0.0][b], seed=b, step=b))
    batch = make_batch(
        requests, method=method, synthetic_rates=[0.9, 0.8, 0.7, 0.6], dtype=torch.bfloat16, device="cuda"
    )  # type: ignore[arg-type]
    seed = LARGE_VOCABULARIES.index(vocab_size)
    num_samples = _gpu_trials(batch, PROFILE.num_samples)
    assert_verdicts(run_checks(load_variant(name), batch, num_samples=num_samples, seed=seed), seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_VARIANTS)
def test_gpu_one_call_past_int32_offsets(name: str) -> None:
    """M23 (vLLM #46560): one call with rows * V past 2**31 keeps the invariants and the laws of m and y."""
    rng = np.random.default_rng(23)
    vocab_size, n = 262144, 3
    target, draft = strategies.family_logits(rng, "peaked", n, vocab_size)
    ids = strategies.choose_drafts(rng, "from_q", target, draft, 1.0, placeholder_rate=0.0)
    batch = make_batch([RequestData(target, ids, draft, 1.0)], dtype=torch.bfloat16, device="cuda")
    num_trials = (1 << 31) // ((n + 1) * vocab_size) + 64  # 2112 trials: 8448 rows, 2.2e9 logits
    variant = load_variant(name)
    trials = draw_trials(variant, batch, num_trials, seed=23, max_elements=1 << 32)
    verdicts = [
        CHECKS[name].run(variant, batch, trials=trials) for name in ("invariants", "law_of_m", "law_of_y")
    ]
    assert_verdicts(verdicts, seed=23)


def test_a_sampler_is_held_to_the_law_of_its_declared_arithmetic() -> None:
    """The PyTorch sampler works in fp32 probabilities and says so: a draft whose p and q underflow is
    never accepted, which its law (fp32-probs) says too; held to the log-space law it would fail."""
    # At T = 0.5, p(d) = e**-193 (2e-84) and q(d) = e**-197 (3e-86): the exact ratio is 55, so a
    # log-space sampler always accepts d; in fp32 probabilities both are zero and d is rejected.
    target = np.array([[0.0, -96.5], [0.0, 0.0]])
    draft = np.array([[0.0, -98.5]])
    batch = make_batch([RequestData(target, [1], draft, temperature=0.5, seed=108)])
    variant = load_variant("torch")
    verdict = CHECKS["law_of_m"].run(variant, batch, num_samples=200, seed=1)
    assert verdict.passed, verdict.message
    log_space = CHECKS["law_of_m"].run(_AsLogSpace(variant), batch, num_samples=200, seed=1)
    assert log_space.failed, log_space.message  # alpha 1e-6; P(m = 1) is 1 against 0 observed


class _AsLogSpace:
    """The same sampler declaring no capabilities: log-space arithmetic by default."""

    streams = None

    def __init__(self, inner: object) -> None:
        self.inner, self.name = inner, "torch declared log-space"

    def __call__(self, batch: SpecBatch) -> object:
        return self.inner(batch)  # type: ignore[operator]
