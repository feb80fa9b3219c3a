"""pytest configuration of the latency benchmarks.

- ``--bench-grid`` picks the cases: ``gate`` (the default on a GPU), ``full`` (docs/design.md's whole
  grid, for RESULTS.md) or ``smoke`` (tiny shapes; the default without CUDA). The environment
  variable ``SPECSAMPLE_BENCH_GRID`` sets the default.
- ``--bench-variants`` names the variants to time side by side (``triton,torch``): registered names
  or any variant spec (``package.module:NAME``, ``path/to/file.py:NAME``); each is timed on the
  cases inside its ``capabilities`` (methods, logit dtypes, draft kinds, vocabulary).
- Without CUDA the suite is a smoke test: timing is disabled, so each benchmark runs once.
- ``machine_info`` gains the GPU, driver, CUDA, torch and Triton versions; the JSON gains the
  ceilings measured in the run; comparing against a baseline of another GPU is an error.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
import torch

from specsample.benchmarks.grid import (
    CALL_LATENCY_CASE,
    GATE_CASES,
    SMOKE_CASES,
    Case,
    full_grid,
    within,
)
from specsample.benchmarks.session import BenchSession, load_variants
from specsample.benchmarks.timing import gpu_description
from specsample.reference.contract import Variant, capabilities

GRID_ENV = "SPECSAMPLE_BENCH_GRID"
GRIDS = ("gate", "full", "smoke")
DEFAULT_VARIANTS = "triton,torch"
_VARIANTS_KEY = pytest.StashKey[dict[str, Variant]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--bench-grid`` and ``--bench-variants``."""
    group = parser.getgroup("specsample benchmarks")
    group.addoption(
        "--bench-grid",
        choices=GRIDS,
        default=os.environ.get(GRID_ENV) or None,
        help=f"cases: gate (default with CUDA), full (RESULTS.md), smoke (default without); env {GRID_ENV}",
    )
    group.addoption(
        "--bench-variants",
        default=DEFAULT_VARIANTS,
        help="comma-separated variants to time side by side: registered names or specs "
        f"(package.module:NAME, path/to/file.py:NAME); default {DEFAULT_VARIANTS}",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Without CUDA, disable timing before pytest-benchmark reads the option: one untimed call each.
    Resolve ``--bench-variants`` (a spec that does not resolve is a usage error), and register the
    ``bench`` marker where no project configuration does (an installed copy run from elsewhere)."""
    if not torch.cuda.is_available():
        config.option.benchmark_disable = True
    if not any(line.split(":", 1)[0].strip() == "bench" for line in config.getini("markers")):
        config.addinivalue_line("markers", "bench: latency benchmarks (benchmarks/)")
    try:
        config.stash[_VARIANTS_KEY] = load_variants(str(config.getoption("--bench-variants")))
    except ValueError as error:
        raise pytest.UsageError(f"--bench-variants: {error}") from error


def grid_name(config: pytest.Config) -> str:
    """The grid this run times."""
    chosen = config.getoption("--bench-grid")
    if chosen is not None:
        return str(chosen)
    return "gate" if torch.cuda.is_available() else "smoke"


def grid_cases(name: str) -> tuple[Case, ...]:
    """The cases of the grid called ``name``."""
    return {"gate": GATE_CASES, "full": full_grid(), "smoke": SMOKE_CASES}[name]


def bench_variants(config: pytest.Config) -> dict[str, Variant]:
    """The variants of ``--bench-variants`` by name, as `pytest_configure` resolved them."""
    return config.stash[_VARIANTS_KEY]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``case`` x ``variant_name`` over the chosen grid, each case's variants together;
    a variant gets the cases inside its capabilities (every case when it declares none)."""
    variants = bench_variants(metafunc.config)
    if "case" in metafunc.fixturenames:
        declared = {name: capabilities(variant) for name, variant in variants.items()}
        cases = grid_cases(grid_name(metafunc.config))
        pairs = [(c, name) for c in cases for name in variants if within(c, declared[name])]
        metafunc.parametrize(("case", "variant_name"), pairs, ids=[f"{c.id}-{n}" for c, n in pairs])
    elif "variant_name" in metafunc.fixturenames:
        metafunc.parametrize("variant_name", list(variants))


@pytest.fixture(scope="session")
def bench_session(request: pytest.FixtureRequest) -> BenchSession:
    """The shared benchmark state; CUDA device 0 when present, else the CPU (smoke mode)."""
    config = request.config
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    session = BenchSession(device=device, grid=grid_name(config), variants=bench_variants(config))
    config.stash[_SESSION_KEY] = session
    return session


_SESSION_KEY = pytest.StashKey[BenchSession]()


@pytest.fixture
def call_latency_case(bench_session: BenchSession) -> Case:
    """The case of the Python call-latency target: B = 1, n = 4, V = 128256 (smoke size on a CPU)."""
    return SMOKE_CASES[0] if bench_session.grid == "smoke" else CALL_LATENCY_CASE


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    """Record the GPU, its driver, and the CUDA, torch and Triton versions (``None`` without CUDA)."""
    machine_info["gpu"] = gpu_description(torch.device("cuda")) if torch.cuda.is_available() else None


def pytest_benchmark_update_json(config: pytest.Config, benchmarks: Any, output_json: dict[str, Any]) -> None:
    """Record the bandwidth ceilings measured in this run next to the results."""
    session = config.stash.get(_SESSION_KEY, None)
    if session is not None and session.measured_ceilings is not None:
        output_json["ceilings"] = dataclasses.asdict(session.measured_ceilings)
    output_json["grid"] = grid_name(config)


def pytest_benchmark_compare_machine_info(
    config: pytest.Config,
    benchmarksession: Any,
    machine_info: dict[str, Any],
    compared_benchmark: dict[str, Any],
) -> None:
    """Refuse to compare against a baseline recorded on another GPU: the margin means nothing there."""
    ours = (machine_info.get("gpu") or {}).get("name")
    theirs = (compared_benchmark.get("machine_info", {}).get("gpu") or {}).get("name")
    if ours != theirs:
        raise pytest.UsageError(f"the baseline was recorded on GPU {theirs!r}; this run is on {ours!r}")
