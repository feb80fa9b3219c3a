"""The Triton sampler's documented behaviour on odd input values, each case against the float64 reference."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch

from specsample.kernels.rejection import KERNEL_METHODS, LAUNCH_PLAN_ENV, LAUNCH_PLANS, rejection_sample
from specsample.properties.checks.coupled import agreement
from specsample.properties.checks.invariants import violations
from specsample.reference.contract import RequestData, SpecBatch, SpecOutput, make_batch, split_output

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
INF, NAN = np.inf, np.nan


@pytest.fixture(autouse=True, params=LAUNCH_PLANS if DEVICE == "cpu" else ("split",))
def plan(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every case runs under both launch plans under the interpreter, the split plan on a GPU (see
    test_kernels.PLANS)."""
    monkeypatch.setenv(LAUNCH_PLAN_ENV, request.param)
    return str(request.param)


def _sample(batch: SpecBatch, **options: bool) -> SpecOutput:
    """Sample and check the hard invariants and coupled agreement with the reference."""
    output = rejection_sample(batch, **options)
    assert violations(batch, output) == []
    assert agreement(batch, output).unexplained == []
    return output


def _batch(requests: list[RequestData], **options: object) -> SpecBatch:
    return make_batch(requests, device=DEVICE, **options)  # type: ignore[arg-type]


def _tokens(output: SpecOutput) -> list[list[int]]:
    return [r.token_ids for r in split_output(output)]


@pytest.mark.parametrize("method", KERNEL_METHODS)
def test_nan_logits_count_as_minus_infinity(method: str) -> None:
    """NaN logits are never emitted nor accepted; an all-NaN row is uniform over the vocabulary."""
    target = np.array([[NAN, 1.0, NAN, 0.5, NAN], [NAN] * 5, [0.3, NAN, NAN, NAN, 2.0]])
    draft = np.array([[0.1, NAN, 0.2, 0.3, 0.4], [1.0, 2.0, NAN, 0.0, 0.0]])
    for seed in range(12):
        batch = _batch(
            [RequestData(target, [0, 2], draft, 1.0, seed=seed)], method=method, synthetic_rates=[1, 1]
        )
        request = split_output(_sample(batch))[0]
        if method != "synthetic":
            assert request.token_ids[0] in (1, 3)


def test_infinite_logits_are_uniform_over_the_infinite_entries() -> None:
    """A row with +inf logits emits only its +inf entries, with logprob -log(count)."""
    target = np.array([[0.0, INF, 3.0, INF, -INF, 1.0]])
    seen = set()
    for seed in range(16):
        output = _sample(_batch([RequestData(target, [], None, 0.7, seed=seed)]))
        seen.add(int(output.token_ids[0, 0]))
        assert output.logprobs is not None
        assert float(output.logprobs[0, 0]) == pytest.approx(-np.log(2.0), abs=1e-6)
    assert seen == {1, 3}


def test_rows_without_a_finite_logit_are_uniform() -> None:
    """A row of -inf (and NaN) logits emits every id, with logprob -log(V)."""
    target = np.array([[-INF, NAN, -INF, -INF]])
    seen = set()
    for seed in range(24):
        output = _sample(_batch([RequestData(target, [], None, 1.0, seed=seed)]))
        seen.add(int(output.token_ids[0, 0]))
        assert output.logprobs is not None
        assert float(output.logprobs[0, 0]) == pytest.approx(-np.log(4.0), abs=1e-6)
    assert seen == {0, 1, 2, 3}


@pytest.mark.parametrize("method", KERNEL_METHODS)
def test_draft_ids_outside_the_vocabulary_are_placeholders(method: str) -> None:
    """Ids outside [0, V) (-1, -5, V, V + 100, 2**40) are never accepted and stop the walk."""
    rng = np.random.default_rng(3)
    vocab_size = 6
    for bad in (-1, -5, vocab_size, vocab_size + 100, 2**40, -(2**40)):
        requests = [
            RequestData(
                rng.normal(size=(3, vocab_size)), [1, bad], rng.normal(size=(2, vocab_size)), 1.0, seed=s
            )
            for s in range(6)
        ]
        output = _sample(_batch(requests, method=method, synthetic_rates=[1.0, 1.0]))
        assert (output.num_emitted <= 2).all()
        for tokens in _tokens(output):
            assert bad not in tokens


