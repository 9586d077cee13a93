"""Task lifecycles against real ``pyrula worker -A proj`` processes on
SQLite (the revoke-before-send tests also on Valkey): errbacks and links that raise,
``request.eta``/``expires``, which store ``-A`` serves, the worker-side task signals,
``revoke`` before the task is sent, and names no worker serves.

The workers import ``proj_worker`` (tasks, and receivers that log the signals to a file).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pyrula_compat import Celery, calling, chain, signature, states
from pyrula_compat.exceptions import TaskRevokedError, TimeLimitExceeded, TimeoutError
from pyrula_compat.result import AsyncResult
from tests.compat.conftest import (
    HERE,
    REPO_ROOT,
    Served,
    broker_url,
    lines,
    proj_workers,
    pyrula_command,
    wait_until,
)

pytestmark = pytest.mark.slow
T = 30  # generous result timeout (seconds)


def tasks() -> Any:
    import proj.tasks

    return proj.tasks


def audit() -> Any:
    import proj_worker

    return proj_worker


@pytest.fixture(scope="module")
def served(proj_app: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One worker of ``proj`` + ``proj_worker`` on a SQLite store, logging its signals to
    ``<tmp>/signals``."""
    tmp = tmp_path_factory.mktemp("audit")
    url = f"sqlite:///{tmp / 'proj.db'}"
    with proj_workers(url, tmp, proj_app) as workers:
        worker = workers.start("--workflow", "proj_worker", env=signal_env(tmp))
        yield Served(proj_app, workers, worker, tmp, url)


def signal_env(tmp: Path) -> dict[str, str]:
    return {"SIGNAL_LOG": str(tmp / "signals")}


def signals_of(served: Served, signal: str, task_id: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in lines(str(served.tmp / "signals"))]
    return [s for s in found if s["signal"] == signal and s["id"] == task_id]


def wait_signal(served: Served, signal: str, task_id: str) -> dict[str, Any]:
    found = wait_until(lambda: signals_of(served, signal, task_id), T, f"{signal} {task_id}")
    assert len(found) == 1, found
    return found[0]  # type: ignore[no-any-return]


# -- 1. errbacks and links that raise --------------------------------------------------
def test_an_errback_that_raises_runs_once_and_the_task_keeps_its_failure(served: Served) -> None:
    t, a = tasks(), audit()
    path = served.path("errback")
    result = t.fail.apply_async(("orig",), link_error=a.broken_errback.s(path))
    error = result.get(timeout=T, propagate=False)
    assert isinstance(error, t.ProjError) and error.args == ("orig",)
    assert result.state == states.FAILURE
    time.sleep(1.5)  # the default step retries would have re-run it after 1 s
    assert [json.loads(x) for x in lines(path)] == [{"id": result.id, "state": "FAILURE"}]
    assert f"task proj.tasks.fail[{result.id}]: errback proj_worker.broken_errback raised" in (
        served.worker.stderr
    )
    assert "RuntimeError: errback bug" in served.worker.stderr


def test_a_link_that_raises_leaves_the_task_successful(served: Served) -> None:
    t, a = tasks(), audit()
    path = served.path("link")
    result = t.add.apply_async((1, 2), link=a.broken_link.s(path))
    assert result.get(timeout=T) == 3
    wait_until(lambda: lines(path), T, "the link to run")
    time.sleep(0.5)
    assert lines(path) == ["3"] and result.state == states.SUCCESS


