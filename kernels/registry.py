"""Every sampler variant by name: ``get("triton")`` is the production sampler.

A variant is registered with a zero-argument factory, so importing the registry compiles nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from specsample.reference.contract import Variant

_FACTORIES: dict[str, Callable[[], Variant]] = {}


def register(name: str, factory: Callable[[], Variant]) -> None:
    """Register ``factory`` under ``name``; a name is registered once."""
    if name in _FACTORIES:
        raise ValueError(f"name {name!r} is already registered")
    _FACTORIES[name] = factory


def names() -> list[str]:
    """The registered variant names, in registration order."""
    return list(_FACTORIES)


def get(name: str) -> Variant:
    """A fresh instance of the variant registered as ``name``."""
    if name not in _FACTORIES:
        raise ValueError(
            f"name {name!r} is not a registered variant; registered: {', '.join(names()) or 'none'}"
        )
    return _FACTORIES[name]()


def _lazy(module: str, name: str) -> Callable[[], Variant]:
    """A factory of ``module``'s class ``name`` that imports the module only when called."""
    return lambda: getattr(importlib.import_module(module), name)()


register("triton", _lazy("specsample.kernels.rejection", "TritonRejectionSampler"))
register("torch", _lazy("specsample.kernels.torch_sampler", "TorchRejectionSampler"))
