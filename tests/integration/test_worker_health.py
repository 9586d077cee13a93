"""``pyrula worker --metrics-port N``: ``/healthz`` and ``/readyz`` as Kubernetes probes
read them, and a worker started before its store, on a real ``valkey-server`` stopped
and started again by PID. Every process is stopped by its PID."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import open_store
from pyrula.workflows.sync import WorkflowClient
from tests.fixtures import pool_workflows
from tests.integration.test_cli_worker import FAST, Worker, Workers, workers  # noqa: F401
from tests.valkey.servers import ValkeyProcess

pytestmark = pytest.mark.slow
T = 30.0
MODULE = "tests.fixtures.pool_workflows"
assert pool_workflows.pool_pid.name == "pool_pid"  # registers the workflows for submit()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of ``GET http://127.0.0.1:port/path``; (0, error) if no answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


def until(check: Callable[[], Any], what: str, worker: Worker, timeout: float = T) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if worker.proc.poll() is not None:
            pytest.fail(f"worker exited ({worker.proc.returncode}) before {what}:\n{worker.stderr}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout}s:\n{worker.stderr}")
        time.sleep(0.1)


@pytest.fixture
def server() -> Iterator[ValkeyProcess]:
    """A valkey-server on a port of its own, not started (each test starts it)."""
    process = ValkeyProcess(persist=True)
    try:
        yield process
    finally:
        process.kill()
        process.cleanup()


def submit_pid(url: str) -> int:
    with WorkflowClient(open_store(url)) as client:
        result: int = client.submit("pool_pid", {}).result(timeout=T)
        return result


def test_a_worker_started_before_its_valkey_serves_once_it_is_up_and_readyz_follows_the_store(
    workers: Workers,  # noqa: F811
    server: ValkeyProcess,
) -> None:
    port = free_port()
    url = f"{server.url}/0?namespace=health"
    worker = workers.start(
        "--workflow", MODULE, "--store", url, "--metrics-port", str(port), *FAST, wait=False
    )  # fmt: skip
    until(lambda: get(port, "/healthz")[0] == 200, "/healthz", worker)
    status, why = get(port, "/readyz")
    assert status == 503, why
    until(lambda: "store unreachable" in worker.stderr, "a logged retry", worker)
    assert "retry 1 of 100" in worker.stderr
    server.start()
    until(lambda: get(port, "/readyz")[0] == 200, "ready once valkey is up", worker)
    assert submit_pid(url) == worker.proc.pid  # it serves
    server.kill()  # by its PID
    until(lambda: get(port, "/readyz")[0] == 503, "unready with valkey down", worker)
    assert "the store does not answer" in get(port, "/readyz")[1]
    assert get(port, "/healthz")[0] == 200  # alive all the same
    server.start()
    until(lambda: get(port, "/readyz")[0] == 200, "ready again", worker)
    assert submit_pid(url) == worker.proc.pid
    assert worker.stop() == 0


def test_no_retry_on_startup_exits_at_once_when_the_store_is_down(
    workers: Workers,  # noqa: F811
    server: ValkeyProcess,
) -> None:
    worker = workers.start(
        "--workflow", MODULE, "--store", f"{server.url}/0", "--no-retry-on-startup", wait=False
    )  # fmt: skip
    code = worker.proc.wait(T)
    assert code != 0
    assert "store unreachable" not in worker.stderr
    assert "failed" in worker.stderr


def test_startup_retries_give_up_after_their_count(
    workers: Workers,  # noqa: F811
    server: ValkeyProcess,
) -> None:
    worker = workers.start(
        "--workflow", MODULE, "--store", f"{server.url}/0", "--startup-retries", "2", wait=False
    )  # fmt: skip
    assert worker.proc.wait(T) != 0
    assert "retry 2 of 2" in worker.stderr and "retry 3" not in worker.stderr


def test_a_prefork_supervisor_serves_the_probes_for_its_pool(
    workers: Workers,  # noqa: F811
    server: ValkeyProcess,
    tmp_path: Path,
) -> None:
    server.start()
    port = free_port()
    url = f"{server.url}/0?namespace=health-pool"
    supervisor = workers.start(
        "--workflow", MODULE, "--store", url, "--processes", "2", "--metrics-port", str(port),
        *FAST, wait=False,
    )  # fmt: skip
    until(lambda: get(port, "/readyz")[0] == 200, "a ready pool", supervisor)
    assert submit_pid(url) != supervisor.proc.pid  # a pool process ran it
    server.kill()
    until(lambda: get(port, "/readyz")[0] == 503, "unready with valkey down", supervisor)
    server.start()
    until(lambda: get(port, "/readyz")[0] == 200, "ready again", supervisor)
    assert supervisor.stop() == 0


def test_a_metrics_port_in_use_is_a_usage_error(workers: Workers) -> None:  # noqa: F811
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = workers.start(
            "--workflow", MODULE, "--store", workers.url, "--metrics-port", str(port), wait=False
        )  # fmt: skip
        assert worker.proc.wait(T) == 2
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in worker.stderr
