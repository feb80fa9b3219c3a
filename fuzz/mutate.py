"""``fuzz mutate``: mutation testing of a variant's ``@triton.jit`` kernels, and the kill matrix.

How strong are the checks on *this* kernel? The mutants are written from the kernel source with
`ast` (the operators of `OPERATORS`), each a one-place change of one ``@triton.jit`` function or of a
``tl.constexpr`` constant of the module. Triton compiles from source text, so a mutant is a changed
copy of its file in a temporary folder, loaded in a fresh interpreter of its own (``python -m
specsample.fuzz.mutate TASK``; never a fork, so never a fork after CUDA starts); the files on disk are
never written, and an interrupted run leaves the tree as it was.

The child process loads the variant twice: unmutated, then with the mutated file in place of the
original (the modules that import it, statically, are imported afresh from the copy and put back
afterwards, so the unmutated variant keeps its own). It runs the campaign of ``fuzz run`` on the
mutant (`fuzz.campaign.run_campaign`, the same checks, profile, seed and a budget in seconds) and
compares the mutant's output with the unmutated variant's on every call, bit for bit, until they
first differ. Its verdict, one JSON line on standard output, is one of `VERDICTS`.

Before the mutants, a control run puts the unmutated variant through the same campaign: a variant
that fails its own checks makes every kill meaningless. Under the Triton interpreter the control
then records which lines of the kernel files each targeted batch runs. A mutant on a line that no
targeted batch runs (the GPU's launch plan, on a CPU) is counted as not reached and not sampled; a
mutant's campaign screens the targeted cases that run its line first, so that a short budget reaches
the change. A launcher must import its kernel modules at module level, as ours do: a kernel imported
inside a function is shared by the two loads of the variant.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import difflib
import hashlib
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

# One row per operator: its name and what it changes.
OPERATORS: dict[str, str] = {
    "compare-strict": "a comparison's strictness toggled (< and <=, > and >=)",
    "compare-flip": "a comparison negated (< to >=, <= to >, == to !=, and back)",
    "off-by-one": "+1 or -1 on an index, offset or bound: a pointer, a comparison's bound, a range end, "
    "an index assigned",
    "mask-drop": "mask= (with other=) dropped from a load or store",
    "mask-invert": "mask= inverted",
    "other": "a load's other= changed (0 to 1, anything else to 0)",
    "swap": "the operands of a non-commutative operation swapped (-, /, //, %, **, <<, >>)",
    "reduction": "max and min, argmax and argmin, maximum and minimum exchanged; a sum or cumsum dropped",
    "constant": "a number changed to 0, 1, -inf or eps (1e-6); True and False exchanged",
    "dtype": "a dtype narrowed: float32 to float16 or bfloat16, float64 to float32, int64 to int32",
    "where": "a tl.where branch dropped: the result is one branch",
    "program-id": "a program_id or num_programs axis changed",
    "stride-swap": "one stride used in place of another",
}

# What a mutant's run ends as: the first two are scored, the others are not.
VERDICTS: dict[str, str] = {
    "killed": "a check failed",
    "survived": "no check failed, and the outputs differed from the unmutated variant's",
    "likely equivalent": "every output equal, bit for bit, to the unmutated variant's on every batch tried",
    "timed out": "the child ran past its timeout (a mutant that loops forever)",
    "crashed": "the child died without a verdict (a signal: an out-of-bounds store, say)",
    "compile error": "the mutant does not import, compile or run on the first targeted batch",
}
SCORED = ("killed", "survived")

# The default seconds of campaign per mutant: the CPU sample of 20 runs in under 10 minutes on 2 cores.
DEFAULT_BUDGET = 15.0
# A child's timeout is this many times its budget plus STARTUP_SECONDS (imports, the first compile).
TIMEOUT_FACTOR = 2.0
STARTUP_SECONDS = 60.0

_MEMORY_OPS = frozenset(
    {"load", "store", "atomic_add", "atomic_max", "atomic_min", "atomic_cas", "atomic_xchg", "atomic_and"}
    | {"atomic_or", "atomic_xor"}
)
_EXTREMA = {"max": "min", "min": "max", "argmax": "argmin", "argmin": "argmax"}
_EXTREMA |= {"maximum": "minimum", "minimum": "maximum"}
_STRICTNESS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_NEGATION = {ast.Lt: ast.GtE, ast.LtE: ast.Gt, ast.Gt: ast.LtE, ast.GtE: ast.Lt, ast.Eq: ast.NotEq}
_NEGATION |= {ast.NotEq: ast.Eq}
_NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift)
_NARROWER = {"float32": ("float16", "bfloat16"), "float64": ("float32",), "int64": ("int32",)}
_OTHER_AXES = {0: (1,), 1: (0,), 2: (0,)}
# Calls whose integer arguments are structure (an axis, a power-of-two range, a shape), not values.
_STRUCTURAL_CALLS = frozenset({"program_id", "num_programs", "arange", "full", "zeros", "reshape", "view"})
_STRUCTURAL_CALLS |= frozenset({"broadcast_to", "permute", "expand_dims", "static_range", "constexpr"})
_STRUCTURAL_KEYWORDS = frozenset({"axis", "num_stages", "eviction_policy", "cache_modifier", "dtype"})
# Names that read as integer positions; names that read as float quantities are never bounds.
_INDEX_NAME = re.compile(
    r"(?i)^(?:[ijkbnm]|.*(?:off|idx|index|pos|start|end|row|col|token|slot|request|pid|lane|tile|num|count"
    r"|size|width|stride|step|split|chunk|first|last|base|call).*)$"
)
_FLOAT_NAME = re.compile(
    r"(?i)(?:max|min|sum|log|prob|temp|weight|key|mass|noise|scale|uniform|gumbel|logit|ratio|fraction)"
)
_ATOMIC_NODES = (ast.Name, ast.Constant, ast.Call, ast.Attribute, ast.Subscript, ast.List, ast.Tuple)


@dataclass(frozen=True)
class Mutant:
    """One change of one kernel file.

    Attributes:
        id: ``<file stem>:<line>:<digest>``, stable while the file is unchanged.
        operator: its `OPERATORS` name.
        path: the file as shown (relative to the working directory when below it).
        line: the first line changed; ``function`` the ``@triton.jit`` function (``<module>`` for a
            module constant).
        change: the text replaced and its replacement, on one line.
        start, end: the replaced character span of the source; ``replacement`` its new text.
        reach: the lines of which one must run for the change to run (its statement, or the header
            of a compound one); ``None`` for a module constant, which runs on import.
    """

    id: str
    operator: str
    path: str
    line: int
    function: str
    change: str
    start: int
    end: int
    replacement: str
    reach: tuple[int, int] | None

    def source(self, original: str) -> str:
        """The mutated text of ``original``, the file's source."""
        return original[: self.start] + self.replacement + original[self.end :]

    def diff(self, original: str) -> str:
        """The unified diff from ``original`` to the mutant, two lines of context."""
        lines = difflib.unified_diff(
            original.splitlines(keepends=True),
            self.source(original).splitlines(keepends=True),
            fromfile=f"a/{self.path}",
            tofile=f"b/{self.path}",
            n=2,
        )
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


