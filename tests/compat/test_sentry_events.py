"""Sentry, with ``sentry-sdk`` and its default integrations (its Celery integration cannot
hook the drop-in: it patches ``celery`` itself): a failing task, and a failing native
workflow run, each produce one event with the exception's type and its stack.

A real ``sentry_sdk`` client whose transport keeps the events in this process; workers
run on threads of this process (a SQLite store for the task, memory for the workflow).
The events come from the worker's ERROR records logged with ``exc_info`` (Sentry's
logging integration).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from pyrula.workflows import (
    MemoryStore,
    RetryPolicy,
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.registry import Registry
from pyrula_compat import Celery
from pyrula_compat.contrib.testing.worker import start_worker

T = 30.0
EVENTS: list[dict[str, Any]] = []


class CapturingTransport(Transport):
    """Keeps each event sent, instead of sending it anywhere."""

    def capture_envelope(self, envelope: Envelope) -> None:
        for item in envelope.items:
            if item.type == "event" and item.payload.json is not None:
                EVENTS.append(item.payload.json)


@pytest.fixture
def sentry() -> Iterator[list[dict[str, Any]]]:
    EVENTS.clear()
    # Never sent: the transport keeps it (an address nothing listens on, all the same).
    sentry_sdk.init(dsn="http://public@127.0.0.1:9/1", transport=CapturingTransport)
    try:
        yield EVENTS
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.get_global_scope().set_client(None)


def _exception(event: dict[str, Any]) -> dict[str, Any]:
    values = event["exception"]["values"]
    last: dict[str, Any] = values[-1]  # the raised one (its causes come first)
    return last


def _functions(exception: dict[str, Any]) -> list[str]:
    return [frame["function"] for frame in exception["stacktrace"]["frames"]]


def test_a_failing_task_is_one_event_with_its_exception_and_stack(
    sentry: list[dict[str, Any]], tmp_path: Path
) -> None:
    app = Celery("sentryapp", broker=f"sqlite:///{tmp_path / 's.db'}", set_as_current=False)

    @app.task(name="sentryapp.divide")
    def divide(x: int, y: int) -> float:
        return x / y

    with start_worker(app):
        result = divide.delay(1, 0)
        with pytest.raises(ZeroDivisionError):
            result.get(timeout=T)
    sentry_sdk.flush()
    errors = [e for e in sentry if e.get("level") == "error"]
    assert len(errors) == 1, errors
    [event] = errors
    exception = _exception(event)
    assert exception["type"] == "ZeroDivisionError"
    assert exception["value"] == "division by zero"
    assert "divide" in _functions(exception)
    assert event["logger"] == "celery.app.trace"
    assert f"Task sentryapp.divide[{result.id}] raised unexpected" in event["logentry"]["formatted"]


def test_a_failing_native_workflow_run_is_one_event_with_its_exception_and_stack(
    sentry: list[dict[str, Any]],
) -> None:
    registry = Registry()

    def explode(n: int) -> None:
        raise KeyError(f"missing {n}")

    @workflow(name="sentry_native_fails", registry=registry)
    async def fails(ctx: WorkflowContext, n: int) -> None:
        await ctx.step("explode", explode, n, retry=RetryPolicy(max_attempts=1))

    async def main() -> str:
        store = MemoryStore()
        worker = WorkflowWorker(
            store=store, registry=registry, options=WorkerOptions(claim_poll_interval=0.05)
        )
        serving = asyncio.create_task(worker.run())
        try:
            client = WorkflowClient(store, registry=registry)
            handle = await client.submit(fails, {"n": 7})
            with pytest.raises(Exception, match="missing 7"):
                await handle.result(timeout=T)
            return handle.run_id
        finally:
            worker.stop()
            await serving

    run_id = asyncio.run(main())
    sentry_sdk.flush()
    errors = [e for e in sentry if e.get("level") == "error"]
    assert len(errors) == 1, errors
    [event] = errors
    exception = _exception(event)
    assert exception["type"] == "KeyError"
    assert "explode" in _functions(exception) and "fails" in _functions(exception)
    assert event["logger"] == "pyrula.workflows.engine"
    assert f"run {run_id} (sentry_native_fails) failed: KeyError" in event["logentry"]["formatted"]
