"""``celery.utils.dispatch.signal``: ``Signal``, the class of every signal.

Declare a signal of your own as Celery documents it, and send it where it happens::

    order_placed = Signal(name="order_placed", providing_args={"order_id"})

    @order_placed.connect
    def notify(sender=None, order_id=None, **kwargs): ...

    order_placed.send(sender="shop", order_id=7)

As in Celery: receivers must accept keyword arguments (``**kwargs``), they are held by
weak reference unless ``weak=False`` (a bound method lives as long as its object), one
receiver connects once per ``(receiver or dispatch_uid, sender)``, a receiver
connected with a ``sender`` hears only that sender (compared by identity, strings by
value; a :class:`~pyrula_compat.local.Proxy` by the object behind it, a
:class:`~pyrula_compat.local.PromiseProxy` once it is evaluated), and ``send`` calls
every receiver even when one raises: the error is logged and returned as that
receiver's response (``send_robust`` is the same method, as in Celery).
``connect(retry=True)`` calls a receiver that raises again, after 2, 4, ... up to 30
seconds, until it returns. ``receivers`` is Celery's list of
``((receiver key, sender key), receiver or weak reference)``; tests that reset a
signal assign it an empty list.

One difference: a string as the first positional argument is the signal's name
(``Signal("order_placed")``), where Celery would read its letters as argument names.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from pyrula_compat.exceptions import CDeprecationWarning
from pyrula_compat.local import PromiseProxy, Proxy
from pyrula_compat.utils.functional import fun_accepts_kwargs

log = logging.getLogger("celery.utils.dispatch.signal")

Receiver = Callable[..., Any]
LookupKey = tuple[Hashable, Hashable]

RETRY_FIRST = 2.0
"""Seconds before a ``retry=True`` receiver's second call; each wait adds as much."""
RETRY_MAX = 30.0
"""The longest wait between two calls of a ``retry=True`` receiver, in seconds."""


def _make_id(target: Any) -> Hashable:
    if isinstance(target, Proxy):
        target = target._get_current_object()
    if isinstance(target, str | bytes):
        return target
    if hasattr(target, "__func__"):
        # bound methods of two instances share __func__: the instance is in the id
        return (id(getattr(target, "__self__", None)), id(target.__func__))
    return id(target)


NONE_ID = _make_id(None)


def _lookup_key(receiver: Any, sender: Any, dispatch_uid: Hashable | None) -> LookupKey:
    if dispatch_uid:
        return (dispatch_uid, _make_id(sender))
    own = getattr(receiver, "_dispatch_uid", None)
    if own is not None:  # a retry=True wrapper answers to its function's key
        return (own, _make_id(sender))
    return (_make_id(receiver), _make_id(sender))


def _retrying(fn: Receiver) -> Receiver:
    def call_until_it_returns(*args: Any, **kwargs: Any) -> Any:
        wait = RETRY_FIRST
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception:
                log.exception(
                    "Could not process signal receiver %r. Retrying in %s seconds...", fn, wait
                )
                time.sleep(wait)
                wait = min(wait + RETRY_FIRST, RETRY_MAX)

    return call_until_it_returns


