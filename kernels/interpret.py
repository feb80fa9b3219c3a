"""Under the Triton interpreter: patch ``triton.language`` once per launch, not once per device call.

Triton's interpreter (``TRITON_INTERPRET=1``) swaps the builtins of ``triton.language`` for
interpreted ones for the length of a launch, and redoes the whole swap on every call of a
``@triton.jit`` helper inside the kernel (`InterpretedFunction.__call__` calls ``_patch_lang``): a
walk over the modules that changes nothing yet costs about 0.9 ms a call, more than half of our
kernels' time under the interpreter. `install` skips the repeat for a helper whose modules were
already patched in the same launch; the first patch of each set of modules still runs, so every
helper sees what it saw before and outputs are identical (``properties/test_kernel_launch.py``
compares them with the patch on and off).

It touches Triton's internals (``triton.runtime.interpreter._patch_lang``, ``GridExecutor.__call__``),
so it is installed only under the interpreter, on the Triton releases in `SUPPORTED_TRITON`, and never
when ``SPECSAMPLE_FAST_INTERPRETER=0``. Nothing changes on a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import triton

SUPPORTED_TRITON = frozenset({"3.6"})
FAST_INTERPRETER_ENV = "SPECSAMPLE_FAST_INTERPRETER"
# Triton's own (_patch_lang, GridExecutor.__call__), kept when `install` replaces them.
_ORIGINAL: list[tuple[Any, Any]] = []


def wanted() -> bool:
    """Whether the patch applies here: the interpreter is on, Triton is supported, not switched off."""
    return (
        os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
        and os.environ.get(FAST_INTERPRETER_ENV, "1") != "0"
        and ".".join(triton.__version__.split(".")[:2]) in SUPPORTED_TRITON
    )


def install() -> bool:
    """Install the once-per-launch patch if `wanted`; returns whether it is installed."""
    if not wanted():
        return False
    if _ORIGINAL:
        return True
    from triton.runtime import interpreter

    patch_lang: Callable[[Any], Any] = interpreter._patch_lang
    run_grid: Callable[..., Any] = interpreter.GridExecutor.__call__
    _ORIGINAL.append((patch_lang, run_grid))
    lang_modules = (interpreter.tl, interpreter.tl.core)
    # The module sets patched in the launch under way (None outside a launch).
    patched: set[tuple[int, ...]] | None = None
    # A jit function -> the ids of the triton.language modules among its globals.
    keys: dict[Any, tuple[int, ...]] = {}

    def patch_once(fn: Any) -> Any:
        if fn not in keys:
            found = {id(v) for v in fn.__globals__.values() if any(v is m for m in lang_modules)}
            keys[fn] = tuple(sorted(found))
        key = keys[fn]
        if patched is not None and key in patched:
            return interpreter._LangPatchScope()  # already patched in this launch: nothing to undo
        scope = patch_lang(fn)
        if patched is not None:
            patched.add(key)
        return scope

    def run_grid_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal patched
        outer, patched = patched, set()
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            patched = outer

    interpreter._patch_lang = patch_once
    interpreter.GridExecutor.__call__ = run_grid_once
    return True


def installed() -> bool:
    """Whether `install` replaced Triton's functions in this process."""
    return bool(_ORIGINAL)


@contextmanager
def triton_own_interpreter() -> Iterator[None]:
    """Inside the block, the interpreter runs as Triton ships it (to compare outputs with the patch)."""
    if not _ORIGINAL:
        yield
        return
    from triton.runtime import interpreter

    mine = (interpreter._patch_lang, interpreter.GridExecutor.__call__)
    interpreter._patch_lang, interpreter.GridExecutor.__call__ = _ORIGINAL[0]
    try:
        yield
    finally:
        interpreter._patch_lang, interpreter.GridExecutor.__call__ = mine