class _Language:
    """How a module names ``triton.language`` (``tl``) and ``triton.jit``."""

    def __init__(self, tree: ast.Module) -> None:
        self.aliases = {"tl"}
        self.jit_names = {"triton.jit"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for name in node.names:
                    if name.name == "triton.language" and name.asname:
                        self.aliases.add(name.asname)
                    if name.name == "triton" and name.asname:
                        self.jit_names.add(f"{name.asname}.jit")
            elif isinstance(node, ast.ImportFrom) and node.module == "triton":
                for name in node.names:
                    if name.name == "language":
                        self.aliases.add(name.asname or "language")
                    if name.name == "jit":
                        self.jit_names.add(name.asname or "jit")

    def call(self, node: ast.AST) -> str | None:
        """``"load"`` for ``tl.load(...)``; ``"range"`` for the builtin ``range(...)``; else ``None``."""
        if not isinstance(node, ast.Call):
            return None
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id in self.aliases
        ):
            return func.attr
        if isinstance(func, ast.Name) and func.id == "range":
            return "range"
        return None

    def is_dtype(self, node: ast.AST) -> str | None:
        """``"float32"`` for ``tl.float32``; else ``None``."""
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
            return None
        return node.attr if node.value.id in self.aliases and node.attr in _NARROWER else None

    def is_jit(self, function: ast.FunctionDef) -> bool:
        """Whether ``function`` is decorated with ``triton.jit`` (called or not)."""
        for decorator in function.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if ast.unparse(target) in self.jit_names:
                return True
        return False


@dataclass
class _Site:
    """Where an operator looks: the function's language, its structural constants, its strides."""

    lang: _Language
    structural: set[int] = field(default_factory=set)
    strides: tuple[str, ...] = ()


# An operator yields (the node whose text is replaced, its replacement).
_Edit = tuple[ast.AST, ast.AST]


def _compare(table: dict[type, type]) -> Callable[[ast.AST, _Site], Iterator[_Edit]]:
    def edits(node: ast.AST, site: _Site) -> Iterator[_Edit]:
        if isinstance(node, ast.Compare):
            for index, op in enumerate(node.ops):
                if type(op) in table:
                    new = copy.deepcopy(node)
                    new.ops[index] = table[type(op)]()
                    yield node, new

    return edits


def _index_like(expr: ast.AST, lang: _Language) -> bool:
    """Whether ``expr`` reads as integer position arithmetic: no float constant and no float-named
    value in it, and an int constant, an index-named value, ``tl.arange`` or ``tl.program_id``."""
    nodes = list(ast.walk(expr))
    if any(isinstance(n, ast.Constant) and isinstance(n.value, float) for n in nodes):
        return False
    if any(isinstance(n, ast.Name) and _FLOAT_NAME.search(n.id) for n in nodes):
        return False
    return any(
        (isinstance(n, ast.Constant) and type(n.value) is int)
        or (isinstance(n, ast.Name) and _INDEX_NAME.match(n.id) is not None)
        or lang.call(n) in ("arange", "program_id", "num_programs")
        for n in nodes
    )


def _plus_minus_one(target: ast.AST) -> Iterator[_Edit]:
    for op in (ast.Add(), ast.Sub()):
        yield target, ast.BinOp(copy.deepcopy(target), op, ast.Constant(1))


def _off_by_one(node: ast.AST, site: _Site) -> Iterator[_Edit]:
    lang = site.lang
    name = lang.call(node)
    if isinstance(node, ast.Call) and name in _MEMORY_OPS and node.args:
        yield from _plus_minus_one(node.args[0])
    elif isinstance(node, ast.Call) and name in ("range", "static_range") and node.args:
        yield from _plus_minus_one(node.args[1] if len(node.args) > 1 else node.args[0])
    elif isinstance(node, ast.Compare):
        for bound in node.comparators:
            if _index_like(bound, lang) and _index_like(node.left, lang):
                yield from _plus_minus_one(bound)
    elif _index_assignment(node, lang):
        assert isinstance(node, ast.Assign)
        yield from _plus_minus_one(node.value)


def _index_assignment(node: ast.AST, lang: _Language) -> bool:
    """Whether ``node`` assigns index arithmetic to one index-named variable (not a structural call)."""
    if not (
        isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
    ):
        return False
    if isinstance(node.value, ast.Call) and lang.call(node.value) in _STRUCTURAL_CALLS:
        return False
    return _INDEX_NAME.match(node.targets[0].id) is not None and _index_like(node.value, lang)


def _keyword(node: ast.AST, lang: _Language, name: str) -> ast.keyword | None:
    if isinstance(node, ast.Call) and lang.call(node) in _MEMORY_OPS:
        return next((k for k in node.keywords if k.arg == name), None)
    return None


def _mask_drop(node: ast.AST, site: _Site) -> Iterator[_Edit]:
    if _keyword(node, site.lang, "mask") is not None:
        assert isinstance(node, ast.Call)
        new = copy.deepcopy(node)
        new.keywords = [k for k in new.keywords if k.arg not in ("mask", "other")]
        yield node, new


def _mask_invert(node: ast.AST, site: _Site) -> Iterator[_Edit]:
    mask = _keyword(node, site.lang, "mask")
    if mask is not None:
        yield mask.value, ast.UnaryOp(ast.Invert(), copy.deepcopy(mask.value))


def _other(node: ast.AST, site: _Site) -> Iterator[_Edit]:
    other = _keyword(node, site.lang, "other")
    if other is None:
        return
    value = other.value
    inner = value.operand if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub) else value
    if isinstance(inner, ast.Constant) and isinstance(inner.value, int | float) and inner.value == 0:
        yield value, ast.Constant(type(inner.value)(1))
    else:
        zero = inner.value if isinstance(inner, ast.Constant) and isinstance(inner.value, float) else 0
        yield value, ast.Constant(type(zero)(0))


