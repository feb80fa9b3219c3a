"""What a failed verdict says: the request in words, the decisive cells, the deviation seen."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch

from specsample.properties.checks import check, run_checks
from specsample.properties.checks.base import Cell, describe_request
from specsample.reference.contract import RequestData, SpecBatch, SpecOutput, make_batch
from specsample.reference.law import exact_law
from specsample.reference.walk import F64Array, I64Array, WalkSampler

# Every failure below is a planted bug seen by a test at alpha 1e-6 (Holm-split within its check);
# the sizes make each far past the detectable deviation the verdict states with power 0.999.
NUM_SAMPLES = 2000


class AlwaysZero:
    """Emits token 0 and nothing else, whatever the law (the reported bug)."""

    name = "always-zero"
    streams = None

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        width = batch.resolved_max_num_drafts() + 1
        tokens = torch.full((batch.num_requests, width), -1, dtype=torch.int64)
        tokens[:, 0] = 0
        return SpecOutput(token_ids=tokens, num_emitted=torch.ones(batch.num_requests, dtype=torch.int32))


class Reluctant(WalkSampler):
    """Acceptance uniforms pushed towards 1 (``sqrt(u)``): fewer drafts accepted than the law says."""

    def accept_uniforms(self, seed: I64Array, step: I64Array, position: int) -> F64Array:
        return np.sqrt(super().accept_uniforms(seed, step, position))


class Returns:
    """A variant that returns ``value`` instead of a `SpecOutput`."""

    streams = None

    def __init__(self, value: object) -> None:
        self.value = value
        self.name = f"returns-{type(value).__name__}"

    def __call__(self, batch: SpecBatch) -> object:
        return self.value


def _point_mass() -> SpecBatch:
    """One request without drafts whose law puts all mass on token 2 of three."""
    target = np.full((1, 3), -np.inf)
    target[0, 2] = 0.0
    return make_batch([RequestData(target, [], None, 1.0, seed=7)])


def _drafted() -> SpecBatch:
    """One request of three drafts with draft logits over twelve tokens at T = 0.7."""
    rng = np.random.default_rng(3)
    target, draft = rng.normal(size=(4, 12)), rng.normal(size=(3, 12))
    return make_batch([RequestData(target, [4, 9, 2], draft, 0.7, seed=5, step=3)])


def test_a_token_of_probability_0_is_named_with_its_counts() -> None:
    """Token 0 emitted 800 times where the law gives it probability 0: the message and the
    explanation say so, with observed 800 against expected 0."""
    verdict = check("law_of_y", AlwaysZero(), _point_mass(), num_samples=800, seed=1)
    assert verdict is not None and verdict.failed, verdict
    assert "\n" not in verdict.message and "probability 0" in verdict.message, verdict.message
    assert "token 0" in verdict.message, verdict.message
    zero = verdict.cells[0]
    assert zero.impossible and zero.observed == 800 and zero.expected == 0, verdict.cells
    assert "token 0" in zero.label and zero.outcomes == 1, zero
    assert any(c.observed == 0 and c.expected == pytest.approx(800) for c in verdict.cells), verdict.cells
    assert verdict.observed is not None and verdict.observed.value == pytest.approx(1.0)
    assert verdict.observed.unit == "total variation"
    text = "\n".join(verdict.explain())
    assert "token 0 with m=0 observed 800 times; the exact law gives it probability 0" in text, text
    row = next(line for line in text.splitlines() if line.strip().startswith("token 0 with m=0  "))
    assert row.split()[-4:] == ["800", "0", "probability", "0"], row
    assert "Request 0: probabilistic, V=3, n=0, drafts [], T=1, seed 7, step 0" in text, text


def test_the_request_is_described_in_words() -> None:
    """The subject gives the method, V, n, the drafts, T, the seed, the step and the draft layout."""
    text = describe_request(_drafted(), 0)
    assert text.startswith("request 0: probabilistic, V=12, n=3, drafts [4, 9, 2], T=0.7, seed 5, step 3")
    assert "flat draft logits" in text and "float32 logits" in text, text
    greedy = make_batch([RequestData(np.zeros((2, 5)), [1], None, 0.0)], method="strict")
    assert "strict" in describe_request(greedy, 0) and "T=0 (greedy)" in describe_request(greedy, 0)
    assert "one-hot drafts" in describe_request(greedy, 0)


def test_a_shifted_law_of_m_shows_the_cells_of_m() -> None:
    """Too few acceptances: the law-of-m verdict shows the cells of m with N times their exact
    probabilities, and the probability's deviation seen."""
    batch = _drafted()
    verdict = check("law_of_m", Reluctant(), batch, num_samples=NUM_SAMPLES, seed=2)
    assert verdict is not None and verdict.failed, verdict
    stop_probs = exact_law(batch)[0].stop_probs
    assert verdict.cells and all(c.label.startswith(("m=", "draft ")) for c in verdict.cells), verdict.cells
    for cell in verdict.cells:
        if cell.label.startswith("m="):
            j = int(cell.label.removeprefix("m="))
            assert cell.expected == pytest.approx(NUM_SAMPLES * stop_probs[j]), cell
    observed = {c.label: c.observed for c in verdict.cells if c.label.startswith("m=")}
    assert sum(observed.values()) <= NUM_SAMPLES and observed, verdict.cells
    assert verdict.observed is not None and verdict.observed.unit == "probability"
    assert verdict.observed.value > 0.01, verdict.observed
    text = "\n".join(verdict.explain())
    assert "m=0" in text and "a probability off by" in text, text


