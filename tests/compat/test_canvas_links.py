"""Callbacks and errbacks on a chain, group or chord go where Celery 5 puts them: a
chain's ``link`` on its last task and ``link_error`` on every task; a group's errback on
every member (``link=``/``link_error=`` on ``group.apply_async`` raise TypeError); a
chord's on its body, whose errback gets the ChordError when the header fails. Arguments
are checked at the call site for the tasks a canvas sends at once. Eagerly, and on a
real worker (SQLite)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from pyrula_compat import Celery, chain, chord, group
from pyrula_compat.canvas import Signature
from pyrula_compat.exceptions import ChordError
from pyrula_compat.result import AsyncResult
from pyrula_compat.utils import uuid
from tests.compat.conftest import Served, lines, wait_until

T = 30


@pytest.fixture(scope="module")
def store_kind() -> str:
    return "sqlite"  # where callbacks go is the canvas's business, not the store's


# -- eager ---------------------------------------------------------------------------------
@pytest.fixture
def t(app: Any) -> Any:
    class Tasks:
        seen: list[Any] = []
        errors: list[tuple[str, str]] = []

    @app.task
    def add(x, y):
        return x + y

    @app.task
    def fail(message):
        raise ValueError(message)

    @app.task
    def tsum(numbers):
        return sum(numbers)

    @app.task
    def rec(value):
        Tasks.seen.append(value)

    @app.task
    def err(request, exc, traceback):
        Tasks.errors.append((request.id, repr(exc)))

    for name, task in {"add": add, "fail": fail, "tsum": tsum, "rec": rec, "err": err}.items():
        setattr(Tasks, name, task)
    return Tasks


def test_eager_chain_link_runs_once_with_the_last_result(t: Any) -> None:
    assert chain(t.add.s(1, 1), t.add.s(10)).apply_async(link=t.rec.s()).get() == 12
    c = chain(t.add.s(1, 1), t.add.s(10), t.add.s(100))
    assert c.link(t.rec.s()) is not None
    assert c.delay().get() == 112
    assert t.seen == [12, 112]


def test_eager_chain_errback_is_on_every_task_and_runs_once_for_the_failing_one(t: Any) -> None:
    c = chain(t.add.s(1, 1), t.fail.si("mid"), t.add.s(1))
    with pytest.raises(ValueError, match="mid"):
        c.apply_async(link_error=t.err.s())
    assert [e for _, e in t.errors] == ["ValueError('mid')"]


def test_eager_chord_link_and_errback_go_to_the_body(t: Any) -> None:
    c = chord([t.add.s(1, 1), t.add.s(2, 2)], t.tsum.s())
    assert c.apply_async(link=t.rec.s()).get() == 6
    assert t.seen == [6]
    body = t.fail.s()
    chord([t.add.s(1, 1)], body).apply_async(link_error=t.err.s())
    assert [e for _, e in t.errors] == ["ValueError([2])"]


def test_on_error_returns_the_signature_and_attaches_the_errback(t: Any) -> None:
    sig = t.fail.s("x")
    assert sig.on_error(t.err.s()) is sig
    assert sig.options["link_error"][0]["task"] == t.err.name
    result = sig.delay()
    assert result.state == "FAILURE" and [e for _, e in t.errors] == ["ValueError('x')"]
    assert t.errors[0][0] == result.id


def test_group_link_and_link_error_as_celery_has_them(t: Any) -> None:
    g = group(t.add.s(1, 1), t.add.s(2, 2))
    with pytest.raises(TypeError, match="use a chord"):
        g.apply_async(link=t.rec.s())
    with pytest.raises(TypeError, match="individual tasks"):
        g.apply_async(link_error=t.err.s())
    g.link(t.rec.s())  # the first member, made immutable
    first, second = g.tasks
    assert [s["immutable"] for s in first.options["link"]] == [True]
    assert "link" not in second.options
    errbacks = g.link_error(t.err.s())
    assert len(errbacks) == 2 and all(m.options["link_error"] for m in g.tasks)
    c = chord([t.add.s(1, 1)], t.tsum.s())
    assert c.on_error(t.err.s()) is c and c.body is not None
    assert c.body.options["link_error"][0]["task"] == t.err.name


def test_arguments_are_checked_for_the_tasks_a_canvas_sends_at_once() -> None:
    app = Celery("typingproj", broker="memory://", set_as_current=False)

    @app.task
    def add(x, y):
        return x + y

    @app.task
    def tsum(numbers):
        return sum(numbers)

    @app.task(typing=False)
    def loose(x, y):
        return x + y

    with pytest.raises(TypeError, match="takes 2 positional arguments but 3 were given"):
        chain(add.s(1, 2, 3), add.s(1))()
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        chain(add.s(1), add.s(1)).apply_async()  # the first task, with no argument given
    with pytest.raises(TypeError):
        group(add.s(1), add.s(1, 2))()
    with pytest.raises(TypeError):
        chord([add.s(1)], tsum.s())()
    with pytest.raises(TypeError):
        chain(group(add.s(1, 2, 3)), tsum.s())()  # a chord first: its header
    # the partial arguments count; later steps and the body are sent later, by a worker
    assert chain(add.s(1), add.s(1, 2, 3)).apply_async((1,)) is not None
    assert group(add.s(1), add.s(2)).apply_async((1,)) is not None
    assert chord([add.s(1, 1)], add.s(1, 2, 3))() is not None
    assert group(loose.s(1)).apply_async() is not None  # typing off for that task


# -- on a worker ---------------------------------------------------------------------------
def tasks() -> Any:
    import proj.tasks

    return proj.tasks


def _records(path: str, count: int = 1) -> list[Any]:
    wait_until(lambda: len(lines(path)) >= count, T, f"{count} line(s) in {path}")
    return [json.loads(line) for line in lines(path)]


def _settled(result: AsyncResult) -> None:
    wait_until(lambda: result.state in ("SUCCESS", "FAILURE"), T, f"{result.id} finished")


@pytest.mark.slow
def test_chain_link_runs_once_with_the_last_result(served: Served) -> None:
    t = tasks()
    p = served.path("chainlink")
    result = chain(t.add.s(1, 1), t.add.s(10)).apply_async(link=t.record.s(p))
    assert result.get(timeout=T) == 12
    q = served.path("chainlinkmethod")
    c = chain(t.add.s(1, 1), t.add.s(10), t.add.s(100))
    c.link(t.record.s(q))
    assert c.delay().get(timeout=T) == 112
    assert _records(q) == [112]
    assert _records(p) == [12]  # once: the first step's result is nowhere


@pytest.mark.slow
def test_chain_errback_runs_once_for_the_task_that_failed(served: Served) -> None:
    t = tasks()
    for how in ("method", "option"):
        p = served.path(f"chainerr-{how}")
        c = chain(t.add.s(1, 1), t.fail.si(f"mid-{how}"), t.add.s(1))
        if how == "method":
            c.link_error(t.record_error.s(p))
            result = c.apply_async()
        else:
            result = c.apply_async(link_error=t.record_error.s(p))
        with pytest.raises(Exception, match=f"mid-{how}"):
            result.get(timeout=T)
        _settled(result)  # the step after the failure is recorded failed too
        (record,) = _records(p)
        assert record["id"] == result.parent.id and f"mid-{how}" in record["error"]


@pytest.mark.slow
def test_group_errback_runs_for_the_member_that_failed(served: Served) -> None:
    t = tasks()
    p = served.path("grouperr")
    g = group(t.add.s(1, 1), t.fail.s("member"))
    g.link_error(t.record_error.s(p))
    result = g.apply_async()
    values = result.get(timeout=T, propagate=False)
    assert values[0] == 2 and "member" in repr(values[1])
    (record,) = _records(p)
    assert record["id"] == result.results[1].id


@pytest.mark.slow
def test_chord_link_errback_and_countdown_apply_to_the_body(served: Served) -> None:
    t = tasks()
    p, q = served.path("chordlink"), served.path("chorderr")
    started = time.monotonic()
    c = chord([t.add.s(1, 1), t.add.s(2, 2)], t.tsum.s())
    result = c.apply_async(link=t.record.s(p), link_error=t.record_error.s(q), countdown=1.5)
    assert result.get(timeout=T) == 6
    assert time.monotonic() - started >= 1.5  # held back, not run at once
    assert _records(p) == [6] and lines(q) == []


@pytest.mark.slow
def test_chord_body_errback_gets_the_chord_error_when_the_header_fails(
    served: Served,
) -> None:
    t = tasks()
    p = served.path("bodyerr")
    old_id = uuid()
    body = t.tsum.s().on_error(t.record_error.s(p))
    body.link_error(t.echo.s().set(task_id=old_id))  # old style: called with the body's id
    result = chord([t.add.s(1, 1), t.fail.s("header")], body)()
    with pytest.raises(ChordError):
        result.get(timeout=T, follow_parents=False)
    (record,) = _records(p)
    assert record["id"] == result.id and record["error"].startswith("ChordError(")
    assert "header" in record["error"]
    assert AsyncResult(old_id, app=served.app).get(timeout=T) == result.id


@pytest.mark.slow
def test_chain_errback_reaches_a_chord_body_as_the_chord_error(served: Served) -> None:
    t = tasks()
    p = served.path("chainchord")
    c = chain(group(t.add.s(1, 1), t.fail.si("in header")), t.tsum.s())
    result = c.apply_async(link_error=t.record_error.s(p))
    with pytest.raises(ChordError):
        result.get(timeout=T, follow_parents=False)
    (record,) = _records(p)  # once: the header tasks have none (Celery's default)
    assert record["id"] == result.id and "in header" in record["error"]


@pytest.mark.slow
def test_on_error_sends_the_task_with_its_errback(served: Served) -> None:
    t = tasks()
    p = served.path("onerror")
    result = t.fail.s("direct").on_error(t.record_error.s(p)).delay()
    assert isinstance(result, AsyncResult) and result.name == t.fail.name
    with pytest.raises(Exception, match="direct"):
        result.get(timeout=T)
    (record,) = _records(p)
    assert record["id"] == result.id


def test_signature_round_trip_keeps_attached_errbacks(t: Any, app: Any) -> None:
    c = chord([t.add.s(1, 1)], t.tsum.s())
    c.link_error(t.err.s())
    again = Signature.from_dict(json.loads(json.dumps(c.as_json())), app)
    assert isinstance(again, chord) and again.body is not None
    assert again.body.options["link_error"][0]["task"] == t.err.name
