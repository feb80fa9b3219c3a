"""`fuzz.targeted`: the targeted cases each method gets, and only inside a sampler's capabilities."""

from __future__ import annotations

from specsample.fuzz.targeted import targeted_cases
from specsample.reference.contract import Capabilities
from specsample.reference.methods import METHODS


def test_targeted_cases_cover_block_verification_inside_the_capabilities() -> None:
    """Block verification gets the targeted shapes its table row names, the block shape among them, and
    a sampler that declares no block method gets none of them."""
    names = [name for name, batch, _ in targeted_cases(("block",)) if batch.method == "block"]
    assert names == [f"block: {shape}" for shape in METHODS["block"].targeted]
    without = Capabilities(methods=("strict", "probabilistic", "synthetic"))
    assert all(reason == "method block" for _, _, reason in targeted_cases(("block",), without))
