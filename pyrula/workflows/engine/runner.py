"""Execute one claimed run until it ends or suspends here: replay, run the rest, record."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from enum import Enum

from pyrula.workflows import log_context
from pyrula.workflows.context import WorkflowContext, bind_context, unbind_context
from pyrula.workflows.engine.control import (
    CancelRequested,
    Crash,
    LeaseGone,
    Nondeterminism,
    Suspend,
    being_cancelled,
)
from pyrula.workflows.engine.execution import ExecutionSettings, RunExecution, call_store
from pyrula.workflows.errors import LeaseLost, NondeterminismError, StoreUnavailable
from pyrula.workflows.faults import fault_point
from pyrula.workflows.records import JournalEntry, Lease, Outcome, RunStatus, Wait
from pyrula.workflows.registry import WorkflowDefinition
from pyrula.workflows.serialization import ErrorInfo, decode, encode
from pyrula.workflows.stores.base import Store
from pyrula.workflows.telemetry import TRACE_PARAM

log = logging.getLogger("pyrula.workflows.engine")

MAX_INLINE_RESUMES = 100
"""A wait that is over by the time the run would suspend is resumed in place, this often."""


class RunEnd(str, Enum):
    """How an execution on this worker ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUSPENDED = "suspended"
    """The run sleeps or waits; a timer, signal or child will queue it again."""
    LOST = "lost"
    """The lease was gone (terminated or reclaimed): nothing more was written."""


async def execute_run(
    definition: WorkflowDefinition,
    lease: Lease,
    store: Store,
    settings: ExecutionSettings,
    *,
    on_start: Callable[[RunExecution], None] | None = None,
) -> RunEnd:
    """Run ``lease``'s run until it ends or suspends here; return how.

    Raises only ``asyncio.CancelledError`` (the worker cancelled the task); every other
    outcome, including exceptions from user code (a ``CancelledError`` it raised while
    the task was not being cancelled too), is recorded in the store. What it logs, and
    what the run's code logs, carries the run's id and workflow (:mod:`log_context`).
    """
    with log_context.bound(run_id=lease.run_id, workflow=definition.name):
        return await _execute_run(definition, lease, store, settings, on_start)


async def _execute_run(
    definition: WorkflowDefinition,
    lease: Lease,
    store: Store,
    settings: ExecutionSettings,
    on_start: Callable[[RunExecution], None] | None,
) -> RunEnd:
    window = settings.store_retry_window
    journal: dict[int, JournalEntry] = {}
    if lease.run.claims != 1:
        # Only a lease holder writes the journal, so on a run's first claim it is empty:
        # the read is saved for every run that goes through in one claim.
        entries = await call_store(
            lambda: store.load_journal(lease.run_id), window, f"journal of {lease.run_id}"
        )
        journal = {entry.position: entry for entry in entries}
    cancel_requested = False
    for _ in range(MAX_INLINE_RESUMES):
        execution = RunExecution(store, lease, journal, settings)
        # A cancel learnt by the previous pass (from a journal write's reply) still holds.
        execution.cancel_requested = execution.cancel_requested or cancel_requested
        if on_start is not None:
            on_start(execution)
        outcome = await _run_workflow(definition, execution, settings.max_payload_bytes)
        cancel_requested = execution.cancel_requested
        if outcome is None:
            return RunEnd.LOST
        try:
            if isinstance(outcome, Wait):
                suspended = await call_store(
                    functools.partial(store.suspend_run, lease.run_id, lease.token, outcome),
                    window,
                    f"suspension of {lease.run_id}",
                )
                if not suspended:
                    continue  # what it waits for is already there: go on in place
                log.debug("run %s (%s) suspended", lease.run_id, definition.name)
                return RunEnd.SUSPENDED
            fault_point("before_outcome")
            if execution.observer is not None:
                await execution.observer.checkpoint(execution, "before the outcome")
            last = await execution.take_pending()
            await call_store(
                functools.partial(store.finish_run, lease.run_id, lease.token, outcome, last),
                window,
                f"outcome of {lease.run_id}",
            )
        except (LeaseLost, StoreUnavailable) as exc:
            log.warning("run %s: could not record its outcome (%s)", lease.run_id, exc)
            return RunEnd.LOST
        except Crash:
            return RunEnd.LOST
        log.info("run %s (%s) %s", lease.run_id, definition.name, outcome.status.value)
        return RunEnd(outcome.status.value)
    log.warning("run %s kept resuming in place; handing it back to the queue", lease.run_id)
    await call_store(lambda: store.release_run(lease.run_id, lease.token), window, "release")
    return RunEnd.SUSPENDED


async def _run_workflow(
    definition: WorkflowDefinition, execution: RunExecution, max_payload_bytes: int
) -> Outcome | Wait | None:
    ctx = WorkflowContext(execution)
    token = bind_context(ctx)
    try:
        params = decode(execution.params_text)
        params.pop(TRACE_PARAM, None)  # the submit's trace context (telemetry.py)
        try:
            running = definition.fn(ctx, **params)
        except TypeError:  # raised by the call itself: no workflow code ran yet
            definition.check_params(params)  # InvalidParams when they don't fit
            raise
        value = await running
        execution.check_journal_used()
        text = encode(value, what="workflow result", max_bytes=max_payload_bytes)
        return Outcome(RunStatus.COMPLETED, result=text)
    except Suspend as suspend:
        return suspend.wait
    except CancelRequested:
        return Outcome(RunStatus.CANCELLED)
    except LeaseGone:
        log.warning("run %s: lease lost; abandoning it to its new holder", execution.run_id)
        return None
    except Crash:
        return None
    except Nondeterminism as signal:
        return _nondeterministic(signal)
    except asyncio.CancelledError as exc:
        if being_cancelled():
            raise  # the worker stops the run here (drain, lost lease): not an outcome
        # Raised by the workflow's own code (or a library it awaited), not a cancellation
        # of the run: a failure like any other, or the worker would requeue it forever.
        log.warning(
            "run %s failed: its code raised asyncio.CancelledError although the run was "
            "not being cancelled",
            execution.run_id,
        )
        return _failed(execution, exc)
    except BaseException as exc:
        try:
            execution.check_journal_used()  # an error where the journal went on
        except Nondeterminism as signal:
            return _nondeterministic(signal)
        if log_context.was_logged(exc):  # with its traceback, where it happened
            log.info("run %s failed: %s: %s", execution.run_id, type(exc).__name__, exc)
        else:
            log.error(
                "run %s (%s) failed: %s: %s", execution.run_id, definition.name,
                type(exc).__name__, exc, exc_info=exc,
            )  # fmt: skip
        return _failed(execution, exc)
    finally:
        unbind_context(token)


def _nondeterministic(signal: Nondeterminism) -> Outcome:
    error = NondeterminismError(str(signal))
    return Outcome(RunStatus.FAILED, error=ErrorInfo.from_exception(error).to_json())


def _failed(execution: RunExecution, exc: BaseException) -> Outcome:
    return Outcome(
        RunStatus.FAILED,
        error=ErrorInfo.from_exception(exc).to_json(),
        failed_position=execution.failed_steps.get(id(exc)),
    )
