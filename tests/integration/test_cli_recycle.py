"""``pyrula worker --max-tasks-per-child`` / ``--max-memory-per-child`` as real processes:
a supervisor runs the worker as a child process and replaces it at a limit, losing
nothing; a child killed with SIGKILL is replaced too; one that fails at start-up stops
the supervisor with its code.

:class:`Recycled` remembers every worker child it sees (the supervisor's
``/proc/<pid>/task/<pid>/children``, the pid in each run's worker id) and kills by PID
the ones still alive at teardown, after the supervisors ``Workers`` kills.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from pyrula.cli.main import cli
from pyrula.workflows import RunRecord, RunStatus, SqliteStore
from pyrula.workflows.sync import WorkflowClient
from tests.integration.test_cli_worker import (  # noqa: F401  (fixture: workers)
    MODULE,
    Worker,
    Workers,
    ask,
    wait_until,
    workers,
)

pytestmark = pytest.mark.slow
T = 30.0


def children_of(pid: int) -> set[int]:
    """The live children of ``pid``, from /proc (empty once it is gone)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found.update(int(p) for p in handle.read().split())
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def pid_of(worker_id: str) -> int:
    """The pid in a worker id: ``host-PID-hex``."""
    return int(worker_id.rsplit("-", 2)[1])


class Recycled:
    """The worker children of the supervisors a test starts, killed by PID at the end."""

    def __init__(self, pool: Workers) -> None:
        self.workers = pool
        self.seen: set[int] = set()

    def note(self, supervisor: Worker, runs: Iterable[RunRecord] = ()) -> set[int]:
        """Remember the supervisor's children now, and the workers that ran ``runs``."""
        self.seen |= children_of(supervisor.proc.pid)
        self.seen |= {pid_of(r.worker_id) for r in runs if r.worker_id}
        return self.seen

    def kill_all(self) -> None:
        for worker in self.workers.started:
            self.note(worker)
        self.workers.kill_all()
        for pid in self.seen:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in self.seen) and time.monotonic() < deadline:
            time.sleep(0.05)


@pytest.fixture
def recycled(workers: Workers) -> Iterator[Recycled]:  # noqa: F811
    pool = Recycled(workers)
    try:
        yield pool
    finally:
        pool.kill_all()


@pytest.fixture
def client(workers: Workers) -> Iterator[WorkflowClient]:  # noqa: F811
    with WorkflowClient(SqliteStore(workers.tmp_path / "pyrula.db")) as sync_client:
        yield sync_client


def records(client: WorkflowClient, run_ids: list[str]) -> list[RunRecord]:
    found = {r.run_id: r for r in ask(client, lambda s: s.list_runs(limit=1000))}
    return [found[run_id] for run_id in run_ids]


def stop_all(supervisor: Worker, recycled: Recycled) -> None:
    """SIGTERM to the supervisor: it exits 0 and no worker child is left."""
    seen = recycled.note(supervisor)
    assert supervisor.stop(signal.SIGTERM) == 0, supervisor.stderr
    assert [pid for pid in seen if alive(pid)] == []
    assert "Traceback" not in supervisor.stderr