def _swap(node: ast.AST, site: _Site) -> Iterator[_Edit]:
    swappable = isinstance(node, ast.BinOp) and isinstance(node.op, _NON_COMMUTATIVE)
    if swappable and ast.dump(node.left) != ast.dump(node.right):
        yield node, ast.BinOp(copy.deepcopy(node.right), node.op, copy.deepcopy(node.left))


def _reduction(node: ast.AST, site: _Site) -> Iterator[_Edit]:
    name = site.lang.call(node)
    if not isinstance(node, ast.Call) or name is None:
        return
    if name in _EXTREMA and isinstance(node.func, ast.Attribute):
        new = copy.deepcopy(node)
        assert isinstance(new.func, ast.Attribute)
        new.func.attr = _EXTREMA[name]
        yield node, new
    elif name in ("sum", "cumsum") and node.args:
        yield node, copy.deepcopy(node.args[0])


def _number(node: ast.AST) -> int | float | bool | None:
    """The number ``node`` spells (a literal, a negated one, ``float("inf")``), or ``None``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number(node.operand)
        return None if inner is None or isinstance(inner, bool) else -inner
    spelled = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float"
    if spelled and len(node.args) == 1 and isinstance(node.args[0], ast.Constant):
        with contextlib.suppress(TypeError, ValueError):
            return float(node.args[0].value)
    return None


def _literal(value: float) -> ast.AST:
    if value == float("-inf"):
        return ast.Call(ast.Name("float", ast.Load()), [ast.Constant("-inf")], [])
    return ast.Constant(value)


def _constant(node: ast.AST, site: _Site) -> Iterator[_Edit]:
    if id(node) in site.structural:
        return
    value = _number(node)
    if value is None:
        return
    if isinstance(value, bool):
        replacements: list[float] = [not value]
    elif isinstance(value, int):
        replacements = [r for r in (0, 1) if r != value]
    elif value != value or value in (float("inf"), float("-inf")):
        replacements = [0.0]
    else:
        replacements = [r for r in (0.0, 1.0, float("-inf")) if r != value] + ([1e-6] if value == 0 else [])
    for replacement in replacements:
        yield node, _literal(replacement)


def _dtype(node: ast.AST, site: _Site) -> Iterator[_Edit]:
    wide = site.lang.is_dtype(node)
    if wide is not None:
        assert isinstance(node, ast.Attribute)
        for narrow in _NARROWER[wide]:
            yield node, ast.Attribute(copy.deepcopy(node.value), narrow, ast.Load())


def _where(node: ast.AST, site: _Site) -> Iterator[_Edit]:
    if isinstance(node, ast.Call) and site.lang.call(node) == "where" and len(node.args) == 3:
        yield node, copy.deepcopy(node.args[1])
        yield node, copy.deepcopy(node.args[2])


def _program_id(node: ast.AST, site: _Site) -> Iterator[_Edit]:
    if isinstance(node, ast.Call) and site.lang.call(node) in ("program_id", "num_programs"):
        axis = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "axis"), None)
        if isinstance(axis, ast.Constant) and axis.value in _OTHER_AXES:
            for other in _OTHER_AXES[axis.value]:
                yield axis, ast.Constant(other)


def _stride_swap(node: ast.AST, site: _Site) -> Iterator[_Edit]:
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in site.strides:
        for other in site.strides:
            if other != node.id:
                yield node, ast.Name(other, ast.Load())


_EDITS: dict[str, Callable[[ast.AST, _Site], Iterator[_Edit]]] = {
    "compare-strict": _compare(_STRICTNESS),
    "compare-flip": _compare(_NEGATION),
    "off-by-one": _off_by_one,
    "mask-drop": _mask_drop,
    "mask-invert": _mask_invert,
    "other": _other,
    "swap": _swap,
    "reduction": _reduction,
    "constant": _constant,
    "dtype": _dtype,
    "where": _where,
    "program-id": _program_id,
    "stride-swap": _stride_swap,
}
assert set(_EDITS) == set(OPERATORS)


def _statement_nodes(body: Sequence[ast.stmt]) -> Iterator[tuple[ast.AST, tuple[int, int]]]:
    """Every node of ``body`` with the lines that run it: its statement's, or for a compound
    statement (``if``, ``while``, ``for``) its header's; nested statements are their own."""
    for statement in body:
        nested: list[ast.stmt] = []
        header: list[ast.AST] = []
        for name, value in ast.iter_fields(statement):
            values = value if isinstance(value, list) else [value]
            if name in ("body", "orelse", "finalbody", "handlers"):
                nested += [v for v in values if isinstance(v, ast.stmt)]
            else:
                header += [v for v in values if isinstance(v, ast.AST)]
        end = max([statement.lineno] + [getattr(h, "end_lineno", 0) or 0 for h in header])
        span = (statement.lineno, statement.end_lineno or end) if not nested else (statement.lineno, end)
        yield statement, span
        for part in header:
            for node in ast.walk(part):
                yield node, span
        yield from _statement_nodes(nested)


def _structural(nodes: Sequence[ast.AST], lang: _Language) -> set[int]:
    """The ids of the nodes inside structural arguments: axes, shapes, power-of-two ranges, dtypes."""
    found: set[int] = set()
    for node in nodes:
        parts: list[ast.AST] = []
        if isinstance(node, ast.Call) and lang.call(node) in _STRUCTURAL_CALLS:
            parts += node.args
        if isinstance(node, ast.Call):
            parts += [k.value for k in node.keywords if k.arg in _STRUCTURAL_KEYWORDS]
            parts += [a for a in node.args if isinstance(a, ast.List | ast.Tuple)]
        if isinstance(node, ast.UnaryOp):
            parts.append(node.operand)  # -1 is one constant, not a negated 1
        for part in parts:
            found |= {id(n) for n in ast.walk(part)}
    return found


