"""Bootsteps and user options in real ``pyrula worker -A proj_steps`` processes (on
SQLite): the steps are made with the worker as parent and the ``--steps-log`` user
option, started in ``requires`` order (consumer steps after the worker's) before the
first task, stopped in reverse at SIGTERM; a step whose start raises stops the
worker's start with one line naming it. The project's ContextTask base runs the worker's
task bodies inside its context. The same steps start and stop with ``start_worker``."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula_compat.bootsteps import BootstepError, Step
from pyrula_compat.contrib.testing.worker import start_worker
from tests.compat.conftest import HERE, REPO_ROOT, Workers, lines, pyrula_command, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    group = Workers(tmp_path, f"sqlite:///{tmp_path / 'steps.db'}")
    try:
        yield group
    finally:
        group.kill_all()


def test_steps_start_and_stop_with_the_worker_and_get_the_user_option(
    workers: Workers, tmp_path: Path
) -> None:
    import proj_steps

    log = str(tmp_path / "steps.log")
    worker = workers.start("--steps-log", log, "-n", "stepper@host", app="proj_steps")
    wait_until(lambda: "start consumer of stepper@host" in lines(log), 30, "the steps")
    previous = proj_steps.app.conf.broker_url
    proj_steps.app.conf.broker_url = workers.broker
    try:
        result = proj_steps.where.delay(7)
        value = result.get(timeout=60)
    finally:
        proj_steps.app.conf.broker_url = previous
    assert value == {"x": 7, "in_context": True, "id": result.id}
    assert worker.stop() == 0
    assert lines(log) == [
        "init worker=stepper@host loglevel=INFO",
        "start app=proj_steps",
        "start after",
        "start consumer of stepper@host",
        "stop consumer",
        "stop after",
        "stop",
    ]


def test_a_step_that_fails_to_start_stops_the_worker_naming_it(tmp_path: Path) -> None:
    log = tmp_path / "steps.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])}
    env.update(PROJ_STEPS_FAIL="1", CELERY_BROKER_URL=f"sqlite:///{tmp_path / 'fail.db'}")
    env.pop("PYRULA_STORE_URL", None)
    done = subprocess.run(
        [*pyrula_command(), "worker", "-A", "proj_steps", "--steps-log", str(log)],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "Error: bootstep proj_steps.LicenseCheck failed to start: RuntimeError: "
        "license server unreachable" in done.stderr
    )
    assert "Traceback" not in done.stderr
    assert "pyrula worker" not in done.stdout  # it never served
    # The steps started before it (by name: AfterRecorder needs Recorder) are stopped.
    assert lines(str(log))[-2:] == ["stop after", "stop"]


def test_start_worker_starts_and_stops_the_steps(tmp_path: Path) -> None:
    import proj_steps

    app = proj_steps.app
    previous = app.conf.broker_url
    app.conf.broker_url = f"sqlite:///{tmp_path / 'thread.db'}"
    try:
        with start_worker(app, perform_ping_check=False):
            assert proj_steps.where.delay(1).get(timeout=60)["in_context"] is True
    finally:
        app.conf.broker_url = previous


def test_a_step_class_that_is_no_step_is_named() -> None:
    from pyrula_compat.bootsteps import Blueprint

    with pytest.raises(BootstepError, match=r"<class 'dict'> in app.steps is not a bootstep"):
        Blueprint("Worker", [dict])
    assert type("S", (Step,), {"__module__": "m"}).name == "m.S"  # as Celery names steps
