"""``delay()`` and ``get()`` from plain sync code against a real ``pyrula worker -A proj``
process: on Valkey they run in the calling thread (the blocking fast path of
``pyrula/workflows/stores/valkey/blocking.py``), on SQLite through the client's loop
thread; both must behave the same. Many threads at once, a ``get()`` whose timeout
expires, a result that arrives while ``get()`` waits, states read on the way, and a
client used before and after ``os.fork``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from pyrula_compat import states
from pyrula_compat.exceptions import TimeoutError
from pyrula_compat.result import AsyncResult
from tests.compat.conftest import Served, wait_until

pytestmark = pytest.mark.slow
T = 30  # generous result timeout (seconds)
WARM_UNKNOWN = "nobody.knows.this"


def tasks() -> Any:  # the project's own module, imported as the worker imports it
    import proj.tasks

    return proj.tasks


@pytest.fixture
def loop_thread_forbidden(served: Served, monkeypatch: pytest.MonkeyPatch) -> bool:
    """On Valkey, after a warm-up (the first call opens the store, the first run of each
    task notes its workflow: both through the loop thread), make any call through the
    client's loop thread fail the test: what follows must take the fast path. Returns
    whether it did so (False on SQLite)."""
    t = tasks()
    assert t.add.delay(1, 1).get(timeout=T) == 2
    assert t.mul.delay(2, 2).get(timeout=T) == 4
    t.limited.delay(served.path("limited")).get(timeout=T)
    with pytest.raises(Exception, match="warm"):
        t.fail.delay("warm").get(timeout=T)
    gate = served.path("gate")
    Path(gate).touch()
    t.wait_gate.delay(gate, served.path("marker")).get(timeout=T)
    served.app.send_task(WARM_UNKNOWN, args=[0])
    client = served.app.client()
    if client._fast is None:
        return False

    def forbidden(coro: Any, timeout: float | None = None) -> Any:
        coro.close()
        raise AssertionError("this call went through the loop thread")

    monkeypatch.setattr(client, "_call", forbidden)
    return True


def test_delay_and_get_in_the_calling_thread(served: Served, loop_thread_forbidden: bool) -> None:
    t = tasks()
    results = [t.add.delay(i, 1) for i in range(40)]
    assert [r.get(timeout=T) for r in results] == [i + 1 for i in range(40)]
    assert all(r.state == states.SUCCESS and r.ready() for r in results)
    # A rate-limited task: its flow control travels in the same create call.
    path = served.path("limited")
    limited = [t.limited.delay(path) for _ in range(3)]
    for result in limited:
        result.get(timeout=T)
    assert len(Path(path).read_text().splitlines()) == 3
    # A failure, read back through the same path.
    failed = t.fail.delay("boom")
    with pytest.raises(Exception, match="boom"):
        failed.get(timeout=T)
    assert failed.state == states.FAILURE
    assert loop_thread_forbidden == served.url.startswith("redis")


def test_many_threads_submit_and_wait_at_once(served: Served, loop_thread_forbidden: bool) -> None:
    t = tasks()
    failures: list[BaseException] = []
    start = threading.Barrier(12)

    def client(n: int) -> None:
        try:
            start.wait(T)
            handles = [t.add.delay(n, i) for i in range(10)]
            for i, handle in enumerate(handles):
                assert handle.get(timeout=T) == n + i
            for i in range(5):  # one at a time: each get() waits for its run
                assert t.mul.delay(n, i).get(timeout=T) == n * i
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(T * 3)
    assert not any(thread.is_alive() for thread in threads)
    assert not failures, failures[0]
    fast = served.app.client()._fast
    if fast is not None and fast._pool is not None:
        # One connection per thread that needed one at the same time, at most.
        assert len(fast._pool._all) <= 13


def test_get_with_a_timeout_that_expires(served: Served, loop_thread_forbidden: bool) -> None:
    gate, marker = served.path("gate"), served.path("marker")
    result = tasks().wait_gate.delay(gate, marker)
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        result.get(timeout=0.5)
    assert 0.45 <= time.monotonic() - began < 15
    assert result.state in (states.PENDING, states.STARTED)
    Path(gate).touch()
    assert result.get(timeout=T) != os.getpid()  # the worker's pid: another process
    assert result.state == states.SUCCESS


def test_a_result_that_arrives_while_get_waits(served: Served, loop_thread_forbidden: bool) -> None:
    gate, marker = served.path("gate"), served.path("marker")
    result = tasks().wait_gate.delay(gate, marker)
    wait_until(lambda: Path(marker).exists(), T, "the task to start")
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(result.get(timeout=T)))
    waiter.start()
    time.sleep(0.3)  # the waiter is blocked on the server now
    assert waiter.is_alive()
    Path(gate).touch()
    waiter.join(T)
    assert got and isinstance(got[0], int) and got[0] != os.getpid()


def test_unknown_id_and_send_task_of_an_unknown_name(
    served: Served, loop_thread_forbidden: bool
) -> None:
    unknown = AsyncResult(uuid.uuid4().hex, app=served.app)
    assert unknown.state == states.PENDING and not unknown.exists()
    with pytest.raises(TimeoutError):
        unknown.get(timeout=0.3)
    queued = served.app.send_task(WARM_UNKNOWN, args=[1])
    with pytest.raises(TimeoutError):
        queued.get(timeout=0.3)
    assert queued.state == states.PENDING and queued.exists()


def test_a_client_used_before_and_after_fork(served: Served) -> None:
    t = tasks()
    assert t.add.delay(20, 1).get(timeout=T) == 21  # the parent's connections are open
    pid = os.fork()
    if pid == 0:  # the child: only os._exit leaves it (never pytest's teardown)
        code = 1
        try:
            results = [t.add.delay(i, 100) for i in range(5)]
            if [r.get(timeout=T) for r in results] == [i + 100 for i in range(5)]:
                code = 0
        except BaseException:
            code = 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    status = None
    while status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(raw)
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child did not finish")
        else:
            time.sleep(0.05)
    assert status == 0
    # The child's connections were its own: the parent's still work.
    assert t.add.delay(30, 1).get(timeout=T) == 31
    assert [t.mul.delay(i, 2).get(timeout=T) for i in range(3)] == [0, 2, 4]
