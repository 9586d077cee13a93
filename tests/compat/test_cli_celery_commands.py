"""``pyrula -A proj purge|call|result|control``: Celery's operational commands against a
real ``pyrula worker -A proj`` process on SQLite (each command a real process too, as
scripts run them). Every worker is stopped by its PID."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.workflows import RunRecord, RunStatus, open_store
from tests.compat import docs_snippets
from tests.compat.conftest import HERE, REPO_ROOT, WorkerProcess, Workers, pyrula_command

pytestmark = pytest.mark.slow

T = 30.0


def run_cli(*args: str, broker: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])}
    environment.pop("PYRULA_STORE_URL", None)
    environment["CELERY_BROKER_URL"] = broker
    return subprocess.run(
        [*pyrula_command(), *args], cwd=HERE, env=environment, input=stdin,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def records(url: str, workflow: str | None = None) -> list[RunRecord]:
    async def read() -> list[RunRecord]:
        store = open_store(url)
        await store.open()
        try:
            return await store.list_runs(workflow=workflow, limit=1000)
        finally:
            await store.close()

    return asyncio.run(read())


def record(url: str, run_id: str) -> RunRecord:
    (found,) = [r for r in records(url) if r.run_id == run_id]
    return found


def call(*args: str, broker: str) -> str:
    done = run_cli("-A", "proj", "call", *args, broker=broker)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def wait_for_line(path: Path, timeout: float = T) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"nothing in {path} after {timeout} s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One ``pyrula worker -A proj`` for the module's tests, on a SQLite file."""
    tmp = tmp_path_factory.mktemp("celery-cli")
    url = f"sqlite:///{tmp / 'proj.db'}"
    workers = Workers(tmp, url)
    try:
        workers.start()
        yield url, tmp
    finally:
        workers.kill_all()


def test_call_then_result_as_celery_prints_them(served: tuple[str, Path]) -> None:
    url, _ = served
    task_id = call("proj.tasks.add", "-a", "[2, 3]", broker=url)
    assert len(task_id) == 36 and record(url, task_id).workflow == "proj.tasks.add"
    done = run_cli("-A", "proj", "result", task_id, broker=url)
    assert (done.returncode, done.stdout) == (0, "5\n")
    # Celery's layout: a list one "* item" a line, a dict as JSON, a string as it is.
    listed = call("proj.tasks.echo", "-k", '{"value": [1, "two"]}', broker=url)
    mapped = call("proj.tasks.echo", "-a", '[{"b": 1, "a": [2]}]', broker=url)
    text = call("proj.tasks.echo", "--args", '["plain"]', "--queue", "q", broker=url)
    assert run_cli("result", listed, "-A", "proj", broker=url).stdout == "* 1\n* two\n"
    dumped = run_cli("result", mapped, "-A", "proj", "--timeout", "30", broker=url).stdout
    assert dumped == '{\n    "a": [\n        2\n    ],\n    "b": 1\n}\n'
    named = run_cli("-A", "proj", "result", text, "-t", "proj.tasks.echo", broker=url)
    assert (named.returncode, named.stdout) == (0, "plain\n")


def test_a_failed_task_prints_its_error_and_its_traceback(served: tuple[str, Path]) -> None:
    url, _ = served
    task_id = call("proj.tasks.fail", "-a", '["kaput"]', broker=url)
    failed = run_cli("-A", "proj", "result", task_id, broker=url)
    assert failed.returncode == 1
    assert failed.stderr == f"Error: task {task_id} FAILURE: ProjError: kaput\n"
    traced = run_cli("-A", "proj", "result", task_id, "--traceback", broker=url)
    assert traced.returncode == 0
    assert "Traceback (most recent call last):" in traced.stdout  # AsyncResult.traceback
    assert ", in fail\n    raise ProjError(message)\n" in traced.stdout
    assert traced.stdout.endswith("proj.tasks.ProjError: kaput\n")
    succeeded = call("proj.tasks.add", "-a", "[1, 1]", broker=url)
    assert run_cli("-A", "proj", "result", succeeded, broker=url).stdout == "2\n"
    none = run_cli("-A", "proj", "result", succeeded, "--traceback", broker=url)
    assert (none.returncode, none.stdout) == (0, "None\n")


def test_waiting_is_bounded_by_timeout(served: tuple[str, Path]) -> None:
    url, _ = served
    unknown = uuid.uuid4().hex
    done = run_cli("-A", "proj", "result", unknown, "--timeout", "0.3", broker=url)
    assert done.returncode == 1
    assert done.stderr.startswith(f"Error: task {unknown} is still PENDING after 0.3 s.")


def test_revoke_a_task_waiting_for_its_countdown(served: tuple[str, Path]) -> None:
    url, _ = served
    later = call("proj.tasks.add", "-a", "[1, 2]", "--countdown", "600", broker=url)
    assert record(url, later).status is RunStatus.QUEUED
    revoked = run_cli("-A", "proj", "control", "revoke", later, broker=url)
    assert (revoked.returncode, revoked.stderr) == (0, "")
    assert revoked.stdout == f"->  store: OK\n        task {later} flagged as revoked\n"
    assert record(url, later).status is RunStatus.CANCELLED
    result = run_cli("-A", "proj", "result", later, broker=url)
    assert (result.returncode, result.stderr) == (
        1,
        f"Error: task {later} REVOKED: TaskRevokedError: revoked\n",
    )
    again = run_cli("-A", "proj", "control", "revoke", later, "-j", broker=url)
    assert again.stdout == f'[{{"store": {{"ok": "task {later} flagged as revoked"}}}}]\n'
    assert f"note: task {later} had ended (REVOKED): left as it is" in again.stderr