def test_max_tasks_per_child_replaces_the_worker_process_and_loses_nothing(
    recycled: Recycled,
    workers: Workers,  # noqa: F811
    client: WorkflowClient,
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "w.pid"
    supervisor = workers.serve("-c", "1", "--max-tasks-per-child", "3", "--pidfile", str(pidfile))
    assert f"pyrula supervisor (pid {supervisor.proc.pid})" in supervisor.stdout
    assert "replaced after 3 runs" in supervisor.stdout
    handles = [client.submit("cli_add", {"a": i, "b": 1}) for i in range(10)]
    assert [h.result(timeout=T)["sum"] for h in handles] == [i + 1 for i in range(10)]
    runs = records(client, [h.run_id for h in handles])
    pids = recycled.note(supervisor, runs)
    by_pid = [pid_of(r.worker_id or "") for r in runs]
    assert len(set(by_pid)) >= 3 and max(by_pid.count(p) for p in by_pid) <= 3, by_pid
    assert supervisor.proc.pid not in pids
    for run in runs:  # each run claimed once, each step run once: nothing re-ran
        journal = ask(client, lambda s, r=run: s.load_journal(r.run_id))  # type: ignore[misc]
        assert (run.status, run.claims, run.recoveries) == (RunStatus.COMPLETED, 1, 0)
        assert [(e.name, e.attempts) for e in journal] == [("add", 1), ("double", 1)]
    assert pidfile.read_text() == f"{supervisor.proc.pid}\n"
    assert supervisor.stderr.count("recycles: 3 runs ended here") >= 3
    stop_all(supervisor, recycled)
    assert not pidfile.exists()


def test_max_memory_per_child_below_the_baseline_recycles_after_each_run(
    recycled: Recycled,
    workers: Workers,  # noqa: F811
    client: WorkflowClient,
) -> None:
    supervisor = workers.serve("--max-memory-per-child", "1000")  # a Python process: more
    run_ids = []
    for i in range(3):  # one at a time: each run ends on a new worker process
        handle = client.submit("cli_add", {"a": i, "b": i})
        assert handle.result(timeout=T)["sum"] == 2 * i
        run_ids.append(handle.run_id)
    runs = records(client, run_ids)
    recycled.note(supervisor, runs)
    assert len({r.worker_id for r in runs}) == 3
    assert "KiB resident (the limit: 1000 KiB)" in supervisor.stderr
    stop_all(supervisor, recycled)


def test_a_child_killed_with_sigkill_is_replaced_and_its_run_recovered(
    recycled: Recycled,
    workers: Workers,  # noqa: F811
    client: WorkflowClient,
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    supervisor = workers.serve(
        "--max-tasks-per-child", "100", "--lock-ttl", "2", "--orphan-scan-interval", "0.5"
    )
    handle = client.submit("cli_gate", {"path": str(gate)})

    def step_done() -> bool:
        return [e.name for e in ask(client, lambda s: s.load_journal(handle.run_id))] == ["start"]

    wait_until(step_done, T, "the first step", supervisor)
    (first,) = records(client, [handle.run_id])
    victim = pid_of(first.worker_id or "")
    recycled.note(supervisor, [first])
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: supervisor.stdout.count("pyrula worker") == 2, T, "a new child", supervisor)
    gate.touch()
    assert handle.result(timeout=T) == "opened:1"
    (run,) = records(client, [handle.run_id])
    recycled.note(supervisor, [run])
    assert pid_of(run.worker_id or "") not in (victim, supervisor.proc.pid)
    assert run.recoveries == 1
    journal = ask(client, lambda s: s.load_journal(handle.run_id))
    assert [(e.name, e.attempts) for e in journal] == [("start", 1), ("gate", 1)]
    assert f"worker process {victim} was killed by SIGKILL" in supervisor.stderr
    stop_all(supervisor, recycled)


def test_a_child_that_fails_at_start_up_stops_the_supervisor_with_its_code(
    recycled: Recycled,
    workers: Workers,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A deploy breaks the module between two recycles: the replacement cannot import
    it (exit 2), so the supervisor stops (no restart loop) with that code."""
    name = f"recycle_flows_{uuid.uuid4().hex[:8]}"
    module = tmp_path / f"{name}.py"
    module.write_text(
        "from pyrula.workflows import workflow\n\n"
        f"@workflow(name='{name}')\nasync def flow(ctx):\n    return 'served'\n"
    )
    supervisor = workers.start(
        "--workflow", name, "--store", workers.url, "-c", "1", "--max-tasks-per-child", "1",
        "--claim-poll-interval", "0.05", cwd=tmp_path,
    )  # fmt: skip
    module.write_text("raise RuntimeError('a bad deploy')\n")
    with WorkflowClient(SqliteStore(tmp_path / "pyrula.db"), require_registered=False) as unchecked:
        handle = unchecked.submit(name, {})
        assert handle.result(timeout=T) == "served"
    recycled.note(supervisor)
    assert supervisor.proc.wait(T) == 2, supervisor.stderr
    assert "a bad deploy" in supervisor.stderr
    assert "before it served" in supervisor.stderr and "not starting another" in supervisor.stderr
    assert [pid for pid in recycled.seen if alive(pid)] == []


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-tasks-per-child", "0"], "--max-tasks-per-child"),
        (["--max-memory-per-child", "lots"], "--max-memory-per-child"),
        (["--max-tasks-per-child", "2.5"], "--max-tasks-per-child"),
    ],
)
def test_bad_limits_exit_2_with_the_flag_named(flags: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["worker", "-w", MODULE, "--store", "sqlite:///x.db", *flags])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_limit_on_a_memory_store_is_a_usage_error() -> None:
    """A memory:// store lives in the worker process: recycling it would lose every run."""
    result = CliRunner().invoke(
        cli, ["worker", "-w", MODULE, "--store", "memory://", "--max-memory-per-child", "9"]
    )
    assert result.exit_code == 2, result.output
    assert "--max-memory-per-child: recycling replaces the worker process" in result.output


def test_without_a_limit_the_worker_is_one_process(workers: Workers) -> None:  # noqa: F811
    worker = workers.serve()
    assert f"(pid {worker.proc.pid})" in worker.stdout and "supervisor" not in worker.stdout
    assert children_of(worker.proc.pid) == set()
    assert worker.stop() == 0
