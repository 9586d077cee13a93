"""``pyrula worker -A proj`` with Celery's global options as deployment scripts give
them: ``-b/--broker`` picks the store, ``--config`` loads a settings module, ``-I``
imports more task modules, ``--result-backend`` is checked like the setting, and
``-n`` names the node in ``--logfile``/``--pidfile`` (real worker processes on SQLite,
stopped by PID)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.compat.conftest import HERE, REPO_ROOT, Workers, proj_workers

pytestmark = pytest.mark.slow


def test_broker_config_include_and_node_named_files(tmp_path: Path, proj_app: Any) -> None:
    url = f"sqlite:///{tmp_path / 'flags.db'}"
    (tmp_path / "flag_settings.py").write_text('imports = ["proj_extra"]\n')
    (tmp_path / "flag_tasks.py").write_text(
        "from proj.celery import app\n\n"
        "@app.task(name='flags.ping')\ndef ping():\n    return 'pong'\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(HERE), str(REPO_ROOT)])}
    with proj_workers(url, tmp_path, proj_app) as workers:
        workers.broker = "sqlite:///not-this-one.db"  # the environment's: -b must win
        worker = workers.start(
            "-b", url, "--config", "flag_settings", "-I", "flag_tasks", "-n", "w7@%h",
            "--pidfile", f"{tmp_path}/%n.pid", "--logfile", f"{tmp_path}/%n%I.log",
            "--skip-checks", "-q", "--no-color",
            env=env,
        )  # fmt: skip
        assert "flags.ping" in worker.stdout  # -I
        assert "proj.extra.shout" in worker.stdout  # --config's imports
        assert (tmp_path / "w7.pid").read_text() == f"{worker.proc.pid}\n"
        result = proj_app.send_task("proj.extra.shout", args=["hi"])
        assert result.get(timeout=30) == "HI!"
        assert proj_app.send_task("flags.ping").get(timeout=30) == "pong"
        assert worker.stop() == 0
    assert not (tmp_path / "w7.pid").exists()
    assert f"w7@{socket.gethostname()}" not in worker.stderr
    assert "pyrula.workflows.worker" in (tmp_path / "w7.log").read_text()
    assert not (HERE / "not-this-one.db").exists()


def test_a_result_backend_on_another_server_is_a_usage_error(tmp_path: Path) -> None:
    workers = Workers(tmp_path, f"sqlite:///{tmp_path / 'x.db'}")
    try:
        worker = workers.start("--result-backend", "redis://elsewhere.invalid:6379/0", wait=False)
        assert worker.proc.wait(30) == 2, worker.stderr
        assert "result_backend" in worker.stderr or "backend" in worker.stderr
        assert "Traceback" not in worker.stderr
    finally:
        workers.kill_all()


def test_a_config_module_that_does_not_import_is_a_usage_error(tmp_path: Path) -> None:
    workers = Workers(tmp_path, f"sqlite:///{tmp_path / 'x.db'}")
    try:
        worker = workers.start("--config", "no_such_settings_module", wait=False)
        assert worker.proc.wait(30) == 2, worker.stderr
        assert "cannot load configuration 'no_such_settings_module'" in worker.stderr
        assert "Traceback" not in worker.stderr
    finally:
        workers.kill_all()


def test_purge_revokes_the_apps_waiting_tasks_before_serving(tmp_path: Path, proj_app: Any) -> None:
    import proj.tasks as t

    url = f"sqlite:///{tmp_path / 'purge.db'}"
    with proj_workers(url, tmp_path, proj_app) as workers:
        waiting = [t.add.delay(i, i) for i in range(3)] + [t.add.apply_async((1, 1), countdown=600)]
        worker = workers.start("--purge")
        assert "--purge: discarded 4 waiting run(s)" in worker.stdout, worker.stdout
        assert [r.state for r in waiting] == ["REVOKED"] * 4
        assert t.add.delay(20, 22).get(timeout=30) == 42  # sent after: served
        assert worker.stop() == 0
