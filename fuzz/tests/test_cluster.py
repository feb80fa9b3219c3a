"""Campaigns past one process: one false-failure budget, a shared example database, Ray workers.

The Ray tests start a real local Ray cluster of two worker processes and a real Redis server (Debian's
``redis-server``, which `.ci/run` installs); without them they skip, except under CI, where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specsample.fuzz import cli
from specsample.fuzz.campaign import (
    FALSE_FAILURE_RATE,
    CampaignResult,
    ErrorBudget,
    example_database,
    run_campaign,
)
from specsample.fuzz.mutants import MUTANTS
from specsample.fuzz.selftest import Blind
from specsample.reference.walk import WalkSampler

ALPHA = 1e-6


# ---------------------------------------------------------------------------------------------
# One false-failure budget


@pytest.mark.parametrize("workers", [1, 2, 3, 8, 64])
def test_the_stages_of_every_worker_sum_to_at_most_the_budget(workers: int) -> None:
    """Worker w of W takes the campaign's stages w + 1, w + 1 + W, ...: no stage twice, each at most
    the profile's alpha, and all of them together (10,000 a worker) within the campaign's rate."""
    budgets = [ErrorBudget(FALSE_FAILURE_RATE, ALPHA, worker=w, workers=workers) for w in range(workers)]
    levels = [budget.grant() for _ in range(10_000) for budget in budgets]
    assert max(levels) <= ALPHA
    assert sum(levels) <= FALSE_FAILURE_RATE
    assert sum(b.spent for b in budgets) == pytest.approx(sum(levels))
    # the interleaving takes every stage once: the same levels as one worker's first stages
    alone = ErrorBudget(FALSE_FAILURE_RATE, ALPHA)
    assert sorted(levels) == sorted(alone.grant() for _ in range(len(levels)))


def test_a_ledger_hands_out_the_stages_in_order() -> None:
    """With one counter the first stages go to whoever confirms first, at the cap while the budget allows."""
    counter = iter(range(1, 100))
    budget = ErrorBudget(FALSE_FAILURE_RATE, ALPHA, worker=1, workers=4, ledger=lambda: next(counter))
    assert [budget.grant() for _ in range(3)] == [ALPHA, ALPHA, FALSE_FAILURE_RATE / 12]
    assert budget.share() == "shared by 4 workers, stages from one counter"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"total": 0.0}, "false_failure_rate is 0.0"),
        ({"total": 1.5}, "false_failure_rate is 1.5"),
        ({"worker": 2, "workers": 2}, "worker is 2"),
    ],
)
def test_a_bad_budget_names_the_argument(kwargs: dict[str, float], message: str) -> None:
    arguments = {"total": FALSE_FAILURE_RATE, "cap": ALPHA, **kwargs}
    with pytest.raises(ValueError, match=message):
        ErrorBudget(**arguments)  # type: ignore[arg-type]


def test_a_campaign_states_its_budget_and_what_it_spent(tmp_path: Path) -> None:
    """A campaign that confirms a planted bug states the rate of the whole campaign and the level its
    stages spent; the reproducer carries the failing stage's level, so the replay tests at it."""
    result = _search_m02(corpus=tmp_path, errors=ErrorBudget(2e-6, ALPHA))
    assert result.failure is not None and result.confirmations >= 1
    assert result.false_failure_rate == 2e-6
    assert 0 < result.spent <= 2e-6
    assert "false-failure rate <= 2e-06 for the campaign" in result.describe()
    assert result.reproducer is not None
    assert f'"alpha": {ALPHA}' in result.reproducer.read_text()  # stage 1: min(alpha, 2e-6 / 2)
    assert result.failure.message.count("alpha=1e-06") == 1


def test_the_cli_refuses_a_rate_outside_zero_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--variant", "walk", "--false-failure-rate", "1"]) == cli.EXIT_USAGE
    assert "--false-failure-rate is '1'; expected a number in (0, 1)" in capsys.readouterr().err


