"""``pyrula worker --log-format json`` (and ``PYRULA_LOG_FORMAT=json``): one JSON object a
line, with the run, workflow or task, step, attempt and worker each record is about.

Real worker processes on a SQLite store: a native workflow whose step is retried once
(WARNING) and whose run then fails (ERROR, with the traceback), and a Celery app's task
(the drop-in's lines carry the task's name and id).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunStatus, open_store
from pyrula.workflows.errors import DurableInvocationError
from pyrula.workflows.sync import WorkflowClient
from tests.compat.conftest import HERE as COMPAT_DIR
from tests.compat.conftest import REPO_ROOT, Workers, pyrula_command

T = 30.0


def _records(text: str) -> list[dict[str, Any]]:
    records = []
    for line in text.splitlines():
        record = json.loads(line)  # every line is one JSON object
        assert {"time", "level", "logger", "message"} <= set(record), line
        records.append(record)
    return records


@pytest.fixture
def native_worker(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    url = f"sqlite:///{tmp_path / 'json.db'}"
    err = tmp_path / "worker.err"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYRULA_LOG_FORMAT": "text"}
    with err.open("wb") as stderr:
        proc = subprocess.Popen(
            [*pyrula_command(), "worker", "--workflow", "tests.fixtures.log_workflows",
             "--store", url, "--log-format", "json", "--claim-poll-interval", "0.05",
             "--worker-id", "json-worker-1"],
            cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    try:
        yield url, proc, err
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.mark.slow
def test_a_native_workers_json_lines_name_the_run_step_attempt_and_worker(
    native_worker: tuple[str, subprocess.Popen[bytes], Path], tmp_path: Path
) -> None:
    url, proc, err = native_worker
    client = WorkflowClient(open_store(url), require_registered=False)
    try:
        handle = client.submit("logs_flaky_then_broken", {"path": str(tmp_path / "marker")})
        with pytest.raises(DurableInvocationError, match="LookupError: nothing here"):
            handle.result(timeout=T)
        assert handle.record().status is RunStatus.FAILED
    finally:
        client.close()
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(20) == 0
    records = _records(err.read_text())
    run_id = handle.run_id
    mine = [r for r in records if r.get("run_id") == run_id]
    assert all(r["workflow"] == "logs_flaky_then_broken" for r in mine)
    assert all(r.get("worker") == "json-worker-1" for r in records if "run_id" in r)
    retried = [r for r in mine if r["level"] == "WARNING" and "retrying" in r["message"]]
    assert len(retried) == 1 and "ConnectionError" in retried[0]["message"]
    [logged] = [r for r in mine if r["message"] == "shaky step succeeded"]
    assert (logged["step"], logged["attempt"], logged["level"]) == ("shaky", 2, "INFO")
    assert logged["logger"] == "tests.fixtures.log_workflows"
    [failed] = [r for r in mine if r["level"] == "ERROR"]
    assert failed["logger"] == "pyrula.workflows.engine"
    assert failed["message"].startswith(
        f"run {run_id} (logs_flaky_then_broken) failed: LookupError"
    )
    assert failed["exc_type"] == "LookupError"
    assert "in _breaks" in failed["exc_info"] and "LookupError: nothing here" in failed["exc_info"]
    assert "step" not in failed  # the run's line, not the step's


@pytest.mark.slow
def test_a_celery_apps_json_lines_carry_the_task_name_and_id(tmp_path: Path) -> None:
    if str(COMPAT_DIR) not in sys.path:
        sys.path.insert(0, str(COMPAT_DIR))
    import logproj

    url = f"sqlite:///{tmp_path / 'celery-json.db'}"
    previous = logproj.app.conf.broker_url
    logproj.app.conf.broker_url = url
    workers = Workers(tmp_path, url)
    try:
        worker = workers.start("-l", "info", app="logproj", env={"PYRULA_LOG_FORMAT": "json"})
        added = logproj.add.delay(2, 2)
        chatty = logproj.chatty.delay("json")
        failed = logproj.divide.delay(1, 0)
        assert added.get(timeout=T) == 4 and chatty.get(timeout=T) == "json"
        with pytest.raises(ZeroDivisionError):
            failed.get(timeout=T)
        assert worker.stop() == 0
        records = _records(worker.stderr)
    finally:
        workers.kill_all()
        logproj.app.conf.broker_url = previous
    [succeeded] = [
        r for r in records if r["message"].startswith(f"Task logproj.add[{added.id}] succ")
    ]
    assert succeeded["logger"] == "celery.app.trace" and succeeded["level"] == "INFO"
    assert (succeeded["task"], succeeded["task_id"], succeeded["run_id"]) == (
        "logproj.add", added.id, added.id,
    )  # fmt: skip
    assert succeeded["step"] == "attempt-0" and succeeded["attempt"] == 1
    [said] = [r for r in records if r["message"] == "saying json"]
    assert (said["task"], said["task_id"], said["logger"]) == (
        "logproj.chatty",
        chatty.id,
        "logproj",
    )
    [error] = [r for r in records if r["level"] == "ERROR"]
    assert error["task_id"] == failed.id and error["exc_type"] == "ZeroDivisionError"
    assert "return x / y" in error["exc_info"]


def test_the_json_logs_example_runs_and_checks_its_lines() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "json_logs.py")],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("json logs: ok")
    assert '"step": "charge", "attempt": 2' in done.stdout
