"""Celery's exception names (``celery.exceptions``), with the same meaning.

A failed task's own exception travels through the store as type, module, message and
traceback text; ``AsyncResult.get()`` re-raises it as its own class when that imports.
"""

from __future__ import annotations

import importlib
from datetime import datetime
from types import TracebackType
from typing import Any, NoReturn

import click

from pyrula.workflows import ConfigurationError

__all__ = [
    "AlreadyRegistered",
    "AlwaysEagerIgnored",
    "BackendError",
    "BackendGetMetaError",
    "BackendStoreError",
    "CDeprecationWarning",
    "CPendingDeprecationWarning",
    "CeleryCommandException",
    "CeleryError",
    "CeleryWarning",
    "ChordError",
    "DuplicateNodenameWarning",
    "DuplicateTaskNameWarning",
    "FixupWarning",
    "Ignore",
    "ImproperlyConfigured",
    "IncompleteStream",
    "InvalidTaskError",
    "MaxRetriesExceededError",
    "NotConfigured",
    "NotRegistered",
    "OperationalError",
    "QueueNotFound",
    "Reject",
    "Retry",
    "SecurityError",
    "SecurityWarning",
    "SoftTimeLimitExceeded",
    "TaskError",
    "TaskPredicate",
    "TaskRevokedError",
    "Terminated",
    "TimeLimitExceeded",
    "TimeoutError",
    "WorkerLostError",
    "WorkerShutdown",
    "WorkerTerminate",
    "reraise",
]


class CeleryError(Exception):
    """Base of the shim's task errors."""


class TaskPredicate(CeleryError):
    """Base of the exceptions that steer what happens to a task (retry, ignore, reject)."""


class Retry(TaskPredicate):
    """Raised by ``self.retry()``: the task runs again later, under the same id.

    ``when`` is the countdown (seconds) or the eta (datetime) of the next attempt.
    """

    def __init__(
        self,
        message: str | None = None,
        exc: BaseException | str | None = None,
        when: float | datetime | None = None,
        is_eager: bool = False,
        sig: Any = None,
        **kwargs: Any,
    ) -> None:
        self.message = message
        self.exc = exc
        # Celery's: the reason's repr (its text when it is a string).
        self.excs = exc if isinstance(exc, str) else repr(exc) if exc is not None else None
        self.when = when
        self.is_eager = is_eager
        self.sig = sig
        # Where the next attempt's arguments come from (None: the current ones).
        self.args_override: tuple[Any, ...] | None = kwargs.get("args_override")
        self.kwargs_override: dict[str, Any] | None = kwargs.get("kwargs_override")
        super().__init__(self.humanize())

    def humanize(self) -> str:
        if isinstance(self.when, (int, float)):
            return f"in {self.when}s"
        return f"at {self.when}"

    def __str__(self) -> str:
        if self.message:
            return self.message
        if self.excs:
            return f"Retry {self.humanize()}: {self.excs}"
        return f"Retry {self.humanize()}"


RetryTaskError = Retry


class Ignore(TaskPredicate):
    """Raised in a task to leave its state as it is (it is not recorded as a failure)."""


class Reject(TaskPredicate):
    """Raised in a task to reject it. ``requeue=True`` runs it again later."""

    def __init__(self, reason: Any = None, requeue: bool = False) -> None:
        self.reason = reason
        self.requeue = requeue
        super().__init__(reason, requeue)


class TaskError(CeleryError):
    """A task-related error."""


class MaxRetriesExceededError(TaskError):
    """The task was retried ``max_retries`` times and asked for another retry."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.task_args = kwargs.pop("task_args", [])
        self.task_kwargs = kwargs.pop("task_kwargs", {})
        super().__init__(*args, **kwargs)


class TaskRevokedError(TaskError):
    """The task was revoked (``'revoked'``) or expired before it started (``'expired'``)."""


class NotRegistered(KeyError, TaskError):
    """No task with that name is registered in this app."""

    def __repr__(self) -> str:
        return f"NotRegistered({self.args[0] if self.args else ''!r})"


class ChordError(TaskError):
    """A chord's header failed, so its body did not run."""


