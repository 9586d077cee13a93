"""Eager execution: ``task.apply()`` and ``task_always_eager``, in this process.

No worker, no store: the body runs here under the same attempt code a worker uses, so
hooks, signals and autoretry behave the same. Retries loop at once (countdowns are
ignored, as in Celery), arguments go through the JSON round trip (tuples become
lists), and a failure is captured in the :class:`EagerResult` unless ``throw`` or
``task_eager_propagates`` asks for it to be raised. With ``task_store_eager_result``
the outcome is also recorded in the store under the task id (:mod:`pyrula_compat.recorded`).
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING, Any

from pyrula.workflows import InvalidRunState
from pyrula_compat import codec, states
from pyrula_compat.app.task import Context
from pyrula_compat.execution import run_attempt
from pyrula_compat.result import EagerResult
from pyrula_compat.utils import uuid

if TYPE_CHECKING:
    from pyrula_compat.app.task import Task

log = logging.getLogger("pyrula_compat")
MAX_EAGER_RETRIES = 10_000
"""A task retrying forever in eager mode stops here (Celery loops without end)."""


def apply(
    task: Task,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    task_id: str | None = None,
    link: Any = None,
    link_error: Any = None,
    retries: int = 0,
    throw: bool | None = None,
    headers: Any = None,
) -> EagerResult:
    """Run ``task`` here; return an EagerResult."""
    app = task.app
    task_id = task_id or uuid()
    if throw is None:
        throw = bool(app.conf.task_eager_propagates)
    call_args: list[Any] = codec.from_json(codec.to_json(list(args)))
    call_kwargs: dict[str, Any] = codec.from_json(codec.to_json(dict(kwargs)))
    start = retries
    while True:
        request = Context(
            id=task_id, args=call_args, kwargs=call_kwargs, retries=retries, is_eager=True,
            called_directly=False, hostname=socket.gethostname(), root_id=task_id,
            headers=headers or {}, task=task.name, callbacks=link, errbacks=link_error,
            delivery_info={"is_eager": True, "exchange": None, "routing_key": None,
                           "priority": None},
        )  # fmt: skip
        attempt = run_attempt(task, request)
        if attempt.kind != "retry" or retries - start >= MAX_EAGER_RETRIES:
            break
        if attempt.args is not None:
            call_args = list(attempt.args)
        if attempt.kwargs is not None:
            call_kwargs = dict(attempt.kwargs)
        retries += 1
    if attempt.kind == "ok":
        _store(task, task_id, call_args, call_kwargs, states.SUCCESS, attempt.value)
        for sig in _sigs(link, app):
            sig.apply_async((attempt.value,))
        return EagerResult(task_id, attempt.value, states.SUCCESS, name=task.name, app=app)
    exc = attempt.exc
    assert exc is not None
    traceback = attempt.einfo.traceback if attempt.einfo is not None else None
    _store(task, task_id, call_args, call_kwargs, states.FAILURE, exc, traceback)
    for sig in _sigs(link_error, app):
        from pyrula_compat.flows import _arity

        target = app.tasks.get(sig.task)
        if target is not None and _arity(target) > 1:
            sig(request, exc, traceback)
        else:
            sig.apply_async((task_id,))
    if throw:
        raise exc
    return EagerResult(task_id, exc, states.FAILURE, traceback=traceback, name=task.name, app=app)


def _sigs(value: Any, app: Any) -> list[Any]:
    from pyrula_compat.canvas import maybe_signature

    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else [value]
    return [s for s in (maybe_signature(i, app=app) for i in items) if s is not None]


def _store(
    task: Task,
    task_id: str,
    args: list[Any],
    kwargs: dict[str, Any],
    state: str,
    value: Any,
    traceback: str | None = None,
) -> None:
    """``task_store_eager_result``: keep the outcome in the store as the run ``task_id``
    (unless the task ignores results), for ``AsyncResult(id)`` in any process."""
    conf = task.app.conf
    if not conf.task_store_eager_result:
        return
    ignore = task.ignore_result if task.ignore_result is not None else conf.task_ignore_result
    if ignore:
        return
    from pyrula_compat import recorded

    outcome = recorded.outcome_json(state, value, traceback)
    try:
        recorded.record(task.app, task_id, task.name, outcome, args, kwargs, replace=True)
    except InvalidRunState as exc:  # a queued or running task has this id: it records it
        log.warning("task %s[%s]: eager result not stored: %s", task.name, task_id, exc)
