"""Validation of `SpecBatch`: every bad argument raises a ValueError that names it."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from specsample.reference.contract import (
    METHODS,
    RequestData,
    SpecBatch,
    SpecOutput,
    Variant,
    make_batch,
    odd_values,
    split_output,
)
from specsample.reference.methods import METHODS as METHOD_TABLE
from specsample.reference.sampler import ReferenceSampler


def _batch(**changes: Any) -> SpecBatch:
    rng = np.random.default_rng(0)
    counts = [2, 0, 3]
    requests = [
        RequestData(rng.normal(size=(n + 1, 8)), rng.integers(0, 8, size=n), rng.normal(size=(n, 8)), seed=b)
        for b, n in enumerate(counts)
    ]
    return dataclasses.replace(make_batch(requests), **changes)


def _slotted(**changes: Any) -> SpecBatch:
    rng = np.random.default_rng(1)
    requests = [RequestData(rng.normal(size=(3, 8)), [1, 2], rng.normal(size=(2, 8))) for _ in range(2)]
    return dataclasses.replace(make_batch(requests, slots=[3, 0], num_slots=4, slot_capacity=4), **changes)


BAD_BATCHES = {
    "target_logits 1-D": (lambda: _batch(target_logits=torch.zeros(8)), "target_logits"),
    "target_logits int": (
        lambda: _batch(target_logits=torch.zeros(8, 8, dtype=torch.int32)),
        "target_logits",
    ),
    "target_logits float64": (
        lambda: _batch(target_logits=torch.zeros(8, 8, dtype=torch.float64)),
        "target_logits",
    ),
    "target_logits non-contiguous rows": (
        lambda: _batch(target_logits=torch.zeros(8, 8).t()),
        "target_logits",
    ),
    "target_logits not a tensor": (lambda: _batch(target_logits=np.zeros((8, 8))), "target_logits"),
    "rows not matching counts": (lambda: _batch(target_logits=torch.zeros(9, 8)), "draft_token_ids"),
    "draft_token_ids int32": (
        lambda: _batch(draft_token_ids=torch.zeros(5, dtype=torch.int32)),
        "draft_token_ids",
    ),
    "draft_logits wrong vocab": (lambda: _batch(draft_logits=torch.zeros(5, 7)), "draft_logits"),
    "draft_logits wrong rows": (lambda: _batch(draft_logits=torch.zeros(4, 8)), "draft_logits"),
    "draft_logits non-contiguous": (lambda: _batch(draft_logits=torch.zeros(8, 5).t()), "draft_logits"),
    "draft_logits on meta device": (
        lambda: _batch(draft_logits=torch.zeros(5, 8, device="meta")),
        "draft_logits",
    ),
    "cu_num_drafts int64": (lambda: _batch(cu_num_drafts=torch.tensor([0, 2, 2, 5])), "cu_num_drafts"),
    "cu_num_drafts empty batch": (
        lambda: _batch(cu_num_drafts=torch.tensor([0], dtype=torch.int32)),
        "cu_num_drafts",
    ),
    "cu_num_drafts not starting at 0": (
        lambda: _batch(cu_num_drafts=torch.tensor([1, 2, 2, 5], dtype=torch.int32)),
        "cu_num_drafts",
    ),
    "cu_num_drafts decreasing (negative count)": (
        lambda: _batch(cu_num_drafts=torch.tensor([0, 3, 2, 5], dtype=torch.int32)),
        "cu_num_drafts",
    ),
    "cu_num_drafts not ending at D": (
        lambda: _batch(cu_num_drafts=torch.tensor([0, 2, 2, 4], dtype=torch.int32)),
        "cu_num_drafts",
    ),
    "temperature wrong length": (lambda: _batch(temperature=torch.ones(2)), "temperature"),
    "temperature float64": (lambda: _batch(temperature=torch.ones(3, dtype=torch.float64)), "temperature"),
    "temperature negative": (lambda: _batch(temperature=torch.tensor([1.0, -0.5, 1.0])), "temperature"),
    "temperature nan": (lambda: _batch(temperature=torch.tensor([1.0, float("nan"), 1.0])), "temperature"),
    "seed int32": (lambda: _batch(seed=torch.zeros(3, dtype=torch.int32)), "seed"),
    "step negative": (lambda: _batch(step=torch.tensor([0, -1, 0])), "step"),
    "step too large": (lambda: _batch(step=torch.tensor([0, 2**32, 0])), "step"),
    "method unknown": (lambda: _batch(method="typical"), "method"),
    "synthetic without rates": (lambda: _batch(method="synthetic"), "synthetic_rates"),
    "synthetic rates too short": (
        lambda: _batch(method="synthetic", synthetic_rates=torch.ones(2, dtype=torch.float64)),
        "synthetic_rates",
    ),
    "synthetic rate above 1": (
        lambda: _batch(
            method="synthetic", synthetic_rates=torch.tensor([0.5, 1.5, 0.5], dtype=torch.float64)
        ),
        "synthetic_rates",
    ),
    "slot with flat drafts": (lambda: _batch(draft_slot=torch.zeros(3, dtype=torch.int64)), "draft_slot"),
    "slot missing": (lambda: _slotted(draft_slot=None), "draft_slot"),
    "slot out of range": (lambda: _slotted(draft_slot=torch.tensor([4, 0])), "draft_slot"),
    "slot negative": (lambda: _slotted(draft_slot=torch.tensor([-1, 0])), "draft_slot"),
    "slot float": (lambda: _slotted(draft_slot=torch.tensor([1.0, 0.0])), "draft_slot"),
    "slot capacity exceeded": (lambda: _slotted(draft_logits=torch.zeros(4, 1, 8)), "draft_logits"),
    "max_num_drafts wrong": (lambda: _batch(max_num_drafts=2), "max_num_drafts"),
}


@pytest.mark.parametrize("case", list(BAD_BATCHES))
def test_bad_argument_raises_value_error_naming_it(case: str) -> None:
    """Each bad argument raises a ValueError whose message starts with the argument's name."""
    build, argument = BAD_BATCHES[case]
    with pytest.raises(ValueError, match=f"^{argument} ") as error:
        build().validate()
    assert len(str(error.value)) > len(argument) + 10