@pytest.mark.parametrize("method", KERNEL_METHODS)
def test_a_single_token_vocabulary_emits_token_zero(method: str) -> None:
    """With V = 1 every real draft is accepted and every emitted id is 0, logprob 0."""
    target = np.array([[0.5], [NAN], [-INF], [3.0]])
    batch = _batch(
        [
            RequestData(target, [0, 0, -1], np.zeros((3, 1)), 1.0, seed=2),
            RequestData(target[:1], [], np.zeros((0, 1)), 0.0),
        ],
        method=method,
        synthetic_rates=[1.0, 1.0, 1.0],
    )
    output = _sample(batch)
    assert _tokens(output) == [[0, 0, 0], [0]]
    assert output.logprobs is not None
    assert output.logprobs[0, :3].tolist() == [0.0, 0.0, 0.0]


def test_all_placeholders_emit_one_token_from_the_first_row() -> None:
    """A request whose drafts are all placeholders emits exactly one token."""
    rng = np.random.default_rng(4)
    requests = [
        RequestData(rng.normal(size=(4, 9)), [-1, -1, -1], rng.normal(size=(3, 9)), 1.0, seed=s)
        for s in range(8)
    ]
    output = _sample(_batch(requests))
    assert (output.num_emitted == 1).all()
    assert (output.token_ids[:, 1:] == -1).all()


def test_no_drafts_anywhere_emit_the_bonus_token() -> None:
    """n_b = 0 for every request gives a one-column output of bonus tokens."""
    rng = np.random.default_rng(5)
    requests = [
        RequestData(rng.normal(size=(1, 17)), [], None, t, seed=s) for s, t in enumerate([0.0, 1.0, 2.0])
    ]
    for method in KERNEL_METHODS:
        output = _sample(_batch(requests, method=method, synthetic_rates=[0.5]))
        assert tuple(output.token_ids.shape) == (3, 1)
        assert (output.num_emitted == 1).all()
        assert int(output.token_ids[0, 0]) == int(np.argmax(requests[0].target_logits[0]))


def test_equal_target_and_draft_accept_every_possible_draft() -> None:
    """With p == q, every draft of positive probability is accepted (p > u p for u < 1)."""
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(5, 11))
    logits[:, 3] = -INF
    requests = [RequestData(logits, [0, 1, 2, 4], logits[:4], 0.8, seed=s) for s in range(8)]
    output = _sample(_batch(requests))
    assert (output.num_emitted == 5).all()
    zero_draft = [RequestData(logits, [0, 3, 2, 4], logits[:4], 0.8, seed=s) for s in range(8)]
    output = _sample(_batch(zero_draft))
    assert (output.num_emitted == 2).all()


@pytest.mark.parametrize("temperature", [1e-30, 1e-45, 1e-38])
def test_tiny_temperatures_sample_among_the_maxima(temperature: float) -> None:
    """Near T = 0 the law is uniform over the tied maxima, without overflow."""
    target = np.array([[1.0, 5.0, 5.0, -2.0, 5.0 - 1e-3], [0.0, 1.0, 2.0, 3.0, 3.0]])
    draft = np.array([[0.0, 9.0, 0.0, 0.0, 0.0]])
    seen = set()
    for seed in range(16):
        output = _sample(_batch([RequestData(target, [1], draft, temperature, seed=seed)]))
        seen.add(tuple(_tokens(output)[0]))
    # q = onehot(1) and p = (0, 1/2, 1/2, 0, 0): accept 1 half the time, else emit the residual's 2.
    assert {tokens[0] for tokens in seen} == {1, 2}
    assert {tokens[1] for tokens in seen if len(tokens) == 2} == {3, 4}


@pytest.mark.parametrize("temperature", [1e6, 1e30, 3e38])
def test_huge_temperatures_are_uniform(temperature: float) -> None:
    """At very large T every token is equally likely, whatever the logits."""
    target = np.array([[100.0, -100.0, 0.0, 50.0]])
    seen = set()
    for seed in range(24):
        seen.add(
            int(_sample(_batch([RequestData(target, [], None, temperature, seed=seed)])).token_ids[0, 0])
        )
    assert seen == {0, 1, 2, 3}


