"""Retrying a failed task (``handle.retry()``, ``pyrula runs retry``) runs its body again.

A failed attempt is journaled as a failed step carrying the task's exception, and an
attempt that asked for a retry as a failed step carrying its ``Retry``; a retry of the
run removes the attempt that failed it, so a worker runs the body again, while the
attempts before it replay as they were decided (their countdowns, no hook again).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunStatus
from pyrula.workflows.records import JournalEntry, NewRun
from pyrula.workflows.serialization import MAX_ERROR_ARGS_BYTES, ErrorInfo
from pyrula_compat.contrib.testing.worker import start_worker
from tests.compat.conftest import HERE, REPO_ROOT, Workers, pyrula_command

T = 30.0  # generous result timeout (seconds)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import retryproj

    db = tmp_path_factory.mktemp("retry-reruns") / "tasks.db"
    previous = retryproj.app.conf.broker_url
    retryproj.app.conf.broker_url = f"sqlite:///{db}"
    with start_worker(retryproj.app, concurrency=2):
        yield retryproj.app
    retryproj.app.conf.broker_url = previous


def _journal(app: Any, run_id: str) -> list[Any]:
    client = app.client()
    return list(client._call(client.store.load_journal(run_id)))


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_failed_attempt_is_a_failed_step_carrying_the_exception(app: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    result = app.tasks["retryproj.until_fixed"].delay(path)
    with pytest.raises(ValueError, match="not fixed yet"):
        result.get(timeout=T)
    [attempt] = _journal(app, result.id)
    assert attempt.name == "attempt-0" and attempt.ok is False
    info = ErrorInfo.from_json(attempt.value)
    assert (info.type_module, info.type_name) == ("builtins", "ValueError")
    assert "not fixed yet" in info.message
    assert (
        "in until_fixed" in info.traceback and 'raise ValueError(f"not fixed yet' in info.traceback
    )
    assert result.traceback is not None and "in until_fixed" in result.traceback


def test_handle_retry_runs_the_body_again_and_it_succeeds(app: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    result = app.tasks["retryproj.until_fixed"].delay(str(path))
    with pytest.raises(ValueError):
        result.get(timeout=T)
    Path(f"{path}.fixed").write_text("fixed")
    handle = app.client().handle("retryproj.until_fixed", result.id)
    handle.retry()
    result = app.AsyncResult(result.id)  # the first one keeps the outcome it read
    assert result.get(timeout=T) == "fixed"
    assert result.status == "SUCCESS"
    assert _lines(Path(f"{path}.log")) == ["ran", "ran"]
    assert _lines(Path(f"{path}.hooks")) == ["on_failure ValueError", "on_success"]
    [attempt] = _journal(app, result.id)
    assert attempt.name == "attempt-0" and attempt.ok is True


def test_a_retried_attempt_replays_its_decision_and_only_the_failed_one_runs_again(
    app: Any, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    result = app.tasks["retryproj.retry_once_then_until_fixed"].delay(str(path))
    with pytest.raises(ValueError):
        result.get(timeout=T)
    journal = _journal(app, result.id)
    assert [(e.name, e.ok) for e in journal] == [
        ("attempt-0", False), ("retry-0", True), ("attempt-1", False),
    ]  # fmt: skip
    retried = ErrorInfo.from_json(journal[0].value)
    assert retried.type_name == "RetryScheduled"
    assert retried.message == "Retry in 0.1s: ConnectionError('first try')"
    assert "ConnectionError: first try" in retried.traceback
    Path(f"{path}.fixed").write_text("done")
    app.client().handle(result.name or "", result.id).retry()
    result = app.AsyncResult(result.id)
    assert result.get(timeout=T) == "done"
    # attempt-0 replayed (no body, no on_retry again); attempt-1 ran again
    assert _lines(Path(f"{path}.log")) == ["ran 0", "ran 1", "ran 1"]
    assert _lines(Path(f"{path}.hooks")) == [
        "on_retry ConnectionError", "on_failure ValueError", "on_success",
    ]  # fmt: skip
    assert [(e.name, e.ok) for e in _journal(app, result.id)] == [
        ("attempt-0", False), ("retry-0", True), ("attempt-1", True),
    ]  # fmt: skip


@pytest.mark.slow
def test_pyrula_runs_retry_on_the_command_line_reruns_the_body_on_a_worker_process(
    tmp_path: Path,
) -> None:
    import retryproj

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    workers = Workers(tmp_path, url)
    previous = retryproj.app.conf.broker_url
    retryproj.app.conf.broker_url = url
    try:
        worker = workers.start(app="retryproj")
        path = tmp_path / "t"
        result = retryproj.until_fixed.delay(str(path))
        with pytest.raises(ValueError):
            result.get(timeout=T)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])}
        shown = subprocess.run(
            [*pyrula_command(), "runs", "show", result.id, "--store", url],
            capture_output=True, text=True, env=env, timeout=60, check=True,
        )  # fmt: skip
        attempt_row = next(line for line in shown.stdout.splitlines() if "attempt-0" in line)
        assert " no " in attempt_row and "builtins.ValueError: not fixed yet" in attempt_row
        Path(f"{path}.fixed").write_text("cli")
        retried = subprocess.run(
            [*pyrula_command(), "runs", "retry", result.id, "--store", url, "--json"],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert retried.returncode == 0, retried.stderr
        assert json.loads(retried.stdout)["run"]["status"] == RunStatus.QUEUED.value
        assert retryproj.app.AsyncResult(result.id).get(timeout=T) == "cli"
        assert _lines(Path(f"{path}.log")) == ["ran", "ran"]
        assert worker.stop() == 0
        log = worker.stderr
        assert f"Task retryproj.until_fixed[{result.id}] raised unexpected: ValueError(" in log
        assert f"Task retryproj.until_fixed[{result.id}] succeeded in " in log
    finally:
        workers.kill_all()
        retryproj.app.conf.broker_url = previous
    assert sys.modules["retryproj"] is retryproj


def test_a_retry_decision_too_large_for_the_exception_is_journaled_as_a_value(
    app: Any, tmp_path: Path
) -> None:
    big = "x" * (MAX_ERROR_ARGS_BYTES + 100)  # more than an exception's args keep
    result = app.tasks["retryproj.big_retry"].delay("small", len(big))
    assert result.get(timeout=T) == len(big)
    first = _journal(app, result.id)[0]
    assert (first.name, first.ok) == ("attempt-0", True)
    assert json.loads(first.value)["kind"] == "retry"


def test_an_attempt_journaled_as_an_error_value_still_replays_as_that_failure(
    tmp_path: Path,
) -> None:
    """Journals written before failed attempts were failed steps: the replay raises the
    recorded error, runs no body, and the run fails with it."""
    from pyrula_compat import Celery

    old = Celery("oldjournal", broker=f"sqlite:///{tmp_path / 'old.db'}", set_as_current=False)
    ran: list[int] = []

    @old.task(name="oldjournal.task")
    def task(n: int) -> int:
        ran.append(n)
        return n

    error = ErrorInfo.from_exception(KeyError("recorded")).to_json()
    client = old.client()
    store = client.store
    params = json.dumps({"args": [1], "kwargs": {}})
    client._call(
        store.create_run(NewRun(run_id="old-1", workflow="oldjournal.task", params=params))
    )
    [lease] = client._call(store.claim_runs("test", ["oldjournal.task"], 1, 30.0))
    entry = JournalEntry(
        run_id="old-1", position=0, kind="step", name="attempt-0", ok=True,
        value=json.dumps({"kind": "error", "error": error}),
    )  # fmt: skip
    client._call(store.append_journal(lease.token, entry))
    client._call(store.release_run("old-1", lease.token))
    with start_worker(old), pytest.raises(KeyError, match="recorded"):
        old.AsyncResult("old-1").get(timeout=T)
    assert ran == []