def test_local_workers_interleave_the_stages_of_one_budget(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """``run --workers 2`` on one host: each process takes every 2nd stage of the one budget and says
    so, and the campaign's line states the rate of the whole campaign."""
    argv = ["run", "--variant", "walk", "--workers", "2", "--budget", "8", "--device", "cpu"]
    code = cli.main([*argv, "--database", str(tmp_path / "db"), "--corpus", str(tmp_path / "corpus")])
    out = capfd.readouterr().out
    assert code in (cli.EXIT_PASSED, cli.EXIT_INCONCLUSIVE), out
    assert out.count("shared by 2 workers, stages interleaved") == 2, out
    assert "campaign of 2 workers: false-failure rate <= 1e-05 for the whole campaign" in out


def _search_m02(**options: Any) -> CampaignResult:
    """The search alone on the planted bug M02 (blind, no shrinking, 20 s), with ``options`` of
    `run_campaign`."""
    return run_campaign(
        Blind(MUTANTS["M02"].load()),
        "M02",
        seconds=20,
        targeted=False,
        shrink=False,
        progress=False,
        **options,
    )


# ---------------------------------------------------------------------------------------------
# The example database: what one campaign found, the next one tries first


def test_a_failure_saved_by_one_campaign_is_the_next_ones_first_batch(tmp_path: Path) -> None:
    """The search saves its failure in the example database; a later campaign, with another search
    seed, screens it first (before this was mended, `hypothesis.seed` dropped the database)."""
    database = tmp_path / "db"
    first = _search_m02(database=example_database(database))
    assert first.failure is not None
    assert any(database.rglob("*")), "nothing was saved"
    second = _search_m02(database=example_database(database), seed=12345)
    assert second.failure is not None and second.searched == 1
    # keyed by the variant: a correct sampler with the same database does not replay M02's batch
    clean = run_campaign(
        Blind(WalkSampler()),
        "walk",
        seconds=3,
        targeted=False,
        progress=False,
        database=example_database(database),
    )
    assert clean.failure is None


# ---------------------------------------------------------------------------------------------
# Ray and Redis, for real


def _needed(tool: str) -> None:
    """Skip without ``tool``, except under CI, which installs it (`.ci/run`)."""
    if os.environ.get("CI"):
        return
    pytest.skip(f"{tool} is not installed here (CI installs it)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A real Redis server on a free port, for this module's tests only."""
    server = shutil.which("redis-server")
    if server is None:
        _needed("redis-server")
    assert server is not None, "redis-server is not installed; .ci/run installs it with apt-get"
    port = _free_port()
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    import redis

    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A local Ray cluster of two CPU slots: the address the commands are given."""
    try:
        import ray
    except ImportError:
        _needed("ray")
        raise
    from specsample.fuzz.cluster import connect

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", runtime_env=_runtime_env())
    connect("local")  # joins the instance above (its workers get the interpreter's variables)
    try:
        yield "local"
    finally:
        ray.shutdown()


def _runtime_env() -> dict[str, object]:
    from specsample.fuzz.cluster import FORWARDED

    return {"env_vars": {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}}


def test_a_planted_bug_found_on_one_worker_replays_on_the_other(
    ray_cluster: str, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two Ray workers search a planted bug (M02, blind, no targeted cases); the first that finds it
    stops the other, the reproducer lands in the corpus here and fails again on the other worker, and
    the failing batch is in Redis: a later campaign on its own finds it on its first batch."""
    corpus = tmp_path / "corpus"
    # The first failure ends the campaign (about 10 s here); the budget is room for a loaded machine.
    argv = ["run", "--variant", "M02", "--cluster", ray_cluster, "--workers", "2", "--budget", "150"]
    argv += ["--database", redis_url, "--corpus", str(corpus), "--no-targeted", "--blind", "--no-shrink"]
    code = cli.main([*argv, "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == cli.EXIT_FAILED, out
    assert "FAILED: M02: 2 workers (one CPU each; the cluster has 2 CPUs)" in out
    assert "false-failure rate <= 1e-05 for the whole campaign" in out
    finder = int(out.split("found by worker ")[1].split(" ")[0])
    assert f"replayed on worker {1 - finder} " in out
    assert out.split("replayed on worker ")[1].split(": ", 1)[1].startswith("FAILED law_of_m")
    [reproducer] = corpus.glob("*.json")
    assert str(reproducer) in json.loads(reproducer.read_text())["replay"]
    assert cli.main(["replay", str(reproducer), "--device", "cpu"]) == cli.EXIT_FAILED

    import redis

    keys = redis.Redis.from_url(redis_url).keys("specsample-fuzz:*")
    assert keys, "the failing batch was not saved in Redis"
    later = _search_m02(database=example_database(redis_url), seed=777)
    assert later.failure is not None and later.searched == 1


def test_a_correct_sampler_passes_with_one_verdict_and_one_rate(
    ray_cluster: str, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The walk on two Ray workers, targeted cases split between them: one PASSED line for the
    campaign with its one false-failure rate, and a line per worker."""
    argv = ["run", "--variant", "walk", "--cluster", ray_cluster, "--budget", "30", "--device", "cpu"]
    code = cli.main([*argv, "--database", redis_url, "--corpus", str(tmp_path)])
    out = capsys.readouterr().out
    verdicts = [line for line in out.splitlines() if line.startswith(("PASSED", "FAILED", "INCONCLUSIVE"))]
    assert len(verdicts) == 1, out
    assert code == cli.EXIT_PASSED, out
    assert verdicts[0].startswith("PASSED: walk: 2 workers (one CPU each; the cluster has 2 CPUs)")
    assert verdicts[0].count("false-failure rate <= 1e-05 for the whole campaign") == 1
    assert out.count("  worker ") == 2


def test_a_lost_worker_is_an_environment_error(
    ray_cluster: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker whose process dies mid-campaign (here: the first to call the sampler exits) is an
    environment error, exit code 2, and the campaign is not reported as passed."""
    flag = tmp_path / "died"
    module = tmp_path / "dies_once.py"
    module.write_text(
        "import os\n"
        "from specsample.reference.walk import WalkSampler\n"
        "class DiesOnce(WalkSampler):\n"
        "    def __call__(self, batch):\n"
        "        try:\n"
        f"            os.close(os.open({str(flag)!r}, os.O_CREAT | os.O_EXCL))\n"
        "        except FileExistsError:\n"
        "            return super().__call__(batch)\n"
        "        os._exit(1)\n"
    )
    argv = ["run", "--variant", f"{module}:DiesOnce", "--cluster", ray_cluster, "--budget", "10"]
    code = cli.main([*argv, "--device", "cpu", "--corpus", str(tmp_path / "corpus")])
    out = capsys.readouterr().out
    assert code == cli.EXIT_USAGE, out
    verdicts = [line for line in out.splitlines() if line.startswith(("PASSED", "ENVIRONMENT ERROR"))]
    assert len(verdicts) == 1 and verdicts[0].startswith("ENVIRONMENT ERROR: "), out
    assert "failed: " in out.split("environment error: worker ")[1]
    assert "its share of the campaign was not searched, so the campaign is not passed" in out


def test_certify_spreads_variants_over_the_workers(
    ray_cluster: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``certify --cluster``: each variant certified on a worker of its own, one report for all of
    them; the planted bug fails it (exit 1) and the walk beside it passes."""
    argv = ["certify", "--variant", "walk", "--variant", "M02", "--cluster", ray_cluster, "--no-mutants"]
    argv += [
        "--methods",
        "probabilistic",
        "--budget",
        "3",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "report"),
    ]
    code = cli.main(argv)
    out = capsys.readouterr().out
    assert code == cli.EXIT_FAILED, out
    assert "cluster: 2 workers: " in out
    assert "## `walk`: PASSED" in out, out
    assert "## `M02`: FAILED" in out, out
    assert (tmp_path / "report" / "report.json").exists()


@pytest.mark.gpu
def test_one_worker_per_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On a machine of two GPUs or more, a local Ray cluster runs one worker per GPU: each holds its
    own (Ray sets its CUDA_VISIBLE_DEVICES), and the campaign reports one verdict."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    pytest.importorskip("ray")
    argv = ["run", "--variant", "triton", "--cluster", "local", "--budget", "90", "--profile", "gpu"]
    argv += ["--no-targeted"]  # the gpu profile's targeted cases at 20,000 trials alone fill 90 s
    code = cli.main([*argv, "--corpus", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == cli.EXIT_PASSED, out
    count = torch.cuda.device_count()
    assert f"PASSED: triton: {count} workers (one GPU each; the cluster has {count} GPUs)" in out
    places = out.split("cluster: ", 1)[1].splitlines()[0]
    assert sorted(part.rsplit("GPU ", 1)[1] for part in places.split("; ")) == [str(g) for g in range(count)]
