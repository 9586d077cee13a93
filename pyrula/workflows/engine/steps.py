"""Running one step: its attempts, retry policy, timeout, and journaled outcome.

Short retry backoffs sleep in the worker. Backoffs of at least
``durable_backoff_after`` seconds are journaled as a ``backoff`` entry (at a negative
position derived from the step's position and attempt, so it never takes a step's
place) and the run is suspended on a timer; when it wakes, the step continues with the
next attempt.

**BaseExceptions from a step.** An ``asyncio.CancelledError`` the step raised while its
run was not being cancelled (see :func:`~pyrula.workflows.engine.control.being_cancelled`)
is an ordinary failure: it becomes a :class:`StepRaisedCancelledError` (an ``Exception``,
retried per the policy, the original as its ``__cause__``). Only a real cancellation of
the run's task passes through. Any other BaseException (``KeyboardInterrupt``,
``SystemExit``, ``GeneratorExit``) fails the step at once, never retried, whether the step
is sync or async: a sync step's outcome comes back from its thread as a value, never as
an exception thrown into the run's task (a thrown ``GeneratorExit`` would close the
run's coroutines instead of reaching the step's caller).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pyrula.workflows import hard_limits, log_context, telemetry
from pyrula.workflows.context import StepContext
from pyrula.workflows.engine.control import Suspend, being_cancelled, running_step
from pyrula.workflows.engine.threads import StepThreadPool
from pyrula.workflows.errors import (
    LeaseLost,
    PayloadError,
    StepRaisedCancelledError,
    StepTimeout,
)
from pyrula.workflows.faults import fault_point
from pyrula.workflows.hard_limits import HardTimeout
from pyrula.workflows.records import JournalEntry, Wait
from pyrula.workflows.retry import RetryPolicy
from pyrula.workflows.serialization import ErrorInfo, decode, encode
from pyrula.workflows.stores.rules import MAX_TRACKED_ATTEMPTS, backoff_position

if TYPE_CHECKING:
    from pyrula.workflows.engine.execution import RunExecution

log = logging.getLogger("pyrula.workflows.engine")

DEFAULT_STEP_RETRY = RetryPolicy()
"""Used by steps that don't name a policy: 3 attempts, 1 s then 2 s backoff."""


def _backoff_state(execution: RunExecution, position: int) -> tuple[int, float | None]:
    """(last failed attempt, when the next may start) from journaled backoffs."""
    attempt, wake_at = 0, None
    for candidate in range(1, MAX_TRACKED_ATTEMPTS):
        entry = execution.journal.get(backoff_position(position, candidate))
        if entry is None:
            break
        state = decode(entry.value)
        attempt, wake_at = int(state["attempt"]), float(state["wake_at"])
    return attempt, wake_at


def _stray_cancel(name: str, exc: asyncio.CancelledError) -> StepRaisedCancelledError:
    detail = f" ({exc})" if str(exc) else ""
    error = StepRaisedCancelledError(
        f"step {name!r} raised asyncio.CancelledError{detail} although its run was not "
        "being cancelled: a failure of the step, retried per its policy (to fail a step, "
        "raise an Exception; let a real cancellation through)"
    )
    error.__cause__ = exc
    return error


async def _guarded(name: str, awaitable: Awaitable[Any]) -> tuple[bool, Any]:
    """Await user code, turning any exception (even SystemExit) into a value.

    Only cancellation of this task passes through, so a step can never stop the loop;
    a ``CancelledError`` the step raised itself becomes a StepRaisedCancelledError.
    """
    token = running_step.set(name)
    try:
        return True, await awaitable
    except asyncio.CancelledError as exc:
        if being_cancelled():
            raise
        return False, _stray_cancel(name, exc)
    except BaseException as exc:
        return False, exc
    finally:
        running_step.reset(token)


def _outcome(name: str, fn: Callable[[], Any]) -> tuple[bool, Any]:
    """Call a sync step, in its thread: its outcome, even a BaseException, as a value.

    So the future that carries it back only ever raises when it is cancelled: an
    exception set on it would be thrown into the run's task, where ``GeneratorExit``
    closes the coroutines it goes through instead of reaching the step's caller, and a
    ``CancelledError`` would pass for a cancellation of the run.
    """
    running_step.set(name)  # in the thread's own copy of the context
    try:
        return True, fn()
    except StopIteration as exc:  # would become a RuntimeError raised from a coroutine
        wrapped = RuntimeError(f"the step raised StopIteration: {exc!r}")
        wrapped.__cause__ = exc
        return False, wrapped
    except BaseException as exc:
        return False, exc


async def run_step(
    execution: RunExecution,
    position: int,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    retry: RetryPolicy | None,
    timeout: float | None,
    takes_context: bool,
) -> Any:
    entry = execution.recorded(position, "step", name)
    if entry is not None:
        return execution.outcome(entry)
    execution.running_steps += 1  # before any await: a step beside it must see this one
    try:
        await execution.flush()  # the previous step's entry, before this one's side effects
        execution.check_boundary()
        return await _execute_step(
            execution, position, name, fn, args, kwargs, retry, timeout, takes_context
        )
    finally:
        execution.running_steps -= 1


