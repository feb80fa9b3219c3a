"""Kernel launches built by parameter name, through Triton's dispatch or directly from compiled kernels.

`dispatch` launches through Triton's dispatch (``kernel[grid](**arguments)``), which specialises,
compiles or loads from its cache, and calls any launch hook. On a GPU it can keep what it launched
(`CachedLaunch`) so that `launch_cached` later launches the same compiled kernels on new buffers
without the dispatch, which saves most of the host time of a small call. That path calls Triton's
internals (`CompiledKernel.run`, its ``packed_metadata``, ``driver.active.get_current_stream``,
``knobs.runtime``'s launch hooks), which change between Triton releases: it is taken only on the
versions in `SUPPORTED_TRITON`, never when ``SPECSAMPLE_DIRECT_LAUNCH=0``, and never while a launch
hook (a profiler's) is set, which only the dispatch calls (`direct_launch_ready`).
"""

from __future__ import annotations

import functools
import os
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import triton
from triton.runtime import driver

# Triton releases (major.minor) whose launch internals `launch_cached` was written against.
SUPPORTED_TRITON = frozenset({"3.6"})
DIRECT_LAUNCH_ENV = "SPECSAMPLE_DIRECT_LAUNCH"
# Set to 0, launches are not programmatically dependent (`programmatic_launch`).
PDL_ENV = "SPECSAMPLE_PDL"
# Stands for an argument that a call's buffers give, in a launch's argument template.
_FROM_BUFFERS = object()


def kernel_arguments(kernel: Any, arguments: Mapping[str, Any]) -> tuple[Any, ...]:
    """The values of ``arguments`` in the order of ``kernel``'s parameters (constexprs included).

    Raises:
        ValueError: a parameter of the kernel has no argument, or an argument names no parameter.
    """
    names = kernel.arg_names
    problems = {
        "missing": [name for name in names if name not in arguments],
        "unknown": [name for name in arguments if name not in names],
    }
    if any(problems.values()):
        found = (f"{kind} arguments {', '.join(args)}" for kind, args in problems.items() if args)
        raise ValueError(f"{kernel.__name__}: {'; '.join(found)}")
    return tuple(arguments[name] for name in names)


@dataclass(frozen=True)
class Launch:
    """One kernel launch: every argument in the kernel's parameter order (``template``), those at the
    ``(position, parameter name)`` pairs of ``buffer_slots`` given by each call's buffers, and the
    launch ``options`` that are not parameters (``num_warps``, ``maxnreg``)."""

    kernel: Any
    grid: tuple[int, int, int]
    template: tuple[Any, ...]
    buffer_slots: tuple[tuple[int, str], ...]
    options: dict[str, Any]

    @classmethod
    def of(
        cls,
        kernel: Any,
        grid: tuple[int, int, int],
        *,
        values: Mapping[str, Any],
        options: Mapping[str, Any],
        buffers: Collection[str],
        sources: Mapping[str, str] | None = None,
    ) -> Launch:
        """The launch of ``kernel`` on ``grid``: ``values`` fixed by the plan (counts, strides,
        constexprs), and each parameter named in ``buffers`` taken from a call's buffer of that name,
        or of the name ``sources`` gives it (a kernel launched twice on different buffers).

        Raises:
            ValueError: a parameter has no argument, a value names no parameter or is also a buffer.
        """
        twice = [name for name in values if name in buffers]
        if twice:
            raise ValueError(f"{kernel.__name__}: values that are also buffers: {', '.join(twice)}")
        open_slots = {name: _FROM_BUFFERS for name in kernel.arg_names if name in buffers}
        template = kernel_arguments(kernel, {**values, **open_slots})
        renamed = sources or {}
        slots = tuple(
            (i, renamed.get(name, name)) for i, name in enumerate(kernel.arg_names) if name in open_slots
        )
        return cls(kernel, grid, template, slots, dict(options))

    def arguments(self, buffers: Mapping[str, Any]) -> list[Any]:
        """Every argument in parameter order, with the call's ``buffers`` (by parameter name) filled in."""
        values = list(self.template)
        for position, name in self.buffer_slots:
            values[position] = buffers[name]
        return values


@dataclass(frozen=True)
class CachedLaunch:
    """A kernel compiled by Triton's dispatch, as `launch_cached` launches it again."""

    run: Any
    function: Any
    packed_metadata: Any


def direct_launch_available() -> bool:
    """Whether cached launches may bypass Triton's dispatch: a Triton release in `SUPPORTED_TRITON`,
    and ``SPECSAMPLE_DIRECT_LAUNCH`` not set to ``0``."""
    release = ".".join(triton.__version__.split(".")[:2])
    return release in SUPPORTED_TRITON and os.environ.get(DIRECT_LAUNCH_ENV, "") != "0"


@functools.cache
def _runtime_knobs() -> Any:
    """Triton's runtime knobs, where the launch hooks live (imported once, and only on the releases
    in `SUPPORTED_TRITON`)."""
    from triton import knobs

    return knobs.runtime


def _hook_set(hook: Any) -> bool:
    # Triton 3.6 keeps the hooks in chains, empty unless a hook was added.
    return hook is not None and getattr(hook, "calls", True)


def direct_launch_ready() -> bool:
    """Whether a call may launch its cached kernels directly now: available, and no launch hook (a
    profiler's) set, which only Triton's dispatch calls."""
    if not direct_launch_available():
        return False
    runtime = _runtime_knobs()
    return not (_hook_set(runtime.launch_enter_hook) or _hook_set(runtime.launch_exit_hook))


