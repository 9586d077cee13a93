"""``celery.local``: ``Proxy``, ``PromiseProxy``, ``maybe_evaluate``, ``try_import``."""

from __future__ import annotations

import json
from typing import Any

import pytest

import pyrula_compat
from pyrula_compat import Celery
from pyrula_compat.local import PromiseProxy, Proxy, maybe_evaluate, try_import


def test_a_proxy_looks_its_object_up_on_every_use() -> None:
    box: dict[str, Any] = {"now": [1, 2]}
    proxy: Any = Proxy(lambda: box["now"])
    assert proxy == [1, 2] and len(proxy) == 2 and 2 in proxy and list(proxy) == [1, 2]
    assert proxy[0] == 1 and proxy.__add__([3]) == [1, 2, 3] and proxy.__radd__([0]) == [0, 1, 2]
    assert isinstance(proxy, list) and proxy.__class__ is list  # as Celery's
    box["now"] = [9]
    assert proxy == [9] and proxy._get_current_object() is box["now"]
    proxy.append(4)  # attribute access and calls go to the object
    proxy[0] = 8  # and item assignment
    assert box["now"] == [8, 4] and str(proxy) == "[8, 4]" and repr(proxy) == "[8, 4]"


def test_a_proxy_forwards_arithmetic_comparison_and_context_managers() -> None:
    number: Any = Proxy(lambda: 7)
    assert number + 1 == 8 and 1 + number == 8 and number * 2 == 14 and -number == -7
    assert number > 6 and number <= 7 and int(number) == 7 and float(number) == 7.0
    assert hash(number) == hash(7) and bool(Proxy(lambda: 0)) is False

    class Resource:
        entered = exited = False

        def __enter__(self) -> str:
            self.entered = True
            return "inside"

        def __exit__(self, *exc: Any) -> None:
            self.exited = True

    resource = Resource()
    with Proxy(lambda: resource) as got:
        assert got == "inside"
    assert resource.entered and resource.exited


def test_a_proxy_passes_args_and_answers_its_name_and_doc() -> None:
    proxy: Any = Proxy(dict, args=([("a", 1)],), kwargs={"b": 2}, name="settings", __doc__="Doc.")
    assert proxy == {"a": 1, "b": 2} and proxy.__name__ == "settings" and proxy.__doc__ == "Doc."
    assert sorted(dir(proxy)) == sorted(dir({}))


def test_the_current_app_proxy_is_the_app() -> None:
    app = Celery("proxied", broker="memory://")
    app.set_current()
    assert pyrula_compat.current_app.main == "proxied"
    assert isinstance(pyrula_compat.current_app, Celery)


def test_a_promise_evaluates_once_and_runs_what_waited_for_it() -> None:
    made: list[int] = []

    def make() -> dict[str, int]:
        made.append(1)
        return {"a": 1}

    promise: Any = PromiseProxy(make)
    later: list[str] = []
    promise.__then__(later.append, "first")
    assert not promise.__evaluated__() and made == [] and later == []
    assert promise["a"] == 1 and promise["a"] == 1 and made == [1]
    assert later == ["first"] and promise.__evaluated__()
    promise.__then__(later.append, "at once")  # evaluated already: runs now
    assert later == ["first", "at once"]
    assert maybe_evaluate(promise) == {"a": 1} and maybe_evaluate(5) == 5


def test_a_promise_whose_factory_raises_stays_unevaluated() -> None:
    calls: list[int] = []

    def broken() -> Any:
        calls.append(1)
        raise LookupError("not yet")

    promise: Any = PromiseProxy(broken)
    with pytest.raises(LookupError):
        promise.__maybe_evaluate__()
    assert not promise.__evaluated__()
    with pytest.raises(LookupError):
        _ = promise.anything
    assert len(calls) == 2


def test_try_import() -> None:
    assert try_import("json") is json
    assert try_import("no_such_module_here") is None
    assert try_import("no_such_module_here", default="d") == "d"
