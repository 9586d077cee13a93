"""Queueing a task: Celery's call options turned into one ``submit`` on the store.

``task_id`` is the run id and, when the caller chose it, its idempotency key, so
sending the same id twice returns the first run (an id generated here is new, so it
needs no key: that saves the key's reservation, a round trip per call).
``countdown``/``eta`` hold the run back (``delay``/``start_at``); ``expires`` drops it if
it has not started by then. Both also go in the task's headers as ISO 8601 strings (a
countdown as its eta), the worker's ``request.eta``/``request.expires``, as in Celery 5's
protocol 2 (a worker of an older release takes them as plain headers), and so does
``origin``, the sending process's node name (Celery's ``gen<pid>@<host>``): the worker's
``request.origin``. An id revoked before it was sent names a revoked run already: the
task is discarded, its result reads REVOKED. ``queue``, ``priority``, ``routing_key`` and
the broker options are accepted and have no effect.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyrula.workflows import RunRecord
from pyrula.workflows.errors import IdempotencyConflict, InvalidRunState
from pyrula_compat import _state, codec, trail
from pyrula_compat.result import AsyncResult, served
from pyrula_compat.runstate import REVOKED_TASK
from pyrula_compat.signals import after_task_publish, before_task_publish
from pyrula_compat.utils import uuid

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery
    from pyrula_compat.app.task import Task

log = logging.getLogger("pyrula_compat")


def aware(value: datetime) -> datetime:
    """A naive datetime is UTC, as Celery's worker reads it."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def eta_datetime(value: Any) -> datetime | None:
    """A task's ``eta`` option as an aware datetime: ``None`` stays ``None``, an ISO 8601
    string is parsed, and a naive datetime is taken as UTC (as Celery's worker reads it).

    Raises TypeError for anything else.
    """
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime):
        return aware(value)
    raise TypeError(f"eta must be a datetime or an ISO 8601 string, got {value!r}")