def test_a_marginal_failure_shows_the_position_and_its_tokens() -> None:
    """The marginal verdict's cells are tokens at the decisive position, expected as N times p_k."""
    batch = _drafted()
    verdict = check("marginal", Reluctant(), batch, num_samples=NUM_SAMPLES, seed=3)
    assert verdict is not None and verdict.failed and verdict.position is not None, verdict
    prefix = f"position {verdict.position}: "
    assert verdict.cells and all(c.label.startswith(prefix) for c in verdict.cells), verdict.cells
    target = exact_law(batch)[0].target_probs[verdict.position]
    # A cell of one token expects N p_k(token), N the trials that reached the position.
    reached = {
        round(c.expected / target[int(c.label.removeprefix(prefix + "token "))])
        for c in verdict.cells
        if c.label.removeprefix(prefix).startswith("token ")
    }
    assert len(reached) == 1 and 0 < reached.pop() <= NUM_SAMPLES, verdict.cells
    assert "drafts drawn afresh from q" in (verdict.subject or ""), verdict.subject
    text = "\n".join(verdict.explain())
    assert prefix + "token" in text and "a total variation of" in text, text


def test_the_coupled_check_names_the_token_the_walk_emits() -> None:
    """A sampler whose acceptances differ from the walk's: the finding says which token it emitted
    where the walk, fed the same random numbers, emits another."""
    verdict = check("coupled", Reluctant(), _drafted(), num_samples=200, seed=4)
    assert verdict is not None and verdict.failed, verdict
    assert verdict.finding is not None and "fed the same random numbers" in verdict.finding, verdict
    assert verdict.subject is not None and "its trial" in verdict.subject, verdict.subject
    assert verdict.observed is not None and verdict.observed.unit == "rate per sample"


def test_a_passing_verdict_shows_no_cells() -> None:
    """A clean verdict carries its subject but no cells and no deviation seen."""
    verdict = check("law_of_y", WalkSampler(), _drafted(), num_samples=400, seed=5)
    assert verdict is not None and verdict.passed, verdict
    assert verdict.cells == () and verdict.observed is None and verdict.subject is not None
    assert verdict.explain()[0] == verdict.message and len(verdict.explain()) == 2


def test_a_failed_verdict_survives_json() -> None:
    """The failing verdict, as a reproducer stores it (asdict), is JSON with its cells."""
    verdict = check("law_of_y", AlwaysZero(), _point_mass(), num_samples=100, seed=1)
    assert verdict is not None
    data = json.loads(json.dumps(asdict(verdict)))
    assert data["cells"][0] == asdict(Cell(verdict.cells[0].label, 100, 0.0)), data["cells"]
    assert data["observed"]["unit"] == "total variation" and data["subject"] == verdict.subject


@pytest.mark.parametrize("value", [None, (1, 2), torch.zeros(3)], ids=["None", "tuple", "tensor"])
def test_a_variant_returning_no_spec_output_fails_every_check_by_name(value: object) -> None:
    """A variant that returns something other than a SpecOutput fails every check, naming the type."""
    verdicts = run_checks(Returns(value), _drafted(), num_samples=20)
    assert {"invariants", "law_of_m", "law_of_y", "marginal", "composition"} <= {v.check for v in verdicts}
    word = f"the variant returned {type(value).__name__}, not a SpecOutput"
    assert all(v.failed and word in v.message for v in verdicts), [v.message for v in verdicts]
