"""``pyrula worker`` as a real process: serving, SIGTERM/SIGINT stops, exit codes.

Each test starts its workers through :class:`Workers`, which kills by PID whatever is
still running at teardown. The test process submits runs and reads results through the
blocking client on the same SQLite file.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pyrula.workflows import DurableInvocationError, RunStatus, SqliteStore, Store
from pyrula.workflows.sync import WorkflowClient
from tests.fixtures import cli_workflows

REPO_ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")
MODULE = "tests.fixtures.cli_workflows"
FAST = ["--claim-poll-interval", "0.05", "--timer-poll-interval", "0.5"]
"""Flags that keep the test workers responsive."""
START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0

pytestmark = pytest.mark.slow
assert cli_workflows.cli_add.name == "cli_add"  # registers the workflows for submit()


def pyrula_command() -> list[str]:
    """The installed console script when it sits next to this interpreter, else -m."""
    script = Path(sys.executable).with_name("pyrula")
    return [str(script)] if script.exists() else [sys.executable, "-m", "pyrula.cli.main"]


class Worker:
    def __init__(self, proc: subprocess.Popen[bytes], out: Path, err: Path) -> None:
        self.proc = proc
        self.out = out
        self.err = err

    @property
    def stdout(self) -> str:
        return self.out.read_text()

    @property
    def stderr(self) -> str:
        return self.err.read_text()

    @property
    def worker_id(self) -> str:
        """From the startup line: ``pyrula worker <id> (pid ...``."""
        return self.stdout.split()[2]

    def wait_started(self) -> None:
        wait_until(lambda: "pyrula worker" in self.stdout, START_TIMEOUT, "the startup line", self)

    def stop(self, signum: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"worker did not exit {timeout}s after {signum!r}:\n{self.stderr}")


class Workers:
    """Starts ``pyrula worker`` processes; kills the ones still alive at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.url = f"sqlite:///{tmp_path / 'pyrula.db'}"
        self.started: list[Worker] = []

    def start(
        self,
        *flags: str,
        cwd: Path = REPO_ROOT,
        wait: bool = True,
        command: list[str] | None = None,
    ) -> Worker:
        n = len(self.started)
        out, err = self.tmp_path / f"worker{n}.out", self.tmp_path / f"worker{n}.err"
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        env.pop("PYRULA_STORE_URL", None)
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                [*(command or pyrula_command()), "worker", *flags],
                cwd=cwd,
                env=env,
                stdout=stdout,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
            )
        worker = Worker(proc, out, err)
        self.started.append(worker)
        if wait:
            worker.wait_started()
        return worker

    def serve(self, *flags: str) -> Worker:
        return self.start("--workflow", MODULE, "--store", self.url, *FAST, *flags)

    def kill_all(self) -> None:
        for worker in self.started:
            if worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait(10)


def wait_until(check: Callable[[], Any], timeout: float, what: str, worker: Worker) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if worker.proc.poll() is not None and not check():
            pytest.fail(f"worker exited ({worker.proc.returncode}) before {what}:\n{worker.stderr}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout}s:\n{worker.stderr}")
        time.sleep(0.05)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(tmp_path)
    try:
        yield pool
    finally:
        pool.kill_all()


@pytest.fixture
def client(workers: Workers) -> Iterator[WorkflowClient]:
    with WorkflowClient(SqliteStore(workers.tmp_path / "pyrula.db")) as sync_client:
        yield sync_client


def ask(client: WorkflowClient, question: Callable[[Store], Awaitable[T]]) -> T:
    """Ask the test's store directly, on its own connection."""

    async def main() -> T:
        store = SqliteStore(Path(client.store.url.removeprefix("sqlite:///")))
        await store.open()
        try:
            return await question(store)
        finally:
            await store.close()

    return asyncio.run(main())


def runs_in(client: WorkflowClient, status: RunStatus) -> list[str]:
    return [r.run_id for r in ask(client, lambda s: s.list_runs(status=status, limit=1000))]


def journal_names(client: WorkflowClient, run_id: str) -> list[str]:
    return [e.name for e in ask(client, lambda s: s.load_journal(run_id))]


def assert_clean_stop(
    worker: Worker, code: int, client: WorkflowClient, failed_runs: int = 0
) -> None:
    """A clean stop: exit 0, nothing left running, unregistered, and no traceback but
    the ERROR records of the ``failed_runs`` runs that failed (logged with theirs)."""
    assert code == 0, worker.stderr
    assert runs_in(client, RunStatus.RUNNING) == []
    assert worker.worker_id not in [w.worker_id for w in ask(client, lambda s: s.list_workers())]
    assert worker.stderr.count("Traceback") == failed_runs, worker.stderr
    assert "stopped" in worker.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_worker_serves_runs_then_stops_cleanly_on_signal(
    workers: Workers, client: WorkflowClient, signum: int
) -> None:
    worker = workers.serve("-c", "4", "--loglevel", "debug")
    assert "serving cli_add, cli_echo, cli_fail, cli_gate, cli_sync_gate on sqlite:///" in (
        worker.stdout
    )
    handles = [client.submit("cli_add", {"a": i, "b": 1}) for i in range(6)]
    failing = client.submit("cli_fail", {"message": "from the test"})
    assert [h.result(timeout=30) for h in handles] == [
        {"sum": i + 1, "doubled": 2 * (i + 1)} for i in range(6)
    ]
    with pytest.raises(DurableInvocationError, match="from the test"):
        failing.result(timeout=30)
    code = worker.stop(signum)
    assert_clean_stop(worker, code, client, failed_runs=1)
    assert "ValueError: from the test" in worker.stderr  # the failed run, logged with it
    assert f"received {signal.Signals(signum).name}: stopping" in worker.stderr