def test_greedy_rows_mix_with_sampled_rows() -> None:
    """Greedy requests follow the argmax chain (ties to the lowest id) inside a sampled batch."""
    target = np.array([[1.0, 3.0, 3.0, NAN], [2.0, 0.0, 2.0, 1.0], [0.0, 0.0, 0.0, 9.0]])
    draft = np.zeros((2, 4))
    for method in ("probabilistic", "strict", "block"):
        requests = [RequestData(target, [1, 0], draft, 0.0), RequestData(target, [1, 2], draft, 1.0, seed=1)]
        output = _sample(_batch(requests, method=method))
        assert _tokens(output)[0] == [1, 0, 3]
        assert output.logprobs is not None
        expected = target[0, 1] - np.log(np.exp(target[0, :3]).sum())
        assert float(output.logprobs[0, 0]) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("method", ["probabilistic", "block"])
def test_many_drafts_walk_past_the_position_block(method: str) -> None:
    """Requests with 0, 17 and 70 drafts (several position chunks) agree with the reference."""
    rng = np.random.default_rng(8)
    logits = rng.normal(size=(71, 5))
    requests = [
        RequestData(logits[:1], [], np.zeros((0, 5)), 1.0, seed=1),
        RequestData(logits[:18], np.argmax(logits[:17], axis=1), logits[:17], 0.01, seed=2),
        RequestData(logits, np.argmax(logits[:70], axis=1), logits[:70], 0.0, seed=3),
    ]
    batch = _batch(requests, method=method)
    output = _sample(batch)
    assert int(output.num_emitted[2]) == 71
    assert tuple(output.token_ids.shape) == (3, 71)
    assert agreement(batch, output).unexplained == []


@pytest.mark.parametrize("method", KERNEL_METHODS)
def test_inconsistent_values_never_leave_the_vocabulary(method: str) -> None:
    """Unchecked garbage (bad slots, counts, temperatures, a tree's parents) still yields ids in [0, V)
    and a valid layout."""
    rng = np.random.default_rng(9)
    vocab_size = 7
    batch = _batch(
        [
            RequestData(
                rng.normal(size=(3, vocab_size)), [1, 2], rng.normal(size=(2, vocab_size)), 1.0, seed=s
            )
            for s in range(3)
        ],
        slots=[0, 1, 2],
    )
    garbage = SpecBatch(
        target_logits=batch.target_logits,
        draft_logits=batch.draft_logits,
        draft_token_ids=torch.tensor([1, 2, 3, 2**40, -9, 0], device=DEVICE),
        cu_num_drafts=torch.tensor([0, 5, 2, 60], dtype=torch.int32, device=DEVICE),
        temperature=torch.tensor([float("nan"), -1.0, float("inf")], device=DEVICE),
        seed=batch.seed,
        step=torch.tensor([-1, 2**40, 3], device=DEVICE),
        draft_slot=torch.tensor([-4, 1, 99], device=DEVICE),
        method=method,
        synthetic_rates=torch.tensor([0.5], dtype=torch.float64, device=DEVICE),
        max_num_drafts=2,
        # Parents of their own node, after it, outside the request, and below the root.
        tree_parent=torch.tensor([0, 5, -9, 2**40, 1, -1], device=DEVICE) if method == "tree" else None,
    )
    output = rejection_sample(garbage, check_values=False)
    tokens = output.token_ids.cpu()
    emitted = output.num_emitted.cpu()
    assert ((emitted >= 1) & (emitted <= 3)).all()
    for b in range(3):
        count = int(emitted[b])
        assert ((tokens[b, :count] >= 0) & (tokens[b, :count] < vocab_size)).all()
        assert (tokens[b, count:] == -1).all()
    if method == "tree":
        assert output.accepted_nodes is not None
        nodes = output.accepted_nodes.cpu()
        for b in range(3):
            accepted = nodes[b, : int(emitted[b]) - 1]
            assert ((accepted >= 0) & (accepted < 2)).all()
            assert (nodes[b, int(emitted[b]) - 1 :] == -1).all()


def test_validation_names_the_argument() -> None:
    """The launcher rejects a malformed batch with a ValueError naming the argument."""
    batch = _batch([RequestData(np.zeros((2, 4)), [1], np.zeros((1, 4)))])
    bad = dataclasses.replace(batch, draft_token_ids=batch.draft_token_ids.to(torch.int32))
    with pytest.raises(ValueError, match="draft_token_ids"):
        rejection_sample(bad)
