"""The kernels' launch interface: arguments by name, few parameters, workspace layout, direct-launch guard."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
import triton

from specsample.kernels import filters, interpret, launch, rejection, rows_kernels
from specsample.kernels import rejection_kernels as jit
from specsample.kernels.records import GEOMETRY, ROW_FLOAT, SPLIT
from specsample.reference.contract import RequestData, SpecBatch, SpecOutput, make_batch

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
MAX_PARAMETERS = 24


def _batch(method: str = "probabilistic") -> SpecBatch:
    """Two requests with flat draft logits over a 40-token vocabulary."""
    rng = np.random.default_rng(3)
    requests = [
        RequestData(rng.normal(size=(n + 1, 40)), rng.integers(0, 40, n), rng.normal(size=(n, 40)), 1.0, seed)
        for seed, n in enumerate((2, 1))
    ]
    return make_batch(requests, method=method, synthetic_rates=[0.5, 0.5], device=DEVICE)


def _assert_same(first: SpecOutput, second: SpecOutput) -> None:
    assert torch.equal(first.token_ids, second.token_ids)
    assert torch.equal(first.num_emitted, second.num_emitted)
    assert first.logprobs is not None and second.logprobs is not None
    assert torch.equal(first.logprobs.nan_to_num(nan=7.0), second.logprobs.nan_to_num(nan=7.0))


def _dispatches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the calls of `launch.dispatch` (one per sampler call that goes through Triton's dispatch)."""
    calls: list[int] = []
    dispatch = launch.dispatch

    def counted(*args: object, **kwargs: bool) -> list[launch.CachedLaunch]:
        calls.append(1)
        return dispatch(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(launch, "dispatch", counted)
    return calls


def test_supported_release_allows_the_direct_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Triton release in the supported set, with the variable unset, allows the direct launch."""
    monkeypatch.delenv(launch.DIRECT_LAUNCH_ENV, raising=False)
    for release in launch.SUPPORTED_TRITON:
        monkeypatch.setattr(triton, "__version__", f"{release}.0")
        assert launch.direct_launch_available()


def test_other_triton_release_goes_through_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an unsupported Triton release a call goes through Triton's dispatch, with the same output."""
    batch = _batch()
    rejection.rejection_sample(batch, plan="split")  # on a GPU, caches compiled launches for the direct path
    before = rejection.rejection_sample(batch, plan="split")
    monkeypatch.setattr(triton, "__version__", "9.9.0")
    assert not launch.direct_launch_available()
    assert not launch.direct_launch_ready()
    calls = _dispatches(monkeypatch)
    _assert_same(rejection.rejection_sample(batch, plan="split"), before)
    assert calls == [1]


def test_environment_variable_turns_the_direct_launch_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """With SPECSAMPLE_DIRECT_LAUNCH=0 every call goes through Triton's dispatch, with the same output."""
    batch = _batch("synthetic")
    rejection.rejection_sample(batch, plan="split")
    before = rejection.rejection_sample(batch, plan="split")
    monkeypatch.setenv(launch.DIRECT_LAUNCH_ENV, "0")
    assert not launch.direct_launch_available()
    calls = _dispatches(monkeypatch)
    _assert_same(rejection.rejection_sample(batch, plan="split"), before)
    assert calls == [1]


def test_the_filters_plan_each_call_structure_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`filter_thresholds`' split plan is made once per call structure and kept with its launches
    (`launch.run_cached`; on a GPU its compiled kernels are then launched directly): a second call of
    the same structure makes no plan and gives the same thresholds, on new tensors of the same
    shapes too; a call with another row count makes its own."""
    made: list[int] = []
    split_plan = filters._split_plan

    def counted(rows: int, *args: object) -> filters.FilterPlan:
        made.append(rows)
        return split_plan(rows, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(filters, "_split_plan", counted)
    monkeypatch.setattr(filters, "_plans", launch.PlanCache(8))
    rng = np.random.default_rng(3)
    logits = torch.tensor(rng.normal(size=(3, 300)), dtype=torch.float32, device=DEVICE)
    temperature = torch.ones(3, device=DEVICE)
    top_k, top_p = torch.tensor([5, 0, 300], device=DEVICE), torch.tensor([0.9, 0.5, 1.0], device=DEVICE)
    first = filters.filter_thresholds(logits, temperature, top_k, top_p, plan="split")
    again = filters.filter_thresholds(logits.clone(), temperature.clone(), top_k, top_p, plan="split")
    assert made == [3]
    assert torch.equal(first, again)
    assert first.isfinite().tolist() == [True, True, False]
    fewer = filters.filter_thresholds(logits[:2], temperature[:2], top_k[:2], top_p[:2], plan="split")
    assert made == [3, 2]
    assert torch.equal(fewer, first[:2])


def test_programmatic_launch_follows_the_device_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The split plan's launches after the first are programmatically dependent on a GPU of compute
    capability 9.0 or later unless SPECSAMPLE_PDL=0, and never on the CPU; the outputs are the same
    either way."""
    monkeypatch.delenv(launch.PDL_ENV, raising=False)
    batch = _batch()
    expected = DEVICE == "cuda" and torch.cuda.get_device_capability()[0] >= 9
    assert launch.programmatic_launch(batch.device) == expected
    launches = rejection.make_plan(batch).launches
    dependent = [item.options.get("launch_pdl", False) for item in launches]
    assert dependent == [False] + [expected] * (len(launches) - 1)
    flags = {dict(zip(item.kernel.arg_names, item.template, strict=True))["PDL"] for item in launches[1:]}
    assert flags == {expected}
    before = rejection.rejection_sample(batch, plan="split")
    monkeypatch.setenv(launch.PDL_ENV, "0")
    rejection._cache.clear()
    try:
        assert not launch.programmatic_launch(batch.device)
        assert not any(item.options.get("launch_pdl", False) for item in rejection.make_plan(batch).launches)
        _assert_same(rejection.rejection_sample(batch, plan="split"), before)
    finally:
        rejection._cache.clear()  # no plan made without it outlives the test


def test_launch_plan_defaults_by_device_and_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows plan on the CPU and the split plan on a GPU unless the argument or the variable says
    otherwise; a name that is no plan is a ValueError naming where it came from and the value."""
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.delenv(rejection.LAUNCH_PLAN_ENV, raising=False)
    assert (rejection.launch_plan(cpu), rejection.launch_plan(gpu)) == ("rows", "split")
    assert rejection.launch_plan(cpu, "split") == "split"
    monkeypatch.setenv(rejection.LAUNCH_PLAN_ENV, "split")
    assert rejection.launch_plan(cpu) == "split"
    assert rejection.launch_plan(cpu, "rows") == "rows"
    with pytest.raises(ValueError, match="plan is 'column'; expected one of split, rows"):
        rejection.launch_plan(cpu, "column")
    monkeypatch.setenv(rejection.LAUNCH_PLAN_ENV, "fast")
    with pytest.raises(ValueError, match="SPECSAMPLE_LAUNCH_PLAN is 'fast'"):
        rejection.rejection_sample(_batch())


def test_rows_plan_launches_once_with_whole_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows plan is one launch of `rows_kernel`, its tile within the device's element budget."""
    batch = _batch("block")
    item = rejection.rows_launch(batch)
    named = dict(zip(item.kernel.arg_names, item.template, strict=True))
    assert item.kernel is rows_kernels.rows_kernel
    tile = named["REQUESTS"] * named["POSITIONS"] * named["BLOCK_V"]
    assert named["POSITIONS"] >= 3 and tile <= rejection.ROWS_TILE_ELEMENTS[batch.device.type]
    assert item.grid == (-(-batch.num_requests // named["REQUESTS"]), 1, 1)
    calls = _dispatches(monkeypatch)
    output = rejection.rejection_sample(batch, plan="rows")
    assert calls == [1] and int(output.num_emitted.min()) >= 1


def test_every_kernel_takes_at_most_24_parameters() -> None:
    """Every kernel, and so every kernel a plan launches, takes at most 24 parameters, constexprs included."""
    kernels = {
        name: value
        for module in (jit, rows_kernels)
        for name, value in vars(module).items()
        if name.endswith("_kernel")
    }
    launched = {item.kernel.__name__ for item in rejection.make_plan(_batch()).launches}
    assert launched and launched <= set(kernels)
    for name, kernel in kernels.items():
        assert len(kernel.arg_names) <= MAX_PARAMETERS, f"{name} takes {len(kernel.arg_names)} parameters"


def test_missing_or_unknown_argument_names_raise() -> None:
    """Arguments without one of a kernel's parameters, or with a name it lacks, raise ValueError naming it."""
    kernel = jit.emit_kernel
    complete = {name: 0 for name in kernel.arg_names}
    assert launch.kernel_arguments(kernel, dict(reversed(complete.items()))) == tuple(complete.values())
    without = {name: 0 for name in kernel.arg_names if name != "num_blocks"}
    with pytest.raises(ValueError, match="missing arguments num_blocks"):
        launch.kernel_arguments(kernel, without)
    with pytest.raises(ValueError, match="unknown arguments num_split_blocks"):
        launch.kernel_arguments(kernel, {**complete, "num_split_blocks": 1})
    with pytest.raises(ValueError, match="values that are also buffers: token_ids_ptr"):
        launch.Launch.of(kernel, (1, 1, 1), values=complete, options={}, buffers=("token_ids_ptr",))


def test_launch_arguments_follow_the_kernel_parameters() -> None:
    """A launch passes each call buffer and each plan value at the position of the parameter of its name."""
    batch = _batch()
    plan = rejection.make_plan(batch)
    buffers = {name: f"<{name}>" for name in rejection.CALL_BUFFERS}
    for item in plan.launches:
        named = dict(zip(item.kernel.arg_names, item.arguments(buffers), strict=True))
        for name, value in named.items():
            assert value == buffers.get(name, value)
        assert named["vocab_size"] == batch.vocab_size


@pytest.mark.parametrize("method", rejection.KERNEL_METHODS)
def test_workspace_records_are_aligned_and_apart(method: str) -> None:
    """Records follow the split records 16-byte aligned and in order; only counters and flags are zeroed;
    the residual-mass shares of block verification take room in its calls only."""
    batch = _batch(method)
    plan = rejection.make_plan(batch)
    geometry = plan.geometry.cpu().tolist()
    assert len(geometry) == GEOMETRY.SIZE.value
    num_splits = rejection.vocab_layout(batch.vocab_size).num_splits
    split_words = SPLIT.SIZE.value * rejection._aligned(plan.num_requests * plan.width * num_splits)
    counter, stop_flag, row_float, row_int = (
        geometry[field.value]
        for field in (GEOMETRY.counter, GEOMETRY.stop_flag, GEOMETRY.row_float, GEOMETRY.row_int)
    )
    starts = [counter, stop_flag, row_float, row_int, *(record.offset for record in plan.records)]
    assert starts[0] == split_words and starts == sorted(set(starts))
    assert all(start % 4 == 0 for start in starts)
    mass = plan.records[-1]
    assert mass.parameter == "mass_ptr"
    mass_words = plan.num_requests * plan.width * num_splits if method == "block" else 0
    assert plan.work_words - mass.offset == rejection._aligned(mass_words)
    assert plan.zeroed == slice(counter, row_float)
    assert [record.parameter for record in plan.records] == list(rejection.RECORD_BUFFERS)


@pytest.mark.parametrize("method", rejection.KERNEL_METHODS)
def test_the_last_launch_leaves_the_zeroed_records_zero(method: str) -> None:
    """A call's last launch zeroes the counters, flags and ticket that its first launch finds zeroed,
    so a workspace kept from call to call (`rejection._resident_workspace`) starts each call as a
    fresh one does, and calls on one kept workspace give what calls on fresh ones give."""
    batch = _batch(method)
    plan = rejection.make_plan(batch)
    work = rejection._workspace(plan, batch.device)
    for trial in range(2):
        changed = dataclasses.replace(batch, seed=batch.seed + trial, step=batch.step + 7 * trial)
        kept, _ = rejection._compile_and_run(changed, plan, work=work)
        assert not bool(work[plan.zeroed].any()), work[plan.zeroed].tolist()
        fresh, _ = rejection._compile_and_run(changed, plan)
        _assert_same(kept, fresh)


@pytest.mark.parametrize("method", rejection.KERNEL_METHODS)
def test_no_launch_rounds_by_the_batch_size(method: str) -> None:
    """Every launch of a vocabulary's plans reduces in the same warps and tiles at every batch size,
    so a request's float32 sums, and its output, do not depend on the batch it rides in (a sum's
    rounding follows the warps and tiles that make it); only the number of programs changes, and
    the sampling pass's parts, each a whole number of its blocks."""
    vocab_size, n = 128256, 4

    def arithmetic(num_requests: int) -> list[tuple[object, ...]]:
        rows = num_requests * (n + 1)
        target = torch.zeros(1, vocab_size).expand(rows, vocab_size)  # shapes and strides only
        draft = torch.zeros(1, vocab_size).expand(num_requests * n, vocab_size)
        batch = SpecBatch(
            target_logits=target,
            draft_logits=None if method == "tree" else draft,
            draft_token_ids=torch.zeros(num_requests * n, dtype=torch.int64),
            cu_num_drafts=torch.arange(0, num_requests * n + 1, n, dtype=torch.int32),
            temperature=torch.ones(num_requests),
            seed=torch.zeros(num_requests, dtype=torch.int64),
            step=torch.zeros(num_requests, dtype=torch.int64),
            method=method,  # type: ignore[arg-type]
            synthetic_rates=torch.full((n,), 0.5, dtype=torch.float64),
            max_num_drafts=n,
            tree_parent=torch.arange(-1, n - 1).repeat(num_requests) if method == "tree" else None,
        )
        plan = rejection.make_plan(batch)
        described = []
        for item in plan.launches:
            named = dict(zip(item.kernel.arg_names, item.template, strict=True))
            tiles = named.get("TILES_PER_SPLIT") if item.kernel is jit.row_stats_kernel else None
            warps = item.options.get("num_warps")
            described.append((item.kernel.__name__, warps, named.get("BLOCK_V"), tiles))
        return described

    single = arithmetic(1)
    for num_requests in (16, 64, 256):
        assert arithmetic(num_requests) == single, num_requests


def test_recent_entries_drop_the_least_recently_used_past_their_budget() -> None:
    """`launch.Recent`, under the plan caches, the validated structures and the kept workspaces:
    counted (each entry 1) or weighed, a use makes an entry the most recently used, and entries go
    oldest first while they weigh more than the budget."""
    counted: launch.Recent[str] = launch.Recent(2)
    for key in "abc":
        counted.keep(key, key.upper())
    assert list(counted) == ["b", "c"] and counted.get("a") is None
    assert counted.get("b") == "B"
    counted.keep("d", "D")
    assert list(counted) == ["b", "d"]
    weighed: launch.Recent[str] = launch.Recent(5, weigh=len)
    weighed.keep("x", "xxx")
    weighed.keep("y", "yy")
    assert list(weighed) == ["x", "y"] and weighed.weight() == 5
    weighed.keep("z", "z")
    assert list(weighed) == ["y", "z"] and weighed.weight() == 3


def test_kept_workspaces_follow_plan_and_stream_within_their_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept workspace is made zeroed, once per plan key and stream; the least recently used go past
    the byte budget; a plan whose workspace exceeds the budget, or a call being captured, gets a fresh
    one each time."""
    plan = rejection.make_plan(_batch())
    size = 4 * plan.work_words
    monkeypatch.setattr(rejection, "_resident", launch.Recent(2 * size, rejection._resident.weigh))
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    device = torch.device("cpu")
    first = rejection._resident_workspace(plan, ("a",), 7, device)
    assert not bool(first.any()) and first.numel() == plan.work_words
    assert rejection._resident_workspace(plan, ("a",), 7, device) is first
    other_stream = rejection._resident_workspace(plan, ("a",), 8, device)
    assert other_stream is not first
    rejection._resident_workspace(plan, ("b",), 7, device)  # a third: the least recently used goes
    assert list(rejection._resident) == [(("a",), 8), (("b",), 7)]
    assert rejection._resident_workspace(plan, ("a",), 7, device) is not first
    capturing[0] = True
    assert rejection._resident_workspace(plan, ("b",), 7, device) is not rejection._resident[(("b",), 7)]
    capturing[0] = False
    monkeypatch.setattr(rejection._resident, "budget", size - 4)
    held = dict(rejection._resident)
    assert rejection._resident_workspace(plan, ("c",), 7, device) is not None
    assert dict(rejection._resident) == held


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs and kept workspaces need a GPU")
@pytest.mark.parametrize("method", rejection.KERNEL_METHODS)
def test_a_captured_call_replays_as_eager_calls_run(method: str) -> None:
    """A call captured in a CUDA graph, replayed on new values copied into its inputs, gives what an
    eager call on those values gives; eager calls of the same structure on the same stream, between
    the replays (on the workspace kept for them), give what calls through Triton's dispatch give."""
    batch = _batch(method)
    rejection.rejection_sample(batch)  # compiles, and caches the plan
    rejection.rejection_sample(batch)  # launched directly, on the kept workspace
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        rejection.rejection_sample(batch)  # the allocator's first blocks on this stream, outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = rejection.rejection_sample(batch)
    for trial in range(3):
        batch.target_logits.mul_(0.5).add_(trial)
        batch.seed.add_(1)
        graph.replay()
        changed = dataclasses.replace(batch, target_logits=batch.target_logits.clone())
        eager = rejection.rejection_sample(changed)
        dispatched, _ = rejection._compile_and_run(changed, rejection.make_plan(changed))
        torch.cuda.synchronize()
        _assert_same(captured, eager)
        _assert_same(eager, dispatched)


POISON = 0x7F7F7F7F


@pytest.mark.skipif(
    DEVICE != "cpu", reason="which rows a GPU skips depends on its scheduling; the interpreter's is fixed"
)
@pytest.mark.parametrize("method", ["probabilistic", "synthetic"])
def test_rows_after_the_first_rejection_are_never_written(
    monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """A program whose row lies after a rejection already decided writes nothing and does not count in,
    so that row is never finished; nothing reads what such a row leaves in the workspace, so the
    outputs equal those of a workspace whose unwritten words hold other values. (The interpreter runs
    a request's splits in turn, each at every position, so the last split of every row after the
    first rejection starts after that rejection is decided and is skipped.)"""
    rng = np.random.default_rng(11)
    vocab, n = 2 * rejection.SPLIT_BLOCK_V + 5, 4
    requests = []
    for seed in range(3):
        target = rng.normal(size=(n + 1, vocab))
        if seed < 2:
            # Drafts the target finds unlikely and the draft model sure of: rejected at position 0.
            ids = np.argsort(target[:n], axis=1)[:, 0]
            draft = np.zeros((n, vocab))
            draft[np.arange(n), ids] = 30.0
        else:
            # q = p and the draft the target's argmax: every draft accepted, nothing skipped.
            ids, draft = target[:n].argmax(axis=1), target[:n].copy()
        requests.append(RequestData(target, ids, draft, 1.0, seed))
    batch = make_batch(requests, method=method, synthetic_rates=[0.001] * n, device=DEVICE)
    plan = rejection.make_plan(batch)
    workspaces: list[torch.Tensor] = []

    def poisoned(plan: rejection.Plan, device: torch.device) -> torch.Tensor:
        work = torch.full((plan.work_words,), POISON, dtype=torch.int32, device=device)
        work[plan.zeroed].zero_()
        workspaces.append(work)
        return work

    clean = rejection.rejection_sample(batch, plan="split")
    monkeypatch.setattr(rejection, "_workspace", poisoned)
    out = rejection.rejection_sample(batch, plan="split")
    _assert_same(out, clean)
    emitted = out.num_emitted.tolist()
    if method == "probabilistic":
        assert emitted == [1, 1, n + 1]
    assert min(emitted) < n + 1
    num_splits = rejection.vocab_layout(vocab).num_splits
    counter, row_float = (
        plan.geometry[field.value].item() for field in (GEOMETRY.counter, GEOMETRY.row_float)
    )
    (work,) = workspaces
    # The last launch cleared every row's counter (`rejection_kernels._clear_zeroed`); a row was
    # finished where its record was written.
    assert not bool(work[counter : counter + len(emitted) * (n + 1)].any())
    for request, count in enumerate(emitted):
        for position in range(n + 1):
            row = request * (n + 1) + position
            row_target_max = work[row_float + row * ROW_FLOAT.SIZE.value + ROW_FLOAT.target_max.value].item()
            if position < count:
                assert row_target_max != POISON
                assert (work[row * num_splits : (row + 1) * num_splits] != POISON).all()
            else:
                assert row_target_max == POISON, (request, position)
                assert work[(row + 1) * num_splits - 1].item() == POISON, (request, position)


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter patch applies under TRITON_INTERPRET=1 only")
@pytest.mark.parametrize("method", rejection.KERNEL_METHODS)
def test_interpreter_patched_once_per_launch_gives_identical_outputs(method: str) -> None:
    """With the once-per-launch patch (installed here), outputs equal the interpreter as Triton ships it."""
    assert interpret.installed(), "kernels.interpret.install() did not run under the interpreter"
    rng = np.random.default_rng(11)
    requests = [
        RequestData(rng.normal(size=(n + 1, 40)), rng.integers(0, 40, n), rng.normal(size=(n, 40)), t, seed)
        for seed, (n, t) in enumerate([(3, 1.0), (2, 0.0), (0, 0.7)])
    ]
    batch = make_batch(requests, method=method, synthetic_rates=[0.6, 0.5, 0.4])
    sampler = rejection.TritonRejectionSampler()
    patched = sampler(batch)
    with interpret.triton_own_interpreter():
        shipped = rejection.TritonRejectionSampler()(batch)
    _assert_same(patched, shipped)


# Compiles every kernel launch of both plans for sm_90 in a process of its own (this one runs the
# interpreter, which neither type-checks nor compiles): `triton.compile` needs no GPU. The rows plan
# gets the GPU's tile sizes; each launch is compiled with the argument types of a real call.
_COMPILE = """
import numpy as np
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specsample.kernels import rejection as r
from specsample.reference.contract import RequestData, make_batch

r.ROWS_TILE_ELEMENTS["cpu"], r.ROWS_BLOCK_V["cpu"] = r.ROWS_TILE_ELEMENTS["cuda"], r.ROWS_BLOCK_V["cuda"]
r.programmatic_launch = lambda device: True  # as on an sm_90 GPU
TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
         torch.int32: "i32", torch.int64: "i64"}


def compile_sm90(kernel, values, options):
    # The kernel compiled for sm_90 with its arguments, in parameter order.
    signature, constexprs = {}, {}
    for index, (name, value) in enumerate(zip(kernel.arg_names, values)):
        if index in kernel.constexprs:
            signature[name], constexprs[(index,)] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + TYPES[value.dtype]
        else:
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


rng = np.random.default_rng(0)
for method, layout, dtype in [(m, "flat", torch.float32) for m in r.KERNEL_METHODS] + [
    ("probabilistic", "slotted", torch.bfloat16), ("block", "one-hot", torch.float16)]:
    draft = None if layout == "one-hot" else rng.normal(size=(2, 40))
    requests = [RequestData(rng.normal(size=(3, 40)), [1, 2], draft)]
    batch = make_batch(requests, method=method, dtype=dtype, synthetic_rates=[0.5, 0.5],
                       slots=[0] if layout == "slotted" else None)
    plan = r.make_plan(batch)
    work = r._workspace(plan, batch.device)
    buffers = dict(zip(r.INPUT_BUFFERS, r._batch_tensors(batch)))
    buffers.update(zip(r.OUTPUT_BUFFERS, r._outputs(plan, batch.device)), work_ptr=work)
    buffers.update(r._record_views(plan, work), geometry_ptr=plan.geometry)
    for split, item in [(True, item) for item in plan.launches] + [(False, r.rows_launch(batch))]:
        kernel = item.kernel
        options = {"num_warps": 4, "launch_pdl": item.options.get("launch_pdl", False)}
        compiled = compile_sm90(kernel, item.arguments(buffers), options)
        assert "cubin" in compiled.asm, (method, layout, kernel.__name__)
        # The split plan's launches after the first wait for the one before them in the kernel.
        if split and item.kernel is not r.jit.row_stats_kernel:
            assert options["launch_pdl"] and "griddepcontrol.wait" in compiled.asm["ptx"], kernel.__name__
        print(method, layout, kernel.__name__, "compiled")

# The filters' launches (`filters.row_parameters`, then `filter_thresholds`'s split plan), recorded as
# an sm_90 GPU would make them, not run: each is programmatically dependent and waits in the kernel.
from triton.runtime.jit import JITFunction
from specsample.kernels import filters as f
f.programmatic_launch = lambda device: True
recorded = []
original = JITFunction.__getitem__
JITFunction.__getitem__ = lambda kernel, grid: lambda *args, **kwargs: recorded.append((kernel, args, kwargs))
try:
    params = f.row_parameters(torch.tensor([0, 2], dtype=torch.int32), 3, 1, torch.ones(1),
                              torch.tensor([5]), torch.tensor([0.9]), torch.tensor([0.1]), kernel=True)
    f.filter_thresholds(torch.zeros(3, 300), *params, check_values=False, plan="split")
finally:
    JITFunction.__getitem__ = original
assert len(recorded) == 7, [kernel.__name__ for kernel, _, _ in recorded]
for kernel, args, kwargs in recorded:
    named = {**dict(zip(kernel.arg_names, args)), **kwargs}
    options = {"num_warps": named.pop("num_warps", 4), "launch_pdl": named.pop("launch_pdl", False)}
    compiled = compile_sm90(kernel, [named[name] for name in kernel.arg_names], options)
    assert options["launch_pdl"] and "griddepcontrol.wait" in compiled.asm["ptx"], kernel.__name__
    print("filters", kernel.__name__, "compiled")
"""


def test_every_kernel_compiles_for_the_gpu_without_one(tmp_path: pathlib.Path) -> None:
    """Every launch of both plans, for every method and the draft layouts and dtypes, and every launch
    of the filters (each programmatically dependent on sm_90), compiles to an sm_90 cubin (the
    interpreter runs code a compiler refuses, such as a loop-carried value that changes type: the
    split plan's block branch once failed so on a GPU only)."""
    environment = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", _COMPILE], env=environment, capture_output=True, text=True, timeout=600,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("compiled") >= 6 * 4, result.stdout
    assert result.stdout.count("filters") == 7, result.stdout


@pytest.mark.parametrize("vocab", [16, 64])
def test_a_vocabulary_shorter_than_a_noise_block_reads_only_its_own_row(vocab: int) -> None:
    """A vocabulary of a power of two below `NOISE_GROUP` tokens is one split shorter than a block,
    taken the fast way: its block mass must come from its own tokens. Request 0's draft row equals its
    target row (one-hot at token 9) and its draft has probability 0, so the draft is rejected and the
    residual has no mass: the specification draws from p, token 9, every time. Read past the row, the
    rows after it gave the block a mass, and the empty block's first token, 0, came out (the Triton
    sampler on an H200 emitted it in 9 % of a search batch's samples). The request after it has rows
    enough that a read of `NOISE_GROUP` tokens stays inside the tensors, so the old read saw those
    rows every time rather than whatever lay past the tensors."""
    one_hot = np.full((2, vocab), -np.inf)
    one_hot[:, 9] = 3.0
    rng = np.random.default_rng(5)
    n = int(jit.NOISE_GROUP) // vocab + 1
    after = RequestData(
        rng.normal(size=(n + 1, vocab)), rng.integers(0, vocab, n), rng.normal(size=(n, vocab))
    )
    emitted = []
    for seed in range(6):
        batch = make_batch(
            [RequestData(one_hot, [5], one_hot[:1].copy(), 10000.0, seed), after], device=DEVICE
        )
        out = rejection.rejection_sample(batch, plan="split")
        emitted.append((int(out.num_emitted[0]), int(out.token_ids[0, 0])))
    assert emitted == [(1, 9)] * 6