# -- 2. request.eta and request.expires --------------------------------------------------
def test_request_eta_and_expires_are_iso_strings(served: Served) -> None:
    a = audit()
    sent = datetime.now(UTC)
    seen = a.request_times.apply_async(countdown=0.5, expires=60).get(timeout=T)
    eta, expires = datetime.fromisoformat(seen["eta"]), datetime.fromisoformat(seen["expires"])
    assert abs((eta - sent).total_seconds() - 0.5) < 5
    assert abs((expires - sent).total_seconds() - 60) < 5

    at = datetime.now(UTC) + timedelta(seconds=0.3)
    until = datetime(2099, 1, 1, tzinfo=UTC)
    seen = a.request_times.apply_async(eta=at, expires=until).get(timeout=T)
    assert seen["eta"] == at.isoformat() and seen["expires"] == until.isoformat()
    assert a.request_times.delay().get(timeout=T) == {"retries": 0, "eta": None, "expires": None}

    retried = a.request_times.apply_async(kwargs={"retry_after": 0.3}, expires=until)
    seen = retried.get(timeout=T)  # the retry's own eta, the same expiry (as in Celery)
    assert seen["retries"] == 1 and seen["expires"] == until.isoformat()
    assert datetime.fromisoformat(seen["eta"]) > sent


def test_the_same_task_id_with_a_countdown_sent_twice_is_one_run(served: Served) -> None:
    t = tasks()
    task_id = f"twice-{time.time_ns()}"
    first = t.add.apply_async((2, 2), task_id=task_id, countdown=0.2)
    again = t.add.apply_async((2, 2), task_id=task_id, countdown=0.2)  # another eta
    assert again.id == first.id and again.get(timeout=T) == 4


# -- 3. the store `pyrula worker -A` serves ----------------------------------------------
def test_pyrula_store_url_does_not_override_the_apps_broker(served: Served) -> None:
    other = f"sqlite:///{served.tmp / 'other.db'}"
    worker = served.workers.start(env={"PYRULA_STORE_URL": other})
    try:
        assert str(served.tmp / "proj.db") in worker.stdout  # the banner names the store
        assert f"PYRULA_STORE_URL={other} ignored" in worker.stderr
        assert str(served.tmp / "proj.db") in worker.stderr.split("ignored", 1)[1]
    finally:
        assert worker.stop() == 0


def test_store_given_on_the_command_line_is_served_and_used_by_the_app(served: Served) -> None:
    other = f"sqlite:///{served.tmp / 'cli.db'}"
    worker = served.workers.start("--store", other)
    client = Celery("proj", broker=other, set_as_current=False)
    try:
        assert str(served.tmp / "cli.db") in worker.stdout
        path = served.path("cli-link")
        link = signature("proj.tasks.record", args=(path,), app=client)
        link_id = link.freeze().id
        result = client.send_task("proj.tasks.add", (1, 2), link=link)
        assert result.get(timeout=T) == 3
        # the worker queued the link in the store it serves, not in the app's broker
        wait_until(lambda: lines(path), T, "the link queued by the worker to run")
        assert lines(path) == ["3"]
        assert client.client().get_run(link_id) is not None
        assert served.app.client().get_run(link_id) is None
    finally:
        assert worker.stop() == 0


# -- 6. worker-side signals --------------------------------------------------------------
def test_the_worker_sends_celerys_start_up_signals(served: Served) -> None:
    # Receivers connected in proj/celery.py, as projects do: logging set up by app.log,
    # which sends the level as a number, as Celery's does (-l INFO: 20).
    assert signals_of(served, "after_setup_logger", "start") == [
        {"signal": "after_setup_logger", "id": "start", "logger": "root", "loglevel": 20}
    ]
    assert signals_of(served, "after_setup_task_logger", "start") == [
        {"signal": "after_setup_task_logger", "id": "start", "logger": "celery.task",
         "loglevel": 20}
    ]  # fmt: skip
    assert signals_of(served, "celeryd_after_setup", "start") == [
        {"signal": "celeryd_after_setup", "id": "start", "timezone": "UTC"}
    ]


def test_task_received_is_sent_for_each_attempt(served: Served) -> None:
    a = audit()
    result = a.request_times.apply_async(kwargs={"retry_after": 0.2})
    result.get(timeout=T)
    found = wait_until(
        lambda: len(signals_of(served, "task_received", result.id)) == 2 or None, T, "two"
    )
    assert found
    first, second = signals_of(served, "task_received", result.id)
    assert first["sender"] == "AppWorker" and first["name"] == "proj_worker.request_times"
    assert first["task"] == "proj_worker.request_times" and first["eta"] is None
    assert second["eta"] is not None  # the retry's


