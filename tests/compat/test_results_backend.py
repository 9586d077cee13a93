"""``AsyncResult.children``/``collect()``, ``app.backend``, ``task_store_eager_result``
and ``task_revoked`` for tasks revoked before a worker took them, against a real
``pyrula worker -A proj`` (with ``proj_worker``'s signal receivers) on SQLite and Valkey.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pyrula.workflows import InvalidRunState
from pyrula_compat import chain, states
from pyrula_compat.exceptions import IncompleteStream, TaskRevokedError, TimeoutError
from pyrula_compat.result import AsyncResult, GroupResult
from pyrula_compat.utils import uuid
from tests.compat.conftest import (
    HERE,
    REPO_ROOT,
    Served,
    broker_url,
    lines,
    proj_workers,
    wait_until,
)

pytestmark = pytest.mark.slow
T = 30


def tasks() -> Any:
    import proj.tasks

    return proj.tasks


@pytest.fixture(scope="module")
def served(
    store_kind: str,
    proj_app: Any,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Served]:
    """A worker of ``proj`` + ``proj_worker`` logging its task signals to ``<tmp>/signals``."""
    tmp = tmp_path_factory.mktemp(f"backend-{store_kind}")
    url = broker_url(store_kind, tmp, request)
    with proj_workers(url, tmp, proj_app) as workers:
        env = {"SIGNAL_LOG": str(tmp / "signals")}
        worker = workers.start("--workflow", "proj_worker", env=env)
        yield Served(proj_app, workers, worker, tmp, url)


def revoked_signals(served: Served, task_id: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in lines(str(served.tmp / "signals"))]
    return [s for s in found if s["signal"] == "task_revoked" and s["id"] == task_id]


# -- AsyncResult.children and collect() --------------------------------------------------
def test_children_are_the_tasks_a_task_sent_from_its_body(served: Served) -> None:
    t = tasks()
    result = t.fan_out.delay(3)
    assert result.get(timeout=T) == 3
    children = result.children
    assert children is not None and len(children) == 3
    assert all(type(child) is AsyncResult for child in children)
    assert [child.get(timeout=T) for child in children] == [0, 2, 4]
    assert [child.name for child in children] == ["proj.tasks.add"] * 3
    # collect(): this result, then its children, each with its value (waits for each)
    assert [(r.id, v) for r, v in result.collect(timeout=T)] == [
        (result.id, 3),
        *((c.id, 2 * i) for i, c in enumerate(children)),
    ]
    # any process can rebuild them from the id alone
    assert AsyncResult(result.id, app=served.app).children == children
    leaf = AsyncResult(children[0].id, app=served.app)
    assert leaf.children == []


def test_a_group_sent_from_a_body_is_one_child_and_collect_walks_into_it(served: Served) -> None:
    t = tasks()
    result = t.fan_out.delay(2, "group")
    assert result.get(timeout=T) == 2
    (child,) = result.children
    assert isinstance(child, GroupResult) and len(child) == 2
    collected = [value for _, value in result.collect(timeout=T)]
    assert collected == [2, [0, 2], 0, 2]


def test_add_to_parent_false_and_add_trail(served: Served) -> None:
    result = tasks().fan_out.delay(1, "trail")
    assert result.get(timeout=T) == 1
    assert [child.id for child in result.children] == [f"{result.id}-manual"]


def test_children_include_the_links_and_the_chains_next_step(served: Served) -> None:
    t = tasks()
    linked = t.add.apply_async((1, 1), link=t.mul.s(3))
    assert linked.get(timeout=T) == 2
    (callback,) = linked.children
    assert callback.get(timeout=T) == 6
    last = chain(t.add.s(1, 2), t.add.s(10), t.mul.s(2))()
    assert last.get(timeout=T) == 26
    first = last.parent.parent
    assert AsyncResult(first.id, app=served.app).children == [last.parent]
    assert last.parent.children == [last] and last.children == []


def test_children_is_none_until_the_task_ended_and_iterdeps_stops_there(served: Served) -> None:
    t = tasks()
    queued = t.slow.apply_async((0,), countdown=30)
    assert queued.children is None
    queued.revoke()
    result = t.fan_out.delay(3, "slow")  # its child sleeps 3 s
    assert result.get(timeout=T) == 3
    with pytest.raises(IncompleteStream):
        list(result.iterdeps())  # the child is not ready
    assert [node for _, node in result.iterdeps(intermediate=True)] == [result, *result.children]


# -- app.backend ------------------------------------------------------------------------
def test_backend_get_task_meta_as_celery_returns_it(served: Served) -> None:
    t, backend = tasks(), served.app.backend
    result = t.fan_out.delay(1)
    meta = backend.wait_for(result.id, timeout=T)
    (child,) = result.children
    assert meta == {
        "status": "SUCCESS", "result": 1, "traceback": None, "task_id": result.id,
        "children": [[[child.id, None], None]], "date_done": meta["date_done"],
    }  # fmt: skip
    assert meta["date_done"] == result.date_done.isoformat()
    assert backend.get_status(result.id) == backend.get_state(result.id) == states.SUCCESS
    assert backend.get_result(result.id) == 1
    failed = t.fail.delay("bad")
    meta = backend.wait_for(failed.id, timeout=T)
    assert meta["status"] == states.FAILURE and isinstance(meta["result"], t.ProjError)
    assert "ProjError: bad" in meta["traceback"] and meta["children"] == []
    assert backend.get_task_meta(uuid()) == {"status": "PENDING", "result": None}
    with pytest.raises(TimeoutError):
        backend.wait_for(t.slow.delay(2).id, timeout=0.2)
    bound = AsyncResult(result.id, backend=backend)  # the backend names the app
    assert bound.app is served.app and bound.get(timeout=T) == 1
    assert result.backend is backend
    backend.forget(result.id)
    assert backend.get_status(result.id) == states.PENDING


def test_backend_store_result_is_kept_in_the_store(served: Served) -> None:
    t, backend = tasks(), served.app.backend
    # inside a running task, for its own id: its progress (fan_out checks it reads back)
    assert t.fan_out.delay(0).get(timeout=T) == 0
    task_id = uuid()
    backend.store_result(task_id, {"imported": True}, states.SUCCESS)
    assert AsyncResult(task_id, app=served.app).get(timeout=T) == {"imported": True}
    backend.store_result(task_id, ValueError("replaced"), states.FAILURE)  # overwrites
    with pytest.raises(ValueError, match="replaced"):
        AsyncResult(task_id, app=served.app).get(timeout=T)
    assert other_process(served, task_id) == {"state": "FAILURE", "result": "replaced"}
    queued = t.slow.apply_async((0,), countdown=30)
    with pytest.raises(InvalidRunState):
        backend.store_result(queued.id, 1, states.SUCCESS)  # its worker records it
    queued.revoke()
    with pytest.raises(ValueError):
        backend.store_result(uuid(), {"done": 1}, "PROGRESS")  # not from inside the task


# -- task_store_eager_result ------------------------------------------------------------
def test_task_store_eager_result_keeps_eager_results_in_the_store(served: Served) -> None:
    t, conf = tasks(), served.app.conf
    conf.task_always_eager = True
    try:
        plain = t.add.delay(1, 1)
        conf.task_store_eager_result = True
        stored = t.add.delay(2, 2)
        failed = t.fail.delay("eager")
    finally:
        conf.task_always_eager = False
        conf.task_store_eager_result = False
    assert plain.get() == 2 and not AsyncResult(plain.id, app=served.app).exists()
    assert other_process(served, stored.id) == {"state": "SUCCESS", "result": 4}
    assert other_process(served, failed.id) == {"state": "FAILURE", "result": "eager"}
    again = AsyncResult(stored.id, app=served.app)
    assert (again.name, again.args, again.date_done is not None) == ("proj.tasks.add", [2, 2], True)


def other_process(served: Served, task_id: str) -> dict[str, Any]:
    """The task's state and result (an exception's message) read by another process."""
    code = (
        "import json, proj\n"
        f"r = proj.celery_app.AsyncResult({task_id!r})\n"
        "v = r.get(timeout=10, propagate=False)\n"
        "print(json.dumps({'state': r.state, 'result': str(v) if r.failed() else v}))\n"
    )
    env = {**os.environ, "CELERY_BROKER_URL": served.url}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO_ROOT)])
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=HERE, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- task_revoked for tasks no worker held ----------------------------------------------
def test_task_revoked_is_sent_by_a_worker_for_a_task_revoked_while_queued(served: Served) -> None:
    t = tasks()
    queued = t.add.apply_async((1, 2), countdown=60)
    queued.revoke()
    queued.revoke()  # twice: one signal
    signal = wait_until(lambda: revoked_signals(served, queued.id), T, "task_revoked")
    assert signal == [{
        "signal": "task_revoked", "sender": "proj.tasks.add", "id": queued.id,
        "terminated": False, "signum": None, "expired": False, "args": [1, 2],
    }]  # fmt: skip
    # terminate=True of a task no worker holds: revoked, not terminated (as Celery)
    delayed = t.mul.apply_async((3, 4), countdown=60)
    delayed.revoke(terminate=True)
    signal = wait_until(lambda: revoked_signals(served, delayed.id), T, "task_revoked")
    assert signal[0]["terminated"] is False and signal[0]["args"] == [3, 4]
    # an id revoked before the task was sent: the worker that would have run it says so
    early = uuid()
    served.app.control.revoke(early)
    discarded = t.add.apply_async((5, 6), task_id=early)
    assert discarded.state == states.REVOKED
    signal = wait_until(lambda: revoked_signals(served, early), T, "task_revoked")
    assert signal[0]["sender"] == "proj.tasks.add" and signal[0]["args"] == [5, 6]
    time.sleep(1.0)
    assert len(revoked_signals(served, queued.id)) == 1
    assert len(revoked_signals(served, early)) == 1


def test_task_revoked_is_sent_by_the_worker_that_finds_a_task_expired(served: Served) -> None:
    """A task still queued at its ``expires`` (due after it, or expired when sent) is
    ended by the claim that finds it, and that worker sends ``task_revoked(expired=True)``
    for it, once, as Celery's worker does when it receives the expired message."""
    t = tasks()
    late = t.add.apply_async((7, 8), countdown=0.5, expires=0.2)
    dead = t.mul.apply_async((2, 5), expires=-1)  # expired already when sent
    for result in (late, dead):
        with pytest.raises(TaskRevokedError, match="expired"):
            result.get(timeout=T)
        assert result.state == states.REVOKED
    signal = wait_until(lambda: revoked_signals(served, late.id), T, "task_revoked")
    assert signal == [{
        "signal": "task_revoked", "sender": "proj.tasks.add", "id": late.id,
        "terminated": False, "signum": None, "expired": True, "args": [7, 8],
    }]  # fmt: skip
    signal = wait_until(lambda: revoked_signals(served, dead.id), T, "task_revoked")
    assert signal[0]["sender"] == "proj.tasks.mul" and signal[0]["expired"] is True
    assert signal[0]["args"] == [2, 5] and signal[0]["terminated"] is False
    time.sleep(1.0)
    assert len(revoked_signals(served, late.id)) == 1
    assert len(revoked_signals(served, dead.id)) == 1
    assert "on_expired" not in served.worker.stderr  # the hook did not fail
