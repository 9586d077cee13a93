"""Celery's signals (``celery.signals``): ``signal.connect(receiver)`` and ``send``.

Receivers are called with keyword arguments only (``sender``, ``signal`` and the
signal's own arguments), as in Celery; a receiver that raises is logged and the others
still run. The task signals fire in the worker around each attempt, in Celery's order:
``task_prerun``, the body, ``task_success``/``task_failure``/``task_retry``,
``task_postrun``. ``before_task_publish``/``after_task_publish`` fire in the process
that calls ``delay``. ``worker_init``/``worker_process_init``/``worker_ready`` fire when
``pyrula worker -A`` starts (one process is both Celery's main and its pool process; with
``--max-tasks-per-child`` the supervisor sends the main process's signals and each
worker child the pool process's: :mod:`pyrula_compat.worker`), and ``setup_logging``,
when it has a receiver, replaces the CLI's logging set-up.
``task_received``, ``task_revoked`` and ``task_unknown`` fire on the worker that takes,
stops or finds the task (:mod:`pyrula_compat.worker_signals` says when). ``task_rejected``
is never sent: Celery sends it for a message of an unknown type (not for ``Reject``), and
a pyrula store holds no such thing.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger("pyrula_compat.signals")

Receiver = Callable[..., Any]


class Signal:
    """A named event that receivers connect to."""

    def __init__(self, name: str, providing_args: Any = None) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._receivers: list[tuple[Any, Any, Any]] = []  # (key, sender, ref or receiver)

    def __repr__(self) -> str:
        return f"<Signal: {self.name}>"

    def connect(
        self,
        receiver: Receiver | None = None,
        *,
        sender: Any = None,
        weak: bool = True,
        dispatch_uid: Any = None,
    ) -> Any:
        """Connect ``receiver``; usable as ``@signal.connect`` or ``@signal.connect(...)``."""

        def add(fn: Receiver) -> Receiver:
            key = dispatch_uid if dispatch_uid is not None else (id(fn), id(sender))
            ref: Any = fn
            if weak:
                try:
                    ref = weakref.WeakMethod(fn) if hasattr(fn, "__self__") else weakref.ref(fn)
                except TypeError:
                    ref = fn
            with self._lock:
                if not any(existing == key for existing, _, _ in self._receivers):
                    self._receivers.append((key, sender, ref))
            return fn

        if receiver is None:
            return add
        return add(receiver)

    def disconnect(
        self, receiver: Receiver | None = None, sender: Any = None, dispatch_uid: Any = None
    ) -> bool:
        key = dispatch_uid if dispatch_uid is not None else (id(receiver), id(sender))
        with self._lock:
            before = len(self._receivers)
            self._receivers = [r for r in self._receivers if r[0] != key]
            return len(self._receivers) != before

    def _live(self, sender: Any) -> list[Receiver]:
        found: list[Receiver] = []
        with self._lock:
            for _, wanted, ref in self._receivers:
                if wanted is not None and wanted is not sender and wanted != sender:
                    continue
                fn = ref() if isinstance(ref, weakref.ref) else ref
                if fn is not None:
                    found.append(fn)
        return found

    @property
    def receivers(self) -> list[Receiver]:
        """Every live receiver, whatever sender it was connected for."""
        with self._lock:
            refs = [ref for _, _, ref in self._receivers]
        live = [ref() if isinstance(ref, weakref.ref) else ref for ref in refs]
        return [fn for fn in live if fn is not None]

    def has_listeners(self, sender: Any = None) -> bool:
        return bool(self._live(sender))

    def send(self, sender: Any = None, **named: Any) -> list[tuple[Receiver, Any]]:
        """Call every receiver; return ``[(receiver, response)]``. Errors are logged."""
        responses: list[tuple[Receiver, Any]] = []
        for fn in self._live(sender):
            try:
                responses.append((fn, fn(signal=self, sender=sender, **named)))
            except Exception as exc:
                log.exception("signal %s receiver %r raised", self.name, fn)
                responses.append((fn, exc))
        return responses

    send_robust = send


before_task_publish = Signal("before_task_publish")
after_task_publish = Signal("after_task_publish")
task_received = Signal("task_received")
task_prerun = Signal("task_prerun")
task_postrun = Signal("task_postrun")
task_success = Signal("task_success")
task_retry = Signal("task_retry")
task_failure = Signal("task_failure")
task_revoked = Signal("task_revoked")
task_rejected = Signal("task_rejected")
task_unknown = Signal("task_unknown")
task_internal_error = Signal("task_internal_error")
celeryd_init = Signal("celeryd_init")
celeryd_after_setup = Signal("celeryd_after_setup")
import_modules = Signal("import_modules")
worker_init = Signal("worker_init")
worker_process_init = Signal("worker_process_init")
worker_process_shutdown = Signal("worker_process_shutdown")
worker_ready = Signal("worker_ready")
worker_shutdown = Signal("worker_shutdown")
worker_shutting_down = Signal("worker_shutting_down")
worker_before_create_process = Signal("worker_before_create_process")
heartbeat_sent = Signal("heartbeat_sent")
setup_logging = Signal("setup_logging")
after_setup_logger = Signal("after_setup_logger")
after_setup_task_logger = Signal("after_setup_task_logger")
beat_init = Signal("beat_init")
beat_embedded_init = Signal("beat_embedded_init")

__all__ = [
    "Signal",
    "after_setup_logger",
    "after_setup_task_logger",
    "after_task_publish",
    "beat_embedded_init",
    "beat_init",
    "before_task_publish",
    "celeryd_after_setup",
    "celeryd_init",
    "heartbeat_sent",
    "import_modules",
    "setup_logging",
    "task_failure",
    "task_internal_error",
    "task_postrun",
    "task_prerun",
    "task_received",
    "task_rejected",
    "task_retry",
    "task_revoked",
    "task_success",
    "task_unknown",
    "worker_before_create_process",
    "worker_init",
    "worker_process_init",
    "worker_process_shutdown",
    "worker_ready",
    "worker_shutdown",
    "worker_shutting_down",
]