def test_task_revoked_when_terminated_or_revoked_while_running(served: Served) -> None:
    a = audit()
    gate, marker = served.path("gate"), served.path("marker")
    running = a.gated.delay(gate, marker)
    wait_until(lambda: lines(marker), T, "the task to start")
    running.revoke(terminate=True)
    signal = wait_signal(served, "task_revoked", running.id)
    assert signal == {
        "signal": "task_revoked", "sender": "proj_worker.gated", "id": running.id,
        "terminated": True, "signum": None, "expired": False,
    }  # fmt: skip
    Path(gate).touch()

    gate, marker = served.path("gate"), served.path("marker")
    retrying = a.gated.delay(gate, marker, retry=True)
    wait_until(lambda: lines(marker), T, "the task to start")
    retrying.revoke()  # noticed at its next step boundary, after this attempt
    Path(gate).touch()
    with pytest.raises(TaskRevokedError):
        retrying.get(timeout=T)
    signal = wait_signal(served, "task_revoked", retrying.id)
    assert signal["terminated"] is False and signal["expired"] is False
    assert lines(marker) == ["start 0"]


def test_a_terminated_task_stops_in_its_thread_with_no_success_hooks(served: Served) -> None:
    a = audit()
    marker = served.path("marker")
    running = a.stoppable.delay(marker)
    wait_until(lambda: lines(marker), T, "the task to start")
    running.revoke(terminate=True)
    assert wait_signal(served, "task_revoked", running.id)["terminated"] is True
    with pytest.raises(TaskRevokedError):
        running.get(timeout=T)
    # The body got BodyStopped (a BaseException: its ``except Exception`` let it through)
    # once the worker noticed: no more ticks, no "finished", no on_success.
    time.sleep(0.3)
    ticks = len(lines(marker))
    time.sleep(0.5)
    assert lines(marker) == ["tick"] * ticks


def test_time_limits_given_to_apply_async_apply_to_that_call(served: Served) -> None:
    spin = audit().spin
    assert spin.delay(0.1).get(timeout=T) == "no limit"
    assert spin.apply_async((5,), soft_time_limit=0.3).get(timeout=T) == "soft"
    with pytest.raises(TimeLimitExceeded):
        spin.apply_async((5,), time_limit=0.3).get(timeout=T)
    assert spin.s(5).set(soft_time_limit=0.3).delay().get(timeout=T) == "soft"


def test_inspect_answers_from_the_store(served: Served) -> None:
    from pyrula_compat.app.control import Inspect

    a, t = audit(), tasks()
    gate, marker = served.path("gate"), served.path("marker")
    running = a.gated.delay(gate, marker)
    later = t.add.apply_async((20, 22), countdown=60)
    wait_until(lambda: lines(marker), T, "the task to start")
    inspect = served.app.control.inspect()
    [(node, [request])] = [(n, rs) for n, rs in inspect.active().items() if rs]
    assert request["id"] == running.id and request["name"] == "proj_worker.gated"
    assert request["args"] == [gate, marker] and request["hostname"] == node
    assert request["time_start"] is not None and request["worker_pid"] > 0
    scheduled = inspect.scheduled()["store"]
    [entry] = [e for e in scheduled if e["request"]["id"] == later.id]
    assert entry["request"]["args"] == [20, 22] and entry["eta"] > datetime.now(UTC).isoformat()
    assert all(tasks == [] for tasks in inspect.reserved().values())
    found = Inspect(app=served.app).query_task(running.id, later.id)
    assert found[node] == {running.id: ["active", request]}
    assert found["store"][later.id][0] == "scheduled"
    assert served.app.control.broadcast("ping", reply=True)
    served.app.control.broadcast("revoke", arguments={"task_id": later.id})
    assert later.state == states.REVOKED
    Path(gate).touch()
    assert running.get(timeout=T) == "done"
    with pytest.raises(NotImplementedError, match="no broadcast"):
        served.app.control.broadcast("pool_grow")


