"""Validation comes first: any input, of any type or device, gets a ValueError naming the argument and
the value before a sampler reads an attribute or allocates, on every sampler and on SpecBatch.validate."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from specsample.kernels import registry
from specsample.kernels.rejection import TritonRejectionSampler, rejection_sample
from specsample.reference.contract import RequestData, SpecBatch, make_batch, validate_batch

V = 8
# Far more elements than any tensor of these small batches, far fewer than an absurd size asks for.
MAX_ELEMENTS = 2**24


def _slotted_synthetic() -> SpecBatch:
    """Two requests (2 and 1 drafts) with slotted draft logits and synthetic rates: every field set."""
    rng = np.random.default_rng(0)
    requests = [
        RequestData(rng.normal(size=(n + 1, V)), list(range(1, n + 1)), rng.normal(size=(n, V)), seed=n)
        for n in (2, 1)
    ]
    return make_batch(requests, method="synthetic", synthetic_rates=[0.5, 0.5], slots=[1, 0], num_slots=3)


def _flat() -> SpecBatch:
    """Two requests (2 and 1 drafts) with flat draft logits."""
    rng = np.random.default_rng(1)
    requests = [
        RequestData(rng.normal(size=(n + 1, V)), list(range(1, n + 1)), rng.normal(size=(n, V)), seed=n)
        for n in (2, 1)
    ]
    return make_batch(requests)


# Every way a batch reaches a check: (name, the call). The Triton sampler runs under the interpreter.
ENTRY_POINTS: dict[str, Callable[[Any], object]] = {
    "SpecBatch.validate": lambda batch: validate_batch(batch),
    "SpecBatch.validate structure only": lambda batch: validate_batch(batch, check_values=False),
    "triton": lambda batch: registry.get("triton")(batch),
    "triton, value checks off": lambda batch: TritonRejectionSampler(check_values=False)(batch),
    "torch": lambda batch: registry.get("torch")(batch),
}
TENSOR_FIELDS = (
    "target_logits", "draft_logits", "draft_token_ids", "cu_num_drafts", "temperature", "seed", "step",
    "draft_slot", "synthetic_rates",
)  # fmt: skip
# A field set to None is legal only for draft_logits (one-hot drafts; the slots then name the error).
REQUIRED_HERE = tuple(name for name in TENSOR_FIELDS if name != "draft_logits")


def _wrong_values(tensor: torch.Tensor) -> Iterator[tuple[str, object, str]]:
    """``(what, value, text the error shows)`` for a tensor field: other Python types and devices."""
    yield "numpy array", tensor.numpy(), "numpy.ndarray"
    yield "list", tensor.tolist(), "list"
    yield "Python number", tensor.flatten()[0].item(), type(tensor.flatten()[0].item()).__name__
    yield "meta tensor beside cpu ones", tensor.to("meta"), "meta"
    yield "sparse tensor", tensor.to_sparse(), "sparse"


def _field_cases() -> Iterator[Any]:
    batch = _slotted_synthetic()
    for name in TENSOR_FIELDS:
        for what, value, shown in _wrong_values(getattr(batch, name)):
            yield pytest.param(name, value, shown, id=f"{name} {what}")
        if name in REQUIRED_HERE:
            yield pytest.param(name, None, "None", id=f"{name} None")
    for value, shown in (
        (["synthetic"], "list"),
        (np.array(["strict", "block"]), "numpy.ndarray"),
        (None, "None"),
    ):
        yield pytest.param("method", value, shown, id=f"method {shown}")
    for value, shown in ((2.0, "float"), (True, "bool"), (np.int64(2), "numpy.int64"), ("2", "str")):
        yield pytest.param("max_num_drafts", value, shown, id=f"max_num_drafts {shown}")


FIELD_CASES = list(_field_cases())


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize(("field", "value", "shown"), FIELD_CASES)
def test_a_field_of_the_wrong_type_or_device_is_named(
    entry: str, field: str, value: object, shown: str
) -> None:
    """A field of another Python type, layout or device raises one line naming the field and the value."""
    batch = dataclasses.replace(_slotted_synthetic(), **{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"^{field} ") as error:
        ENTRY_POINTS[entry](batch)
    assert shown in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_batch_on_the_meta_device_is_named(entry: str) -> None:
    """A batch whose every tensor is on the meta device (no data to read) is refused at target_logits."""
    batch = _slotted_synthetic()
    on_meta = {
        f.name: getattr(batch, f.name).to("meta")
        for f in dataclasses.fields(batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }
    with pytest.raises(ValueError, match=r"^target_logits is on device meta; expected a cpu or cuda tensor$"):
        ENTRY_POINTS[entry](dataclasses.replace(batch, **on_meta))


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize(
    "batch", [None, {"target_logits": torch.zeros(3, V)}, "batch"], ids=["None", "dict", "str"]
)
def test_something_other_than_a_batch_is_named(entry: str, batch: object) -> None:
    """Anything but a SpecBatch raises a ValueError naming the batch and its type."""
    with pytest.raises(ValueError, match=r"^batch (is None|has type (dict|str)); expected a SpecBatch$"):
        ENTRY_POINTS[entry](batch)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("layout", ["flat", "slotted"])
@pytest.mark.parametrize("draft_vocab", [V - 1, V + 3])
def test_mismatched_vocabularies_name_both_sizes(entry: str, layout: str, draft_vocab: int) -> None:
    """Draft logits over another vocabulary than the target's raise an error naming both sizes."""
    batch = _flat() if layout == "flat" else _slotted_synthetic()
    assert batch.draft_logits is not None
    draft = torch.zeros(*batch.draft_logits.shape[:-1], draft_vocab)
    with pytest.raises(ValueError, match=rf"^draft_logits has vocab size {draft_vocab} .*expected V = {V}\b"):
        ENTRY_POINTS[entry](dataclasses.replace(batch, draft_logits=draft))


