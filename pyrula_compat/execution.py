"""One attempt of a task body, with Celery's hooks, signals, autoretry and time limits.

The same code runs an attempt on a worker (inside a journaled step) and in eager mode.
It never raises: it returns an :class:`Attempt` saying the task succeeded, wants a
retry (with its countdown or eta and the arguments for next time), or failed for good.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyrula.workflows import hard_limits
from pyrula_compat import _state, states
from pyrula_compat.app.task import Context, Task
from pyrula_compat.errors import ExceptionInfo
from pyrula_compat.exceptions import (
    Ignore,
    Reject,
    Retry,
    SoftTimeLimitExceeded,
    TimeLimitExceeded,
)
from pyrula_compat.replace import Replaced
from pyrula_compat.signals import (
    task_failure,
    task_postrun,
    task_prerun,
    task_retry,
    task_success,
)
from pyrula_compat.utils.time import get_exponential_backoff_interval

log = logging.getLogger("pyrula_compat.worker")


@dataclass
class Attempt:
    """How one attempt ended. ``kind`` is ``ok``, ``retry``, ``error``, ``replace`` or
    ``lost`` (the worker lost the run meanwhile: nothing is recorded)."""

    kind: str
    value: Any = None
    exc: BaseException | None = None
    countdown: float | None = None
    eta: float | None = None
    """Epoch seconds of the next attempt (wins over countdown)."""
    args: tuple[Any, ...] | None = None
    kwargs: dict[str, Any] | None = None
    chain_stopped: bool = False
    einfo: ExceptionInfo | None = None
    retry_text: str = ""
    """For ``retry``: Celery's text of the retry (``Retry in 10s: ConnectionError()``)."""
    ignored: bool = False
    """For ``ok``: the body raised ``Ignore``."""
    retry: Retry | None = None
    """The Retry of a ``retry`` attempt (``retry.is_eager``: raised by ``self.retry()``
    in eager mode, which runs the task again there)."""


def backoff_interval(factor: float, retries: int, maximum: float, full_jitter: bool) -> float:
    """Celery's ``get_exponential_backoff_interval``: ``min(maximum, factor * 2**retries)``,
    replaced by a uniform integer in ``[0, countdown]`` with full jitter."""
    return float(get_exponential_backoff_interval(factor, retries, maximum, full_jitter))


def _eta_epoch(when: Any) -> float | None:
    if isinstance(when, datetime):
        aware = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
        return aware.timestamp()
    if isinstance(when, str):
        return _eta_epoch(datetime.fromisoformat(when))
    return None


class BodyStopped(BaseException):
    """Raised inside a task's body when its worker lost the run (terminated, or taken
    over by another worker): a BaseException, so that ``except Exception`` in the body
    does not swallow it. The attempt then ends with no hook and no signal."""


class BodyGuard:
    """What may raise inside the body's thread while it runs: SoftTimeLimitExceeded /
    TimeLimitExceeded at the limits, :class:`BodyStopped` when :meth:`stop_body` is
    called. Python delivers them at the next bytecode, so code blocked in C (a socket
    read, ``time.sleep``) sees them only when it returns; nothing is killed. Nothing is
    raised once the body returned (:meth:`done`)."""

    def __init__(self, soft: float | None, hard: float | None) -> None:
        self._thread = threading.get_ident()
        self._lock = threading.Lock()
        self._done = False
        self._raised = False
        """Whether an exception was set for the thread (done() must drop it if pending)."""
        self.stopped = False
        """Whether :meth:`stop_body` was called before the body returned."""
        # In a process pool, the pool's parent kills this process at the hard limit
        # (pyrula.workflows.hard_limits); else the limit is raised into the thread.
        self._killed = (
            hard is not None and hard > 0 and hard_limits.arm(hard, TimeLimitExceeded(hard))
        )
        if self._killed:
            hard = None
        self._timers = [
            threading.Timer(limit, self._raise, (kind,))
            for limit, kind in ((soft, SoftTimeLimitExceeded), (hard, TimeLimitExceeded))
            if limit
        ]
        for timer in self._timers:
            timer.daemon = True
            timer.start()

    def stop_body(self) -> None:
        """From any thread: raise BodyStopped in the body, if it is still running."""
        with self._lock:
            if not self._done:
                self.stopped = True
        self._raise(BodyStopped)

    def _raise(self, kind: type[BaseException]) -> None:
        with self._lock:
            if not self._done:
                self._raised = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self._thread), ctypes.py_object(kind)
                )

    def done(self) -> None:
        """The body returned: raise nothing more, and drop what was raised but not yet
        delivered (idempotent)."""
        with self._lock:
            if self._done:
                return
            self._done = True
            if self._killed:
                hard_limits.disarm()
            for timer in self._timers:
                timer.cancel()
            if self._raised:  # nothing was raised on most attempts: no call then
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread), None)