def programmatic_launch(device: torch.device) -> bool:
    """Whether a call's launches after the first (the sampler's and the filters') are programmatically
    dependent launches on ``device``: on a GPU of compute capability 9.0 or later, unless
    ``SPECSAMPLE_PDL=0``. The driver then places each launch's programs while the launch before it
    finishes, and they wait for it in the kernel (`rules.after_previous_launch`) instead of behind a
    launch gap. A plan made with it stays cached, so the variable counts when a batch structure is
    first seen."""
    if device.type != "cuda" or os.environ.get(PDL_ENV, "") == "0":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def pdl_options(pdl: bool) -> dict[str, bool]:
    """A launch's options for being programmatically dependent (`programmatic_launch`), or none."""
    return {"launch_pdl": True} if pdl else {}


def aligned(*tensors: torch.Tensor | None) -> tuple[bool, ...]:
    """Which tensors start at a multiple of 16 bytes (Triton specialises on it, so a plan's key holds it)."""
    return tuple(tensor is not None and tensor.data_ptr() % 16 == 0 for tensor in tensors)


def current_device() -> int:
    """The GPU that Triton's dispatch launches on."""
    return int(driver.active.get_current_device())


def dispatch(launches: Iterable[Launch], buffers: Mapping[str, Any], *, keep: bool) -> list[CachedLaunch]:
    """Launch in order through Triton's dispatch on the call's tensors (``buffers``, by parameter name);
    with ``keep``, return the compiled kernels for `launch_cached` (none unless `direct_launch_available`)."""
    keep = keep and direct_launch_available()
    kept = []
    for launch in launches:
        named = dict(zip(launch.kernel.arg_names, launch.arguments(buffers), strict=True))
        compiled = launch.kernel[launch.grid](**named, **launch.options)
        if keep:
            kept.append(CachedLaunch(compiled.run, compiled.function, compiled.packed_metadata))
    return kept


def current_stream(device_index: int) -> int:
    """The handle of the current stream of ``device_index``, the stream Triton's dispatch launches on."""
    return int(driver.active.get_current_stream(device_index))


def launch_cached(
    launches: Iterable[Launch],
    compiled: Iterable[CachedLaunch],
    buffers: Mapping[str, int],
    stream: int,
) -> None:
    """Launch the kernels `dispatch` compiled for ``launches`` again, on ``stream`` (`current_stream`
    of the device Triton's dispatch would launch on), with device addresses for the call's buffers.
    Only when `direct_launch_ready`."""
    for launch, kernel in zip(launches, compiled, strict=True):
        args = launch.arguments(buffers)
        # No launch metadata and no enter or exit hook: `direct_launch_ready` saw none set.
        kernel.run(*launch.grid, stream, kernel.function, kernel.packed_metadata, None, None, None, *args)


Value = TypeVar("Value")


class Recent(OrderedDict[Hashable, Value]):
    """The most recently used entries, oldest first: past ``budget`` in all (each entry weighs
    ``weigh(value)``, 1 by default), the least recently used go."""

    def __init__(self, budget: int, weigh: Callable[[Value], int] | None = None) -> None:
        super().__init__()
        self.budget = budget
        self.weigh = weigh

    def get(self, key: Hashable) -> Value | None:  # type: ignore[override]
        """The value under ``key``, now the most recently used; None if absent."""
        value = super().get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def keep(self, key: Hashable, value: Value) -> None:
        """Keep ``value`` under ``key`` as the most recently used, then drop the least recently used
        while the entries weigh more than the budget."""
        self[key] = value
        self.move_to_end(key)
        while self and self.weight() > self.budget:
            self.popitem(last=False)

    def weight(self) -> int:
        """What the entries weigh in all."""
        return len(self) if self.weigh is None else sum(self.weigh(value) for value in self.values())


class PlanCache(Recent[tuple[Any, list[CachedLaunch]]]):
    """A launcher's plans and their compiled launches by batch structure; the least recently used
    goes when there are more than ``size``."""

    def __init__(self, size: int) -> None:
        super().__init__(size)

    def put(self, key: Hashable, plan: Any, compiled: list[CachedLaunch]) -> None:
        """Keep ``plan`` and its compiled launches (empty where launches go through the dispatch)."""
        self.keep(key, (plan, compiled))


def run_cached(
    cache: PlanCache,
    key: Hashable,
    make: Callable[[], Any],
    buffers: Callable[[Any, bool], Mapping[str, Any]],
    device: torch.device,
) -> Any:
    """Launch the plan cached under ``key`` (``make()`` the first time), which holds its ``launches``:
    directly from its compiled kernels where `direct_launch_ready`, on ``buffers(plan, True)`` (device
    addresses by buffer name), else through Triton's dispatch on ``buffers(plan, False)`` (tensors),
    keeping the compiled kernels on a GPU for the next call. Returns the plan."""
    entry = cache.get(key)
    if entry is not None and entry[1] and device.type == "cuda" and direct_launch_ready():
        plan, compiled = entry
        launch_cached(plan.launches, compiled, buffers(plan, True), current_stream(current_device()))
        return plan
    plan = make() if entry is None else entry[0]
    compiled = dispatch(plan.launches, buffers(plan, False), keep=device.type == "cuda")
    cache.put(key, plan, compiled)
    return plan