def test_inspect_scheduled_lists_a_task_waiting_for_its_retry(served: Served) -> None:
    """Celery's retry is a message with an eta, which ``scheduled()`` lists: here a run
    sleeping until its retry, with the retry's time and arguments."""
    sent = datetime.now(UTC)
    result = audit().retry_later.delay(4)
    wait_until(lambda: result.state == states.RETRY, T, "the retry")
    inspect = served.app.control.inspect()
    [entry] = [e for e in inspect.scheduled()["store"] if e["request"]["id"] == result.id]
    eta = datetime.fromisoformat(entry["eta"])
    assert sent + timedelta(seconds=100) < eta < sent + timedelta(seconds=140)
    assert entry["request"]["name"] == "proj_worker.retry_later"
    assert (entry["request"]["args"], entry["request"]["kwargs"]) == ([40], {})
    found = inspect.query_task(result.id)["store"]
    assert found == {result.id: ["scheduled", entry["request"]]}
    # pyrula -A proj inspect scheduled answers the same (the CLI's inspector is the app's)
    shown = subprocess.run(
        [*pyrula_command(), "-A", "proj", "inspect", "scheduled", "-j", "--store", served.url],
        cwd=HERE, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])},
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    listed = json.loads(shown.stdout)["store"]
    assert [e["request"]["args"] for e in listed if e["request"]["id"] == result.id] == [[40]]
    result.revoke()
    assert result.state == states.REVOKED
    scheduled = inspect.scheduled() or {}
    assert result.id not in [e["request"]["id"] for e in scheduled.get("store", [])]


def test_an_abortable_task_sees_its_abort_and_stops(served: Served) -> None:
    from pyrula_compat.contrib.abortable import AbortableAsyncResult

    marker = served.path("marker")
    result = audit().abortable.delay(marker)
    assert isinstance(result, AbortableAsyncResult)
    wait_until(lambda: lines(marker), T, "the task to start")
    assert not result.is_aborted()
    AbortableAsyncResult(result.id, app=served.app).abort()
    assert result.is_aborted()
    wait_until(lambda: "aborted" in lines(marker), T, "the task to see its abort")
    assert result.get(timeout=T) == "aborted"  # what it returned, as in Celery
    # With a callback too: the task's return is its result, and the callback gets it.
    marker = served.path("marker")
    linked = audit().abortable.apply_async((marker,), link=tasks().echo.s())
    wait_until(lambda: lines(marker), T, "the task to start")
    linked.abort()
    assert linked.get(timeout=T) == "aborted"


def test_task_revoked_when_a_beat_entry_expired(served: Served) -> None:
    client = served.app.client()  # what a beat entry with expires=0 queues, due in 0.5 s
    params = {"args": [1, 2], "kwargs": {}, "expires_in": 0.0}
    handle = client.submit("proj.tasks.add", params, delay=0.5)
    result = AsyncResult(handle.run_id, app=served.app)
    with pytest.raises(TaskRevokedError, match="expired"):
        result.get(timeout=T)
    signal = wait_signal(served, "task_revoked", handle.run_id)
    assert signal["expired"] is True and signal["terminated"] is False


def test_task_revoked_when_a_retry_comes_after_the_expiry(served: Served) -> None:
    path = served.path("attempts")
    result = tasks().retry_until_expired.apply_async((path,), expires=0.5)
    with pytest.raises(TaskRevokedError, match="expired"):
        result.get(timeout=T)
    signal = wait_signal(served, "task_revoked", result.id)
    assert signal["expired"] is True and signal["terminated"] is False
    attempts = len(lines(path))  # no task_received for the retry that was not run
    assert len(signals_of(served, "task_received", result.id)) == attempts