class Signal:
    """A named event that receivers connect to and senders send."""

    def __init__(
        self,
        providing_args: Iterable[str] | str | None = None,
        use_caching: bool = False,
        name: str | None = None,
    ) -> None:
        if isinstance(providing_args, str) and name is None:
            name, providing_args = providing_args, None
        self.name = name
        self.providing_args: set[str] = set(providing_args or ())
        self.use_caching = use_caching
        self.lock = threading.Lock()
        self.receivers: list[tuple[LookupKey, Any]] = []

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.name} providing_args={self.providing_args!r}>"

    __str__ = __repr__

    def connect(self, *args: Any, **kwargs: Any) -> Any:
        """Connect a receiver: ``connect(fn, sender=None, weak=True, dispatch_uid=None,
        retry=False)``, or as a decorator, ``@signal.connect`` or
        ``@signal.connect(sender=..., ...)``. Returns the receiver."""
        if args and callable(args[0]):
            return self._options(*args[1:], **kwargs)(args[0])
        return self._options(*args, **kwargs)

    def _options(
        self,
        sender: Any = None,
        weak: bool = True,
        dispatch_uid: Hashable | None = None,
        retry: bool = False,
    ) -> Callable[[Receiver], Receiver]:
        def connect_receiver(fn: Receiver) -> Receiver:
            if not callable(fn):
                raise TypeError(f"signal {self.name} receivers must be callable, not {fn!r}")
            if not fun_accepts_kwargs(fn):
                raise ValueError(
                    f"signal {self.name}: receiver {fn!r} must accept keyword arguments "
                    "(add **kwargs)"
                )
            uid, use_weak, connected = dispatch_uid, weak, fn
            if retry:
                use_weak = False  # the wrapper would die at once
                uid = uid or _make_id(fn)
                connected = _retrying(fn)
                connected._dispatch_uid = uid  # type: ignore[attr-defined]
            self._connect(connected, sender, use_weak, uid)
            return connected

        return connect_receiver

    def _connect(self, fn: Receiver, sender: Any, weak: bool, uid: Hashable | None) -> None:
        if isinstance(sender, PromiseProxy) and not sender.__evaluated__():
            sender.__then__(lambda: self._connect(fn, sender._get_current_object(), weak, uid))
            return
        key = _lookup_key(fn, sender, uid)
        held: Any = fn
        if weak:
            try:
                held = weakref.WeakMethod(fn) if hasattr(fn, "__self__") else weakref.ref(fn)
            except TypeError:
                held = fn  # a builtin cannot be weakly held; keep it
        with self.lock:
            self._drop_dead()
            if all(existing != key for existing, _ in self.receivers):
                self.receivers.append((key, held))

    def disconnect(
        self,
        receiver: Receiver | None = None,
        sender: Any = None,
        weak: bool | None = None,
        dispatch_uid: Hashable | None = None,
    ) -> bool:
        """Disconnect ``receiver`` (or the one connected with ``dispatch_uid``) from
        ``sender``; True if it was connected."""
        if weak is not None:
            warnings.warn(
                "Passing `weak` to disconnect has no effect.", CDeprecationWarning, stacklevel=2
            )
        key = _lookup_key(receiver, sender, dispatch_uid)
        with self.lock:
            self._drop_dead()
            for index, (existing, _) in enumerate(self.receivers):
                if existing == key:
                    del self.receivers[index]
                    return True
        return False

    def has_listeners(self, sender: Any = None) -> bool:
        """Whether a live receiver hears ``sender``."""
        return bool(self._live_receivers(sender))

    def send(self, sender: Any = None, **named: Any) -> list[tuple[Receiver, Any]]:
        """Call every receiver that hears ``sender`` with ``signal``, ``sender`` and
        ``named``; return ``[(receiver, response)]``, a raised error as its response."""
        responses: list[tuple[Receiver, Any]] = []
        for fn in self._live_receivers(sender):
            try:
                response = fn(signal=self, sender=sender, **named)
            except Exception as exc:
                log.exception("Signal handler %r raised: %r", fn, exc)
                responses.append((fn, exc))
            else:
                responses.append((fn, response))
        return responses

    send_robust = send

    def _live_receivers(self, sender: Any) -> list[Receiver]:
        wanted = _make_id(sender)
        with self.lock:
            self._drop_dead()
            held = [r for (_, key), r in self.receivers if key in (NONE_ID, wanted)]
        live = [r() if isinstance(r, weakref.ReferenceType) else r for r in held]
        return [fn for fn in live if fn is not None]

    def _drop_dead(self) -> None:
        # the caller holds self.lock
        self.receivers[:] = [
            entry
            for entry in self.receivers
            if not (isinstance(entry[1], weakref.ReferenceType) and entry[1]() is None)
        ]


__all__ = ["Signal"]