def _docstring_free(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return body[1:]
    return body


def _offsets(source: str) -> list[int]:
    """The character offset at which each line (1-based, index ``line - 1``) starts."""
    starts, total = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(total)
        total += len(line)
    return [*starts, total]


def _char(source_lines: list[str], starts: list[int], line: int, col: int) -> int:
    """The character offset of ``(line, col)``, ``col`` in UTF-8 bytes as `ast` counts."""
    return starts[line - 1] + len(source_lines[line - 1].encode()[:col].decode())


def jit_functions(source: str) -> list[str]:
    """The names of the ``@triton.jit`` functions defined at the top level of ``source``."""
    tree = ast.parse(source)
    lang = _Language(tree)
    return [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and lang.is_jit(f)]


def generate_mutants(path: Path, source: str, shown: str | None = None) -> list[Mutant]:
    """Every mutant of the ``@triton.jit`` functions and ``tl.constexpr`` constants of ``source``
    (the text of ``path``), in the order of the file, one per distinct mutated text; each parses."""
    tree = ast.parse(source)
    lang = _Language(tree)
    shown = shown or str(path)
    lines = source.splitlines(keepends=True)
    starts = _offsets(source)
    units: list[tuple[str, list[tuple[ast.AST, tuple[int, int] | None]]]] = []
    for top in tree.body:
        if isinstance(top, ast.FunctionDef) and lang.is_jit(top):
            units.append((top.name, list(_statement_nodes(_docstring_free(top.body)))))
        elif isinstance(top, ast.Assign) and lang.call(top.value) == "constexpr":
            assert isinstance(top.value, ast.Call)
            units.append(("<module>", [(n, None) for a in top.value.args for n in ast.walk(a)]))
    mutants: list[Mutant] = []
    seen: set[tuple[int, int, str]] = set()
    for function, nodes in units:
        everything = [n for n, _ in nodes]
        strides = sorted({n.id for n in everything if isinstance(n, ast.Name) and "stride" in n.id.lower()})
        site = _Site(lang, _structural(everything, lang), tuple(strides))
        if function == "<module>":
            site.structural = set()
        for node, reach in nodes:
            for operator, edits in _EDITS.items():
                for target, new in edits(node, site):
                    mutant = _mutant(
                        operator, target, new, path, shown, source, lines, starts, function, reach
                    )
                    if mutant is None:
                        continue
                    key = (mutant.start, mutant.end, mutant.replacement)
                    if key not in seen:
                        seen.add(key)
                        mutants.append(mutant)
    return sorted(mutants, key=lambda m: (m.start, m.end, m.operator, m.replacement))


def _mutant(
    operator: str,
    target: ast.AST,
    new: ast.AST,
    path: Path,
    shown: str,
    source: str,
    lines: list[str],
    starts: list[int],
    function: str,
    reach: tuple[int, int] | None,
) -> Mutant | None:
    """The mutant replacing ``target``'s text by ``new``'s, or ``None`` when it changes nothing."""
    lineno, col = getattr(target, "lineno", None), getattr(target, "col_offset", None)
    end_lineno, end_col = getattr(target, "end_lineno", None), getattr(target, "end_col_offset", None)
    if lineno is None or col is None or end_lineno is None or end_col is None:
        return None
    start, end = _char(lines, starts, lineno, col), _char(lines, starts, end_lineno, end_col)
    text = ast.unparse(new)
    if not isinstance(new, _ATOMIC_NODES):
        text = f"({text})"
    old = source[start:end]
    if text == old or ast.dump(new) == ast.dump(target):
        return None
    try:  # an expression, atomic or parenthesised, in place of an expression: the file still parses
        ast.parse(text, mode="eval")
    except SyntaxError:
        return None
    digest = hashlib.sha1(f"{operator}|{start}|{end}|{text}".encode()).hexdigest()[:6]
    change = f"{_one_line(old)} -> {_one_line(text)}"
    return Mutant(
        id=f"{Path(shown).stem}:{lineno}:{digest}",
        operator=operator,
        path=shown,
        line=lineno,
        function=function,
        change=change,
        start=start,
        end=end,
        replacement=text,
        reach=reach,
    )


def _one_line(text: str, most: int = 70) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= most else flat[: most - 3] + "..."


# -- which files: the variant's kernel modules ------------------------------------------------------


def _external_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib"))


def module_file(module: object) -> str | None:
    file = getattr(module, "__file__", None)
    return os.path.realpath(file) if isinstance(file, str) and file.endswith(".py") else None


def static_imports(module: ModuleType) -> set[str]:
    """The module names ``module``'s file imports anywhere in it (``import a.b``: ``a.b``; ``from a
    import b``: ``a`` and ``a.b``), relative imports resolved."""
    file = module_file(module)
    if file is None:
        return set()
    try:
        tree = ast.parse(Path(file).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return set()
    package = module.__package__ or ""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def _project(name: str, module: ModuleType) -> bool:
    """Whether ``module`` is the project's or the user's code, not an installed library's."""
    file = module_file(module)
    if file is None:
        return False
    if name.startswith(("specsample.", "_specsample_variant_")):
        return True
    return not file.startswith(_external_roots())


def variant_modules(variant: object) -> list[ModuleType]:
    """The modules of the variant's own code: its class's module and what it imports, transitively,
    leaving out installed libraries."""
    first = sys.modules.get(type(variant).__module__)
    if first is None:
        return []
    found: dict[str, ModuleType] = {}
    pending = [first]
    while pending:
        module = pending.pop()
        if module.__name__ in found or not _project(module.__name__, module):
            continue
        found[module.__name__] = module
        pending += [sys.modules[n] for n in static_imports(module) if n in sys.modules]
    return list(found.values())


def kernel_files(variant: object) -> list[Path]:
    """The files among `variant_modules` that define at least one ``@triton.jit`` function."""
    files = []
    for module in variant_modules(variant):
        file = module_file(module)
        if file is not None and jit_functions(Path(file).read_text(encoding="utf-8")):
            files.append(Path(file))
    return sorted(set(files))


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory when below it (through the package's symlinks
    too: ``specsample/kernels/rules.py`` is shown as ``kernels/rules.py``), else absolute."""
    real = Path(os.path.realpath(path))
    cwd = Path(os.path.realpath(Path.cwd()))
    return str(real.relative_to(cwd)) if real.is_relative_to(cwd) else str(real)


# -- the child: one mutant (or the control) in a fresh interpreter -----------------------------------


class _MutatedSource:
    """A meta path finder that imports the modules ``names`` from ``path`` (the mutated copy)."""

    def __init__(self, names: dict[str, ModuleType], path: str) -> None:
        self.names, self.path = names, path

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> Any:
        import importlib.util

        if fullname not in self.names:
            return None
        search = getattr(self.names[fullname], "__path__", None)
        return importlib.util.spec_from_file_location(
            fullname, self.path, submodule_search_locations=list(search) if search is not None else None
        )


def _dependents(roots: set[str], candidates: dict[str, ModuleType]) -> set[str]:
    """``roots`` and every module of ``candidates`` that imports one of them, transitively."""
    imports = {name: static_imports(module) for name, module in candidates.items()}
    found = set(roots)
    grew = True
    while grew:
        grew = False
        for name, imported in imports.items():
            if name not in found and imported & found:
                found.add(name)
                grew = True
    return found


def load_mutant(spec: str, original: object, source: str, mutated: str) -> object:
    """The variant ``spec`` built with the file ``source`` read from ``mutated`` instead.

    A file spec naming ``source`` itself loads the copy as its file; otherwise the modules that are
    ``source`` and those of the variant's folders that import them (and the variant's own module)
    are imported afresh, ``source`` from the copy, and the originals are put back afterwards.
    """
    from specsample.fuzz.spec import load_variant

    real = os.path.realpath(source)
    target, _, name = spec.rpartition(":")
    if target and (target.endswith(".py") or "/" in target) and os.path.realpath(target) == real:
        return load_variant(f"{mutated}:{name}")
    loaded = {n: m for n, m in list(sys.modules.items()) if isinstance(m, ModuleType)}
    roots = {n for n, m in loaded.items() if module_file(m) == real}
    if not roots:
        raise LookupError(f"{source} is not imported by variant {spec!r}")
    own = type(original).__module__
    folders = {os.path.dirname(real)} | {os.path.dirname(module_file(loaded[own]) or real)}
    candidates = {n: m for n, m in loaded.items() if os.path.dirname(module_file(m) or "") in folders}
    purged = _dependents(roots, candidates) | {own}
    saved = {n: loaded[n] for n in purged if n in loaded}
    attributes: dict[tuple[str, str], object] = {}
    for n in saved:
        parent, _, child = n.rpartition(".")
        if parent in sys.modules and hasattr(sys.modules[parent], child):
            attributes[(parent, child)] = getattr(sys.modules[parent], child)
            delattr(sys.modules[parent], child)
        del sys.modules[n]
    finder = _MutatedSource({n: loaded[n] for n in roots}, mutated)
    sys.meta_path.insert(0, finder)
    try:
        return load_variant(spec)
    finally:
        sys.meta_path.remove(finder)
        sys.modules.update(saved)
        for (parent, child), value in attributes.items():
            setattr(sys.modules[parent], child, value)


class _Compared:
    """The mutant as a variant that also calls the unmutated variant on every batch, until their
    outputs first differ, and counts the calls that were equal bit for bit."""

    def __init__(self, mutant: Any, original: Any) -> None:
        from specsample.reference.contract import capabilities

        self.mutant, self.original = mutant, original
        self.name = mutant.name
        self.streams = mutant.streams
        self.capabilities = capabilities(mutant)
        self.calls = 0
        self.equal_calls = 0
        self.differed_at: int | None = None

    def __call__(self, batch: Any) -> Any:
        """The mutant's output; compared with the unmutated variant's while they have been equal."""
        output = self.mutant(batch)
        self.calls += 1
        if self.differed_at is None:
            try:
                same = _same_output(output, self.original(batch))
            except Exception:  # the unmutated variant raised where the mutant did not: they differ
                same = False
            if same:
                self.equal_calls += 1
            else:
                self.differed_at = self.calls
        return output


def _same_output(first: Any, second: Any) -> bool:
    """Whether two `SpecOutput` hold the same tensors, bit for bit (NaN payloads included)."""
    import torch

    for name in ("token_ids", "num_emitted", "logprobs", "accepted_nodes"):
        a, b = getattr(first, name, None), getattr(second, name, None)
        if (a is None) != (b is None):
            return False
        if a is None:
            continue
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return bool(a == b)
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        bytes_a = a.detach().cpu().contiguous().view(torch.uint8)
        bytes_b = b.detach().cpu().contiguous().view(torch.uint8)
        if not torch.equal(bytes_a, bytes_b):
            return False
    return True


class _LineTrace:
    """The lines of ``files`` that run inside the block (`sys.settrace`), by real path."""

    def __init__(self, files: Sequence[str]) -> None:
        self.files = {os.path.realpath(f) for f in files}
        self.lines: dict[str, set[int]] = defaultdict(set)
        self._real: dict[str, str | None] = {}

    def _mine(self, filename: str) -> str | None:
        if filename not in self._real:
            real = os.path.realpath(filename)
            self._real[filename] = real if real in self.files else None
        return self._real[filename]

    def _global(self, frame: FrameType, event: str, arg: object) -> Any:
        real = self._mine(frame.f_code.co_filename)
        if real is None:
            return None
        lines = self.lines[real]

        def local(frame: FrameType, event: str, arg: object) -> Any:
            if event == "line":
                lines.add(frame.f_lineno)
            return local

        return local

    def __enter__(self) -> _LineTrace:
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _reordered(
    targeted: Callable[..., list[tuple[str, Any]]], first: Sequence[str]
) -> Callable[..., list[tuple[str, Any]]]:
    """``targeted`` (`fuzz.targeted.targeted_batches`) with the cases named in ``first`` first."""

    def batches(*args: Any, **kwargs: Any) -> list[tuple[str, Any]]:
        cases = targeted(*args, **kwargs)
        return sorted(cases, key=lambda case: case[0] not in first)

    return batches


def _case_lines(
    variant: Any, cases: Sequence[tuple[str, Any]], files: Sequence[str], device: str
) -> dict[str, dict[str, list[int]]]:
    """Per targeted case, the lines of ``files`` one call of ``variant`` on its batch runs."""
    from specsample.properties.batching import on_device

    reached: dict[str, dict[str, list[int]]] = {}
    for name, batch in cases:
        with _LineTrace(files) as trace, contextlib.suppress(Exception):
            variant(on_device(batch, device))
        reached[name] = {file: sorted(lines) for file, lines in trace.lines.items()}
    return reached


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """Run one mutant (or, with ``mutated`` ``None``, the control) as ``task`` says; its verdict.

    ``task``: ``spec``, ``source`` and ``mutated`` (the original file and its mutated copy),
    ``budget`` seconds, ``profile``, ``device``, ``seed``; for the control ``trace``, the files whose
    lines each targeted batch runs (recorded under the interpreter, after the campaign, one untimed
    call a batch); for a mutant ``first_cases``, the targeted cases that run its line, which its
    campaign screens before the others so that a short budget reaches the change.
    """
    from specsample.fuzz import campaign
    from specsample.fuzz.spec import load_variant
    from specsample.fuzz.targeted import targeted_batches
    from specsample.properties.batching import on_device
    from specsample.properties.checks.base import EnvironmentProblem
    from specsample.reference.contract import capabilities

    start = time.monotonic()
    spec, device, control = task["spec"], task["device"], task["mutated"] is None

    def verdict(name: str, message: str, **fields: Any) -> dict[str, Any]:
        return {"verdict": name, "message": message, "seconds": round(time.monotonic() - start, 2), **fields}

    original = load_variant(spec)
    cases = targeted_batches(None, capabilities(original))
    first = on_device(cases[0][1], device) if cases else None
    try:
        if first is not None:
            original(first)  # compiles, and imports what the launcher imports lazily
    except Exception as error:
        return verdict(
            "error", f"the unmutated variant raised on {cases[0][0]}: {type(error).__name__}: {error}"
        )
    if control:
        variant: Any = original
    else:
        try:
            mutant = load_mutant(spec, original, task["source"], task["mutated"])
            if first is not None:
                mutant(first)
        except Exception as error:
            return verdict("compile error", f"{type(error).__name__}: {_one_line(str(error), 300)}")
        variant = _Compared(mutant, original)
    first_cases = task.get("first_cases") or []
    if first_cases:  # the campaign reads its targeted cases through this module attribute
        campaign.targeted_batches = _reordered(targeted_batches, first_cases)
    try:
        result = campaign.run_campaign(
            variant,
            spec,
            profile=task["profile"],
            seconds=task["budget"],
            seed=task["seed"],
            shrink=False,
            device=device,
            progress=False,
        )
    except EnvironmentProblem as error:
        name = "error" if control else "compile error"
        return verdict(name, f"environment: {_one_line(str(error), 300)}")
    fields: dict[str, Any] = {
        "status": result.status,
        "batches": result.screened,
        "samples": result.samples,
        "found_after": None if result.found_after is None else round(result.found_after, 2),
        "case": result.case,
        "describe": result.describe(),
    }
    if control and task.get("trace") and _interpreted():
        fields["reached"] = _case_lines(original, cases, task["trace"], device)
    if control:
        failure = result.failure
        if failure is not None:
            return verdict("failed", failure.message, check=failure.check, **fields)
        return verdict("passed", result.describe(), **fields)
    assert isinstance(variant, _Compared)
    fields |= {"calls": variant.calls, "equal_calls": variant.equal_calls, "differed_at": variant.differed_at}
    same = variant.differed_at is None and variant.calls > 0
    if result.failure is not None:
        if same:  # the check fails the unmutated variant on these very outputs: not the mutant's doing
            message = f"outputs equal to the unmutated variant's, yet {result.failure.check} failed on them"
            return verdict("likely equivalent", message, **fields)
        return verdict("killed", result.failure.message, check=result.failure.check, **fields)
    if same:
        return verdict(
            "likely equivalent",
            f"{variant.calls} calls, every output equal to the unmutated variant's",
            **fields,
        )
    return verdict("survived", result.describe(), **fields)


def child_main(argv: Sequence[str]) -> int:
    """``python -m specsample.fuzz.mutate TASK.json``: run the task, print its verdict as one JSON line."""
    import specsample.kernels  # noqa: F401  (chooses the Triton backend before any kernel module loads)

    task = json.loads(Path(argv[0]).read_text())
    print(json.dumps(run_task(task)), flush=True)
    return 0


# -- the parent: control, sample, one child per mutant, the matrix ----------------------------------


@dataclass
class Outcome:
    """One mutant's run: its `VERDICTS` name, the killing check, and what the child reported."""

    mutant: Mutant
    verdict: str
    check: str | None = None
    message: str = ""
    seconds: float = 0.0
    found_after: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self, source: str, replay: str) -> dict[str, Any]:
        """JSON-ready: the mutant (diff included), the verdict and its replay command."""
        mutant = {k: v for k, v in asdict(self.mutant).items() if k not in ("start", "end", "reach")}
        return {
            **mutant,
            "diff": self.mutant.diff(source),
            "verdict": self.verdict,
            "check": self.check,
            "time_to_kill": self.found_after if self.verdict == "killed" else None,
            "seconds": round(self.seconds, 2),
            "message": self.message,
            "details": self.details,
            "replay": replay,
        }


