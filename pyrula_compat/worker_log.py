"""Celery's worker log lines for each task attempt, from the loggers Celery writes them to.

As Celery 5.7's worker writes them (``celery.worker.strategy`` and ``celery.app.trace``):

- ``Task proj.tasks.add[<id>] received`` (INFO), as each attempt starts;
- ``Task proj.tasks.add[<id>] succeeded in 0.003s: 5`` (INFO), the result's repr cut to
  the task's ``resultrepr_maxsize``;
- ``Task proj.tasks.add[<id>] retry: Retry in 10s: ConnectionError('down')`` (INFO);
- ``Task proj.tasks.add[<id>] raised unexpected: ZeroDivisionError('division by zero')``
  at ERROR with the exception as ``exc_info``, so handlers print its traceback and
  Sentry's logging integration reports it with its stack; an exception the task lists
  in ``throws`` at INFO without the traceback (``raised expected``); ``Reject`` at
  WARNING with its traceback; ``Ignore`` at INFO (``ignored``).

Each record also carries Celery's ``data`` extra (the line's fields) for handlers that
read it.
"""

from __future__ import annotations

import logging
from typing import Any

from pyrula.workflows import log_context
from pyrula_compat.app.task import Context, Task
from pyrula_compat.exceptions import Reject
from pyrula_compat.execution import Attempt

trace_logger = logging.getLogger("celery.app.trace")
strategy_logger = logging.getLogger("celery.worker.strategy")

LOG_RECEIVED = "Task %(name)s[%(id)s] received"
LOG_SUCCESS = "Task %(name)s[%(id)s] succeeded in %(runtime)ss: %(return_value)s"
LOG_FAILURE = "Task %(name)s[%(id)s] %(description)s: %(exc)s"
LOG_IGNORED = "Task %(name)s[%(id)s] %(description)s"
LOG_REJECTED = "Task %(name)s[%(id)s] %(exc)s"
LOG_RETRY = "Task %(name)s[%(id)s] retry: %(exc)s"
DEFAULT_RESULTREPR_MAXSIZE = 1024


def received(name: str, request: Context) -> None:
    """The attempt's ``received`` line."""
    if strategy_logger.isEnabledFor(logging.INFO):
        context = {
            "id": request.id, "name": name, "args": _repr(request.args),
            "kwargs": _repr(request.kwargs), "eta": request.eta,
        }  # fmt: skip
        strategy_logger.info(LOG_RECEIVED, context, extra={"data": context})


def ended(task: Task, request: Context, attempt: Attempt, runtime: float) -> None:
    """The line for how the attempt ended (``runtime``: seconds in the worker)."""
    context: dict[str, Any] = {"id": request.id, "name": task.name}
    if attempt.kind in ("ok", "replace"):
        if attempt.ignored:
            _log(logging.INFO, LOG_IGNORED, {**context, "description": "ignored"})
            return
        if trace_logger.isEnabledFor(logging.INFO):
            maxsize = getattr(task, "resultrepr_maxsize", None) or DEFAULT_RESULTREPR_MAXSIZE
            value = _repr(attempt.value if attempt.kind == "ok" else None, int(maxsize))
            context.update(runtime=runtime, return_value=value)
            _log(logging.INFO, LOG_SUCCESS, context)
        return
    exc = attempt.exc
    if exc is None:  # a lost attempt: the worker that took the run over logs it
        return
    if attempt.kind == "retry":
        _log(logging.INFO, LOG_RETRY, {**context, "exc": attempt.retry_text or repr(exc)})
        return
    context.update(
        exc=_repr(exc), args=_repr(request.args), kwargs=_repr(request.kwargs),
        hostname=request.hostname, internal=False,
        traceback=attempt.einfo.traceback if attempt.einfo is not None else "",
    )  # fmt: skip
    exc_info = (type(exc), exc, exc.__traceback__)
    log_context.mark_logged(exc)  # the engine's line for the run's failure stays short
    if isinstance(exc, Reject):
        _log(logging.WARNING, LOG_REJECTED, {**context, "description": "rejected"}, exc_info)
    elif isinstance(exc, tuple(task.throws or ())):
        _log(logging.INFO, LOG_FAILURE, {**context, "description": "raised expected"})
    else:
        context["description"] = "raised unexpected"
        _log(logging.ERROR, LOG_FAILURE, context, exc_info)


def _log(level: int, fmt: str, context: dict[str, Any], exc_info: Any = None) -> None:
    trace_logger.log(level, fmt, context, exc_info=exc_info, extra={"data": context})


def _repr(value: Any, maxsize: int = DEFAULT_RESULTREPR_MAXSIZE) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a result whose __repr__ raises still gets its line
        text = f"<unrepresentable {type(value).__name__}: {exc!r}>"
    return text if len(text) <= maxsize else f"{text[: maxsize - 3]}..."
