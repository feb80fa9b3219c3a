"""Bad input gets a clear error naming the argument and the value; odd but valid input is handled alike
by every sampler."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable

import numpy as np
import pytest
import torch

from specsample.kernels import registry
from specsample.properties.checks import check, run_checks
from specsample.properties.checks.coupled import agreement
from specsample.properties.checks.invariants import violations
from specsample.reference.contract import Capabilities, RequestData, SpecBatch, make_batch
from specsample.reference.walk import WalkSampler

# The kernel samplers' tensors: on a GPU when there is one (no interpreter), else the CPU.
DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"

RNG = np.random.default_rng(13)
V = 12


def _request(n: int = 2, **fields: object) -> RequestData:
    data = RequestData(
        RNG.normal(size=(n + 1, V)), list(range(1, n + 1)), RNG.normal(size=(n, V)), 1.0, seed=3
    )
    return dataclasses.replace(data, **fields)  # type: ignore[arg-type]


def _batch() -> SpecBatch:
    return make_batch([_request(), _request(1)])


# (what is wrong, the call, the argument its error must name)
LIBRARY_CASES: list[tuple[str, Callable[[], object], str]] = [
    ("no requests", lambda: make_batch([]), "requests"),
    (
        "draft logits for some requests only",
        lambda: make_batch([_request(), _request(draft_logits=None)]),
        "requests",
    ),
    (
        "target rows for the wrong draft count",
        lambda: make_batch([_request(target_logits=np.zeros((2, V)))]),
        "target_logits",
    ),
    (
        "two vocabularies",
        lambda: make_batch([_request(), _request(target_logits=np.zeros((3, V + 1)))]),
        "target_logits",
    ),
    ("float draft ids", lambda: make_batch([_request(draft_token_ids=[1.5, 2.0])]), "draft_token_ids"),
    ("a seed past int64", lambda: make_batch([_request(seed=2**64)]), "seed"),
    ("a step past 2**32", lambda: make_batch([_request(step=2**33)]), "step"),
    ("a negative temperature", lambda: make_batch([_request(temperature=-1.0)]), "temperature"),
    ("a NaN temperature", lambda: make_batch([_request(temperature=float("nan"))]), "temperature"),
    ("two requests in one slot", lambda: make_batch([_request(), _request()], slots=[1, 1]), "slots"),
    (
        "a slot past the buffer",
        lambda: make_batch([_request(), _request()], slots=[0, 5], num_slots=3),
        "slots",
    ),
    (
        "a slot too short",
        lambda: make_batch([_request(3), _request()], slots=[0, 1], slot_capacity=2),
        "slot_capacity",
    ),
    ("synthetic without rates", lambda: make_batch([_request()], method="synthetic"), "synthetic_rates"),
    (
        "a rate above 1",
        lambda: make_batch([_request()], method="synthetic", synthetic_rates=[0.5, 1.5]),
        "synthetic_rates",
    ),
    (
        "too few rates",
        lambda: make_batch([_request()], method="synthetic", synthetic_rates=[0.5]),
        "synthetic_rates",
    ),
    ("an unknown method", lambda: make_batch([_request()], method="greedy"), "method"),  # type: ignore[arg-type]
    ("zero trials", lambda: run_checks(WalkSampler(), _batch(), num_samples=0), "num_samples"),
    ("alpha of 1", lambda: run_checks(WalkSampler(), _batch(), alpha=1.0), "alpha"),
    ("an unknown check", lambda: run_checks(WalkSampler(), _batch(), checks=("speed",)), "checks"),
    (
        "no required trials",
        lambda: check("law_of_m", WalkSampler(), _batch(), required_samples=0),
        "required_samples",
    ),
    (
        "an unknown method capability",
        lambda: Capabilities(methods=("fly",)).validate(),
        "capabilities.methods",
    ),
    ("an unknown arithmetic", lambda: Capabilities(arithmetic="bf16").validate(), "capabilities.arithmetic"),  # type: ignore[arg-type]
    ("a vocabulary cap of 0", lambda: Capabilities(max_vocab=0).validate(), "capabilities.max_vocab"),
]


@pytest.mark.parametrize(("what", "call", "argument"), LIBRARY_CASES, ids=[c[0] for c in LIBRARY_CASES])
def test_bad_input_raises_a_value_error_naming_the_argument(
    what: str, call: Callable[[], object], argument: str
) -> None:
    """Each bad input raises ValueError whose message starts with the argument it is about."""
    with pytest.raises(ValueError, match=rf"^(requests\[\d+\]\.)?{re.escape(argument)} "):
        call()


@pytest.mark.parametrize("name", ["triton", "torch"])
def test_a_synthetic_batch_without_drafts_is_sampled(name: str) -> None:
    """A synthetic batch in which no request has a draft is valid, and every sampler emits its bonus token."""
    batch = make_batch(
        [RequestData(RNG.normal(size=(1, V)), [], None, 1.0, seed=s) for s in range(3)],
        method="synthetic",
        synthetic_rates=np.zeros(0),
        device=DEVICE,
    )
    output = registry.get(name)(batch)
    assert violations(batch, output) == []


def test_samplers_agree_at_temperatures_past_the_clamp() -> None:
    """Temperatures above 1e30 act as 1e30 in the specification, the walk and the Triton kernel alike."""
    logits = RNG.normal(size=(3, V)) * 1e31
    requests = [
        RequestData(logits, [1, 2], logits[:2] * 0.5, temperature=t, seed=s)
        for s, t in enumerate((1e38, 3e33))
    ]
    batch = make_batch(requests, device=DEVICE)
    output = registry.get("triton")(batch)
    assert violations(batch, output) == []
    assert agreement(batch, output).unexplained == []
