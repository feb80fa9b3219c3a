"""Resolve a variant spec to a `Variant`: `specsample.properties.variant_spec`'s specs and the planted
mutants' ids (``M01`` ..., `specsample.fuzz.mutants.MUTANTS`).
"""

from __future__ import annotations

from specsample.properties.variant_spec import SpecError, as_variant
from specsample.properties.variant_spec import load_variant as _load_variant
from specsample.reference.contract import Variant

__all__ = ["SpecError", "as_variant", "load_variant"]


def load_variant(spec: str) -> Variant:
    """Resolve ``spec``: a mutant id, or any spec `specsample.properties.variant_spec` resolves."""
    from specsample.fuzz.mutants import MUTANTS

    return _load_variant(spec, {id_: mutant.load for id_, mutant in MUTANTS.items()})