def test_make_batch_names_a_request_with_another_draft_vocabulary() -> None:
    """make_batch refuses a request whose draft logits have another vocabulary, naming the request."""
    rng = np.random.default_rng(2)
    requests = [
        RequestData(rng.normal(size=(3, V)), [1, 2], rng.normal(size=(2, V))),
        RequestData(rng.normal(size=(2, V)), [3], rng.normal(size=(1, V + 1))),
    ]
    with pytest.raises(
        ValueError, match=rf"^requests\[1\]\.draft_logits has shape \(1, {V + 1}\); .*\[1, {V}\]"
    ):
        make_batch(requests)


@pytest.fixture
def no_absurd_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.empty, through which the launchers allocate, fails the test on more than MAX_ELEMENTS."""
    original = torch.empty

    def empty(*size: Any, **options: Any) -> torch.Tensor:
        shape = size[0] if len(size) == 1 and not isinstance(size[0], int) else size
        assert math.prod(shape) <= MAX_ELEMENTS, (
            f"torch.empty{tuple(shape)}: an allocation from an unchecked size"
        )
        return original(*size, **options)

    monkeypatch.setattr(torch, "empty", empty)


def _many_drafts() -> SpecBatch:
    """One request of 200 drafts, past the 127 a request has in canonical-v3; consistent otherwise."""
    logits = np.random.default_rng(3).normal(size=(201, 4))
    batch = make_batch([RequestData(logits[:1], [], None)])
    return dataclasses.replace(
        batch,
        target_logits=torch.as_tensor(logits, dtype=torch.float32),
        draft_token_ids=torch.zeros(200, dtype=torch.int64),
        cu_num_drafts=torch.tensor([0, 200], dtype=torch.int32),
        max_num_drafts=None,
    )


def _cu(batch: SpecBatch, values: list[int]) -> SpecBatch:
    cu = torch.tensor(values, dtype=torch.int32)
    return dataclasses.replace(batch, cu_num_drafts=cu, max_num_drafts=None)


# (what, the corrupted batch, the value the error shows): counts that only a read of cu_num_drafts sees.
CORRUPTED_COUNTS: dict[str, tuple[Callable[[], SpecBatch], str]] = {
    "ends at 2**31 - 1": (lambda: _cu(_flat(), [0, 2, 2**31 - 1]), "2147483647"),
    "a negative count": (lambda: _cu(_flat(), [0, 5, 3]), "5 -> 3"),
    "starts past 0": (lambda: _cu(_flat(), [2, 2, 3]), "starts at 2"),
    "a request past 127 drafts": (_many_drafts, "200 drafts"),
}


@pytest.mark.usefixtures("no_absurd_allocation")
@pytest.mark.parametrize("case", list(CORRUPTED_COUNTS))
@pytest.mark.parametrize(
    "sample",
    [
        lambda batch: rejection_sample(batch, check_values=False),
        lambda batch: TritonRejectionSampler(check_values=False)(batch),
        lambda batch: registry.get("torch")(batch),
        lambda batch: batch.num_drafts(),
        lambda batch: batch.resolved_max_num_drafts(),
    ],
    ids=["rejection_sample", "TritonRejectionSampler", "torch", "num_drafts", "resolved_max_num_drafts"],
)
def test_counts_read_to_size_the_output_are_checked(case: str, sample: Callable[[SpecBatch], object]) -> None:
    """Without max_num_drafts, the cu_num_drafts read to size the output is checked even with value
    checks off: a corrupted count raises a ValueError naming it, and nothing absurd is allocated."""
    build, shown = CORRUPTED_COUNTS[case]
    with pytest.raises(ValueError, match=r"^cu_num_drafts ") as error:
        sample(build())
    assert shown in str(error.value)


@pytest.mark.usefixtures("no_absurd_allocation")
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("hint", [-1, 4, 127, 128, 2**40])
def test_an_absurd_max_num_drafts_is_named(entry: str, hint: int) -> None:
    """A max_num_drafts past D (here 3) or past 127 drafts a request is refused before any allocation,
    value checks on or off."""
    with pytest.raises(ValueError, match=rf"^max_num_drafts is {hint}; expected 0 <= max_num_drafts <= 3 "):
        ENTRY_POINTS[entry](dataclasses.replace(_flat(), max_num_drafts=hint))


def test_value_checks_on_the_host_only_read_cpu_values() -> None:
    """check_values=None reads values where the batch is on the CPU: no device to synchronise."""
    batch = _cu(_flat(), [0, 2, 1])
    batch.validate(check_values=False)
    with pytest.raises(ValueError, match=r"^cu_num_drafts decreases at request 1"):
        batch.validate(check_values=None)
