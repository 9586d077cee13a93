"""``pyrula worker --metrics-port N``'s ``/metrics``, read over HTTP as Prometheus reads
it, on a real worker process that ran runs: the counters and histograms move, under
pyrula's names and celery-exporter's, summed across the prefork pool's processes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.workflows import SqliteStore
from pyrula.workflows.errors import DurableInvocationError
from pyrula.workflows.sync import WorkflowClient
from tests.fixtures import cli_workflows
from tests.integration.dashboard_processes import Processes
from tests.integration.test_cli_worker import FAST, Workers, workers  # noqa: F401
from tests.integration.test_worker_health import free_port, get, until

pytestmark = pytest.mark.slow
T = 30.0
MODULE = "tests.fixtures.cli_workflows"
assert cli_workflows.cli_add.name == "cli_add"  # registers the workflows for submit()


def sample(text: str, metric: str, /, **labels: str) -> float:
    """The sum of the series ``metric`` whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(metric + "{") and not line.startswith(metric + " "):
            continue
        series, value = line.rsplit(" ", 1)
        found = dict(re.findall(r'(\w+)="([^"]*)"', series))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


@pytest.fixture
def client(workers: Workers) -> Iterator[WorkflowClient]:  # noqa: F811
    with WorkflowClient(SqliteStore(workers.tmp_path / "pyrula.db")) as sync_client:
        yield sync_client


def run_some(client: WorkflowClient, adds: int) -> None:
    for i in range(adds):
        assert client.submit("cli_add", {"a": i, "b": 1}).result(timeout=T)["sum"] == i + 1
    with pytest.raises(DurableInvocationError):
        client.submit("cli_fail", {}).result(timeout=T)


def test_metrics_of_a_worker_that_ran_runs_move(
    workers: Workers,  # noqa: F811
    client: WorkflowClient,
) -> None:
    port = free_port()
    worker = workers.start(
        "--workflow", MODULE, "--store", workers.url, "--metrics-port", str(port), *FAST
    )  # fmt: skip
    until(lambda: get(port, "/readyz")[0] == 200, "ready", worker)
    status, before = get(port, "/metrics")
    assert status == 200 and sample(before, "pyrula_worker_up") == 1
    assert sample(before, "pyrula_runs_started_total") == 0
    client.submit("cli_add", {"a": 1, "b": 1}, delay=3600)  # delayed: not in the depth
    gate = workers.tmp_path / "gate"
    client.submit("cli_gate", {"path": str(gate)})  # held until the gate opens
    run_some(client, 3)
    _, text = get(port, "/metrics")
    add = {"workflow": "cli_add", "queue": "cli_add"}
    assert sample(text, "pyrula_runs_started_total", **add) == 3
    assert sample(text, "pyrula_runs_ended_total", status="completed", **add) == 3
    assert sample(text, "pyrula_runs_ended_total", workflow="cli_fail", status="failed") == 1
    assert sample(text, "pyrula_run_duration_seconds_count", **add) == 3
    assert sample(text, "pyrula_step_duration_seconds_count", step="add", **add) == 3
    assert sample(text, "pyrula_step_duration_seconds_count", step="double", **add) == 3
    assert sample(text, "pyrula_step_retries_total", workflow="cli_fail", step="explode") == 1
    assert sample(text, "pyrula_claim_latency_seconds_count", **add) == 3
    assert sample(text, "pyrula_runs_in_flight", workflow="cli_gate") == 1  # the gate waits
    assert sample(text, "celery_task_succeeded_total", name="cli_add", queue_name="cli_add") == 3
    assert sample(text, "celery_task_failed_total", name="cli_fail") == 1
    assert sample(text, "celery_task_retried_total", name="cli_fail") == 1
    assert sample(text, "celery_task_runtime_count", name="cli_add") == 3
    assert sample(text, "celery_worker_tasks_active") == 1
    assert sample(text, "celery_worker_up") == 1
    gate.write_text("open")
    until(lambda: sample(get(port, "/metrics")[1], "pyrula_runs_in_flight") == 0, "0", worker)
    assert worker.stop() == 0


def test_the_prefork_supervisor_sums_its_pool_processes(
    workers: Workers,  # noqa: F811
    client: WorkflowClient,
) -> None:
    port = free_port()
    supervisor = workers.start(
        "--workflow", MODULE, "--store", workers.url, "--processes", "2",
        "--max-tasks-per-child", "2", "--metrics-port", str(port), *FAST, wait=False,
    )  # fmt: skip
    until(lambda: get(port, "/readyz")[0] == 200, "ready", supervisor)
    run_some(client, 5)  # recycled along the way: the replaced processes still count
    _, text = get(port, "/metrics")
    assert sample(text, "pyrula_runs_ended_total", workflow="cli_add", status="completed") == 5
    assert sample(text, "pyrula_step_duration_seconds_count", workflow="cli_add") == 10
    assert sample(text, "celery_task_failed_total", name="cli_fail") == 1
    assert sample(text, "pyrula_worker_up") == 1
    gate = workers.tmp_path / "gate"
    for _ in range(4):  # two hold the pool processes, two wait in their queue
        client.submit("cli_gate", {"path": str(gate)})
    until(
        lambda: sample(get(port, "/metrics")[1], "pyrula_queue_depth", queue="cli_gate") == 2,
        "a queue depth of 2",
        supervisor,
    )
    text = get(port, "/metrics")[1]
    assert sample(text, "celery_queue_length", queue_name="cli_gate") == 2
    assert sample(text, "pyrula_oldest_queued_age_seconds", queue="cli_gate") > 0
    assert sample(text, "pyrula_runs_in_flight", workflow="cli_gate") == 2
    gate.write_text("open")
    until(
        lambda: (
            sample(get(port, "/metrics")[1], "pyrula_runs_ended_total", workflow="cli_gate") == 4
        ),
        "the gated runs ended",
        supervisor,
    )
    assert sample(get(port, "/metrics")[1], "pyrula_runs_in_flight") == 0
    assert supervisor.stop() == 0


def test_the_dashboards_metrics_show_its_stores_queues(
    tmp_path: Path, client: WorkflowClient
) -> None:
    processes = Processes(tmp_path)
    try:
        site = processes.dashboard(f"sqlite:///{tmp_path / 'pyrula.db'}")
        for i in range(3):  # no worker serves: they wait in their queue
            client.submit("cli_add", {"a": i, "b": 1})
        reply = site.get("/metrics")
        assert reply.status == 200 and reply.content_type.startswith("text/plain")
        assert sample(reply.body, "pyrula_queue_depth", queue="cli_add", priority="0") == 3
        assert sample(reply.body, "celery_queue_length", queue_name="cli_add") == 3
        assert "pyrula_worker_up" not in reply.body  # a dashboard is no worker
    finally:
        processes.stop_all()
