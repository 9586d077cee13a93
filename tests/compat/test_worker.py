"""The sample project against a real ``pyrula worker -A proj``, on SQLite and Valkey.

Results and states, failures and tracebacks, autoretry and ``self.retry``, countdown
and eta, revoke, expiry, the canvas, links, custom states, hooks, rate limits, soft time
limits, ``send_task`` of a name no worker knows, and many client threads.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from pyrula.workflows.errors import NotJSONSerializable
from pyrula_compat import chain, chord, group, signature, states
from pyrula_compat.exceptions import (
    ChordError,
    MaxRetriesExceededError,
    TaskRevokedError,
    TimeoutError,
)
from pyrula_compat.result import AsyncResult
from tests.compat.conftest import Served, lines, wait_until

pytestmark = pytest.mark.slow
T = 30  # generous result timeout (seconds)


def tasks():  # the project's own module, imported as the worker imports it
    import proj.tasks

    return proj.tasks


def test_delay_get_and_states(served: Served) -> None:
    t = tasks()
    result = t.add.delay(2, 3)
    assert isinstance(result, AsyncResult)
    assert result.get(timeout=T) == 5
    assert result.state == states.SUCCESS == result.status
    assert result.ready() and result.successful() and not result.failed()
    assert result.result == 5 and result.info == 5
    assert result.date_done is not None and result.name == "proj.tasks.add"
    assert result.args == [2, 3] and result.kwargs == {}
    assert AsyncResult(result.id).get(timeout=T) == 5  # no app=: the current app
    assert served.app.AsyncResult(result.id).state == states.SUCCESS
    result.forget()
    assert result.state == states.PENDING and not result.exists()
    unknown = AsyncResult("no-such-task-id")
    assert unknown.state == states.PENDING and not unknown.exists()
    with pytest.raises(TimeoutError):
        unknown.get(timeout=0.3)


def test_running_task_is_started_and_custom_state_is_visible(served: Served) -> None:
    gate = served.path("gate")
    result = tasks().progress.delay(gate)
    wait_until(lambda: result.state == "PROGRESS", T, "the PROGRESS state")
    assert result.info == {"done": 1, "total": 2}
    assert not result.ready()
    open(gate, "w").close()
    assert result.get(timeout=T) == "finished"
    assert result.state == states.SUCCESS


def test_request_fields(served: Served) -> None:
    result = tasks().request_info.apply_async((1, "a"), {"k": True})
    info = result.get(timeout=T)
    assert info["id"] == result.id and info["root_id"] == result.id
    assert info["args"] == [1, "a"] and info["kwargs"] == {"k": True}
    assert info["retries"] == 0 and info["is_eager"] is False
    host = socket.gethostname()
    assert info["hostname"] == f"celery@{host}"  # the worker's node name (no -n given)
    assert info["origin"] == f"gen{os.getpid()}@{host}"  # the process that sent it
    assert "origin" not in (info["headers"] or {})  # a field of its own, as in Celery


def test_get_calls_back_with_the_id_and_the_value(served: Served) -> None:
    t, seen = tasks(), []
    result = t.add.delay(1, 2)
    assert result.get(timeout=T, callback=lambda *a: seen.append(a)) == 3
    failed = t.fail.delay("no")
    with pytest.raises(t.ProjError):  # raised: no call
        failed.get(timeout=T, callback=lambda *a: seen.append(a))
    fresh = AsyncResult(failed.id)
    error = fresh.get(timeout=T, propagate=False, callback=lambda *a: seen.append(a))
    assert isinstance(error, t.ProjError) and seen == [(result.id, 3), (failed.id, error)]
    fresh.get(timeout=T, propagate=False, callback=lambda *a: seen.append(a))
    assert len(seen) == 2  # as in Celery: a result read already, not propagated, no call


def test_dict_keys_become_strings_as_json_dumps_writes_them(served: Served) -> None:
    t = tasks()
    value = {7: "int", 2.5: "float", True: "bool", None: "none", "x": {3: [4]}}
    expected = {"7": "int", "2.5": "float", "true": "bool", "null": "none", "x": {"3": [4]}}
    assert t.echo.delay(value).get(timeout=T) == expected
    assert t.count_lengths.delay(["a", "bb", "cc"]).get(timeout=T) == {"1": 1, "2": 2}
    with pytest.raises(NotJSONSerializable, match="key \\(1, 2\\) of type tuple"):
        t.echo.delay({(1, 2): "a tuple key"})


def test_failure_reraises_the_tasks_own_exception_with_traceback(served: Served) -> None:
    t = tasks()
    result = t.fail.delay("out of stock")
    with pytest.raises(t.ProjError, match="out of stock"):
        result.get(timeout=T)
    assert result.state == states.FAILURE and result.failed()
    assert isinstance(result.result, t.ProjError)
    assert "raise ProjError(message)" in (result.traceback or "")
    returned = result.get(timeout=T, propagate=False)
    assert isinstance(returned, t.ProjError) and str(returned) == "out of stock"


def test_autoretry_with_backoff_then_success(served: Served) -> None:
    result = tasks().flaky.delay(2)
    assert result.get(timeout=T) == 2  # two retries, same task id


def test_autoretry_exhausted_raises_the_original_error(served: Served) -> None:
    result = tasks().flaky.delay(10)  # max_retries=3: 4 attempts, then the error
    with pytest.raises(ConnectionError, match="attempt 3 failed"):
        result.get(timeout=T)


def test_self_retry_keeps_the_id_and_counts_retries(served: Served) -> None:
    result = tasks().retry_manually.delay(2)
    assert result.get(timeout=T) == {"retries": 2, "id": result.id}
    exhausted = tasks().retry_manually.delay(5)
    with pytest.raises(OSError, match="disk busy on try 2"):
        exhausted.get(timeout=T)
    no_exc = tasks().retry_then_give_up.delay()
    with pytest.raises(MaxRetriesExceededError):
        no_exc.get(timeout=T)


def test_retry_with_throw_false_runs_again_with_new_args(served: Served) -> None:
    assert tasks().retry_without_raising.delay(4).get(timeout=T) == 40


def test_inspect_ping_answers_from_worker_heartbeats(served: Served) -> None:
    replies = wait_until(lambda: served.app.control.inspect().ping(), T, "a heartbeat")
    assert all(reply == {"ok": "pong"} for reply in replies.values())
    # app.control.ping with a destination asks only the workers it names.
    worker = next(iter(replies))
    assert served.app.control.ping(destination=[worker]) == [{worker: {"ok": "pong"}}]
    assert served.app.control.ping(destination=["celery@no-such-host"]) == []


def test_state_is_retry_while_waiting_for_the_next_attempt(served: Served) -> None:
    result = tasks().retry_manually.delay(1, countdown=3)
    wait_until(lambda: result.state == states.RETRY, T, "the RETRY state")
    assert isinstance(result.info, OSError)
    assert result.get(timeout=T)["retries"] == 1


def test_countdown_and_eta(served: Served) -> None:
    t = tasks()
    started = time.monotonic()
    delayed = t.add.apply_async((1, 1), countdown=1.5)
    assert delayed.state == states.PENDING
    eta = datetime.now(UTC) + timedelta(seconds=1.5)
    at_eta = t.add.apply_async((2, 2), eta=eta)
    assert delayed.get(timeout=T) == 2 and at_eta.get(timeout=T) == 4
    assert time.monotonic() - started >= 1.4


def test_task_id_is_idempotent(served: Served) -> None:
    t = tasks()
    first = t.add.apply_async((3, 4), task_id=f"order-{time.time_ns()}")
    again = t.add.apply_async((3, 4), task_id=first.id)
    assert again.id == first.id and first.get(timeout=T) == 7
    # Dicts reach the task in the order sent (and back); the same dict in another order
    # is the same submission for a repeated task_id.
    sent = t.echo.apply_async(({"b": 1, "a": {"z": 2, "c": 3}},), task_id=f"echo-{first.id}")
    assert list(sent.get(timeout=T)) == ["b", "a"] and list(sent.get()["a"]) == ["z", "c"]
    repeat = t.echo.apply_async(({"a": {"c": 3, "z": 2}, "b": 1},), task_id=sent.id)
    assert repeat.id == sent.id


def test_revoke_queued_running_and_terminate(served: Served) -> None:
    t = tasks()
    queued = t.add.apply_async((1, 2), countdown=30)
    queued.revoke()
    assert queued.state == states.REVOKED
    with pytest.raises(TaskRevokedError, match="revoked"):
        queued.get(timeout=T)
    served.app.control.revoke("no-such-id")  # remembered: see test_worker_task_lifecycle.py

    gate, marker = served.path("gate"), served.path("marker")
    running = t.wait_gate.delay(gate, marker)
    wait_until(lambda: lines(marker), T, "the task to start")
    running.revoke(terminate=True)
    assert running.state == states.REVOKED
    with pytest.raises(TaskRevokedError):
        running.get(timeout=T)
    open(gate, "w").close()


def test_expires_revokes_a_task_not_started_in_time(served: Served) -> None:
    result = tasks().add.apply_async((1, 2), countdown=2, expires=0.5)
    with pytest.raises(TaskRevokedError, match="expired"):
        result.get(timeout=T)
    assert result.state == states.REVOKED


def test_a_retry_due_after_the_tasks_expiry_never_runs(served: Served) -> None:
    t = tasks()
    for task in (t.retry_until_expired, t.autoretry_until_expired):  # countdowns of 0.3 s
        path = served.path("attempts")
        result = task.apply_async((path,), expires=1.0)
        with pytest.raises(TaskRevokedError, match="expired"):
            result.get(timeout=T)
        assert result.state == states.REVOKED
        attempts = lines(path)
        assert attempts == [str(n) for n in range(len(attempts))] and 1 <= len(attempts) <= 5
        time.sleep(0.5)
        assert lines(path) == attempts


def test_chain_passes_results_and_links_parents(served: Served) -> None:
    t = tasks()
    result = chain(t.add.s(1, 2), t.add.s(10), t.mul.s(2))()
    assert result.get(timeout=T) == 26
    assert result.parent.get(timeout=T) == 13 and result.parent.parent.get(timeout=T) == 3
    piped = (t.add.s(2, 2) | t.mul.si(5, 5) | t.add.s(1)).apply_async()
    assert piped.get(timeout=T) == 26


def test_chain_failure_stops_it_and_get_raises_the_original(served: Served) -> None:
    t = tasks()
    path = served.path("after")
    result = chain(t.add.s(1, 1), t.fail.si("broken"), t.record.s(path))()
    with pytest.raises(t.ProjError, match="broken"):
        result.get(timeout=T)
    assert result.state == states.FAILURE  # the rest is marked failed, never run
    assert lines(path) == []
    # ... with the failed task's traceback, as Celery marks them (not the re-raise's)
    assert "raise ProjError(message)" in (result.traceback or "")
    assert result.traceback == result.parent.traceback
    assert result.parent.parent.get(timeout=T) == 2


def test_request_chain_none_stops_the_chain(served: Served) -> None:
    t = tasks()
    path = served.path("never")
    result = chain(t.stop_chain.s(5), t.record.s(path))()
    assert result.parent.get(timeout=T) == 5
    time.sleep(0.5)
    assert result.state == states.PENDING and lines(path) == []


def test_group_and_partial_signatures(served: Served) -> None:
    t = tasks()
    res = group(t.add.s(i, i) for i in range(6))()
    assert res.get(timeout=T) == [0, 2, 4, 6, 8, 10]
    assert res.completed_count() == 6 and res.successful()
    assert group(t.add.s(4), t.mul.s(4))(6).get(timeout=T) == [10, 24]
    assert t.add.s(4).delay(6).get(timeout=T) == 10
    assert signature("proj.tasks.add", args=(1, 2)).delay().get(timeout=T) == 3
    mixed = group(t.add.s(1, 1), t.fail.s("one bad"))()
    values = mixed.get(timeout=T, propagate=False)
    assert values[0] == 2 and isinstance(values[1], t.ProjError)
    assert mixed.failed() and mixed.completed_count() == 1


def test_chord_both_forms_and_group_piped_into_a_task(served: Served) -> None:
    t = tasks()
    assert chord((t.add.s(i, i) for i in range(5)), t.tsum.s())().get(timeout=T) == 20
    assert chord([t.mul.s(2, 3), t.mul.s(4, 5)])(t.tsum.s()).get(timeout=T) == 26
    assert (group(t.add.s(1, 1), t.add.s(2, 2)) | t.tsum.s())().get(timeout=T) == 6
    assert chord([], t.tsum.s())().get(timeout=T) == 0
    in_chain = chain(t.add.s(1, 1), group(t.add.s(1), t.mul.s(10)), t.tsum.s())()
    assert in_chain.get(timeout=T) == 23


def test_a_chord_header_may_hold_groups_and_chords(served: Served) -> None:
    t = tasks()
    nested = group(t.add.s(2, 2), t.add.s(3, 3))
    inner = chord([t.add.s(1, 1), t.add.s(1, 2)], t.tsum.s())
    result = chord([t.add.s(1, 1), nested, inner], t.echo.s())()
    assert result.get(timeout=T) == [2, [4, 6], 5]  # a group's list, a chord's body result
    broken = chord([t.add.s(1, 1), group(t.fail.s("deep"), t.add.s(1, 1))], t.echo.s())()
    with pytest.raises(ChordError):
        broken.get(timeout=T, follow_parents=False)


def test_failed_chord_header_fails_the_body_with_chord_error(served: Served) -> None:
    t = tasks()
    result = chord([t.add.s(1, 1), t.fail.s("header broke")], t.tsum.s())()
    with pytest.raises(t.ProjError, match="header broke"):
        result.get(timeout=T)  # follow_parents: the header's own error first
    with pytest.raises(ChordError, match="header broke"):
        result.get(timeout=T, follow_parents=False)
    assert result.state == states.FAILURE


def test_link_and_link_error(served: Served) -> None:
    t = tasks()
    linked, errors = served.path("linked"), served.path("errors")
    assert t.add.apply_async((2, 3), link=t.record.s(linked)).get(timeout=T) == 5
    wait_until(lambda: lines(linked), T, "the link to run")
    assert json.loads(lines(linked)[0]) == 5
    failed = t.fail.apply_async(("bad",), link_error=t.record_error.s(errors))
    with pytest.raises(t.ProjError):
        failed.get(timeout=T)
    wait_until(lambda: lines(errors), T, "the errback to run")
    assert json.loads(lines(errors)[0]) == {"id": failed.id, "error": "ProjError('bad')"}


def test_hooks_on_a_base_class(served: Served) -> None:
    t = tasks()
    ok, bad = served.path("ok"), served.path("bad")
    assert t.hooked.delay(3, path=ok).get(timeout=T) == 3
    assert lines(ok) == ["success 3", "after_return SUCCESS"]
    with pytest.raises(ValueError):
        t.hooked.delay(-1, path=bad).get(timeout=T)
    assert lines(bad) == ["failure ValueError", "after_return FAILURE"]


def test_rate_limit_is_shared_by_every_worker(served: Served) -> None:
    path = served.path("rate")
    results = [tasks().limited.delay(path) for _ in range(6)]
    for result in results:
        result.get(timeout=T)
    stamps = sorted(float(x) for x in lines(path))
    assert stamps[-1] - stamps[0] >= 0.8  # 6 starts at 5/s need at least a second


def test_soft_time_limit_is_raised_inside_the_body(served: Served) -> None:
    assert tasks().cooperative_loop.delay().get(timeout=T) == "cleaned up"


def test_datetimes_round_trip_like_kombu_json(served: Served) -> None:
    moment = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)
    assert tasks().echo.delay({"at": moment, "pair": (1, 2)}).get(timeout=T) == {
        "at": moment,
        "pair": [1, 2],
    }


def test_unknown_task_name_stays_queued_until_a_worker_knows_it(served: Served) -> None:
    result = served.app.send_task("proj.extra.shout", args=("hi",))
    time.sleep(1.0)
    assert result.state == states.PENDING and result.exists()
    extra = served.workers.start("--workflow", "proj_extra")
    try:
        assert result.get(timeout=T) == "HI!"
    finally:
        extra.stop()


def test_many_client_threads(served: Served) -> None:
    t = tasks()
    failures: list[BaseException] = []

    def client(n: int) -> None:
        try:
            for i in range(5):
                assert t.add.delay(n, i).get(timeout=T) == n + i
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(T * 2)
    assert not failures