def test_good_batches_validate() -> None:
    """The flat, slotted and one-hot batches built by make_batch pass validation."""
    _batch().validate()
    _slotted().validate()
    _batch(draft_logits=None).validate()


def test_structural_checks_skip_values() -> None:
    """Without check_values, a batch whose counts are inconsistent passes the structural checks."""
    batch = _batch(cu_num_drafts=torch.tensor([0, 3, 2, 5], dtype=torch.int32))
    batch.validate(check_values=False)


def test_make_batch_layout() -> None:
    """make_batch places request b's rows at cu_num_drafts[b] + b and its drafts at cu_num_drafts[b]."""
    batch = _batch()
    assert batch.cu_num_drafts.tolist() == [0, 2, 2, 5]
    assert batch.num_drafts() == [2, 0, 3]
    assert batch.target_logits.shape == (8, 8)
    assert batch.draft_logits is not None and batch.draft_logits.shape == (5, 8)
    slotted = _slotted()
    assert slotted.draft_logits is not None and slotted.draft_logits.shape == (4, 4, 8)
    assert slotted.draft_slot is not None and slotted.draft_slot.tolist() == [3, 0]


def test_split_output_and_variant_protocol() -> None:
    """The reference sampler is a Variant, and split_output cuts each row at num_emitted."""
    sampler = ReferenceSampler()
    assert isinstance(sampler, Variant)
    output = SpecOutput(
        token_ids=torch.tensor([[4, 5, -1], [7, -1, -1]]),
        num_emitted=torch.tensor([2, 1], dtype=torch.int32),
    )
    parts = split_output(output)
    assert [p.token_ids for p in parts] == [[4, 5], [7]]
    assert [p.num_accepted for p in parts] == [1, 0]


def test_odd_values_are_legal_and_reported() -> None:
    """NaN and infinite logits and ids outside [-1, V) validate, and odd_values names each of them."""
    batch = _batch()
    target = batch.target_logits.clone()
    target[0, 0], target[1, 1] = float("nan"), float("inf")
    ids = batch.draft_token_ids.clone()
    ids[0], ids[1] = -5, 8
    odd = dataclasses.replace(batch, target_logits=target, draft_token_ids=ids)
    odd.validate()
    notes = odd_values(odd)
    assert any("target_logits has NaN" in n for n in notes)
    assert any("target_logits has infinite" in n for n in notes)
    assert any("2 ids outside [-1, V)" in n for n in notes)
    assert odd_values(batch) == []


@pytest.mark.parametrize("variant", ["triton", "torch"])
def test_kernel_samplers_refuse_a_method_they_have_no_branch_for(
    variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel sampler raises on a method outside its capabilities instead of sampling another one
    (the Triton kernels have a branch for every method: the test takes all but strict away)."""
    from specsample.kernels import registry, rejection

    monkeypatch.setattr(rejection, "KERNEL_METHODS", ("strict",))
    sampler = registry.get(variant)
    kernel_methods = rejection.KERNEL_METHODS if variant == "triton" else sampler.capabilities.methods
    missing = [m for m in METHODS if m not in kernel_methods]
    assert missing, f"{variant} declares every method: this test has nothing left to check"
    rng = np.random.default_rng(0)
    request = RequestData(
        target_logits=rng.normal(size=(3, 5)).astype(np.float32),
        draft_token_ids=[1, 2],
        draft_logits=rng.normal(size=(2, 5)).astype(np.float32),
        temperature=1.0,
        seed=1,
        step=0,
    )
    for method in missing:
        # A tree batch needs its parents (a chain of the two drafts).
        parents = [-1, 0] if METHOD_TABLE[method].verifies_tree else None
        batch = make_batch(
            [dataclasses.replace(request, tree_parent=parents)], method=method, synthetic_rates=[0.5, 0.5]
        )
        with pytest.raises(ValueError, match=f"method is {method!r}"):
            sampler(batch)
