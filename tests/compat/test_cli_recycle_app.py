"""``pyrula worker -A proj`` with the app's ``worker_max_tasks_per_child`` (from a
``--config`` module, as a settings file gives it): the worker process is replaced as
Celery replaces a pool process, and a bad setting is a usage error. Real processes on
SQLite; the supervisor and every worker child are stopped by PID."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunRecord, SqliteStore
from tests.compat.conftest import HERE, REPO_ROOT, proj_workers
from tests.integration.test_cli_recycle import alive, children_of, pid_of

pytestmark = pytest.mark.slow


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
    env = {"PYTHONPATH": f"{tmp_path}:{HERE}:{REPO_ROOT}"}
    seen: set[int] = set()
    with proj_workers(f"sqlite:///{db}", tmp_path, proj_app) as workers:
        try:
            supervisor = workers.start("--config", "recycle_settings", "-c", "1", env=env)
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
            for worker in workers.started:
                seen |= children_of(worker.proc.pid)
            workers.kill_all()
            for pid in seen:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_a_bad_setting_is_a_usage_error(tmp_path: Path, proj_app: Any) -> None:
    (tmp_path / "bad_recycle_settings.py").write_text("worker_max_memory_per_child = 'lots'\n")
    env = {"PYTHONPATH": f"{tmp_path}:{HERE}:{REPO_ROOT}"}
    with proj_workers(f"sqlite:///{tmp_path / 'bad.db'}", tmp_path, proj_app) as workers:
        worker = workers.start("--config", "bad_recycle_settings", env=env, wait=False)
        assert worker.proc.wait(30) == 2, worker.stderr
        assert "worker_max_memory_per_child must be a whole number" in worker.stderr
        assert children_of(worker.proc.pid) == set()