def test_sigterm_requeues_an_in_flight_run_which_another_worker_finishes(
    workers: Workers, client: WorkflowClient, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    worker = workers.serve("--shutdown-grace", "0.5", "--cancel-timeout", "2")
    handle = client.submit("cli_gate", {"path": str(gate)})
    wait_until(lambda: journal_names(client, handle.run_id) == ["start"], 30, "step 1", worker)
    assert_clean_stop(worker, worker.stop(signal.SIGTERM), client)
    assert handle.status() is RunStatus.QUEUED
    assert "requeued" in worker.stderr
    gate.touch()
    second = workers.serve()
    assert handle.result(timeout=30) == "opened:1"
    assert journal_names(client, handle.run_id) == ["start", "gate"]
    assert_clean_stop(second, second.stop(signal.SIGINT), client)


def test_a_stuck_sync_step_does_not_keep_the_stopped_worker_alive(
    workers: Workers, client: WorkflowClient, tmp_path: Path
) -> None:
    worker = workers.serve("--shutdown-grace", "0.3", "--cancel-timeout", "0.5")
    handle = client.submit("cli_sync_gate", {"path": str(tmp_path / "never")})
    wait_until(lambda: handle.status() is RunStatus.RUNNING, 30, "the claim", worker)
    time.sleep(0.3)  # the step is now blocking in its thread
    code = worker.stop(signal.SIGTERM, timeout=20)  # the step itself would block for 60 s
    assert_clean_stop(worker, code, client)
    assert handle.status() is RunStatus.QUEUED
    # Step threads are daemon threads: the one still blocked does not hold the exit.
    assert f"run {handle.run_id} requeued" in worker.stderr


def test_a_second_signal_exits_at_once_and_the_run_is_recovered_later(
    workers: Workers, client: WorkflowClient, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    worker = workers.serve("--shutdown-grace", "60", "--lock-ttl", "2")
    handle = client.submit("cli_gate", {"path": str(gate)})
    wait_until(lambda: journal_names(client, handle.run_id) == ["start"], 30, "step 1", worker)
    worker.proc.send_signal(signal.SIGINT)
    wait_until(lambda: "received SIGINT: stopping" in worker.stderr, 10, "the stop", worker)
    time.sleep(0.7)  # past the window in which a repeat counts as the same signal
    assert worker.stop(signal.SIGINT, timeout=10) == 1
    assert "received SIGINT again: exiting now" in worker.stderr
    assert handle.status() is RunStatus.RUNNING  # left for the lease to expire
    gate.touch()
    rescuer = workers.serve("--lock-ttl", "2", "--orphan-scan-interval", "0.2")
    assert handle.result(timeout=30) == "opened:1"  # bound: lease 2 s + scan 0.2 s
    assert handle.record().recoveries == 1
    assert_clean_stop(rescuer, rescuer.stop(signal.SIGTERM), client)


def test_a_module_that_fails_to_import_exits_2_in_one_line(
    workers: Workers, tmp_path: Path
) -> None:
    (tmp_path / "broken_flows.py").write_text("raise RuntimeError('missing setting FOO')\n")
    # cwd is importable, as for `pyrula worker --workflow app` in a project directory.
    worker = workers.start("--workflow", "broken_flows", cwd=tmp_path, wait=False)
    assert worker.proc.wait(STOP_TIMEOUT) == 2
    assert worker.stderr.strip() == (
        "Error: cannot import workflow module 'broken_flows': RuntimeError: missing setting FOO"
    )
    assert worker.stdout == ""


def test_a_missing_module_and_a_module_without_workflows_exit_2(workers: Workers) -> None:
    missing = workers.start("--workflow", "no_such_flows", wait=False)
    assert missing.proc.wait(STOP_TIMEOUT) == 2
    assert "No module named 'no_such_flows'" in missing.stderr
    empty = workers.start("--workflow", "json", "--store", workers.url, wait=False)
    assert empty.proc.wait(STOP_TIMEOUT) == 2
    assert "no @workflow functions" in empty.stderr and "Traceback" not in empty.stderr


def test_a_bad_option_value_exits_2(workers: Workers) -> None:
    worker = workers.start(
        *("--workflow", MODULE, "--store", workers.url, "--lock-ttl", "0"),
        wait=False,
        command=[sys.executable, "-m", "pyrula.cli.main"],  # python -m works too
    )
    assert worker.proc.wait(STOP_TIMEOUT) == 2
    assert worker.stderr.strip() == "Error: --lock-ttl: WorkerOptions.lock_ttl must be > 0, got 0.0"