def test_request_hostname_is_the_workers_node_name(served: Served) -> None:
    other = f"sqlite:///{served.tmp / 'named.db'}"
    worker = served.workers.start("--store", other, "-n", "alpha@%h")
    client = Celery("proj", broker=other, set_as_current=False)
    try:
        info = client.send_task("proj.tasks.request_info").get(timeout=T)
        assert info["hostname"] == f"alpha@{socket.gethostname()}"
    finally:
        assert worker.stop() == 0


def test_task_unknown_and_warnings_for_a_name_no_worker_serves(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="pyrula_compat"):
        result = served.app.send_task("proj.audit.nobody", args=(1,))
    assert any(
        "'proj.audit.nobody' sent, but no running worker has it registered" in r.getMessage()
        for r in caplog.records
    )
    with pytest.raises(TimeoutError, match="no running worker has it registered"):
        result.get(timeout=0.3)
    worker = served.workers.start("--workflow", "proj_worker", env=signal_env(served.tmp))
    try:
        signal = wait_signal(served, "task_unknown", result.id)
        assert signal == {
            "signal": "task_unknown", "sender": "AppWorker", "id": result.id,
            "name": "proj.audit.nobody", "exc": "NotRegistered",
        }  # fmt: skip
        assert "unregistered task 'proj.audit.nobody'" in worker.stderr
        assert result.state == states.PENDING  # kept queued, never discarded
    finally:
        assert worker.stop() == 0
    with pytest.raises(TimeoutError) as raised:  # a served name times out plainly
        audit().gated.delay(served.path("never"), served.path("m")).get(timeout=0.01)
    assert "registered" not in str(raised.value)


# -- 7. revoke before the task is sent ---------------------------------------------------
def test_revoke_before_send_discards_the_task(served: Served) -> None:
    t = tasks()
    path = served.path("revoked")
    task_id = f"early-{time.time_ns()}"
    served.app.control.revoke(task_id)
    result = t.record.apply_async((5, path), task_id=task_id)
    assert result.state == states.REVOKED and result.name == "proj.tasks.record"
    with pytest.raises(TaskRevokedError):
        result.get(timeout=T)

    # a chain's later step, revoked by its frozen id before the chain reaches it
    first, second = t.add.s(1, 1), t.record.s(path)
    canvas = chain(first, second)
    canvas.freeze()
    served.app.control.revoke(second.id, terminate=True)
    assert canvas.apply_async().parent.get(timeout=T) == 2
    with pytest.raises(TaskRevokedError):
        AsyncResult(second.id, app=served.app).get(timeout=T)
    time.sleep(1.0)
    assert lines(path) == []  # neither ran


def test_revoke_leaves_a_finished_task_as_it_is(served: Served) -> None:
    result = tasks().add.delay(3, 4)
    assert result.get(timeout=T) == 7
    served.app.control.revoke(result.id)
    assert AsyncResult(result.id, app=served.app).state == states.SUCCESS


@pytest.mark.parametrize("kind", ["sqlite", "valkey"])
def test_revoke_before_send_on_each_store(
    kind: str, proj_app: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """No worker needed: the task sent after its revoke finds the revoked run."""
    url = broker_url(kind, tmp_path, request)
    t = tasks()
    with proj_workers(url, tmp_path, proj_app):
        ids = [f"pre-{kind}-{n}-{time.time_ns()}" for n in range(4)]
        proj_app.control.revoke(ids)
        keyed = t.add.apply_async((1, 2), task_id=ids[0])
        delayed = t.add.apply_async((1, 2), task_id=ids[1], countdown=5)
        by_name = proj_app.send_task("proj.tasks.add", (1, 2), task_id=ids[2])
        frozen = calling.submit(proj_app, "proj.tasks.add", (1, 2), {}, task_id=ids[3], keyed=False)
        for result in (keyed, delayed, by_name, frozen):
            assert result.state == states.REVOKED
            record = proj_app.client().get_run(result.id)
            assert record is not None and record.workflow == "celery.revoked"
        proj_app.control.revoke(ids[0])  # revoking it again changes nothing
        assert keyed.state == states.REVOKED
