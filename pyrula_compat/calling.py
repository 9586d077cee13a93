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

import inspect
import json
import logging
import math
import numbers
import os
import socket
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyrula.workflows import RunRecord
from pyrula.workflows.errors import IdempotencyConflict, InvalidRunState
from pyrula_compat import _state, codec, publish_retry, trail
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


def eta_datetime(value: Any, task: str | None = None, option: str = "eta") -> datetime | None:
    """A task's ``eta`` option as an aware datetime: ``None`` stays ``None``, an ISO 8601
    string is parsed, and a naive datetime is taken as UTC (as Celery's worker reads it).

    Raises TypeError (ValueError for a string that is no date) naming the option.
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(
                f"{_who(task)}{option}={value!r} is not an ISO 8601 date and time "
                "(e.g. '2030-01-01T12:00:00+00:00')"
            ) from None
    if isinstance(value, datetime):
        return aware(value)
    raise TypeError(
        f"{_who(task)}{option} takes a datetime or an ISO 8601 string, got "
        f"{type(value).__name__} {value!r} (use countdown= for a number of seconds)"
    )


def _who(task: str | None) -> str:
    return f"task {task}: " if task else ""


def seconds(option: str, value: Any, task: str | None = None) -> float:
    """``countdown`` (or a relative ``expires``) as a finite number of seconds: a
    string, a bool, NaN or an infinity is refused with TypeError or ValueError naming the
    task and the option."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{_who(task)}{option} takes a number of seconds (int or float), got "
            f"{type(value).__name__} {value!r}"
        )
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{_who(task)}{option} must be a finite number of seconds, got {value!r}")
    if number > MAX_SECONDS:
        raise ValueError(
            f"{_who(task)}{option}={value!r} seconds is past the last date Python can hold"
        )
    return number


MAX_SECONDS = (datetime.max.replace(tzinfo=UTC) - datetime(2100, 1, 1, tzinfo=UTC)).total_seconds()
"""The longest countdown or expiry taken: from any date before 2100, one more would
pass ``datetime.max``."""


def _expiry(value: Any, task: str | None = None) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, (str, datetime)):
        return eta_datetime(value, task, "expires")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{_who(task)}expires takes a number of seconds, a timedelta, a datetime or "
            f"an ISO 8601 string, got {type(value).__name__} {value!r}"
        )
    return datetime.fromtimestamp(time.time() + seconds("expires", value, task), UTC)


def check_call(name: str, args: Any, kwargs: Any, options: Mapping[str, Any]) -> None:
    """Refuse, before anything is stored or run, what Celery refuses when it sends a
    task: args that are no list or tuple, kwargs that are no mapping (:func:`check_args`),
    and a ``countdown``, ``eta`` or ``expires`` of the wrong type or not finite
    (``float("nan")``). Each error names the task and the option."""
    check_args(name, args, kwargs)
    if options.get("countdown") is not None:
        seconds("countdown", options["countdown"], name)
    if options.get("eta") is not None:
        eta_datetime(options["eta"], name)
    if options.get("expires") is not None:
        _expiry(options["expires"], name)