async def _execute_step(
    execution: RunExecution,
    position: int,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    retry: RetryPolicy | None,
    timeout: float | None,
    takes_context: bool,
) -> Any:
    policy = retry or DEFAULT_STEP_RETRY
    attempt, wake_at = _backoff_state(execution, position)
    if wake_at is not None and await execution.store_now() < wake_at:
        raise Suspend(Wait(wake_at=wake_at))
    attempt += 1
    while True:
        fault_point("step_started")
        if execution.observer is not None:
            execution.observer.step_started(execution, name, attempt)
        call_args = args
        if takes_context:
            step_ctx = StepContext(
                run_id=execution.run_id,
                workflow=execution.workflow,
                step=name,
                position=position,
                attempt=attempt,
                max_attempts=policy.max_attempts,
                token=execution.token,
                reporter=_progress_reporter(execution),
            )
            call_args = (step_ctx, *args)
        instrument = telemetry.current
        scope = None if instrument is None else instrument.step_started(execution, name, attempt)
        with log_context.bound(step=name, attempt=attempt):  # what the step logs says so
            ok, value = await _call(execution, name, fn, call_args, kwargs, timeout)
        if instrument is not None:
            instrument.step_ended(scope, execution, name, None if ok else value)
        if ok:
            try:
                text = encode(
                    value, what=f"result of step {name!r}", max_bytes=execution.max_payload
                )
                break
            except PayloadError as exc:
                # The step ran and its effects happened: retrying would repeat them
                # only to return the same unstorable value. Fail the step now.
                ok, value = False, exc
                text = ErrorInfo.from_exception(value).to_json()
                break
        if not policy.should_retry(value, attempt):
            text = ErrorInfo.from_exception(value).to_json()
            break
        delay = policy.backoff(attempt)
        if instrument is not None:
            instrument.step_retrying(execution, name, attempt)
        log.warning(
            "run %s step %r attempt %d failed (%s: %s); retrying in %.2fs",
            execution.run_id,
            name,
            attempt,
            type(value).__name__,
            value,
            delay,
            extra={"step": name, "attempt": attempt},
        )
        if delay >= execution.durable_backoff_after:
            wake = await execution.store_now() + delay
            await execution.append(
                JournalEntry(
                    run_id=execution.run_id,
                    position=backoff_position(position, attempt),
                    kind="backoff",
                    name=name,
                    ok=False,
                    value=encode({"attempt": attempt, "wake_at": wake}),
                    attempts=attempt,
                )
            )
            raise Suspend(Wait(wake_at=wake))
        await asyncio.sleep(delay)
        execution.check_boundary()
        attempt += 1
    fault_point("after_step_before_journal")
    entry = JournalEntry(
        run_id=execution.run_id,
        position=position,
        kind="step",
        name=name,
        ok=ok,
        value=text,
        attempts=attempt,
    )
    # Deferred (see RunExecution.defer) unless steps run beside it (ctx.gather) or a test
    # observer names every write as a crash point (check_crash_safety): the crashes it
    # tries are the same ones either way, a step re-runs if its entry was not yet written.
    if execution.running_steps == 1 and execution.pending is None and execution.observer is None:
        execution.defer(entry)
    else:
        await execution.append(entry)  # steps still running beside it (ctx.gather)
    if ok:
        return decode(text)
    execution.failed_steps[id(value)] = position
    raise value


async def _call(
    execution: RunExecution,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    timeout: float | None,
) -> tuple[bool, Any]:
    if isinstance(timeout, HardTimeout):  # @step(hard=True): a pool process is killed
        error = StepTimeout(f"step {name!r} ran past its hard timeout of {timeout}s")
        if hard_limits.arm(timeout, error):
            try:
                return await _call(execution, name, fn, args, kwargs, float(timeout))
            finally:
                hard_limits.disarm()
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - async callables
    ):
        try:
            return await asyncio.wait_for(_guarded(name, fn(*args, **kwargs)), timeout)
        except TimeoutError:
            return False, StepTimeout(f"step {name!r} did not finish within {timeout}s")
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    call = functools.partial(
        contextvars.copy_context().run, _outcome, name, functools.partial(fn, *args, **kwargs)
    )
    executor = execution.executor
    # Raises only when cancelled (see _outcome): the task's, or the pool's at shutdown.
    if isinstance(executor, StepThreadPool):
        ok, value = await executor.run_soon(loop, call)
    else:
        ok, value = await loop.run_in_executor(executor, call)
    if not ok and isinstance(value, asyncio.CancelledError):
        value = _stray_cancel(name, value)  # nothing cancels a thread: raised by the step
    elif ok and inspect.isawaitable(value):
        ok, value = await _guarded(name, value)  # a sync callable that returned a coroutine
    elapsed = time.monotonic() - started
    if timeout is not None and elapsed > timeout:
        log.warning(
            "run %s sync step %r took %.1fs, over its %.1fs timeout; sync steps are never "
            "killed, so its outcome stands",
            execution.run_id,
            name,
            elapsed,
            timeout,
        )
    return ok, value


PROGRESS_WRITE_TIMEOUT = 30.0


def _progress_reporter(execution: RunExecution) -> Callable[[str, Any], None]:
    """A thread-safe ``set_progress`` for this run's steps."""
    return functools.partial(_report, execution, asyncio.get_running_loop())


def _report(
    execution: RunExecution, loop: asyncio.AbstractEventLoop, state: str, info: Any
) -> None:
    text = encode(info, what=f"info of progress {state!r}", max_bytes=execution.max_payload)

    async def write() -> None:
        try:
            await execution.store.set_progress(execution.run_id, execution.token, state, text)
        except LeaseLost:
            # The run moved on without us; the step's outcome will be refused too.
            execution.lost = True

    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        task = loop.create_task(write())
        task.add_done_callback(_log_progress_failure)
    else:
        asyncio.run_coroutine_threadsafe(write(), loop).result(PROGRESS_WRITE_TIMEOUT)


def _log_progress_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("progress update failed: %s", task.exception())
