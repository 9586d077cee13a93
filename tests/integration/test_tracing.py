"""OpenTelemetry spans (``pyrula.workflows.tracing``) read from the SDK's in-memory
exporter: a submit's span is the parent of its run's span on the worker (through the
``traceparent`` the run's params carry), each step attempt's span is a child of the
run's, a failed attempt records its exception, and the workflow never sees the trace
context. A real SQLite store and a real worker in this process."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from pyrula.workflows import (
    RetryPolicy,
    SqliteStore,
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    telemetry,
    tracing,
    workflow,
)
from pyrula.workflows.errors import DurableInvocationError
from pyrula.workflows.registry import Registry

FAST = WorkerOptions(claim_poll_interval=0.02, timer_poll_interval_s=0.2)


@pytest.fixture
def traced_with() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """An application's own TracerProvider (not the global one), given to enable()."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield provider, exporter
    finally:
        tracing.disable()
        assert telemetry.current is None


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def flaky_step(state: dict[str, int]) -> str:
    state["calls"] = state.get("calls", 0) + 1
    if state["calls"] == 1:
        raise ValueError("first attempt fails")
    return "ok"


async def test_a_runs_spans_join_the_request_that_submitted_it(
    traced_with: tuple[TracerProvider, InMemorySpanExporter], tmp_path: Path
) -> None:
    provider, spans = traced_with
    registry = Registry()
    seen: list[dict[str, Any]] = []
    state: dict[str, int] = {}

    @workflow(name="traced", registry=registry)
    async def traced(ctx: WorkflowContext, **params: Any) -> str:
        seen.append(params)
        return str(await ctx.step("flaky", flaky_step, state, retry=RetryPolicy(initial_backoff=0)))

    @workflow(name="traced_fail", registry=registry)
    async def traced_fail(ctx: WorkflowContext) -> None:
        await ctx.step("boom", flaky_step, {}, retry=RetryPolicy(max_attempts=1))

    store = SqliteStore(tmp_path / "t.db")
    client = WorkflowClient(store, registry=registry)
    worker = WorkflowWorker(store, options=FAST, registry=registry)
    serving = asyncio.create_task(worker.run())
    try:
        with provider.get_tracer("app").start_as_current_span("POST /orders") as incoming:
            handle = await client.submit(traced, {"order": 7})
        assert await handle.result(timeout=20) == "ok"
        failing = await client.submit(traced_fail, {})
        with pytest.raises(DurableInvocationError):
            await failing.result(timeout=20)
        keyed = await client.submit(traced, {"order": 8}, idempotency_key="k")
        assert await keyed.result(timeout=20) == "ok"
    finally:
        worker.stop()
        await serving
        await store.close()
    assert seen[0] == {"order": 7}  # the trace context never reaches the workflow
    (submit,) = [
        s for s in named(spans, "submit traced") if s.attributes["pyrula.run_id"] == handle.run_id
    ]
    assert (
        submit.parent is not None and submit.parent.span_id == incoming.get_span_context().span_id
    )
    (run,) = [
        s for s in named(spans, "run traced") if s.attributes["pyrula.run_id"] == handle.run_id
    ]
    assert run.context.trace_id == incoming.get_span_context().trace_id
    assert run.parent is not None and run.parent.span_id == submit.context.span_id
    assert run.attributes["pyrula.run.end"] == "completed"
    attempts = [
        s for s in named(spans, "step flaky") if s.attributes["pyrula.run_id"] == handle.run_id
    ]
    assert [s.attributes["pyrula.attempt"] for s in attempts] == [1, 2]
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in attempts)
    assert attempts[0].status.status_code is StatusCode.ERROR
    assert attempts[0].events[0].name == "exception"
    assert attempts[1].status.status_code is StatusCode.UNSET
    (failed_run,) = named(spans, "run traced_fail")
    assert failed_run.status.status_code is StatusCode.ERROR
    # An idempotent submit keeps its params as given: its run starts a trace of its own.
    (keyed_run,) = [
        s for s in named(spans, "run traced") if s.attributes["pyrula.run_id"] == keyed.run_id
    ]
    assert keyed_run.parent is None
