"""What a log record is about, for structured logs: the run, workflow, step and attempt
this code executes for, and the worker it runs in.

The engine binds these fields around each run and each step, in a context variable, so
code a step runs (in its thread, or in tasks it starts) logs with them; an extension
binds its own (the Celery drop-in adds ``task`` and ``task_id``). :class:`JsonFormatter`
writes each record as one JSON object with them; ``pyrula worker --log-format json``
installs it. The library never configures logging: only the CLI does.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

_NONE: Mapping[str, Any] = MappingProxyType({})
_fields: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "pyrula_log_fields", default=_NONE
)
LOG_FORMAT_ENV = "PYRULA_LOG_FORMAT"
"""The environment variable that picks the CLI's log format (``text`` or ``json``)."""
LOGGED = "__pyrula_logged__"
"""Attribute set on an exception whose failure was logged already, with its traceback
(see :func:`mark_logged`)."""


def fields() -> Mapping[str, Any]:
    """The fields bound in this context (``run_id``, ``workflow``, ``step``,
    ``attempt``, ``worker``, and whatever an extension bound)."""
    return _fields.get()


def bind(**values: Any) -> contextvars.Token[Mapping[str, Any]]:
    """Add ``values`` (None values are left out) to this context's fields; undo with
    :func:`reset`."""
    merged = {**_fields.get(), **{k: v for k, v in values.items() if v is not None}}
    return _fields.set(merged)


def reset(token: contextvars.Token[Mapping[str, Any]]) -> None:
    _fields.reset(token)


@contextmanager
def bound(**values: Any) -> Iterator[None]:
    """:func:`bind` for the block."""
    token = bind(**values)
    try:
        yield
    finally:
        _fields.reset(token)


def mark_logged(exc: BaseException) -> None:
    """Say ``exc`` was logged with its traceback where it happened (the Celery drop-in
    logs a task's failure as Celery does), so the engine logs the run's failure it causes
    in one line, not with the traceback again. In this process only."""
    with contextlib.suppress(AttributeError, TypeError):  # a class with __slots__
        setattr(exc, LOGGED, True)


def was_logged(exc: BaseException) -> bool:
    return bool(getattr(exc, LOGGED, False))


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``time`` (ISO 8601, UTC, milliseconds), ``level``,
    ``logger``, ``message``, then the context's fields (:func:`fields`) and those a
    record carries as ``extra`` under the same names, then ``exc_type`` and
    ``exc_info`` (the traceback text) for a record logged with an exception."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update(fields())
        for name in ("run_id", "workflow", "step", "attempt", "worker", "task", "task_id"):
            value = record.__dict__.get(name)
            if value is not None:
                data[name] = value
        if record.exc_info and record.exc_info[0] is not None:
            data["exc_type"] = record.exc_info[0].__name__
            data["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            data["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(data, default=repr, ensure_ascii=False)
