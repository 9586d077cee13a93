"""Fixtures of the Celery-shaped sample project: real ``pyrula worker -A proj`` processes.

``proj`` (in this folder) is imported as a top-level package, as a Celery project's
worker and web processes import it. ``served`` starts one worker per store kind for a
test module (SQLite file, or a namespace on a real valkey-server from
``tests/valkey/servers.py``) and points the test process's app at the same store.
Every process started here is stopped by its PID at teardown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.valkey.servers import valkey_server  # noqa: F401  (fixture)

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

FAST = [
    "--claim-poll-interval", "0.05",
    "--timer-poll-interval", "0.2",
    "--lock-ttl", "2",
    "--orphan-scan-interval", "0.5",
    "--schedule-poll-interval", "0.5",
    "--shutdown-grace", "3",
    "-c", "16", "--pool", "threads",  # one process; tests/compat/test_prefork.py: the pool
]  # fmt: skip
START_TIMEOUT = 30.0


def pyrula_command() -> list[str]:
    script = Path(sys.executable).with_name("pyrula")
    return [str(script)] if script.exists() else [sys.executable, "-m", "pyrula.cli.main"]


class WorkerProcess:
    def __init__(self, proc: subprocess.Popen[bytes], out: Path, err: Path) -> None:
        self.proc = proc
        self.out = out
        self.err = err

    @property
    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def wait_started(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while "pyrula worker" not in self.stdout:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"worker did not start (exit {self.proc.poll()}):\n{self.stdout}\n{self.stderr}"
                )
            time.sleep(0.05)

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class Workers:
    """Starts ``pyrula worker -A ...`` processes on one store; kills leftovers by PID."""

    def __init__(self, tmp: Path, broker: str) -> None:
        self.tmp = tmp
        self.broker = broker
        self.started: list[WorkerProcess] = []

    def start(
        self,
        *flags: str,
        app: str = "proj",
        cwd: Path = HERE,
        env: dict[str, str] | None = None,
        wait: bool = True,
    ) -> WorkerProcess:
        n = len(self.started)
        out, err = self.tmp / f"worker{n}.out", self.tmp / f"worker{n}.err"
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])}
        environment.pop("PYRULA_STORE_URL", None)
        environment["CELERY_BROKER_URL"] = self.broker
        environment.update(env or {})
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                [*pyrula_command(), "worker", "-A", app, *FAST, *flags],
                cwd=cwd, env=environment, stdout=stdout, stderr=stderr,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        worker = WorkerProcess(proc, out, err)
        self.started.append(worker)
        if wait:
            worker.wait_started()
        return worker

    def kill_all(self) -> None:
        for worker in self.started:
            worker.kill()


def broker_url(kind: str, tmp: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp / 'proj.db'}"
    server = request.getfixturevalue("valkey_server")
    return f"{server.url}/0?namespace=compat{uuid.uuid4().hex[:10]}"


@pytest.fixture
def app() -> Any:
    """An app of its own in eager mode (tasks run inline: no worker, no store to reach);
    a module that needs another app defines its own ``app``."""
    from pyrula_compat import Celery

    app = Celery("eagerproj", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True
    return app


@pytest.fixture(scope="module", params=["sqlite", "valkey"])
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture(scope="module")
def proj_app() -> Any:
    import proj

    return proj.celery_app


@pytest.fixture(scope="module")
def served(
    store_kind: str,
    proj_app: Any,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Served]:
    """One ``pyrula worker -A proj`` for the module, and the test process's app on the
    same store."""
    tmp = tmp_path_factory.mktemp(f"compat-{store_kind}")
    url = broker_url(store_kind, tmp, request)
    # The test process's app is proj's: its shared tasks (proj.tasks.tsum) follow the
    # current app, which an app another test module made may have become since.
    proj_app.set_current()
    with proj_workers(url, tmp, proj_app) as workers:
        yield Served(proj_app, workers, workers.start(), tmp, url)


@contextmanager
def proj_workers(url: str, tmp: Path, proj_app: Any) -> Iterator[Workers]:
    """Worker processes of the sample project on ``url`` (started by the caller), with
    the test process's app pointed at the same store; every one killed by PID at the
    end."""
    workers = Workers(tmp, url)
    previous = proj_app.conf.broker_url
    proj_app.conf.broker_url = url
    proj_app.conf.task_always_eager = False
    try:
        yield workers
    finally:
        workers.kill_all()
        proj_app.conf.broker_url = previous


class Served:
    def __init__(
        self, app: Any, workers: Workers, worker: WorkerProcess, tmp: Path, url: str
    ) -> None:
        self.app = app
        self.workers = workers
        self.worker = worker
        self.tmp = tmp
        self.url = url

    def path(self, name: str) -> str:
        return str(self.tmp / f"{name}-{uuid.uuid4().hex[:8]}")


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