def test_terminate_a_running_task(served: tuple[str, Path]) -> None:
    url, tmp = served
    gate, marker = tmp / f"gate-{uuid.uuid4().hex}", tmp / f"marker-{uuid.uuid4().hex}"
    task_id = call("proj.tasks.wait_gate", "-a", f'["{gate}", "{marker}"]', broker=url)
    wait_for_line(marker)
    done = run_cli("-A", "proj", "control", "terminate", "SIGKILL", task_id, broker=url)
    assert done.returncode == 0 and "revoked and terminated" in done.stdout
    assert "SIGKILL: no signal is sent" in done.stderr
    assert record(url, task_id).status is RunStatus.TERMINATED
    gate.write_text("open")  # the stopped body's thread may finish; its result is dropped


def test_bad_input_sends_nothing(served: tuple[str, Path]) -> None:
    url, _ = served
    before = len(records(url))
    for args, message in [
        (["proj.tasks.add", "-a", "[1,"], "-a/--args is not valid JSON"),
        (["proj.tasks.add", "-a", "[1]"], "proj.tasks.add: the arguments do not fit its "
         "signature: proj.tasks.add() missing 1 required positional argument: 'y'"),
        (["proj.tasks.add", "-k", '{"x": 1, "y": 2, "z": 3}'], "unexpected keyword argument"),
    ]:  # fmt: skip
        done = run_cli("-A", "proj", "call", *args, broker=url)
        assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(records(url)) == before
    # A name the app does not register is sent all the same, as send_task sends it.
    unknown = run_cli("-A", "proj", "call", "proj.tasks.not_deployed_yet", broker=url)
    assert unknown.returncode == 0
    assert "no running worker has it registered: it stays queued (PENDING)" in unknown.stderr
    queued = record(url, unknown.stdout.strip())
    assert (queued.workflow, queued.status) == ("proj.tasks.not_deployed_yet", RunStatus.QUEUED)


def test_purge_revokes_waiting_tasks_and_leaves_running_ones(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'purge.db'}"
    workers = Workers(tmp_path, url)
    try:
        worker: WorkerProcess = workers.start("-c", "1")  # one at a time: the rest wait
        gate, marker = tmp_path / "gate", tmp_path / "marker"
        running = call("proj.tasks.wait_gate", "-a", f'["{gate}", "{marker}"]', broker=url)
        wait_for_line(marker)
        due = [call("proj.tasks.add", "-a", f"[{n}, 1]", broker=url) for n in range(3)]
        delayed = [
            call("proj.tasks.mul", "-a", "[2, 2]", "--countdown", "600", broker=url),
            call("proj.tasks.tsum", "-a", "[[1]]", "--eta", "2099-01-01T00:00:00", broker=url),
        ]
        waiting = due + delayed
        refused = run_cli("-A", "proj", "purge", broker=url, stdin="n\n")
        assert refused.returncode == 1 and refused.stderr == "Aborted!\n"
        assert "WARNING: This will revoke every task waiting to start in " in refused.stdout
        assert "Are you sure you want to delete all tasks [y/N]: " in refused.stdout
        assert {record(url, i).status for i in waiting} == {RunStatus.QUEUED}

        purged = run_cli("purge", "-f", "-A", "proj", broker=url)
        assert (purged.returncode, purged.stdout) == (
            0,
            "Purged 5 messages from 1 known task queue.\n",
        )
        assert {record(url, i).status for i in waiting} == {RunStatus.CANCELLED}
        left = record(url, running)
        assert left.status is RunStatus.RUNNING and not left.cancel_requested
        gate.write_text("open")
        result = run_cli("-A", "proj", "result", running, "--timeout", str(T), broker=url)
        assert (result.returncode, result.stdout) == (0, f"{worker.proc.pid}\n")
        for task_id in waiting:  # never started
            assert record(url, task_id).started_at is None
        again = run_cli("-A", "proj", "purge", "-f", broker=url)
        assert again.stdout == "No messages purged from 1 queue.\n"
        # -Q names the app's queue (task_default_queue "default"); -X excludes it.
        more = call("proj.tasks.add", "-a", "[5, 5]", "--countdown", "600", broker=url)
        excluded = run_cli("-A", "proj", "purge", "-f", "-X", "default", broker=url)
        assert excluded.stdout == "No messages purged from 1 queue.\n"
        chosen = run_cli("-A", "proj", "purge", "-f", "-Q", "default,other", broker=url)
        assert chosen.stdout == "Purged 1 message from 1 known task queue.\n"
        assert record(url, more).status is RunStatus.CANCELLED
    finally:
        workers.kill_all()


def test_the_docs_snippet_runs(served: tuple[str, Path]) -> None:
    """docs/coming-from-celery.md's snippet of these commands, run by bash as written."""
    url, _ = served
    snippet = docs_snippets.snippets()[36]
    assert snippet.language == "bash"
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)]),
        "CELERY_BROKER_URL": url,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
    }
    environment.pop("PYRULA_STORE_URL", None)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", snippet.code], cwd=HERE, env=environment,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "4"
    assert lines[1] == "->  store: OK" and lines[2].endswith("flagged as revoked")
    assert lines[3].startswith(("Purged", "No messages purged"))
