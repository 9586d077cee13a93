"""``pyrula status`` and ``pyrula inspect`` against real ``pyrula worker`` processes, on a
SQLite file and on a real valkey-server: what container health checks run.

Workers run with ``--lock-ttl 1.5`` (a heartbeat every 0.5 s), and the checks that wait
for a killed worker to go stale pass ``--stale-after 1.5``. Every CLI call is the real
console script in a subprocess, so exit codes are the ones a probe sees.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from pyrula.cli.main import cli
from pyrula.workflows import RunStatus, open_store
from pyrula.workflows.sync import WorkflowClient
from tests.integration.test_cli_worker import (
    FAST,
    MODULE,
    REPO_ROOT,
    Worker,
    Workers,
    pyrula_command,
    wait_until,
)
from tests.valkey.servers import ValkeyProcess, fresh_namespace, valkey_server  # noqa: F401

HEARTBEAT = ["--lock-ttl", "6"]
"""Worker flags: leases of 6 s, so a heartbeat every 2 s, and a live worker counts for 6 s
after its last one (the default --stale-after): room for a loaded machine."""
STALE = ["--stale-after", "3"]
"""A killed worker drops out once its last heartbeat is older than this."""
NO_REPLY = "Error: No nodes replied within time constraint\n"
BOUND = 20.0
"""Generous bound on anything that must happen (a heartbeat, a heartbeat going stale)."""


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("PYRULA_STORE_URL", None)
    return subprocess.run(
        [*pyrula_command(), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def until_exit(code: int, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the command until it exits with ``code`` (fail after BOUND seconds)."""
    deadline = time.monotonic() + BOUND
    while True:
        done = run_cli(*args)
        if done.returncode == code:
            return done
        if time.monotonic() > deadline:
            pytest.fail(f"{args} still exits {done.returncode} after {BOUND}s:\n{done.stderr}")
        time.sleep(0.1)


@pytest.fixture(params=["sqlite", "valkey"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'pyrula.db'}"
    server: ValkeyProcess = request.getfixturevalue("valkey_server")
    return f"{server.url}?namespace={fresh_namespace()}"


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(tmp_path)
    try:
        yield pool
    finally:
        pool.kill_all()


def serve(workers: Workers, url: str) -> Worker:
    return workers.start("--workflow", MODULE, "--store", url, *FAST, *HEARTBEAT)


@pytest.mark.slow
def test_status_and_inspect_answer_for_a_live_worker_until_it_stops(
    workers: Workers, url: str, tmp_path: Path
) -> None:
    worker = serve(workers, url)
    node = worker.worker_id
    status = until_exit(0, "status", "--store", url)
    assert status.stdout == f"->  {node}: OK\n\n1 node online.\n"
    ping = run_cli("inspect", "ping", "--store", url)
    assert (ping.returncode, ping.stdout) == (
        0,
        f"->  {node}: OK\n        pong\n\n1 node online.\n",
    )
    host = socket.gethostname()
    for destination in (host, f"celery@{host}", node, f"celery@elsewhere,{node}"):
        found = run_cli("inspect", "ping", "-d", destination, "--store", url, "--json")
        assert (found.returncode, json.loads(found.stdout)) == (0, {node: {"ok": "pong"}})
    for nobody in ("celery@elsewhere", "", "celery@"):  # "": an unset $HOSTNAME
        missing = run_cli("status", "-d", nobody, "--store", url, "-t", "5")
        assert (missing.returncode, missing.stdout, missing.stderr) == (69, "", NO_REPLY)

    gate = tmp_path / "gate"
    with WorkflowClient(open_store(url)) as client:
        handle = client.submit("cli_gate", {"path": str(gate)})
        wait_until(lambda: handle.status() is RunStatus.RUNNING, BOUND, "the claim", worker)
        active = run_cli("inspect", "active", "--store", url)
        assert active.returncode == 0 and active.stdout.startswith(f"->  {node}: OK\n    * {{")
        assert f"'id': '{handle.run_id}', 'name': 'cli_gate'" in active.stdout
        [request] = json.loads(run_cli("inspect", "active", "--store", url, "-j").stdout)[node]
        assert request["kwargs"] == {"path": str(gate)} and request["worker_pid"] == worker.proc.pid
        registered = run_cli("inspect", "registered", "-d", f"celery@{host}", "--store", url)
        assert (
            "\n    * cli_add\n" in registered.stdout and "\n    * cli_gate\n" in registered.stdout
        )
        query = run_cli("inspect", "query_task", handle.run_id, "nope", "--store", url, "-j")
        assert json.loads(query.stdout)[node][handle.run_id][0] == "active"
        gate.touch()
        assert handle.result(timeout=BOUND) == "opened:1"

    assert worker.stop(signal.SIGTERM) == 0
    stopped = run_cli("status", "--store", url)  # deregistered: gone at once
    assert (stopped.returncode, stopped.stderr) == (69, NO_REPLY)


@pytest.mark.slow
def test_a_killed_worker_drops_out_once_its_heartbeat_is_stale(workers: Workers, url: str) -> None:
    worker = serve(workers, url)
    until_exit(0, "inspect", "ping", "--store", url)
    worker.proc.send_signal(signal.SIGKILL)
    worker.proc.wait(10)
    # The store keeps its last heartbeat: within --stale-after it counts (a generous one:
    # the default, the worker's lock_ttl, is what a loaded machine can spend starting the
    # command).
    still = run_cli("status", "--store", url, "--stale-after", "120")
    assert (still.returncode, still.stdout) == (
        0,
        f"->  {worker.worker_id}: OK\n\n1 node online.\n",
    )
    gone = until_exit(69, "inspect", "ping", "--store", url, *STALE)
    assert (gone.stdout, gone.stderr) == ("", NO_REPLY)
    assert run_cli("status", "--store", url, *STALE).returncode == 69


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), prog_name="pyrula", catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["inspect", "bogus"], "Error: Command bogus not recognized. Available inspect commands: "),
        (["inspect", "query_task"], "Error: inspect query_task needs one or more task ids"),
        (["inspect", "ping", "extra"], "Error: inspect ping takes no arguments, got extra"),
        (["inspect"], "Error: Missing argument 'COMMAND'."),
        (["status", "--stale-after", "0"], "Error: Invalid value for '--stale-after'"),
    ],
)
def test_bad_input_is_a_usage_error(args: list[str], message: str) -> None:
    code, out = invoke(*args)
    assert code == 2 and message in out and "Usage: pyrula" in out


def test_the_app_option_before_status_and_inspect_is_accepted() -> None:
    code, out = invoke("-A", "proj", "runs", "list")
    assert code == 2 and "`pyrula runs` takes no app; only `pyrula worker`, " in out
    assert "`pyrula status`, `pyrula inspect`" in out and "take one" in out
    code, out = invoke("-A", "no_such_celery_project_xyz", "inspect", "ping")
    assert code == 2 and "-A no_such_celery_project_xyz: cannot load the app" in out


def test_no_worker_at_all_exits_69(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert invoke("status", "--store", url) == (69, NO_REPLY)
    assert invoke("inspect", "query_task", "some-id", "--store", url, "-j") == (69, NO_REPLY)
