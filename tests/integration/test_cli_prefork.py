"""``pyrula worker --workflow M --processes N``: the native prefork pool as real
processes on SQLite. A ``@step(timeout=, hard=True)`` blocked in ``time.sleep`` ends at
its timeout: its pool process is killed, the run fails with StepTimeout, a fresh
process serves the next run."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.workflows import RunStatus, SqliteStore
from pyrula.workflows.errors import DurableInvocationError
from pyrula.workflows.sync import WorkflowClient
from tests.fixtures import pool_workflows
from tests.integration.test_cli_recycle import (  # noqa: F401  (fixtures)
    Recycled,
    alive,
    pid_of,
    recycled,
    stop_all,
)
from tests.integration.test_cli_worker import Workers, workers  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow
T = 30.0
MODULE = "tests.fixtures.pool_workflows"
assert pool_workflows.pool_pid.name == "pool_pid"  # registers the workflows for submit()


@pytest.fixture
def client(workers: Workers) -> Iterator[WorkflowClient]:  # noqa: F811
    with WorkflowClient(SqliteStore(workers.tmp_path / "pyrula.db")) as sync_client:
        yield sync_client


def test_a_hard_step_timeout_kills_its_pool_process_and_fails_the_run(
    recycled: Recycled,  # noqa: F811
    workers: Workers,  # noqa: F811
    client: WorkflowClient,
) -> None:
    supervisor = workers.start(
        "--workflow", MODULE, "--store", workers.url, "--claim-poll-interval", "0.05",
        "--processes", "2",
    )  # fmt: skip
    assert "through 2 pool processes" in supervisor.stdout
    # The step would block 120 s, longer than the wait for its result (T): the run
    # failing within it is the 1 s hard timeout's doing.
    handle = client.submit("pool_hard_timeout", {"seconds": 120.0})
    with pytest.raises(DurableInvocationError) as failed:
        handle.result(timeout=T)
    assert "StepTimeout" in str(failed.value) and "hard timeout of 1.0s" in str(failed.value)
    record = client.get_run(handle.run_id)
    assert record is not None and record.status is RunStatus.FAILED
    killed = pid_of(record.worker_id or "")  # the pool process that ran it
    assert not alive(killed)
    after = {client.submit("pool_pid", {}).result(timeout=T) for _ in range(4)}
    assert killed not in after and len(recycled.note(supervisor)) >= 2  # replaced
    assert "passed its hard time limit" in supervisor.stderr
    recycled.note(supervisor)
    stop_all(supervisor, recycled)


def test_the_prefork_example_runs_as_documented() -> None:
    root = Path(__file__).resolve().parents[2]
    ran = subprocess.run(
        [sys.executable, "examples/prefork_pool.py"], cwd=root, capture_output=True,
        text=True, timeout=180,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "two CPU-bound runs ran in 2 processes" in ran.stdout
    assert "hard timeout of 1.0s" in ran.stdout
    assert "a fresh pool process replaced the killed one: True" in ran.stdout
    assert "and the pool serves on: 2001" in ran.stdout
