"""``pyrula -A proj worker``, Celery's argument order, serves the app like
``pyrula worker -A proj`` (a real worker process on SQLite)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.compat.conftest import FAST, HERE, REPO_ROOT, WorkerProcess, pyrula_command

pytestmark = pytest.mark.slow


def test_app_option_before_the_worker_command_serves_the_app(tmp_path: Path, proj_app: Any) -> None:
    import proj.tasks as t

    url = f"sqlite:///{tmp_path / 'proj.db'}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])}
    env.pop("PYRULA_STORE_URL", None)
    env["CELERY_BROKER_URL"] = url
    out, err = tmp_path / "worker.out", tmp_path / "worker.err"
    previous = proj_app.conf.broker_url
    proj_app.conf.broker_url = url
    proj_app.conf.task_always_eager = False
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [*pyrula_command(), "-A", "proj", "worker", "-l", "info", *FAST],
            cwd=HERE, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    worker = WorkerProcess(proc, out, err)
    try:
        worker.wait_started()
        assert "proj.tasks.add" in worker.stdout and str(tmp_path) in worker.stdout
        assert t.add.delay(2, 3).get(timeout=30) == 5
    finally:
        assert worker.stop() == 0
        proj_app.conf.broker_url = previous
