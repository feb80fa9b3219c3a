"""Resolve a variant spec to a `Variant`.

A spec is one of:
- a registered name: ``reference``, ``walk``, a name from `kernels.registry` (``triton``, ``torch``), or a
  planted mutant id (``M01`` ... ``M30``);
- ``package.module:NAME`` or ``path/to/file.py:NAME``, where ``NAME`` is a `Variant`, a class whose
  instances are variants, or a zero-argument factory returning one.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from specsample.reference.contract import Variant


class SpecError(ValueError):
    """A variant spec that cannot be resolved (a usage error: exit code 2)."""


def _load_module(target: str) -> object:
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise SpecError(f"variant spec names file {target!r}, which does not exist")
        module_name = f"_fuzz_variant_{abs(hash(path.resolve()))}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise SpecError(f"variant spec names file {target!r}, which cannot be imported")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            del sys.modules[module_name]
            raise SpecError(
                f"variant spec names file {target!r}, which fails to import: {_named(error)}"
            ) from error
        return module
    try:
        return importlib.import_module(target)
    except Exception as error:
        raise SpecError(
            f"variant spec names module {target!r}, which cannot be imported: {_named(error)}"
        ) from error


def _named(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def as_variant(obj: object, spec: str) -> Variant:
    """Turn a variant, a variant class or a zero-argument factory into a `Variant`."""
    if not isinstance(obj, type) and isinstance(obj, Variant):
        return obj
    if callable(obj):
        try:
            made = obj()
        except TypeError as error:
            raise SpecError(
                f"variant spec {spec!r} is callable but not a zero-argument factory: {error}"
            ) from error
        except Exception as error:
            raise SpecError(f"variant spec {spec!r} raised when built: {_named(error)}") from error
        if isinstance(made, Variant):
            return made
    raise SpecError(
        f"variant spec {spec!r} resolves to {type(obj).__name__}; expected a Variant (a callable with "
        "`name` and `streams`) or a zero-argument factory returning one"
    )


def load_variant(spec: str) -> Variant:
    """Resolve ``spec`` (see the module docstring) to a `Variant`."""
    from specsample.fuzz.mutants import MUTANTS

    if spec == "reference":
        from specsample.reference.sampler import ReferenceSampler

        return ReferenceSampler()
    if spec == "walk":
        from specsample.reference.walk import WalkSampler

        return WalkSampler()
    if spec.upper() in MUTANTS:
        return MUTANTS[spec.upper()].load()
    if ":" not in spec:
        from specsample.kernels import registry

        if spec in registry.names():
            return registry.get(spec)
        known = ", ".join(["reference", "walk", *registry.names(), *MUTANTS])
        raise SpecError(
            f"variant spec {spec!r} is neither MODULE:NAME, FILE.py:NAME nor a known name ({known})"
        )
    target, _, name = spec.rpartition(":")
    module = _load_module(target)
    if not hasattr(module, name):
        raise SpecError(f"variant spec {spec!r}: {target} has no attribute {name!r}")
    return as_variant(getattr(module, name), spec)
