"""``pyrula worker -A proj`` with the app's ``worker_max_tasks_per_child`` (from a
``--config`` module, as a settings file gives it): the worker process is replaced as
Celery replaces a pool process, and a bad setting is a usage error. The worker signals
fire where Celery's prefork worker fires them: the supervisor as Celery's main process,
each worker child as a pool process (``proj_lifecycle`` records them). Real processes on
SQLite; the supervisor and every worker child are stopped by PID."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from pyrula.cli.daemon import read_pid
from pyrula.workflows import RunRecord, SqliteStore
from tests.compat.conftest import HERE, REPO_ROOT, lines, proj_workers, wait_until
from tests.integration.test_cli_recycle import alive, children_of, pid_of

pytestmark = pytest.mark.slow


def kill_everything(workers: Any, seen: set[int]) -> None:
    """SIGKILL every process the test started (supervisors by PID, then every worker child
    seen or still attached to one)."""
    for worker in workers.started:
        seen |= children_of(worker.proc.pid)
    workers.kill_all()
    for pid in seen:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def task_runs(db: Path) -> list[RunRecord]:
    async def main() -> list[RunRecord]:
        store = SqliteStore(db)
        await store.open()
        try:
            return await store.list_runs(workflow="proj.tasks.add", limit=100)
        finally:
            await store.close()

    return asyncio.run(main())


def test_the_apps_worker_max_tasks_per_child_recycles_the_worker(
    tmp_path: Path, proj_app: Any
) -> None:
    import proj.tasks as t

    db = tmp_path / "recycle.db"
    (tmp_path / "recycle_settings.py").write_text("worker_max_tasks_per_child = 2\n")
    recorded = tmp_path / "signals"
    env = {"PYTHONPATH": f"{tmp_path}:{HERE}:{REPO_ROOT}", "LIFECYCLE_SIGNALS": str(recorded)}
    seen: set[int] = set()
    with proj_workers(f"sqlite:///{db}", tmp_path, proj_app) as workers:
        try:
            flags = ("--config", "recycle_settings", "-c", "1")
            supervisor = workers.start(*flags, app="proj_lifecycle", env=env)
            assert "replaced after 2 runs" in supervisor.stdout
            results = [t.add.delay(i, i) for i in range(5)]
            assert [r.get(timeout=30) for r in results] == [2 * i for i in range(5)]
            seen |= children_of(supervisor.proc.pid)
            runs = task_runs(db)
            seen |= {pid_of(r.worker_id or "") for r in runs}
            assert len({r.worker_id for r in runs}) >= 3, [r.worker_id for r in runs]
            assert supervisor.proc.pid not in seen
            supervisor.proc.send_signal(signal.SIGTERM)
            assert supervisor.proc.wait(30) == 0, supervisor.stderr
            assert [pid for pid in seen if alive(pid)] == []
        finally:
            kill_everything(workers, seen)
    # The limit came from the app's settings, found once the supervisor had prepared the
    # app as a worker would: it still sends only the main process's signals.
    assert sent_by(recorded)[supervisor.proc.pid] == SUPERVISOR


def test_a_bad_setting_is_a_usage_error(tmp_path: Path, proj_app: Any) -> None:
    (tmp_path / "bad_recycle_settings.py").write_text("worker_max_memory_per_child = 'lots'\n")
    env = {"PYTHONPATH": f"{tmp_path}:{HERE}:{REPO_ROOT}"}
    with proj_workers(f"sqlite:///{tmp_path / 'bad.db'}", tmp_path, proj_app) as workers:
        worker = workers.start("--config", "bad_recycle_settings", env=env, wait=False)
        assert worker.proc.wait(30) == 2, worker.stderr
        assert "worker_max_memory_per_child must be a whole number" in worker.stderr
        assert children_of(worker.proc.pid) == set()


APP_LEVEL = ["after_setup_logger", "after_setup_task_logger"]
"""Sent wherever the app is set up (logging), before the worker signals."""
ONE_PROCESS = [
    *APP_LEVEL, "celeryd_init", "import_modules", "celeryd_after_setup",
    "worker_init", "worker_process_init", "worker_ready",
    "worker_shutting_down", "worker_process_shutdown", "worker_shutdown",
]  # fmt: skip
"""Without recycling: what one ``pyrula worker -A`` process sends, in Celery's order
(and ``on_after_configure``: see :func:`sent_by`)."""
POOL_PROCESS = ["worker_process_init", "worker_process_shutdown"]
SUPERVISOR = [name for name in ONE_PROCESS if name not in POOL_PROCESS]
"""Celery's main process: the start signals, ``worker_ready`` (once the first child
serves), the shutdown ones."""
CHILD = [*APP_LEVEL, "import_modules", *POOL_PROCESS]
"""A worker child (Celery's pool process): the app set up again, its own two signals."""
CONFIGURED = "on_after_configure"
NOTE = "note: -E accepted, no effect."


def sent_by(path: Path) -> dict[int, list[str]]:
    """The signals each process recorded (``proj_lifecycle``), in order, by pid, but
    ``on_after_configure``: checked to be sent once by each, before ``import_modules``.
    It goes out as the process first reads the app's configuration (Celery's worker
    reads it as it parses its command line, before sending any other), which is earlier
    in a supervisor reading the app's recycling limits."""
    found: dict[int, list[str]] = {}
    for line in lines(str(path)):
        name, pid = line.split()
        found.setdefault(int(pid), []).append(name)
    for names in found.values():
        if "import_modules" in names:  # else a process still starting
            assert names.count(CONFIGURED) == 1, names
            assert names.index(CONFIGURED) < names.index("import_modules"), names
        if CONFIGURED in names:
            names.remove(CONFIGURED)
    return found


def stopped_by(path: Path) -> list[str]:
    """What each ``worker_shutting_down`` carried: ``sig how exitcode`` (proj_lifecycle)."""
    return lines(f"{path}.stop")


@pytest.mark.parametrize(
    ("stop", "shutting_down"),
    [(signal.SIGTERM, "SIGTERM Warm 0"), (signal.SIGINT, "SIGINT Warm 1")],
)
def test_one_worker_process_sends_every_worker_signal_once_in_celerys_order(
    tmp_path: Path, proj_app: Any, stop: signal.Signals, shutting_down: str
) -> None:
    """... and ``worker_shutting_down`` names the signal that stopped it, with Celery's
    ``how`` and ``exitcode`` for it (the process itself exits 0)."""
    import proj.tasks as t

    recorded = tmp_path / "signals"
    env = {"LIFECYCLE_SIGNALS": str(recorded)}
    with proj_workers(f"sqlite:///{tmp_path / 'one.db'}", tmp_path, proj_app) as workers:
        worker = workers.start("-E", app="proj_lifecycle", env=env)
        assert t.add.delay(2, 3).get(timeout=30) == 5
        worker.proc.send_signal(stop)
        assert worker.proc.wait(30) == 0, worker.stderr
    assert sent_by(recorded) == {worker.proc.pid: ONE_PROCESS}
    assert stopped_by(recorded) == [shutting_down]
    assert worker.stderr.count(NOTE) == 1, worker.stderr


def test_the_supervisor_sends_the_main_process_signals_and_each_child_its_own(
    tmp_path: Path, proj_app: Any
) -> None:
    import proj.tasks as t

    recorded = tmp_path / "signals"
    env = {"LIFECYCLE_SIGNALS": str(recorded)}
    seen: set[int] = set()
    flags = ("--max-tasks-per-child", "2", "-c", "1", "-E")

    def sent(name: str) -> list[int]:
        return [pid for pid, names in sent_by(recorded).items() if name in names]

    with proj_workers(f"sqlite:///{tmp_path / 'recycle.db'}", tmp_path, proj_app) as workers:
        try:
            supervisor = workers.start(*flags, app="proj_lifecycle", env=env)
            assert "replaced after 2 runs" in supervisor.stdout
            results = [t.add.delay(i, i) for i in range(6)]
            assert [r.get(timeout=30) for r in results] == [2 * i for i in range(6)]
            # Two runs each: children 1-3 recycled, and the 4th serves.
            wait_until(
                lambda: (
                    (len(sent("worker_process_init")), len(sent("worker_process_shutdown")))
                    == (4, 3)
                ),
                30,
                "the 4th worker child serving",
            )
            seen |= children_of(supervisor.proc.pid) | set(sent("worker_process_init"))
            supervisor.proc.send_signal(signal.SIGINT)  # Ctrl-C: the supervisor's sig
            assert supervisor.proc.wait(30) == 0, supervisor.stderr
            assert [pid for pid in seen if alive(pid)] == []
        finally:
            kill_everything(workers, seen)

    main = supervisor.proc.pid
    by_pid = sent_by(recorded)
    assert by_pid.pop(main) == SUPERVISOR
    assert stopped_by(recorded) == ["SIGINT Warm 1"]
    assert len(by_pid) == 4 and main not in by_pid
    assert by_pid == {pid: CHILD for pid in by_pid}
    ordered = [line.split()[0] for line in lines(str(recorded))]
    assert ordered.index("worker_process_init") < ordered.index("worker_ready")
    assert ordered.index("worker_shutdown") == len(ordered) - 1
    assert supervisor.stderr.count(NOTE) == 1, supervisor.stderr


def test_a_detach_launcher_sends_no_worker_signal(tmp_path: Path, proj_app: Any) -> None:
    """Celery detaches before it makes the worker: the process ``--detach`` starts sends
    them all, the one that launched it none (it only checks the app first)."""
    import proj.tasks as t

    recorded, pidfile = tmp_path / "signals", tmp_path / "w.pid"
    env = {"LIFECYCLE_SIGNALS": str(recorded)}
    flags = ("--detach", "--pidfile", str(pidfile), "--logfile", str(tmp_path / "w.log"))
    background = 0
    with proj_workers(f"sqlite:///{tmp_path / 'detach.db'}", tmp_path, proj_app) as workers:
        try:
            launcher = workers.start(*flags, app="proj_lifecycle", env=env, wait=False)
            assert launcher.proc.wait(30) == 0, launcher.stderr
            wait_until(lambda: read_pid(pidfile) is not None, 30, "the detached worker's pid")
            background = read_pid(pidfile) or 0
            assert t.add.delay(2, 3).get(timeout=30) == 5
            os.kill(background, signal.SIGTERM)
            wait_until(lambda: not alive(background), 30, "the detached worker's exit")
        finally:
            workers.kill_all()
            if background and alive(background):
                os.kill(background, signal.SIGKILL)
    by_pid = sent_by(recorded)
    assert by_pid.pop(background) == ONE_PROCESS
    # The launcher sets the app up (to fail in the foreground on a bad app), no more.
    assert by_pid == {launcher.proc.pid: [*APP_LEVEL, "import_modules"]}
