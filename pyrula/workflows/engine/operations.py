"""The durable operations a workflow awaits: steps, time, signals, child runs, gather.

Each takes its journal position(s) when it starts (or when ``ctx.gather`` reserves them,
in argument order), so the numbering is the same on every replay.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Generator, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyrula.workflows.client import outcome_of
from pyrula.workflows.engine.control import CancelRequested, EngineSignal, LeaseGone, Suspend
from pyrula.workflows.engine.rerun import CHILD, CHILD_RESULT
from pyrula.workflows.errors import InvalidParams, SignalTimeout, WorkflowError
from pyrula.workflows.records import JournalEntry, NewRun, RunRecord, RunStatus, Wait
from pyrula.workflows.registry import Registry, WorkflowDefinition
from pyrula.workflows.serialization import decode, encode
from pyrula.workflows.stores.base import signals_of

if TYPE_CHECKING:
    from pyrula.workflows.engine.execution import RunExecution


class Operation:
    """An awaitable durable operation that owns ``slots`` consecutive journal positions."""

    def __init__(
        self, execution: RunExecution, slots: int, body: Callable[[int], Awaitable[Any]]
    ) -> None:
        self._execution = execution
        self._slots = slots
        self._body = body
        self._position: int | None = None

    def reserve(self) -> int:
        if self._position is None:
            self._position = self._execution.reserve(self._slots)
        return self._position

    def __await__(self) -> Generator[Any, None, Any]:
        return self._body(self.reserve()).__await__()


def seconds_of(duration: float | timedelta, what: str) -> float:
    value = duration.total_seconds() if isinstance(duration, timedelta) else duration
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidParams(f"{what} takes seconds or a timedelta, got {duration!r}")
    if value < 0:
        raise InvalidParams(f"{what} must not be negative, got {duration!r}")
    return float(value)


def _entry(
    execution: RunExecution, position: int, kind: str, name: str, value: Any
) -> JournalEntry:
    return JournalEntry(
        run_id=execution.run_id,
        position=position,
        kind=kind,
        name=name,
        ok=True,
        value=encode(value, what=f"{kind} {name!r}"),
    )


# -- time --------------------------------------------------------------------------------
async def now(execution: RunExecution) -> datetime:
    """The store's time, journaled so that replays see the same value."""
    position = execution.reserve()
    entry = execution.recorded(position, "now", "now")
    if entry is None:
        execution.check_boundary()
        entry = _entry(execution, position, "now", "now", await execution.store_now())
        await execution.append(entry)
    return datetime.fromtimestamp(float(decode(entry.value)), UTC)


async def sleep_until(
    execution: RunExecution, wake_at: float | None, seconds: float, name: str
) -> None:
    """Suspend the run until ``wake_at`` (or now + ``seconds``), journaled on first reach."""
    position = execution.reserve()
    entry = execution.recorded(position, "sleep", name)
    if entry is None:
        execution.check_boundary()
        if wake_at is None:
            wake_at = await execution.store_now() + seconds
        entry = _entry(execution, position, "sleep", name, wake_at)
        await execution.append(entry)
    target = float(decode(entry.value))
    if await execution.store_now() < target:
        raise Suspend(Wait(wake_at=target))


# -- signals -----------------------------------------------------------------------------
async def wait_for_signal(execution: RunExecution, name: str, timeout: float | None) -> Any:
    """Return the next signal ``name``'s payload; SignalTimeout after ``timeout`` seconds."""
    position = execution.reserve(2)
    entry = execution.recorded(position, "wait", name)
    if entry is None:
        execution.check_boundary()
        deadline = None if timeout is None else await execution.store_now() + timeout
        entry = _entry(execution, position, "wait", name, deadline)
        await execution.append(entry)
    deadline = decode(entry.value)
    received = execution.journal.get(position + 1)
    if received is None:
        execution.check_boundary()
        probe = JournalEntry(
            run_id=execution.run_id,
            position=position + 1,
            kind="signal",
            name=name,
            ok=True,
            value="null",
        )
        payload = await execution.fenced(
            lambda: signals_of(execution.store, "ctx.wait_for_signal").consume_signal(
                execution.token, probe
            ),
            "signal receipt",
        )
        if payload is not None:
            received = JournalEntry(
                run_id=execution.run_id,
                position=position + 1,
                kind="signal",
                name=name,
                ok=True,
                value=payload,
            )
            execution.journal[position + 1] = received
        elif deadline is not None and await execution.store_now() >= deadline:
            received = _entry(execution, position + 1, "timeout", name, deadline)
            await execution.append(received)
        else:
            raise Suspend(Wait(signal=name, wake_at=deadline))
    if received.kind == "timeout" and received.name == name:
        raise SignalTimeout(f"signal {name!r} did not arrive within its timeout")
    execution.recorded(position + 1, "signal", name)
    return decode(received.value)


