"""Argument checks at the call site stay exact once calls of a shape are remembered
(``Task.check_arguments`` binds a number of arguments and keyword names once), and
follow a body replaced at run time."""

from __future__ import annotations

from typing import Any

import pytest


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
