"""Argument and option errors at the call site name the task and the option, at least as
clearly as Celery 5.7's, and nothing is stored: a keyword the body does not take, args
that are no list or tuple, kwargs that are no mapping, a countdown, eta or expires of the
wrong type, and NaN or infinite times (which Celery refuses too)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunRecord, open_store
from pyrula_compat import Celery


def runs(url: str) -> list[RunRecord]:
    async def read() -> list[RunRecord]:
        store = open_store(url)
        await store.open()
        try:
            return await store.list_runs(limit=100)
        finally:
            await store.close()

    return asyncio.run(read())


@pytest.fixture
def stored(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path / 'calls.db'}"
    app = Celery("calls", broker=url, set_as_current=False)

    @app.task(name="calls.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="calls.flexible")
    def flexible(x: int, *rest: int, scale: int, **extra: int) -> int:
        return x

    yield app, add, flexible, url
    app.close()


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda t, a: t.delay(1, z=3), TypeError,
         "calls.add() got an unexpected keyword argument 'z'"),
        (lambda t, a: t.delay(1), TypeError,
         "calls.add() missing 1 required positional argument: 'y'"),
        (lambda t, a: t.delay(), TypeError,
         "calls.add() missing 2 required positional arguments: 'x' and 'y'"),
        (lambda t, a: t.delay(1, 2, 3), TypeError,
         "calls.add() takes 2 positional arguments but 3 were given"),
        (lambda t, a: t.delay(1, x=2), TypeError,
         "calls.add() got multiple values for argument 'x'"),
        (lambda t, a: a.send_task("calls.add", 5), TypeError,
         "task calls.add: args must be a list or tuple, got int 5"),
        (lambda t, a: t.apply_async(5), TypeError,
         "task calls.add: args must be a list or tuple"),
        (lambda t, a: a.send_task("calls.add", [1, 2], [3]), TypeError,
         "task calls.add: kwargs must be a mapping"),
        (lambda t, a: t.apply_async((1, 2), countdown="10"), TypeError,
         "task calls.add: countdown takes a number of seconds (int or float), got str '10'"),
        (lambda t, a: t.apply_async((1, 2), countdown=NAN), ValueError,
         "task calls.add: countdown must be a finite number of seconds, got nan"),
        (lambda t, a: t.apply_async((1, 2), countdown=INF), ValueError,
         "countdown must be a finite number of seconds, got inf"),
        (lambda t, a: a.send_task("calls.add", (1, 2), countdown=-INF), ValueError,
         "countdown must be a finite number of seconds, got -inf"),
        (lambda t, a: t.apply_async((1, 2), eta=5), TypeError,
         "task calls.add: eta takes a datetime or an ISO 8601 string, got int 5"),
        (lambda t, a: t.apply_async((1, 2), eta=NAN), TypeError, "eta takes a datetime"),
        (lambda t, a: t.apply_async((1, 2), eta="tomorrow"), ValueError,
         "task calls.add: eta='tomorrow' is not an ISO 8601 date and time"),
        (lambda t, a: t.apply_async((1, 2), expires=NAN), ValueError,
         "task calls.add: expires must be a finite number of seconds, got nan"),
        (lambda t, a: t.apply_async((1, 2), expires=1e300), ValueError,
         "task calls.add: expires=1e+300 seconds is past the last date Python can hold"),
        (lambda t, a: t.apply_async((1, 2), countdown=1e300), ValueError,
         "task calls.add: countdown=1e+300 seconds is past the last date Python can hold"),
        (lambda t, a: t.apply_async((1, 2), expires=[1]), TypeError,
         "task calls.add: expires takes a number of seconds, a timedelta, a datetime or an ISO "
         "8601 string, got list [1]"),
    ],
)  # fmt: skip
def test_a_bad_call_is_refused_naming_the_task_and_option_and_stores_nothing(
    stored: Any, call: Any, error: type[Exception], message: str
) -> None:
    app, add, _, url = stored
    with pytest.raises(error) as raised:
        call(add, app)
    assert message in str(raised.value)
    assert runs(url) == []


def test_the_same_checks_in_eager_mode(stored: Any) -> None:
    app, add, _, _ = stored
    app.conf.task_always_eager = True
    with pytest.raises(ValueError, match="countdown must be a finite number"):
        add.apply_async((1, 2), countdown=NAN)
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        add.delay(1, 2, z=3)
    assert add.apply_async((1, 2), countdown=1.5).get() == 3


def test_calls_that_fit_are_sent(stored: Any) -> None:
    _, add, flexible, url = stored
    add.apply_async([1, 2], countdown=0.5, expires=timedelta(minutes=5))
    add.apply_async((1,), {"y": 2}, eta="2030-01-01T00:00:00+00:00", expires=60)
    flexible.delay(1, 2, 3, scale=2, other=4)
    with pytest.raises(TypeError, match=r"calls.flexible\(\) missing 1 required keyword-only"):
        flexible.delay(1)
    assert len(runs(url)) == 3