# -- child runs --------------------------------------------------------------------------
def child_params(
    registry: Registry, workflow: str | WorkflowDefinition, params: Mapping[str, Any] | None
) -> tuple[str, str, WorkflowDefinition | None]:
    name = workflow.name if isinstance(workflow, WorkflowDefinition) else workflow
    definition = workflow if isinstance(workflow, WorkflowDefinition) else registry.find(name)
    values = dict(params or {})
    text = encode(values, what=f"params of child run {name!r}")
    if definition is not None:
        definition.check_params(values)
    return name, text, definition


async def run_child(
    execution: RunExecution,
    position: int,
    name: str,
    params_text: str,
    new_run: Callable[[str], NewRun],
) -> Any:
    """Start (once) a child run that any worker may take, then wait for its outcome."""
    entry = execution.recorded(position, CHILD, name)
    if entry is None:
        execution.check_boundary()
        child_id = f"{execution.run_id}.{position}"
        entry = _entry(execution, position, CHILD, name, child_id)
        child = new_run(child_id)
        await execution.fenced(
            lambda: execution.store.start_child(execution.token, entry, child), "child start"
        )
        execution.journal[position] = entry
    child_id = str(decode(entry.value))
    result = execution.journal.get(position + 1)
    if result is None:
        record = await execution.store.get_run(child_id)
        if record is None:
            raise WorkflowError(f"child run {child_id!r} of run {execution.run_id!r} vanished")
        if not record.is_terminal:
            raise Suspend(Wait(child=child_id))
        if record.status in _STOPPED and not execution.cancel_requested:
            # Was it our own cancel? It is set on the parent with the child's stop, in one
            # store operation, so the parent's record says so now if it was.
            own = await execution.store.get_run(execution.run_id)
            execution.cancel_requested = own is not None and own.cancel_requested
        if execution.cancel_requested and record.status in _STOPPED:
            # The parent's own cancel (or terminate) ended the child. Its outcome is not
            # journaled, so retrying the parent retries the child too (engine/rerun.py).
            raise CancelRequested()
        # An outcome that raises in the parent is journaled as an error (ok=False): if it
        # fails the parent, retry_run removes it, and the retried child runs again.
        result = JournalEntry(
            run_id=execution.run_id,
            position=position + 1,
            kind=CHILD_RESULT,
            name=name,
            ok=record.status is RunStatus.COMPLETED,
            value=encode(_child_outcome(record), what=f"{CHILD_RESULT} {name!r}"),
        )
        await execution.append(result)
        if execution.cancel_requested and record.status in _STOPPED:
            raise CancelRequested()  # the cancel was learnt from the write's reply
    execution.recorded(position + 1, CHILD_RESULT, name)
    try:
        return _replay_child(child_id, name, decode(result.value))
    except Exception as error:
        if not result.ok:  # the position retry_run clears if this error fails the run
            execution.failed_steps[id(error)] = position + 1
        raise


_STOPPED = (RunStatus.CANCELLED, RunStatus.TERMINATED)


def _child_outcome(record: RunRecord) -> dict[str, Any]:
    return {"status": record.status.value, "result": record.result, "error": record.error}


def _replay_child(child_id: str, name: str, data: dict[str, Any]) -> Any:
    record = RunRecord(
        run_id=child_id,
        workflow=name,
        params="{}",
        status=RunStatus(data["status"]),
        owner="",
        idempotency_key=None,
        created_at=0.0,
        available_at=0.0,
        updated_at=0.0,
        result=data["result"],
        error=data["error"],
    )
    return outcome_of(record)


# -- gather ------------------------------------------------------------------------------


async def gather(operations: tuple[Any, ...], return_exceptions: bool) -> list[Any]:
    """Run durable operations concurrently; results in argument order.

    Positions are reserved in argument order before any starts. Every branch is awaited
    to the end before an error or a suspension is raised, so no step is left running.
    """
    bad = [op for op in operations if not isinstance(op, Operation)]
    if bad:
        # Checked before any position is reserved; a coroutine passed by mistake is
        # closed, so it does not also warn that it was never awaited.
        for op in bad:
            if inspect.iscoroutine(op):
                op.close()
        raise WorkflowError(
            "ctx.gather takes step calls and ctx.run_child(...) calls; run a branch of "
            f"several steps as a child workflow instead (got {bad[0]!r})"
        )
    for operation in operations:
        operation.reserve()
    tasks = [asyncio.ensure_future(op) for op in operations]
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    signals = [o for o in outcomes if isinstance(o, EngineSignal)]
    if signals:
        # A lost lease or a cancellation outranks a suspension; suspend on the first wait.
        for kind in (LeaseGone, EngineSignal):
            for signal in signals:
                if isinstance(signal, kind) and not isinstance(signal, Suspend):
                    raise signal
        raise signals[0]
    for outcome in outcomes:
        if isinstance(outcome, asyncio.CancelledError):
            raise outcome
    if not return_exceptions:
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
    return list(outcomes)
