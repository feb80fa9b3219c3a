"""M23: row offsets computed in int32, which overflow once ``rows * V`` passes ``2**31`` elements.

Seen in vLLM #46560 and #48055. The mutant is the production Triton sampler with one planted change:
`rules.request_span` casts the request's first row to ``tl.int32`` instead of ``tl.int64``, so
``row * stride`` wraps for rows that start past ``2**31`` elements. The change is applied to the
production source when the mutant loads, so the mutant always tracks the real kernel. GPU tier: the
bug needs a batch of several gigabytes.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from specsample.kernels import rejection, rejection_kernels, rows_kernels, rules
from specsample.reference.contract import SpecBatch, SpecOutput
from specsample.reference.schemes import CANONICAL

# (original, planted): the two lines of `rules.request_span` that widen the request's first draft index.
PLANTED = [
    (
        "start = tl.maximum(tl.load(cu_ptr + request).to(tl.int64), 0)",
        "start = tl.maximum(tl.load(cu_ptr + request).to(tl.int32), 0)",
    ),
    ("end = tl.load(cu_ptr + request + 1).to(tl.int64)", "end = tl.load(cu_ptr + request + 1).to(tl.int32)"),
]


def _load(name: str, source: str) -> ModuleType:
    """Import ``source`` as module ``name`` from a real file (Triton reads kernel source from files)."""
    folder = Path(tempfile.mkdtemp(prefix="specsample-m23-"))
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@functools.cache
def mutated_launcher() -> ModuleType:
    """The production launcher bound to kernels with the int32 offsets planted (built once): the
    rules module with the bug, both launch plans' kernels importing it, and the launcher importing
    them."""
    source = inspect.getsource(rules)
    for original, planted in PLANTED:
        if original not in source:
            raise RuntimeError(f"M23 cannot plant its bug: the kernel rules no longer contain {original!r}")
        source = source.replace(original, planted)
    _load("m23_rules", source)  # the kernel modules below import it by this name
    for module in (rejection_kernels, rows_kernels):
        _load(f"m23_{module.__name__.rsplit('.', 1)[1]}", _rewired(inspect.getsource(module), RULES_IMPORT))
    launcher_source = _rewired(inspect.getsource(rejection), LAUNCHER_IMPORT)
    return _load("m23_rejection", launcher_source)


# (production import, the mutant's) of the kernel modules and of the launcher.
RULES_IMPORT = ("from specsample.kernels.rules import (", "from m23_rules import (")
LAUNCHER_IMPORT = (
    "from specsample.kernels import launch, rows_kernels\n"
    "from specsample.kernels import rejection_kernels as jit",
    "from specsample.kernels import launch\n"
    "import m23_rejection_kernels as jit\n"
    "import m23_rows_kernels as rows_kernels",
)


def _rewired(source: str, imports: tuple[str, str]) -> str:
    """``source`` importing the mutant's modules in place of the production ones."""
    production, mutant = imports
    if production not in source:
        raise RuntimeError(f"M23 cannot rewire its imports: the source no longer contains {production!r}")
    return source.replace(production, mutant)


class Int32Offsets:
    """The production Triton sampler with int32 row offsets."""

    name = "M23"
    streams = CANONICAL

    def __call__(self, batch: SpecBatch) -> SpecOutput:
        """Sample ``batch`` with the planted kernels."""
        output: SpecOutput = mutated_launcher().rejection_sample(batch)
        return output
