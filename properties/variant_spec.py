"""Resolve a variant spec to a `Variant`: what every command that takes ``--variant`` shares.

A spec is one of:
- a registered name: ``reference``, ``walk``, or a name from `kernels.registry` (``triton``, ``torch``);
- ``package.module:NAME`` or ``path/to/file.py:NAME``, where ``NAME`` is a `Variant`, a class whose
  instances are variants, or a zero-argument factory returning one.

`specsample.fuzz.spec` adds the planted mutants' ids (``M01`` ...).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from specsample.reference.contract import Variant


class SpecError(ValueError):
    """A variant spec that cannot be resolved (a usage error: exit code 2)."""


def _load_module(target: str) -> object:
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise SpecError(f"variant spec names file {target!r}, which does not exist")
        module_name = f"_specsample_variant_{abs(hash(path.resolve()))}"
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


def load_variant(spec: str, extra: Mapping[str, Callable[[], Variant]] | None = None) -> Variant:
    """Resolve ``spec`` (see the module docstring) to a `Variant`; ``extra`` maps more names (upper
    case, matched case-insensitively) to their factories."""
    extra = extra or {}
    if spec == "reference":
        from specsample.reference.sampler import ReferenceSampler

        return ReferenceSampler()
    if spec == "walk":
        from specsample.reference.walk import WalkSampler

        return WalkSampler()
    if spec.upper() in extra:
        return extra[spec.upper()]()
    if ":" not in spec:
        from specsample.kernels import registry

        if spec in registry.names():
            return registry.get(spec)
        known = ", ".join(["reference", "walk", *registry.names(), *extra])
        raise SpecError(
            f"variant spec {spec!r} is neither MODULE:NAME, FILE.py:NAME nor a known name ({known})"
        )
    target, _, name = spec.rpartition(":")
    module = _load_module(target)
    if not hasattr(module, name):
        raise SpecError(f"variant spec {spec!r}: {target} has no attribute {name!r}")
    return as_variant(getattr(module, name), spec)
