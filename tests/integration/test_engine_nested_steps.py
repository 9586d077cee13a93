"""A step, sleep or other durable operation called from inside a running step fails that
step with StepInsideStep, never retried, whether the outer step is sync (run in a
thread, where the inner call used to return an Operation nobody awaited: a silent no-op)
or async (where the inner step was journaled at a position of the workflow's own, so the
replay that followed failed with NondeterminismError). The plain function stays callable."""

from __future__ import annotations

from typing import Any

import pytest

from pyrula.workflows import (
    DurableInvocationError,
    RetryPolicy,
    RunStatus,
    StepContext,
    Store,
    WorkflowClient,
    WorkflowContext,
    step,
    workflow,
)
from pyrula.workflows.registry import Registry
from tests.conftest import StartWorker

POLICY = RetryPolicy(max_attempts=3, initial_backoff=0.01)


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_a_step_called_inside_a_step_fails_it_once_with_a_clear_error(
    engine_store: Store, registry: Registry, start_worker: StartWorker, sync: bool
) -> None:
    inner_calls: list[int] = []
    outer_attempts: list[int] = []

    @step(name="inner")
    def inner(ctx: StepContext) -> int:
        inner_calls.append(ctx.attempt)
        return 1

    def sync_outer(ctx: StepContext) -> Any:
        outer_attempts.append(ctx.attempt)
        return inner()

    async def async_outer(ctx: StepContext) -> Any:
        outer_attempts.append(ctx.attempt)
        return await inner()

    outer = step(name="outer", retry=POLICY)(sync_outer if sync else async_outer)

    @workflow(registry=registry)
    async def nests(ctx: WorkflowContext) -> Any:
        return await outer()

    await start_worker(engine_store, [nests])
    client = WorkflowClient(engine_store, registry=registry)
    handle = await client.submit("nests")
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    assert failed.value.error_type == "pyrula.workflows.errors.StepInsideStep"
    assert "step 'inner' was called inside step 'outer'" in failed.value.error_message
    assert outer_attempts == [1] and inner_calls == []  # never retried, inner never ran
    [entry] = await engine_store.load_journal(handle.run_id)
    assert (entry.name, entry.ok) == ("outer", False)
    assert (await handle.status()) is RunStatus.FAILED


async def test_a_sleep_inside_an_async_step_fails_it_and_plain_functions_still_work(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @step(name="helper")
    def helper(ctx: StepContext, n: int) -> int:
        return n * 2

    @workflow(registry=registry)
    async def sleeps_in_a_step(ctx: WorkflowContext) -> Any:
        async def naps() -> None:
            await ctx.sleep(0.01)  # the workflow's context, captured by the step's code

        return await ctx.step("naps", naps, retry=POLICY)

    @workflow(registry=registry)
    async def calls_plain(ctx: WorkflowContext) -> Any:
        # .fn is the plain function: a step may call it (with a StepContext of its own)
        return await ctx.step("twice", lambda: helper.fn(None, 21))

    await start_worker(engine_store, [sleeps_in_a_step, calls_plain])
    client = WorkflowClient(engine_store, registry=registry)
    handle = await client.submit("sleeps_in_a_step")
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    assert failed.value.error_type.endswith(".StepInsideStep")
    assert "a durable operation" in failed.value.error_message
    assert "inside step 'naps'" in failed.value.error_message
    assert await (await client.submit("calls_plain")).result(timeout=10) == 42
