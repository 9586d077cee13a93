"""``pyrula -A proj inspect ping`` and ``pyrula -A proj status``: a Celery project's
health checks, against a real ``pyrula worker -A proj`` on SQLite. The store is the
app's (its broker URL), as the worker serves it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.compat.conftest import HERE, REPO_ROOT, Workers, pyrula_command

pytestmark = pytest.mark.slow

NO_REPLY = "Error: No nodes replied within time constraint\n"


def run_cli(
    *args: str, broker: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])}
    environment.pop("PYRULA_STORE_URL", None)
    environment["CELERY_BROKER_URL"] = broker
    environment.update(env or {})
    return subprocess.run(
        [*pyrula_command(), *args],
        cwd=HERE,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_inspect_ping_and_status_read_the_apps_store(tmp_path: Path) -> None:
    broker = f"sqlite:///{tmp_path / 'proj.db'}"
    workers = Workers(tmp_path, broker)
    try:
        worker = workers.start()
        node = worker.stdout.split()[2]  # pyrula worker <id> (pid ...)
        deadline = time.monotonic() + 20
        ping = run_cli("-A", "proj", "inspect", "ping", broker=broker)
        while ping.returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
            ping = run_cli("-A", "proj", "inspect", "ping", broker=broker)
        assert (ping.returncode, ping.stdout) == (
            0,
            f"->  {node}: OK\n        pong\n\n1 node online.\n",
        )
        host = f"celery@{socket.gethostname()}"
        status = run_cli("-A", "proj", "status", "-d", host, broker=broker)
        assert (status.returncode, status.stdout) == (0, f"->  {node}: OK\n\n1 node online.\n")
        registered = run_cli("inspect", "registered", "-A", "proj", "-j", broker=broker)
        assert "proj.tasks.add" in json.loads(registered.stdout)[node]
        # PYRULA_STORE_URL naming another store is ignored (with a warning), as by the worker.
        other = f"sqlite:///{tmp_path / 'other.db'}"
        ignored = run_cli("-A", "proj", "status", broker=broker, env={"PYRULA_STORE_URL": other})
        assert ignored.returncode == 0 and "PYRULA_STORE_URL=" in ignored.stderr
        # --store given on the command line wins over the app's broker URL.
        elsewhere = run_cli("-A", "proj", "inspect", "ping", "--store", other, broker=broker)
        assert (elsewhere.returncode, elsewhere.stderr) == (69, NO_REPLY)
        assert worker.stop() == 0
        stopped = run_cli("-A", "proj", "inspect", "ping", broker=broker)
        assert (stopped.returncode, stopped.stderr) == (69, NO_REPLY)
    finally:
        workers.kill_all()
