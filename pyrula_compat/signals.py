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
a pyrula store holds no such thing; nor are the ``eventlet_pool_*`` signals, which Celery
sends only from its eventlet pool (pyrula has none): they exist so that code connecting
to them imports and runs.

Every signal is a :class:`pyrula_compat.utils.dispatch.signal.Signal`, the class a
project declares its own signals with (``Signal(name="...", providing_args={...})``).
"""

from __future__ import annotations

from pyrula_compat.utils.dispatch.signal import Receiver, Signal

before_task_publish = Signal(
    name="before_task_publish",
    providing_args={
        "body",
        "declare",
        "exchange",
        "headers",
        "properties",
        "retry_policy",
        "routing_key",
    },
)
after_task_publish = Signal(
    name="after_task_publish", providing_args={"body", "exchange", "routing_key"}
)
task_received = Signal(name="task_received", providing_args={"request"})
task_prerun = Signal(name="task_prerun", providing_args={"args", "kwargs", "task", "task_id"})
task_postrun = Signal(
    name="task_postrun", providing_args={"args", "kwargs", "retval", "task", "task_id"}
)
task_success = Signal(name="task_success", providing_args={"result", "runtime"})
task_retry = Signal(name="task_retry", providing_args={"einfo", "reason", "request"})
task_failure = Signal(
    name="task_failure",
    providing_args={"args", "einfo", "exception", "kwargs", "task_id", "traceback"},
)
task_revoked = Signal(
    name="task_revoked", providing_args={"expired", "request", "signum", "terminated"}
)
task_rejected = Signal(name="task_rejected", providing_args={"exc", "message"})
task_unknown = Signal(name="task_unknown", providing_args={"exc", "id", "message", "name"})
task_internal_error = Signal(
    name="task_internal_error",
    providing_args={"args", "einfo", "exception", "kwargs", "request", "task_id", "traceback"},
)
celeryd_init = Signal(name="celeryd_init", providing_args={"conf", "instance", "options"})
celeryd_after_setup = Signal(name="celeryd_after_setup", providing_args={"conf", "instance"})
import_modules = Signal(name="import_modules")
worker_init = Signal(name="worker_init")
worker_process_init = Signal(name="worker_process_init")
worker_process_shutdown = Signal(name="worker_process_shutdown")
worker_ready = Signal(name="worker_ready")
worker_shutdown = Signal(name="worker_shutdown")
worker_shutting_down = Signal(name="worker_shutting_down")
worker_before_create_process = Signal(name="worker_before_create_process")
heartbeat_sent = Signal(name="heartbeat_sent")
setup_logging = Signal(
    name="setup_logging", providing_args={"colorize", "format", "logfile", "loglevel"}
)
after_setup_logger = Signal(
    name="after_setup_logger",
    providing_args={"colorize", "format", "logfile", "logger", "loglevel"},
)
after_setup_task_logger = Signal(
    name="after_setup_task_logger",
    providing_args={"colorize", "format", "logfile", "logger", "loglevel"},
)
beat_init = Signal(name="beat_init")
beat_embedded_init = Signal(name="beat_embedded_init")
eventlet_pool_started = Signal(name="eventlet_pool_started")
eventlet_pool_preshutdown = Signal(name="eventlet_pool_preshutdown")
eventlet_pool_postshutdown = Signal(name="eventlet_pool_postshutdown")
eventlet_pool_apply = Signal(
    name="eventlet_pool_apply", providing_args={"target", "args", "kwargs"}
)

__all__ = [
    "Receiver",
    "Signal",
    "after_setup_logger",
    "after_setup_task_logger",
    "after_task_publish",
    "beat_embedded_init",
    "beat_init",
    "before_task_publish",
    "celeryd_after_setup",
    "celeryd_init",
    "eventlet_pool_apply",
    "eventlet_pool_postshutdown",
    "eventlet_pool_preshutdown",
    "eventlet_pool_started",
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
