"""Execute one claimed run to its outcome: replay the journal, run the rest, record the end."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from enum import Enum

from pyrula.workflows.context import WorkflowContext, bind_context, unbind_context
from pyrula.workflows.engine.control import CancelRequested, LeaseGone, Nondeterminism
from pyrula.workflows.engine.execution import RunExecution, call_store
from pyrula.workflows.errors import LeaseLost, NondeterminismError
from pyrula.workflows.faults import fault_point
from pyrula.workflows.records import Lease, Outcome, RunStatus
from pyrula.workflows.registry import WorkflowDefinition
from pyrula.workflows.serialization import ErrorInfo, decode, encode
from pyrula.workflows.stores.base import Store

log = logging.getLogger("pyrula.workflows.engine")


class RunEnd(str, Enum):
    """How an execution on this worker ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"
    """The lease was gone (terminated or reclaimed): nothing more was written."""


async def execute_run(
    definition: WorkflowDefinition,
    lease: Lease,
    store: Store,
    *,
    executor: Executor | None,
    max_payload_bytes: int,
    store_retry_window: float,
    on_start: Callable[[RunExecution], None] | None = None,
) -> tuple[RunEnd, RunExecution]:
    """Run ``lease``'s run until it ends here; return how, and its execution state.

    Raises only ``asyncio.CancelledError`` (the worker cancelled the task); every other
    outcome, including exceptions from user code, is recorded in the store.
    """
    journal = await call_store(
        lambda: store.load_journal(lease.run_id), store_retry_window, f"journal of {lease.run_id}"
    )
    execution = RunExecution(
        store,
        lease,
        journal,
        executor=executor,
        max_payload_bytes=max_payload_bytes,
        store_retry_window=store_retry_window,
    )
    if on_start is not None:
        on_start(execution)
    outcome = await _run_workflow(definition, execution, max_payload_bytes)
    if outcome is None:
        return RunEnd.LOST, execution
    fault_point("before_outcome")
    try:
        await call_store(
            lambda: store.finish_run(lease.run_id, lease.token, outcome),
            store_retry_window,
            f"outcome of {lease.run_id}",
        )
    except LeaseLost:
        log.warning("run %s: lease lost before its outcome was recorded", lease.run_id)
        return RunEnd.LOST, execution
    log.info("run %s (%s) %s", lease.run_id, definition.name, outcome.status.value)
    return RunEnd(outcome.status.value), execution


async def _run_workflow(
    definition: WorkflowDefinition, execution: RunExecution, max_payload_bytes: int
) -> Outcome | None:
    ctx = WorkflowContext(execution)
    token = bind_context(ctx)
    try:
        params = decode(execution.params_text)
        definition.check_params(params)
        value = await definition.fn(ctx, **params)
        text = encode(value, what="workflow result", max_bytes=max_payload_bytes)
        return Outcome(RunStatus.COMPLETED, result=text)
    except CancelRequested:
        return Outcome(RunStatus.CANCELLED)
    except LeaseGone:
        log.warning("run %s: lease lost; abandoning it to its new holder", execution.run_id)
        return None
    except Nondeterminism as signal:
        error = NondeterminismError(str(signal))
        return Outcome(RunStatus.FAILED, error=ErrorInfo.from_exception(error).to_json())
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        log.info("run %s failed: %s: %s", execution.run_id, type(exc).__name__, exc)
        return Outcome(RunStatus.FAILED, error=ErrorInfo.from_exception(exc).to_json())
    finally:
        unbind_context(token)