@dataclass
class MutationReport:
    """A mutation run: what was generated, reached and sampled, the control, and the outcomes."""

    spec: str
    command: str
    profile: str
    device: str
    budget: float
    seed: int
    sources: dict[str, str]
    generated: dict[str, int]
    reached: dict[str, int] | None
    sampled: int
    control: dict[str, Any] | None
    outcomes: list[Outcome] = field(default_factory=list)
    replay_base: str = ""
    interrupted: bool = False
    seconds: float = 0.0
    jobs: int = 1

    def counts(self) -> Counter[str]:
        """Mutants per verdict."""
        return Counter(o.verdict for o in self.outcomes)

    @property
    def survivors(self) -> list[Outcome]:
        """The mutants that survived."""
        return [o for o in self.outcomes if o.verdict == "survived"]

    def replay(self, mutant: Mutant) -> str:
        """The command that runs ``mutant`` alone."""
        return f"{self.replay_base} --mutant {shlex.quote(mutant.id)}"

    def score(self, outcomes: Sequence[Outcome] | None = None) -> tuple[int, int]:
        """``(killed, killed + survived)`` of ``outcomes`` (default: all)."""
        counts = Counter(o.verdict for o in (self.outcomes if outcomes is None else outcomes))
        return counts["killed"], sum(counts[v] for v in SCORED)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON: the run, the score per operator and per check, every mutant."""
        killed, scored = self.score()
        return {
            "variant": self.spec,
            "command": self.command,
            "profile": self.profile,
            "device": self.device,
            "budget_per_mutant": self.budget,
            "seed": self.seed,
            "jobs": self.jobs,
            "generated": self.generated,
            "reached": self.reached,
            "sampled": self.sampled,
            "run": len(self.outcomes),
            "interrupted": self.interrupted,
            "seconds": round(self.seconds, 1),
            "control": self.control,
            "counts": dict(self.counts()),
            "score": {
                "killed": killed,
                "non_equivalent": scored,
                "ratio": killed / scored if scored else None,
            },
            "per_operator": self._per_operator(),
            "per_check": self._per_check(),
            "mutants": [
                o.to_json(self.sources[o.mutant.path], self.replay(o.mutant))
                for o in sorted(self.outcomes, key=_survivors_first)
            ],
        }

    def _per_operator(self) -> dict[str, dict[str, Any]]:
        table: dict[str, dict[str, Any]] = {}
        for operator in OPERATORS:
            mine = [o for o in self.outcomes if o.mutant.operator == operator]
            if mine:
                killed, scored = self.score(mine)
                counts = Counter(o.verdict for o in mine)
                table[operator] = {v: counts[v] for v in VERDICTS} | {
                    "score": killed / scored if scored else None
                }
        return table

    def _per_check(self) -> dict[str, int]:
        return dict(
            Counter(o.check for o in self.outcomes if o.verdict == "killed" and o.check).most_common()
        )

    def markdown(self) -> str:
        """The kill matrix as Markdown: the summary, survivors with diffs and replay commands, then
        every mutant, the score per operator and per check."""
        counts = self.counts()
        killed, scored = self.score()
        ratio = f"{100 * killed / scored:.0f} %" if scored else "n/a"
        lines = [
            f"# Mutation testing: {self.spec}",
            "",
            f"Command: `{self.command}`",
            f"Profile {self.profile}, device {self.device}, {self.budget:g} s of campaign per mutant, seed "
            f"{self.seed}"
            + (f", {self.jobs} mutants at a time (timed on a shared device)" if self.jobs > 1 else "")
            + f"; {self.seconds:.0f} s in all"
            + (" (INTERRUPTED: a partial report)" if self.interrupted else "")
            + ".",
            "",
            "| kernel file | mutants | reached on this device |",
            "|---|---|---|",
        ]
        for path, count in self.generated.items():
            reached = "all (no trace)" if self.reached is None else str(self.reached.get(path, 0))
            lines.append(f"| {path} | {count} | {reached} |")
        lines += [
            "",
            f"Ran {len(self.outcomes)} of {self.sampled} mutants sampled. " + self._control_line(),
            "",
        ]
        lines.append(
            f"**Score: {killed} killed of {scored} non-equivalent ({ratio})**; "
            + ", ".join(f"{counts[v]} {v}" for v in VERDICTS)
            + ". Timed-out, crashed and compile-error mutants are not scored."
        )
        survivors = self.survivors
        lines += ["", f"## Survivors ({len(survivors)})", ""]
        if not survivors:
            lines.append("None.")
        for o in survivors:
            m = o.mutant
            lines += [
                f"### {m.id}: {m.operator} in `{m.function}` ({m.path}:{m.line})",
                "",
                f"`{m.change}`; {o.details.get('batches', 0)} batches, {o.details.get('calls', 0)} calls, "
                f"outputs first differed at call {o.details.get('differed_at')}.",
                "",
                "```diff",
                m.diff(self.sources[m.path]).rstrip("\n"),
                "```",
                "",
                f"Replay: `{self.replay(m)}`",
                "",
            ]
        lines += [
            "",
            "## Kill matrix",
            "",
            "| mutant | operator | where | change | verdict | check | to kill s | s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for o in sorted(self.outcomes, key=_survivors_first):
            m = o.mutant
            kill = "" if o.found_after is None or o.verdict != "killed" else f"{o.found_after:.1f}"
            change = m.change.replace("|", "\\|")
            lines.append(
                f"| {m.id} | {m.operator} | {m.function} ({m.path}:{m.line}) | `{change}` | {o.verdict} | "
                f"{o.check or ''} | {kill} | {o.seconds:.0f} |"
            )
        lines += ["", "## Score per operator", "", "| operator | " + " | ".join(VERDICTS) + " | score |"]
        lines.append("|---" * (len(VERDICTS) + 2) + "|")
        for operator, row in self._per_operator().items():
            score = "n/a" if row["score"] is None else f"{100 * row['score']:.0f} %"
            lines.append(f"| {operator} | " + " | ".join(str(row[v]) for v in VERDICTS) + f" | {score} |")
        lines += ["", "## Kills per check", "", "| check | kills | of non-equivalent |", "|---|---|---|"]
        for check, kills in self._per_check().items():
            lines.append(f"| {check} | {kills} | {100 * kills / scored:.0f} % |")
        compile_errors = [o for o in self.outcomes if o.verdict in ("compile error", "crashed", "timed out")]
        if compile_errors:
            lines += ["", "## Not scored", ""]
            lines += [f"- {o.mutant.id} ({o.verdict}): {_one_line(o.message, 200)}" for o in compile_errors]
        return "\n".join(lines) + "\n"

    def _control_line(self) -> str:
        if self.control is None:
            return "No control run."
        status = self.control.get("status", self.control["verdict"])
        return (
            f"Control (the unmutated variant, same campaign): {self.control['verdict']} ({status}), "
            f"{self.control.get('batches', 0)} batches in {self.control.get('seconds', 0):.0f} s."
        )

    def write(self, markdown: Path | None, json_path: Path | None) -> None:
        """Write the Markdown and JSON reports where asked."""
        if markdown is not None:
            markdown.write_text(self.markdown())
        if json_path is not None:
            json_path.write_text(json.dumps(self.to_json(), indent=1) + "\n")


def _survivors_first(outcome: Outcome) -> tuple[int, str, int]:
    order = ("survived", "timed out", "crashed", "killed", "likely equivalent", "compile error")
    return (order.index(outcome.verdict), outcome.mutant.path, outcome.mutant.line)


# The children running now, so that a Ctrl-C (which reaches only this process: each child has a
# session of its own) ends every one of them, whichever thread waits on it.
_LIVE: set[subprocess.Popen[str]] = set()
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


def _end(child: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)


def end_children() -> None:
    """End every child still running, and any started after (their threads then see them die)."""
    _STOPPING.set()
    with _LIVE_LOCK:
        for child in list(_LIVE):
            _end(child)


def run_child(task: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run ``task`` in a fresh interpreter (its own session, so a Ctrl-C reaches only this process,
    which then ends the child); its verdict, or ``timed out`` / ``crashed``."""
    with tempfile.TemporaryDirectory(prefix="specsample-task-") as folder:
        path = Path(folder) / "task.json"
        path.write_text(json.dumps(task))
        start = time.monotonic()
        child = subprocess.Popen(
            [sys.executable, "-m", "specsample.fuzz.mutate", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        with _LIVE_LOCK:
            _LIVE.add(child)
            if _STOPPING.is_set():
                _end(child)
        try:
            out, err = child.communicate(timeout=timeout)
        except BaseException as stop:
            _end(child)
            child.communicate()
            if isinstance(stop, subprocess.TimeoutExpired):
                return {
                    "verdict": "timed out",
                    "message": f"no verdict after {timeout:.0f} s",
                    "seconds": timeout,
                }
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(child)
        seconds = round(time.monotonic() - start, 2)
    for line in reversed(out.splitlines()):
        with contextlib.suppress(ValueError):
            reported = json.loads(line)
            if isinstance(reported, dict) and "verdict" in reported:
                return reported
    code = child.returncode
    how = f"signal {-code}" if code < 0 else f"exit code {code}"
    return {"verdict": "crashed", "message": f"{how}: {_one_line(err[-600:], 300)}", "seconds": seconds}


def sample(mutants: Sequence[Mutant], count: int | None, seed: int) -> list[Mutant]:
    """``count`` of ``mutants`` drawn uniformly with ``seed`` (all when ``count`` is ``None``), in
    file order."""
    if count is None or count >= len(mutants):
        return list(mutants)
    chosen = random.Random(seed).sample(range(len(mutants)), count)
    return [mutants[i] for i in sorted(chosen)]


def reached(mutant: Mutant, lines: dict[str, set[int]], real: str) -> bool:
    """Whether a line that runs ``mutant``'s change is among ``lines`` (by real path); a module
    constant always is."""
    if mutant.reach is None:
        return True
    first, last = mutant.reach
    return any(line in lines.get(real, ()) for line in range(first, last + 1))


def mutate(
    spec: str,
    files: dict[str, Path],
    mutants: Sequence[Mutant],
    *,
    count: int | None,
    chosen_ids: Sequence[str] = (),
    budget: float,
    timeout: float,
    profile: str,
    device: str,
    seed: int,
    control: bool,
    command: str,
    replay_base: str,
    markdown: Path | None = None,
    json_path: Path | None = None,
    jobs: int = 1,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> MutationReport:
    """Run the control, then each sampled mutant in a child of its own, ``jobs`` children at a
    time, writing the reports after each; a Ctrl-C ends every child and stops the run, and the
    report of what finished is written and marked interrupted.

    ``files`` maps each shown path to its file; ``chosen_ids`` (replay) runs those mutants, with no
    control and no sampling.
    """
    started = time.monotonic()
    _STOPPING.clear()  # a run stopped before in this process stops nothing now
    sources = {shown: path.read_text(encoding="utf-8") for shown, path in files.items()}
    base_task = {"spec": spec, "budget": budget, "profile": profile, "device": device, "seed": seed}
    report = MutationReport(
        spec=spec,
        command=command,
        profile=profile,
        device=device,
        budget=budget,
        seed=seed,
        sources=sources,
        generated=dict(Counter(m.path for m in mutants)),
        reached=None,
        sampled=0,
        control=None,
        replay_base=replay_base,
        jobs=jobs,
    )
    try:
        case_lines: dict[str, dict[str, set[int]]] | None = None
        if control and not chosen_ids:
            log(f"control: the unmutated variant {spec}, {budget:g} s of campaign")
            trace = [str(p) for p in files.values()]
            report.control = run_child(
                {**base_task, "source": None, "mutated": None, "trace": trace}, timeout
            )
            if "reached" in report.control:
                reported_lines = report.control.pop("reached")
                case_lines = {
                    c: {f: set(v) for f, v in by_file.items()} for c, by_file in reported_lines.items()
                }
            log(f"control: {report.control['verdict']} ({report.control.get('status', '')})")
            if report.control["verdict"] != "passed":
                return report
        real = {shown: os.path.realpath(path) for shown, path in files.items()}
        first_cases = {
            m.id: [c for c, lines in (case_lines or {}).items() if reached(m, lines, real[m.path])]
            for m in mutants
        }
        if chosen_ids:
            pool = [m for m in mutants if m.id in set(chosen_ids)]
        elif case_lines is None:
            pool = list(mutants)
        else:
            pool = [m for m in mutants if m.reach is None or first_cases[m.id]]
            report.reached = dict(Counter(m.path for m in pool))
        chosen = pool if chosen_ids else sample(pool, count, seed)
        report.sampled = len(chosen)

        def run_mutant(mutant: Mutant) -> dict[str, Any]:
            with tempfile.TemporaryDirectory(prefix="specsample-mutant-") as folder:
                copy_path = Path(folder) / Path(mutant.path).name
                copy_path.write_text(mutant.source(sources[mutant.path]), encoding="utf-8")
                task = {**base_task, "source": str(files[mutant.path]), "mutated": str(copy_path)}
                task["first_cases"] = first_cases[mutant.id]
                return run_child(task, timeout)

        def record(mutant: Mutant, reported: dict[str, Any]) -> None:
            outcome = Outcome(
                mutant=mutant,
                verdict=reported.pop("verdict"),
                check=reported.pop("check", None),
                message=reported.pop("message", ""),
                seconds=float(reported.pop("seconds", 0.0)),
                found_after=reported.pop("found_after", None),
                details=reported,
            )
            report.outcomes.append(outcome)
            killer = f" by {outcome.check}" if outcome.check else ""
            log(
                f"[{len(report.outcomes)}/{len(chosen)}] {mutant.id} {mutant.operator}: "
                f"{outcome.verdict}{killer} ({outcome.seconds:.0f} s)"
            )
            report.seconds = time.monotonic() - started
            report.write(markdown, json_path)

        pending: dict[Future[dict[str, Any]], Mutant] = {}
        queue = iter(chosen)
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="mutant") as pool_of_children:
            try:
                while True:
                    while len(pending) < jobs and (mutant := next(queue, None)) is not None:
                        pending[pool_of_children.submit(run_mutant, mutant)] = mutant
                    if not pending:
                        break
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in finished:
                        record(pending.pop(future), future.result())
            except KeyboardInterrupt:
                end_children()  # the threads' children die, and their outcomes are not recorded
                raise
    except KeyboardInterrupt:
        report.interrupted = True
    report.seconds = time.monotonic() - started
    report.write(markdown, json_path)
    return report


if __name__ == "__main__":
    raise SystemExit(child_main(sys.argv[1:]))