class InvalidTaskError(TaskError):
    """A task's arguments or options cannot be used."""


class TimeoutError(TaskError):
    """``AsyncResult.get(timeout=...)`` elapsed before the task finished."""


class ImproperlyConfigured(CeleryError, ConfigurationError):
    """A setting cannot work (a broker pyrula cannot use, a pickle serializer, ...).

    A :class:`CeleryError`, as in Celery, and a pyrula ``ConfigurationError`` (which
    pyrula's command line reports as a usage error)."""


class CeleryWarning(UserWarning):
    """The base class of Celery's warnings."""


class DuplicateNodenameWarning(CeleryWarning):
    """Two workers run with the same node name."""


class DuplicateTaskNameWarning(CeleryWarning):
    """Two callables are registered under one task name."""


class FixupWarning(CeleryWarning):
    """A framework fix-up (Django's) could not apply."""


class SecurityWarning(CeleryWarning):
    """A setting weakens security."""


class CPendingDeprecationWarning(PendingDeprecationWarning):
    """A feature that will be deprecated."""


class CDeprecationWarning(DeprecationWarning):
    """A deprecated feature."""


class NotConfigured(CeleryWarning):
    """A setting is missing; the default applies."""


class AlwaysEagerIgnored(CeleryWarning):
    """An option that has no meaning in eager mode was given."""


class SecurityError(CeleryError):
    """A security check failed (Celery's message signing; pyrula signs nothing, so
    only code of your own raises it)."""


class AlreadyRegistered(TaskError):
    """A task name is registered already."""


class QueueNotFound(KeyError, TaskError):
    """A queue name that is not defined."""


class IncompleteStream(TaskError):
    """A stream ended early."""


class SoftTimeLimitExceeded(Exception):
    """Raised inside a task that ran past its ``soft_time_limit``; it may clean up."""


class TimeLimitExceeded(Exception):
    """A task ran past its ``time_limit``."""


class WorkerLostError(Exception):
    """The process running the task died."""


class Terminated(Exception):
    """The task was terminated."""


def _operational_base() -> type[Exception]:
    """kombu's ``OperationalError`` when kombu imports, else ``Exception``."""
    try:
        module = importlib.import_module("kombu.exceptions")
    except ImportError:
        return Exception
    base: type[Exception] = module.OperationalError
    return base


class OperationalError(_operational_base()):  # type: ignore[misc]
    """A task could not be sent: the store stayed unreachable through the publish retry
    policy (``task_publish_retry_policy``). A subclass of kombu's ``OperationalError``
    (which ``celery.exceptions`` re-exports) when kombu is installed, so code catching
    either catches it; its ``__cause__`` is pyrula's ``StoreUnavailable``."""


class WorkerTerminate(SystemExit):
    """Raised in a worker to stop it at once (as ``SIGQUIT`` does)."""


SystemTerminate = WorkerTerminate


class WorkerShutdown(SystemExit):
    """Raised in a worker to stop it warmly: running tasks finish first."""


class BackendError(Exception):
    """Reading or writing a result failed."""


class BackendGetMetaError(BackendError):
    """Reading a task's result failed; ``task_id`` names the task."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args)
        self.task_id: str = kwargs.get("task_id", "")

    def __repr__(self) -> str:
        return super().__repr__() + " task_id:" + self.task_id


class BackendStoreError(BackendError):
    """Writing a task's result failed; ``state`` and ``task_id`` say which."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args)
        self.state: str = kwargs.get("state", "")
        self.task_id: str = kwargs.get("task_id", "")

    def __repr__(self) -> str:
        return super().__repr__() + " state:" + self.state + " task_id:" + self.task_id


class CeleryCommandException(click.ClickException):
    """A command-line error with its exit code (``exit_code``)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message=message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it a ClassVar


def reraise(tp: Any, value: BaseException, tb: TracebackType | None = None) -> NoReturn:
    """Raise ``value`` again, with traceback ``tb`` when given (``tp`` is unused, as in
    Celery)."""
    if value.__traceback__ is not tb:
        raise value.with_traceback(tb)
    raise value
