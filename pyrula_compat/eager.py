"""Eager execution: ``task.apply()`` and ``task_always_eager``, in this process.

No worker, no store: the body runs here under the same attempt code a worker uses, so
hooks, signals and autoretry behave the same. Retries loop at once (countdowns are
ignored, as in Celery), and a failure is captured in the :class:`EagerResult` unless
``throw`` or ``task_eager_propagates`` asks for it to be raised. With
``task_store_eager_result`` the outcome is also recorded in the store under the task id
(:mod:`pyrula_compat.recorded`).

Arguments: Celery's eager ``apply_async``/``delay`` sends them through the serializer and
back before it calls ``apply()`` (its ``apply()`` itself does not, and neither result is
serialized). :func:`serialized` is that round trip with the encoding the worker path
uses (:mod:`pyrula_compat.codec`, then the store client's JSON encoder): tuples become
lists, ``{1: "a"}`` becomes ``{"1": "a"}``, and what a worker could not be sent (a model
instance, a set, a tuple key) raises the same ``NotJSONSerializable`` at the call.
:func:`apply` does it unless told ``serialize=False``; ``options`` (``priority``,
``exchange``, ``routing_key``) show in ``request.delivery_info`` as in Celery.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyrula.workflows import InvalidRunState
from pyrula.workflows.serialization import decode, encode
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


def serialized(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """``args``/``kwargs`` after the trip a worker's would make (what Celery's eager
    ``apply_async`` does with its serializer): encoded as :func:`calling.task_params
    <pyrula_compat.calling.task_params>` and the store client encode them, then decoded.

    Raises NotJSONSerializable (a TypeError) naming what is not JSON, or PayloadTooLarge,
    as sending them to a worker would."""
    params = {"args": codec.to_json(list(args)), "kwargs": codec.to_json(dict(kwargs))}
    decoded = decode(encode(params, what="params"))  # key order kept, as calling.submit
    return codec.from_json(decoded["args"]), codec.from_json(decoded["kwargs"])


def apply(
    task: Task,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    task_id: str | None = None,
    link: Any = None,
    link_error: Any = None,
    retries: int = 0,
    throw: bool | None = None,
    headers: Any = None,
    options: Mapping[str, Any] | None = None,
    serialize: bool = True,
) -> EagerResult:
    """Run ``task`` here; return an EagerResult. ``serialize``: pass the arguments through
    :func:`serialized` first (False: the body gets them as given, as Celery's ``apply()``
    does). ``options``: the call's options (``priority``... for ``delivery_info``)."""
    app = task.app
    task_id = task_id or uuid()
    if throw is None:
        throw = bool(app.conf.task_eager_propagates)
    call_args: Sequence[Any]
    if serialize:
        call_args, call_kwargs = serialized(args, kwargs)
    else:
        call_args, call_kwargs = args, dict(kwargs)
    opts = options or {}
    delivery_info = {
        "is_eager": True, "exchange": opts.get("exchange"),
        "routing_key": opts.get("routing_key"), "priority": opts.get("priority"),
    }  # fmt: skip
    start = retries
    while True:
        request = Context(
            id=task_id, args=call_args, kwargs=call_kwargs, retries=retries, is_eager=True,
            called_directly=False, hostname=socket.gethostname(), root_id=task_id,
            headers=headers or {}, task=task.name, callbacks=link, errbacks=link_error,
            shadow=(headers or {}).get("shadow"),
            delivery_info=dict(delivery_info),
        )  # fmt: skip
        attempt = run_attempt(task, request)
        if attempt.kind != "retry" or retries - start >= MAX_EAGER_RETRIES:
            break
        if attempt.retry is not None and not attempt.retry.is_eager:
            # A Retry raised by other code than self.retry() (a mocked retry): as
            # Celery, the task is not run again; raised with throw, else state RETRY.
            if throw:
                raise attempt.retry
            return EagerResult(task_id, attempt.retry, states.RETRY, name=task.name, app=app)
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
    args: Sequence[Any],
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
