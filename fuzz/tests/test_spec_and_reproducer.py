"""Variant specs resolve to variants, and reproducers round-trip a batch exactly."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from specsample.fuzz.mutants import MUTANTS
from specsample.fuzz.reproducer import Reproducer, decode_batch, encode_batch, load_reproducer, versions
from specsample.fuzz.spec import SpecError, load_variant
from specsample.reference.contract import RequestData, make_batch
from specsample.reference.schemes import CANONICAL

VARIANT_FILE = """
from specsample.reference.sampler import ReferenceSampler

class Mine(ReferenceSampler):
    name = "mine"

def factory():
    return Mine()

instance = Mine()
not_a_variant = 3
"""


def test_specs_resolve(tmp_path: Path) -> None:
    """Names, mutant ids, MODULE:NAME and FILE.py:NAME (instance, class or factory) give variants."""
    assert load_variant("reference").name == "reference"
    assert load_variant("m03").name == "M03"
    assert load_variant("specsample.reference.walk:WalkSampler").streams is CANONICAL
    path = tmp_path / "my_variant.py"
    path.write_text(VARIANT_FILE)
    for name in ("Mine", "factory", "instance"):
        assert load_variant(f"{path}:{name}").name == "mine"


@pytest.mark.parametrize(
    "spec",
    [
        "no_such_name",
        "no.such.module:X",
        "specsample.reference.walk:Missing",
        "/no/such/file.py:X",
        "FILE:not_a_variant",
    ],
)
def test_bad_specs_raise_spec_errors(spec: str, tmp_path: Path) -> None:
    """A spec that names nothing usable raises a SpecError that quotes it."""
    path = tmp_path / "my_variant.py"
    path.write_text(VARIANT_FILE)
    spec = spec.replace("FILE", str(path))
    with pytest.raises(SpecError, match="variant spec"):
        load_variant(spec)


def test_every_mutant_loads() -> None:
    """Every catalogued mutant imports and names itself by its id."""
    for mutant_id, mutant in MUTANTS.items():
        assert mutant.load().name == mutant_id


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reproducer_round_trip(dtype: torch.dtype, tmp_path: Path) -> None:
    """A saved reproducer reloads the same batch, bit for bit, NaN and infinities included."""
    rng = np.random.default_rng(0)
    target = rng.normal(size=(3, 7))
    target[0, 1], target[1, 2], target[2, 3] = np.nan, np.inf, -np.inf
    batch = make_batch(
        [RequestData(target, [1, -1], rng.normal(size=(2, 7)), temperature=0.3, seed=2**40 + 1, step=5)],
        dtype=dtype,
        slots=[1],
        num_slots=2,
    )
    again = decode_batch(encode_batch(batch))
    for name in (
        "target_logits",
        "draft_logits",
        "draft_token_ids",
        "cu_num_drafts",
        "temperature",
        "seed",
        "step",
        "draft_slot",
    ):
        before, after = getattr(batch, name), getattr(again, name)
        assert before.dtype == after.dtype
        assert torch.equal(
            torch.nan_to_num(before.float(), nan=7.5), torch.nan_to_num(after.float(), nan=7.5)
        )
    reproducer = Reproducer("M03", "law_of_y", {"message": "x"}, batch, 100, 1e-6, 9, versions())
    loaded = load_reproducer(reproducer.save(tmp_path))
    assert (loaded.variant, loaded.check, loaded.seed, loaded.alpha) == ("M03", "law_of_y", 9, 1e-6)
    assert math.isnan(float(loaded.batch.target_logits[0, 1]))
