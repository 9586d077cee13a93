"""States as Celery reports them, against real ``pyrula worker -A proj_states``
processes: with ``task_track_started`` off (Celery's default) a running task reads
``PENDING`` until it ends, so the tutorial's ``while result.status == "PENDING"`` loop
works; with the setting (or the task's ``track_started``) on it reads ``STARTED``; an
attempt after a retry reads ``RETRY``. The run itself reads ``running`` all along."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunStatus
from pyrula_compat import states
from tests.compat.conftest import Workers, lines, wait_until

pytestmark = pytest.mark.slow
T = 30


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Any, Workers]]:
    import proj_states

    app = proj_states.app
    url = f"sqlite:///{tmp_path / 'states.db'}"
    workers = Workers(tmp_path, url)
    app.conf.broker_url = url
    try:
        yield app, workers
    finally:
        workers.kill_all()
        del app.conf["broker_url"]
        app.close()


def run_and_read(app: Any, task: Any, tmp: Path, *args: Any) -> tuple[str, RunStatus, Any]:
    """Start ``task``, read its state and its run's status while it runs, open its gate:
    (the state, the native status, the result)."""
    gate, marker = str(tmp / f"{task.name}.gate"), str(tmp / f"{task.name}.marker")
    result = task.delay(gate, marker)
    wait_until(lambda: lines(marker), T, f"{task.name} to start")
    state = result.status
    native = app.client().handle(task.name, result.id).status()
    Path(gate).write_text("open")
    deadline = time.monotonic() + T
    while result.status == state:  # the Celery tutorial's loop, for PENDING
        assert time.monotonic() < deadline, "the task did not end"
        time.sleep(0.05)
    assert result.status == "SUCCESS" and result.state == states.SUCCESS
    return state, native, result.get(timeout=T)


def test_a_running_task_reads_pending_unless_it_tracks_started(
    served: tuple[Any, Workers], tmp_path: Path
) -> None:
    import proj_states

    app, workers = served
    workers.start(app="proj_states")
    assert run_and_read(app, proj_states.gated, tmp_path) == (
        states.PENDING, RunStatus.RUNNING, "done",
    )  # fmt: skip
    assert run_and_read(app, proj_states.gated_tracked, tmp_path) == (
        states.STARTED, RunStatus.RUNNING, "tracked",
    )  # fmt: skip
    retried = proj_states.retry_then_gated
    gate, marker = str(tmp_path / "retry.gate"), str(tmp_path / "retry.marker")
    result = retried.delay(gate, marker)
    wait_until(lambda: lines(marker), T, "the attempt after the retry to start")
    assert result.state == states.RETRY  # as Celery's backend holds it until the end
    assert app.client().handle(retried.name, result.id).status() is RunStatus.RUNNING
    Path(gate).write_text("open")
    assert result.get(timeout=T) == 1 and result.state == states.SUCCESS


def test_task_track_started_on_reads_started(served: tuple[Any, Workers], tmp_path: Path) -> None:
    import proj_states

    app, workers = served
    workers.start(app="proj_states", env={"PROJ_TRACK_STARTED": "1"})
    state, native, value = run_and_read(app, proj_states.gated, tmp_path)
    assert (state, native, value) == (states.STARTED, RunStatus.RUNNING, "done")
