"""Under the Triton interpreter: patch ``triton.language`` once per launch, not once per device call.

Triton's interpreter (``TRITON_INTERPRET=1``) swaps the builtins of ``triton.language`` for
interpreted ones when a kernel launches and swaps them back when it ends. It also redoes the whole
swap on every call of a ``@triton.jit`` helper inside the kernel (`InterpretedFunction.__call__`
calls ``_patch_lang``), walking the modules' members each time; the swap finds them already swapped
and changes nothing, but it costs about 0.9 ms a call, more than half of our kernels' time under the
interpreter. `install` makes the repeat a no-op: within one launch, a helper whose ``triton.language``
modules were already patched in that launch is not patched again. The first patch of each set of
modules in a launch still runs, so what every helper sees is unchanged, and outputs are identical
(``properties/test_kernel_launch.py`` compares them with the patch on and off).

It touches Triton's internals (``triton.runtime.interpreter._patch_lang`` and
``GridExecutor.__call__``), so it is installed only under the interpreter, on the Triton releases in
`SUPPORTED_TRITON`, and never when ``SPECSAMPLE_FAST_INTERPRETER=0``. Nothing changes on a GPU.
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
    from triton.runtime import interpreter

    if _ORIGINAL:
        return True
    patch_lang: Callable[[Any], Any] = interpreter._patch_lang
    run_grid: Callable[..., Any] = interpreter.GridExecutor.__call__
    _ORIGINAL.append((patch_lang, run_grid))
    lang_modules = (interpreter.tl, interpreter.tl.core)
    # The module sets patched in the launch under way (None outside a launch).
    patched: list[set[tuple[int, ...]] | None] = [None]
    # A function's globals (by id, kept alive) -> the triton.language modules among them.
    keys: dict[int, tuple[dict[str, Any], tuple[int, ...]]] = {}

    def patch_once(fn: Any) -> Any:
        done = patched[0]
        known = keys.get(id(fn.__globals__))
        if known is None or known[0] is not fn.__globals__:
            found = {id(v) for v in fn.__globals__.values() if any(v is m for m in lang_modules)}
            known = keys[id(fn.__globals__)] = (fn.__globals__, tuple(sorted(found)))
        key = known[1]
        if done is not None and key in done:
            return interpreter._LangPatchScope()  # already patched in this launch: nothing to undo
        scope = patch_lang(fn)
        if done is not None:
            done.add(key)
        return scope

    def run_grid_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer, patched[0] = patched[0], set()
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            patched[0] = outer

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