def _invoke(task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Call the body the way Celery's worker does: through the class's ``__call__``
    when it overrides Task's (a Flask ``ContextTask``), else ``task.run``."""
    body = task if type(task).__call__ is not Task.__call__ else task.run
    value = body(*args, **kwargs)
    if inspect.iscoroutine(value):
        value = asyncio.run(value)
    return value


def _call_with_autoretry(task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    try:
        return _invoke(task, args, kwargs)
    except (Ignore, Retry, Reject):
        raise
    except Exception as exc:
        autoretry = tuple(task.autoretry_for or ())
        if not autoretry or not isinstance(exc, autoretry):
            raise
        if isinstance(exc, tuple(task.dont_autoretry_for or ())):
            raise
        retry_kwargs = dict(task.retry_kwargs or {})
        if task.retry_backoff:
            retry_kwargs["countdown"] = backoff_interval(
                factor=int(max(1.0, float(task.retry_backoff))),
                retries=task.request.retries,
                maximum=task.retry_backoff_max,
                full_jitter=bool(task.retry_jitter),
            )
        raise task.retry(exc=exc, **retry_kwargs) from None


def limits(task: Task, request: Context) -> tuple[float | None, float | None]:
    """The attempt's (soft, hard) time limits: the call's (``apply_async(time_limit=,
    soft_time_limit=)``, ``request.timelimit`` = (hard, soft)), else the task's, else
    the app's."""
    conf = task.app.conf
    soft = task.soft_time_limit if task.soft_time_limit is not None else conf.task_soft_time_limit
    hard = task.time_limit if task.time_limit is not None else conf.task_time_limit
    if request.timelimit:
        call_hard, call_soft = request.timelimit
        hard = call_hard if call_hard is not None else hard
        soft = call_soft if call_soft is not None else soft
    return soft, hard


def run_attempt(task: Task, request: Context, guards: dict[str, Any] | None = None) -> Attempt:
    """Run one attempt of ``task`` under ``request`` (pushed as ``task.request``). On a
    worker, ``guards`` gets the body's :class:`BodyGuard` under ``"body"`` while the body
    runs, for the worker to stop it; a ``"stop"`` the worker set there before (it lost
    the run while the attempt was on its way to the body) stops it on entry. Each side
    writes its key before it reads the other's, so one of them sees the other."""
    # The hooks and signals get the request's args as they came (a list from a worker's
    # JSON, as Celery's from its message), the body the same values.
    args: Sequence[Any] = request.args if request.args is not None else ()
    kwargs = dict(request.kwargs or {})
    task_id = request.id or ""
    stack = task.request_stack
    stack.append(request)
    _state.push_task(task)
    outcome: Attempt
    guard: BodyGuard | None = None
    try:
        task_prerun.send(sender=task, task_id=task_id, task=task, args=args, kwargs=kwargs)
        if not request.is_eager:
            guard = BodyGuard(*limits(task, request))
            if guards is not None:
                guards["body"] = guard
                if guards.get("stop"):  # the worker lost the run before the body began
                    raise BodyStopped
        try:
            task.before_start(task_id, args, kwargs)
            value = _call_with_autoretry(task, args, kwargs)
        finally:
            if guard is not None:
                guard.done()
        if guard is not None and guard.stopped:
            raise BodyStopped
        if request._retry is not None:
            raise request._retry
        outcome = _succeeded(task, request, value, args, kwargs)
    except BodyStopped:
        log.warning("task %s[%s]: stopped, its worker lost the run", task.name, task_id)
        outcome = Attempt("lost")
    except Retry as retry:
        outcome = _retrying(task, request, retry, args, kwargs)
    except Replaced as replaced:
        outcome = _replacing(task, request, replaced, args, kwargs)
    except Ignore:
        outcome = Attempt("ok", None, chain_stopped=True, ignored=True)
        task_postrun.send(
            sender=task, task_id=task_id, task=task, args=args, kwargs=kwargs, retval=None,
            state=states.IGNORED,
        )  # fmt: skip
    except Reject as reject:
        if reject.requeue:
            outcome = _retrying(task, request, Retry(exc=reject, when=0), args, kwargs)
        else:
            outcome = _failed(task, request, reject, args, kwargs)
    except BaseException as exc:  # a worker must record every failure, even SystemExit
        if isinstance(exc, (KeyboardInterrupt, GeneratorExit)):
            raise
        outcome = _failed(task, request, exc, args, kwargs)
    finally:
        if guard is not None:
            guard.done()  # again: an exception may have landed before the first
            if guards is not None:
                guards.pop("body", None)
        _state.pop_task()
        if stack and stack[-1] is request:
            stack.pop()
    return outcome


def _succeeded(
    task: Task, request: Context, value: Any, args: Sequence[Any], kwargs: dict[str, Any]
) -> Attempt:
    task_id = request.id or ""
    _hook(task.on_success, value, task_id, args, kwargs)
    task_success.send(sender=task, result=value)
    _hook(task.after_return, states.SUCCESS, value, task_id, args, kwargs, None)
    task_postrun.send(
        sender=task, task_id=task_id, task=task, args=args, kwargs=kwargs, retval=value,
        state=states.SUCCESS,
    )  # fmt: skip
    return Attempt("ok", value, chain_stopped=request.chain is None and _had_chain(request))


def _replacing(
    task: Task, request: Context, replaced: Replaced, args: Sequence[Any], kwargs: dict[str, Any]
) -> Attempt:
    """``self.replace(sig)``: eagerly, the task returns the replacement's result; on a
    worker the run goes on with ``sig`` (``kind="replace"``, the signature as value)."""
    if replaced.eager:
        return _succeeded(task, request, replaced.value, args, kwargs)
    task_postrun.send(
        sender=task, task_id=request.id or "", task=task, args=args, kwargs=kwargs,
        retval=None, state=states.IGNORED,
    )  # fmt: skip
    value = {"sig": replaced.sig, "nesting": replaced.nesting}
    return Attempt("replace", value, chain_stopped=replaced.chain_stopped)


def _had_chain(request: Context) -> bool:
    return bool(getattr(request, "_chain_given", False))


def _retrying(
    task: Task, request: Context, retry: Retry, args: Sequence[Any], kwargs: dict[str, Any]
) -> Attempt:
    task_id = request.id or ""
    reason = retry.exc if isinstance(retry.exc, BaseException) else retry
    # As Celery: on_retry gets Retry.exc (None when retry() was given none) and an
    # einfo of the Retry itself, whose traceback chains the exception handled.
    einfo = ExceptionInfo(retry)
    _hook(task.on_retry, retry.exc, task_id, args, kwargs, einfo)
    task_retry.send(sender=task, request=request, reason=retry, einfo=einfo)
    task_postrun.send(
        sender=task, task_id=task_id, task=task, args=args, kwargs=kwargs, retval=retry,
        state=states.RETRY,
    )  # fmt: skip
    when = retry.when
    eta = _eta_epoch(when)
    countdown = None if eta is not None or isinstance(when, datetime) else float(when or 0)
    return Attempt(
        "retry",
        exc=reason,
        countdown=countdown,
        eta=eta,
        args=retry.args_override,
        kwargs=retry.kwargs_override,
        einfo=ExceptionInfo(reason) if reason is not retry else einfo,
        retry_text=str(retry),
        retry=retry,
    )


def _failed(
    task: Task,
    request: Context,
    exc: BaseException,
    args: Sequence[Any],
    kwargs: dict[str, Any],
) -> Attempt:
    task_id = request.id or ""
    einfo = ExceptionInfo(exc)
    expected = isinstance(exc, tuple(task.throws or ()))
    if request.is_eager and expected:  # on a worker, worker_log.ended() logs it as Celery
        log.info("task %s[%s] raised expected: %r", task.name, task_id, exc)
    elif request.is_eager:
        log.error("task %s[%s] raised unexpected: %r", task.name, task_id, exc)
    _hook(task.on_failure, exc, task_id, args, kwargs, einfo)
    task_failure.send(
        sender=task, task_id=task_id, exception=exc, args=args, kwargs=kwargs,
        traceback=exc.__traceback__, einfo=einfo,
    )  # fmt: skip
    _hook(task.after_return, states.FAILURE, exc, task_id, args, kwargs, None)  # as Celery
    task_postrun.send(
        sender=task, task_id=task_id, task=task, args=args, kwargs=kwargs, retval=exc,
        state=states.FAILURE,
    )  # fmt: skip
    return Attempt("error", exc=exc, einfo=einfo)


def _hook(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("task hook %r raised", fn)
