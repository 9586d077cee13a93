"""reliability.md §4 item 5: secrets stay out of logs.

A real ``pyrula worker`` process serves a real valkey-server that requires a password
(``redis://:PASSWORD@127.0.0.1:PORT/0``), at INFO and at DEBUG. Runs carry a canary in
their params (``cli_echo``) and in a step exception's message (``cli_fail``). Fails if
the password shows in the worker's output at any level, in ``pyrula runs list/show``, in
``SLOWLOG GET`` or ``CLIENT LIST``; or if the params canary shows in the worker's output
at INFO. Every process started here is stopped by its PID.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from pyrula.cli.main import cli
from pyrula.workflows import RunStatus, open_store
from pyrula.workflows.sync import WorkflowClient
from tests.valkey.servers import ValkeyProcess, fresh_namespace

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def secured() -> Iterator[tuple[ValkeyProcess, str]]:
    """A valkey-server of its own; after start it requires a password."""
    server = ValkeyProcess("--slowlog-log-slower-than", "0")  # log every command
    server.start()
    password = "PW-" + uuid.uuid4().hex
    try:
        client = server.client()
        client.config_set("requirepass", password)
        client.close()
        yield server, password
    finally:
        server.cleanup()


def run_worker(tmp: Path, url: str, level: str) -> tuple[str, list[str]]:
    out = tmp / f"worker-{level}.log"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("PYRULA_STORE_URL", None)
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyrula.cli.main", "worker", "--workflow",
             "tests.fixtures.cli_workflows", "--store", url, "--loglevel", level,
             "--claim-poll-interval", "0.05"],
            cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        canaries = ["SECRET-CANARY-" + uuid.uuid4().hex, "SECRET-CANARY-" + uuid.uuid4().hex]
        with WorkflowClient(open_store(url), require_registered=False) as client:
            echo = client.submit("cli_echo", {"text": canaries[0]})
            fail = client.submit("cli_fail", {"message": canaries[1]})
            for handle, status in ((echo, RunStatus.COMPLETED), (fail, RunStatus.FAILED)):
                deadline = time.monotonic() + 20
                while handle.status() is not status:
                    assert time.monotonic() < deadline, out.read_text(errors="replace")
                    time.sleep(0.05)
        time.sleep(0.3)  # let the worker flush its lines for these runs
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return out.read_text(errors="replace"), [echo.run_id, fail.run_id, *canaries]


def test_no_password_in_worker_output_cli_slowlog_or_client_list(
    secured: tuple[ValkeyProcess, str], tmp_path: Path
) -> None:
    server, password = secured
    url = f"redis://:{password}@127.0.0.1:{server.port}/0?namespace={fresh_namespace()}"
    info, (echo_id, fail_id, params_canary, exc_canary) = run_worker(tmp_path, url, "INFO")
    debug, _ = run_worker(tmp_path, url, "DEBUG")
    assert "pyrula worker" in info, info  # the worker did start and log
    assert password not in info, "password in the worker's output at INFO"
    assert password not in debug, "password in the worker's output at DEBUG"
    assert params_canary not in info, "params canary in the worker's output at INFO"
    runner = CliRunner()
    for args in (
        ["runs", "list", "--store", url],
        ["runs", "list", "--store", url, "--json"],
        ["runs", "show", echo_id, "--store", url],
        ["runs", "show", fail_id, "--store", url, "--json"],
        ["runs", "show", "no-such-run", "--store", url],
    ):
        shown = runner.invoke(cli, args)
        assert password not in shown.output, args
        assert password not in repr(shown.exception), args
    client = server.client()
    client.connection_pool.connection_kwargs["password"] = password
    try:
        slowlog = repr(client.execute_command("SLOWLOG", "GET", "1000"))
        clients = repr(client.execute_command("CLIENT", "LIST"))
    finally:
        client.close()
    assert "SLOWLOG" in slowlog or len(slowlog) > 10  # slowlog does record commands
    assert password not in slowlog, "password in SLOWLOG GET"
    assert password not in clients, "password in CLIENT LIST"
    print("exception canary in INFO log:", exc_canary in info)
