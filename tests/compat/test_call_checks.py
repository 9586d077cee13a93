"""Argument checks at the call site stay exact once calls of a shape are remembered
(``Task.check_arguments`` binds a number of arguments and keyword names once), and
follow a body replaced at run time; eager calls encode their arguments as a worker's
would be sent, failing at the call as Celery's serializer does."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from pyrula.workflows.errors import NotJSONSerializable
from pyrula_compat import codec, eager


def test_each_shape_is_checked_and_remembered_only_when_it_fits(app: Any) -> None:
    @app.task
    def pair(x, y, z=0):
        return x + y + z

    for _ in range(3):  # the same shapes again, after they were remembered
        assert pair.delay(1, 2).get() == 3
        assert pair.delay(1, y=2).get() == 3
        assert pair.delay(1, 2, z=3).get() == 6
        with pytest.raises(TypeError):
            pair.delay(1)
        with pytest.raises(TypeError):
            pair.delay(1, 2, 3, 4)
        with pytest.raises(TypeError):
            pair.delay(1, 2, w=3)
        with pytest.raises(TypeError):
            pair.delay(1, 2, y=3)  # y twice: the names alone would fit, the count not


def test_a_replaced_body_is_checked_against_its_own_signature(app: Any) -> None:
    @app.task
    def one(x):
        return x

    assert one.delay(1).get() == 1
    one.run = lambda x, y: x + y  # type: ignore[method-assign]
    with pytest.raises(TypeError):
        one.delay(1)
    assert one.delay(1, 2).get() == 3


def test_eager_calls_send_arguments_through_the_workers_encoding(app: Any) -> None:
    ran: list[Any] = []

    @app.task
    def echo(value):
        ran.append(value)
        return value

    class Model:  # a Django model instance passed by mistake
        pk = 1

    at = datetime(2024, 5, 1, tzinfo=UTC)
    keys = {7: "int", 2.5: "float", True: "bool", None: "none", "x": {3: (at, "t")}}
    as_json = {"7": "int", "2.5": "float", "true": "bool", "null": "none", "x": {"3": [at, "t"]}}
    assert echo.delay(keys).get() == as_json
    assert codec.to_json({float("nan"): 1, -0.0: 2}) == {"NaN": 1, "-0.0": 2}  # json.dumps'
    for bad in (Model(), {1, 2}, {(1, 2): "tuple key"}):  # kombu: EncodeError at the call
        with pytest.raises(NotJSONSerializable) as eager_error:
            echo.delay(bad)
        app.conf.task_always_eager = False  # memory://: a store in this process
        with pytest.raises(NotJSONSerializable) as sent_error:
            echo.delay(bad)
        app.conf.task_always_eager = True
        assert str(eager_error.value) == str(sent_error.value)
    assert ran == [as_json]  # nothing else ran

    @app.task(bind=True)
    def seen(self, value):
        return self.request.args, self.request.delivery_info

    result = eager.apply(seen, ({1, 2},), {}, options={"priority": 5}, serialize=False)
    assert result.get() == (({1, 2},), {"is_eager": True, "exchange": None,
                                        "routing_key": None, "priority": 5})  # fmt: skip


def test_eager_apply_does_not_serialize_and_delivery_info_shows_the_priority(app: Any) -> None:
    @app.task(bind=True)
    def seen(self, value):
        return self.request.args, self.request.delivery_info["priority"]

    assert seen.apply(({1, 2},)).get() == (({1, 2},), None)  # Celery's apply(): as given
    assert seen.apply_async(((1, 2),), priority=5).get() == ([[1, 2]], 5)