def check_args(name: str, args: Any, kwargs: Any) -> None:
    """TypeError naming task ``name`` for args that are no list or tuple, or kwargs that
    are no mapping, as Celery refuses them."""
    if args is not None and not isinstance(args, (list, tuple)):
        raise TypeError(
            f"task {name}: args must be a list or tuple, got {type(args).__name__} {args!r}"
            " (one argument is args=(value,))"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(
            f"task {name}: kwargs must be a mapping (a dict of keyword arguments), got "
            f"{type(kwargs).__name__} {kwargs!r}"
        )


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
    check_args(name, args, kwargs)  # the times are checked as they are read, below
    chosen = task_id or options.pop("task_id", None)
    task_id = chosen or uuid()
    countdown = options.get("countdown")
    eta = eta_datetime(options.get("eta"), name)
    delay: float | None = None
    start_at: datetime | None = None
    if countdown is not None:
        delay = max(0.0, seconds("countdown", countdown, name))
        eta = datetime.now(UTC) + timedelta(seconds=delay)
    elif eta is not None:
        start_at = eta
    expires_at = _expiry(options.get("expires"), name)
    headers = {**(options.get("headers") or {}), ORIGIN: options.get("origin") or anon_nodename()}
    if eta is not None or expires_at is not None:  # Celery 5's protocol 2 headers
        headers = {**(headers or {}), **_times(eta, expires_at)}
    hard, soft = options.get("time_limit"), options.get("soft_time_limit")
    if hard is not None or soft is not None:  # the call's limits win over the task's
        headers = {**(headers or {}), "timelimit": [hard, soft]}
    params = task_params(
        args, kwargs, app=app, link=link, link_error=link_error, headers=headers, extra=extra
    )
    retry, policy = publish_retry.policy_of(app, options)
    _publish(before_task_publish, name, task_id, params, options, policy)
    key = (chosen or None) if keyed else None

    def attempt(tries: int) -> None:
        client = app.client()
        try:
            client.submit(
                name, params, run_id=task_id, idempotency_key=key, delay=delay,
                start_at=start_at, expires_at=expires_at,
                fresh_id=not chosen and tries == 1,  # a retry may find its first try's run
                keep_key_order=True,  # a task gets its dicts in the order sent, as with kombu
            )  # fmt: skip
        except (InvalidRunState, IdempotencyConflict) as exc:
            if not chosen and tries == 1:
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

    publish_retry.send(f"task {name}[{task_id}]", attempt, retry, policy)
    _publish(after_task_publish, name, task_id, params, options, policy)
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


def _publish(
    signal: Any, name: str, task_id: str, params: dict[str, Any], options: Any, policy: Any
) -> None:
    if not signal.has_listeners(name):
        return
    headers = {"id": task_id, "task": name, "root_id": params.get("root_id", task_id)}
    headers.update(codec.from_json(params.get("headers")) or {})
    body = (params["args"], params["kwargs"], {"callbacks": params.get("link")})
    signal.send(
        sender=name, body=body, exchange="", routing_key=options.get("queue") or "celery",
        headers=headers, properties={}, declare=[], retry_policy=policy,
    )  # fmt: skip


def call_error(
    name: str, signature: inspect.Signature, args: tuple[Any, ...], kwargs: Mapping[str, Any],
    error: TypeError,
) -> str:  # fmt: skip
    """What Python says of calling task ``name``'s body with these arguments, in the
    order Python checks them (too many positional, an unexpected or repeated keyword, a
    missing argument), the task's name standing for the function's: the message Celery
    shows (``add() got an unexpected keyword argument 'z'``), with the task named in
    full. ``error`` (``Signature.bind``'s) when none of these applies."""
    kinds = inspect.Parameter
    params = list(signature.parameters.values())
    positional = [
        p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    ]
    var_args = any(p.kind is kinds.VAR_POSITIONAL for p in params)
    var_kwargs = any(p.kind is kinds.VAR_KEYWORD for p in params)
    if not var_args and len(args) > len(positional):
        required = sum(p.default is kinds.empty for p in positional)
        takes = (
            f"from {required} to {len(positional)}"
            if required < len(positional)
            else len(positional)
        )
        given = f"{len(args)} {'was' if len(args) == 1 else 'were'} given"
        plural = "" if takes == 1 else "s"
        return f"{name}() takes {takes} positional argument{plural} but {given}"
    named = {p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)}
    filled = {p.name for p in positional[: len(args)]}
    for key in kwargs:
        if key in filled and key in named:
            return f"{name}() got multiple values for argument {key!r}"
        if key not in named and not var_kwargs:
            return f"{name}() got an unexpected keyword argument {key!r}"
    for kind, label in (
        (positional, "positional"),
        ([p for p in params if p.kind is kinds.KEYWORD_ONLY], "keyword-only"),
    ):
        missing = [
            p.name
            for p in kind
            if p.default is kinds.empty and p.name not in filled and p.name not in kwargs
        ]
        if missing:
            quoted = [repr(m) for m in missing]
            listed = (
                quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]
            )
            plural = "" if len(missing) == 1 else "s"
            return f"{name}() missing {len(missing)} required {label} argument{plural}: {listed}"
    return f"{name}(): {error}"