def _expiry(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(time.time() + float(value), UTC)
    return eta_datetime(value)


def frozen(sigs: Any, app: Celery) -> list[dict[str, Any]] | None:
    """Signatures (one or a list) as JSON dicts, each with its task id fixed now."""
    if sigs is None:
        return None
    from pyrula_compat.canvas import maybe_signature

    items = sigs if isinstance(sigs, (list, tuple)) else [sigs]
    out = []
    for item in items:
        sig = maybe_signature(item, app=app)
        if sig is None:
            continue
        sig.freeze()
        out.append(sig.as_json())
    return out or None


def task_params(
    args: Any,
    kwargs: Any,
    *,
    app: Celery,
    link: Any = None,
    link_error: Any = None,
    headers: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The params of a task run: ``{"args": [...], "kwargs": {...}}`` plus canvas data."""
    params: dict[str, Any] = {
        "args": codec.to_json(list(args or ())),
        "kwargs": codec.to_json(dict(kwargs or {})),
    }
    links = frozen(link, app)
    if links:
        params["link"] = links
    errbacks = frozen(link_error, app)
    if errbacks:
        params["link_error"] = errbacks
    if headers:
        params["headers"] = codec.to_json(dict(headers))
    current = _state.get_current_worker_task()
    if current is not None and current.request.id:
        params.setdefault("parent_id", current.request.id)
        params.setdefault("root_id", current.request.root_id or current.request.id)
    for key, value in (extra or {}).items():
        if value is not None:
            params[key] = value
    return params


def submit(
    app: Celery,
    name: str,
    args: Any,
    kwargs: Any,
    *,
    task_id: str | None = None,
    link: Any = None,
    link_error: Any = None,
    options: Mapping[str, Any] | None = None,
    task: Task | None = None,
    extra: Mapping[str, Any] | None = None,
    keyed: bool = True,
) -> AsyncResult:
    """Queue a run of task ``name``; return its AsyncResult (id known now).

    ``keyed=False``: a given ``task_id`` was generated when a canvas was frozen, not
    chosen by the caller, so it is not made the idempotency key (``canvas.GENERATED_ID``);
    submitting it again finds the first run, as a key would."""
    options = dict(options or {})
    chosen = task_id or options.pop("task_id", None)
    task_id = chosen or uuid()
    countdown = options.get("countdown")
    eta = eta_datetime(options.get("eta"))
    delay: float | None = None
    start_at: datetime | None = None
    if countdown is not None:
        delay = max(0.0, float(countdown))
        eta = datetime.now(UTC) + timedelta(seconds=delay)
    elif eta is not None:
        start_at = eta
    expires_at = _expiry(options.get("expires"))
    headers = {**(options.get("headers") or {}), ORIGIN: options.get("origin") or anon_nodename()}
    if eta is not None or expires_at is not None:  # Celery 5's protocol 2 headers
        headers = {**(headers or {}), **_times(eta, expires_at)}
    hard, soft = options.get("time_limit"), options.get("soft_time_limit")
    if hard is not None or soft is not None:  # the call's limits win over the task's
        headers = {**(headers or {}), "timelimit": [hard, soft]}
    params = task_params(
        args, kwargs, app=app, link=link, link_error=link_error, headers=headers, extra=extra
    )
    _publish(before_task_publish, name, task_id, params, options)
    client = app.client()
    key = (chosen or None) if keyed else None
    try:
        client.submit(
            name, params, run_id=task_id, idempotency_key=key, delay=delay,
            start_at=start_at, expires_at=expires_at, fresh_id=not chosen,
            keep_key_order=True,  # a task gets its dicts in the order sent, as with kombu
        )  # fmt: skip
    except (InvalidRunState, IdempotencyConflict) as exc:
        if not chosen:
            raise
        record = client.get_run(task_id)
        if record is not None and record.workflow == REVOKED_TASK:
            log.info("task %s[%s] was revoked before it was sent: discarded", name, task_id)
            from pyrula_compat import notices

            notices.send(client, name, task_id, json.loads(json.dumps(params)))
        elif (key is not None and isinstance(exc, InvalidRunState)) or not _same_submission(
            record, name, params
        ):
            raise
    _publish(after_task_publish, name, task_id, params, options)
    if task is None and name not in app.tasks:
        _warn_if_unserved(app, name)
    # The task's own result class (an AbortableTask's can abort), as Celery's result_cls.
    result = (
        AsyncResult(task_id, app=app, task_name=name) if task is None else task.AsyncResult(task_id)
    )
    ignore = task.ignore_result if task is not None else None
    if options.get("ignore_result") is not None:
        ignore = options["ignore_result"]
    if ignore is None:
        ignore = bool(app.conf.task_ignore_result)
    result.ignored = bool(ignore)
    trail.add(result, options.get("add_to_parent", True))  # the sender's children
    return result


UNSERVED_CHECK_EVERY = 60.0
"""How often (seconds) a process asks the store whether a running worker serves a task
name it sends without having it registered itself (``send_task``)."""
_unserved_checked: dict[tuple[int, str], float] = {}


def _warn_if_unserved(app: Celery, name: str) -> None:
    """Warn, at most once a minute per name, when ``name`` is sent while no running
    worker serves it: the task stays queued until a worker that knows it starts."""
    key = (id(app), name)
    now = time.monotonic()
    last = _unserved_checked.get(key)
    if last is not None and now - last < UNSERVED_CHECK_EVERY:
        return
    _unserved_checked[key] = now
    if served(app, name) is False:
        log.warning(
            "task %r sent, but no running worker has it registered: it stays queued "
            "(PENDING) until a worker that knows it starts (check that the task's module "
            "is imported there: include=, autodiscover_tasks())",
            name,
        )


TIMES = ("eta", "expires")
"""Headers a countdown or a relative expiry computes anew at each send."""
ORIGIN = "origin"
"""The header naming the process that sent the task (``request.origin``)."""
_origin: tuple[int, str] | None = None


def anon_nodename() -> str:
    """This process's node name as Celery's ``anon_nodename()`` makes it for a message's
    ``origin``: ``gen<pid>@<host name>`` (anew in a forked child)."""
    global _origin
    pid = os.getpid()
    if _origin is None or _origin[0] != pid:
        _origin = (pid, f"gen{pid}@{socket.gethostname()}")
    return _origin[1]


def _times(eta: datetime | None, expires_at: datetime | None) -> dict[str, str]:
    """The message headers the worker's ``request.eta``/``request.expires`` read: ISO 8601
    strings, as in Celery 5 (a countdown as its eta)."""
    times = {}
    if eta is not None:
        times["eta"] = eta.isoformat()
    if expires_at is not None:
        times["expires"] = expires_at.isoformat()
    return times


def _same_submission(record: RunRecord | None, name: str, params: dict[str, Any]) -> bool:
    """Whether ``record`` is this very submission made before (a replayed chain step
    submitting its next step again, or the same ``task_id`` sent twice): same task, same
    params but for the eta and expiry, which a countdown computes anew each time, and the
    origin (a replay may run in another process)."""
    if record is None or record.workflow != name:
        return False
    return _stable(json.loads(record.params)) == _stable(json.loads(json.dumps(params)))


def _stable(params: dict[str, Any]) -> dict[str, Any]:
    headers = {
        k: v for k, v in (params.get("headers") or {}).items() if k not in TIMES and k != ORIGIN
    }
    rest = {k: v for k, v in params.items() if k != "headers"}
    return {**rest, "headers": headers} if headers else rest


def _publish(signal: Any, name: str, task_id: str, params: dict[str, Any], options: Any) -> None:
    if not signal.has_listeners(name):
        return
    headers = {"id": task_id, "task": name, "root_id": params.get("root_id", task_id)}
    headers.update(codec.from_json(params.get("headers")) or {})
    body = (params["args"], params["kwargs"], {"callbacks": params.get("link")})
    signal.send(
        sender=name, body=body, exchange="", routing_key=options.get("queue") or "celery",
        headers=headers, properties={}, declare=[], retry_policy=None,
    )  # fmt: skip
