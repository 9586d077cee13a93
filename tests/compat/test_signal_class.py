"""``celery.utils.dispatch.signal.Signal``: the class of every signal, and how a project
declares its own (no worker, no server)."""

from __future__ import annotations

import gc
import logging
import warnings
from typing import Any

import pytest

from pyrula_compat import signals
from pyrula_compat.exceptions import CDeprecationWarning
from pyrula_compat.local import PromiseProxy, Proxy
from pyrula_compat.utils import dispatch
from pyrula_compat.utils.dispatch import signal as signal_module
from pyrula_compat.utils.dispatch.signal import Signal


def test_every_shim_signal_is_a_signal_and_the_import_paths_agree() -> None:
    assert dispatch.Signal is Signal is signals.Signal
    for name in signals.__all__:
        if name not in ("Signal", "Receiver"):
            sig = getattr(signals, name)
            assert isinstance(sig, Signal) and sig.name == name
    assert signals.task_prerun.providing_args == {"task_id", "task", "args", "kwargs"}
    assert signals.task_revoked.providing_args == {"request", "terminated", "signum", "expired"}


def test_a_custom_signal_declared_as_celery_documents_it() -> None:
    order_placed = Signal(name="order_placed", providing_args={"order_id"})
    assert order_placed.providing_args == {"order_id"} and order_placed.name == "order_placed"
    assert repr(order_placed) == "<Signal: order_placed providing_args={'order_id'}>"
    heard: list[tuple[Any, Any, Any]] = []

    @order_placed.connect
    def notify(sender: Any = None, order_id: Any = None, signal: Any = None, **kw: Any) -> str:
        heard.append((sender, order_id, signal))
        return "noted"

    assert order_placed.send(sender="shop", order_id=7) == [(notify, "noted")]
    assert heard == [("shop", 7, order_placed)]
    assert Signal(["a", "b"]).providing_args == {"a", "b"}  # Celery's positional order
    assert Signal("named").name == "named"


def test_connect_as_decorator_with_options_and_sender_filtering() -> None:
    sig = Signal(name="s")
    calls: list[str] = []
    mine, other = object(), object()

    @sig.connect(sender=mine)
    def only_mine(sender: Any, **kw: Any) -> None:
        calls.append("mine")

    @sig.connect(dispatch_uid="uid-1")
    def any_sender(sender: Any, **kw: Any) -> None:
        calls.append("any")

    sig.connect(any_sender, dispatch_uid="uid-1")  # same uid: connected once
    sig.send(sender=other)
    sig.send(sender=mine)
    assert calls == ["any", "mine", "any"]
    assert sig.has_listeners(mine) and sig.has_listeners(other)
    assert len(sig.receivers) == 2  # Celery's list of (lookup key, receiver)
    assert sig.disconnect(dispatch_uid="uid-1") is True
    assert sig.disconnect(dispatch_uid="uid-1") is False
    assert sig.disconnect(only_mine, sender=mine) is True and not sig.has_listeners(mine)


def test_strings_match_senders_by_value_and_proxies_by_their_object() -> None:
    sig = Signal(name="s")
    target = {"id": 1}
    heard: list[Any] = []
    sig.connect(lambda sender, **kw: heard.append("by name"), sender="proj.add", weak=False)
    sig.connect(
        lambda sender, **kw: heard.append("by proxy"), sender=Proxy(lambda: target), weak=False
    )
    sig.send(sender="".join(["proj.", "add"]))  # an equal string, not the same object
    sig.send(sender=target)
    assert heard == ["by name", "by proxy"]


def test_a_promise_proxy_sender_connects_once_it_is_evaluated() -> None:
    sig = Signal(name="s")
    target = object()
    promise = PromiseProxy(lambda: target)
    heard: list[Any] = []

    def receiver(sender: Any, **kw: Any) -> None:
        heard.append(sender)

    sig.connect(receiver, sender=promise)
    assert not sig.receivers  # waits for the promise
    promise.__maybe_evaluate__()
    sig.send(sender=target)
    assert heard == [target]


def test_receivers_are_weak_unless_asked_and_bound_methods_live_with_their_object() -> None:
    sig = Signal(name="s")

    class Listener:
        def __init__(self) -> None:
            self.count = 0

        def on(self, **kw: Any) -> None:
            self.count += 1

    listener = Listener()
    sig.connect(listener.on)
    sig.connect(lambda **kw: None)  # a weak lambda nobody holds: gone
    sig.connect(lambda **kw: None, weak=False)
    gc.collect()
    sig.send(sender=None)
    assert listener.count == 1 and len(sig.send(sender=None)) == 2
    del listener
    gc.collect()
    assert len(sig.send(sender=None)) == 1 and len(sig.receivers) == 1


def test_a_receiver_without_kwargs_is_refused_with_its_name() -> None:
    sig = Signal(name="order_placed")

    def bad(sender: Any) -> None: ...

    with pytest.raises(ValueError, match=r"order_placed.*bad.*\*\*kwargs"):
        sig.connect(bad)
    with pytest.raises(TypeError, match="callable"):
        sig.connect(sender=None)(42)  # type: ignore[arg-type]
    assert not sig.receivers


def test_send_robust_is_send_and_a_raising_receiver_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sig = Signal(name="s")
    boom = RuntimeError("boom")

    def raises(**kw: Any) -> None:
        raise boom

    def fine(**kw: Any) -> int:
        return 1

    sig.connect(raises)
    sig.connect(fine)
    with caplog.at_level(logging.ERROR):
        assert sig.send_robust(sender=None) == [(raises, boom), (fine, 1)]
    assert Signal.send_robust is Signal.send
    assert "Signal handler" in caplog.text and "boom" in caplog.text


def test_connect_with_retry_calls_again_until_it_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signal_module, "RETRY_FIRST", 0.01)
    sig = Signal(name="s")
    attempts: list[int] = []

    def flaky(**kw: Any) -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("down")
        return "up"

    wrapper = sig.connect(flaky, retry=True)
    assert sig.send(sender=None) == [(wrapper, "up")] and len(attempts) == 3
    assert sig.disconnect(flaky) is True  # found by the function's own key


def test_disconnect_weak_warns_as_in_celery() -> None:
    sig = Signal(name="s")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sig.disconnect(lambda **kw: None, weak=True)
    assert [w.category for w in caught] == [CDeprecationWarning]
