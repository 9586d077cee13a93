"""Steps and replay: @step and ctx.step, threads, JSON round-trips, the journal, nondeterminism."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from pyrula.workflows import (
    DurableInvocationError,
    Fatal,
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

NO_RETRY = RetryPolicy(max_attempts=1)


async def test_step_kinds_run_and_sync_steps_run_off_the_loop(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    seen: dict[str, Any] = {}

    @step
    def sync_step(ctx: StepContext, x: int) -> dict[str, Any]:
        seen["sync_thread"] = threading.get_ident()
        return {"x": x, "attempt": ctx.attempt, "step": ctx.step, "position": ctx.position}

    @step(name="async_named")
    async def async_step(ctx: StepContext, x: int) -> list[Any]:
        seen["async_thread"] = threading.get_ident()
        return [ctx.attempt, ctx.step, ctx.workflow, x]

    async def plain_async(a: int, b: int) -> int:
        return a + b

    def plain_sync(a: int, *, b: int) -> int:
        seen["inline_thread"] = threading.get_ident()
        return a * b

    @workflow(registry=registry)
    async def kinds(ctx: WorkflowContext, x: int) -> dict[str, Any]:
        seen["workflow_thread"] = threading.get_ident()
        return {
            "sync": await sync_step(x),
            "async": await async_step(x),
            "inline_sync": await ctx.step("mul", plain_sync, x, b=3),
            "inline_async": await ctx.step("add", plain_async, x, 5),
        }

    loop_thread = threading.get_ident()
    await start_worker(engine_store, [kinds])
    client = WorkflowClient(engine_store, registry=registry)
    handle = await client.submit("kinds", {"x": 2})
    assert await handle.result(timeout=10) == {
        "sync": {"x": 2, "attempt": 1, "step": "sync_step", "position": 0},
        "async": [1, "async_named", "kinds", 2],
        "inline_sync": 6,
        "inline_async": 7,
    }
    assert seen["workflow_thread"] == loop_thread
    assert seen["async_thread"] == loop_thread
    assert seen["sync_thread"] != loop_thread
    assert seen["inline_thread"] != loop_thread
    journal = await engine_store.load_journal(handle.run_id)
    assert [(e.position, e.name, e.ok) for e in journal] == [
        (0, "sync_step", True),
        (1, "async_named", True),
        (2, "mul", True),
        (3, "add", True),
    ]


async def test_retry_replays_finished_steps_and_reruns_the_failed_one(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    calls = {"one": 0, "two": 0, "three": 0}
    broken = {"three": True}
    kinds_seen: list[tuple[str, bool]] = []

    def one() -> tuple[int, str]:
        calls["one"] += 1
        return (1, "a")

    @step
    async def two(ctx: StepContext, base: int) -> int:
        calls["two"] += 1
        return base + 10

    @step(retry=NO_RETRY)
    def three(ctx: StepContext, value: int) -> int:
        calls["three"] += 1
        if broken["three"]:
            raise Fatal("step three is broken")
        return value * 2

    @workflow(registry=registry)
    async def pipeline(ctx: WorkflowContext) -> dict[str, Any]:
        first = await ctx.step("one", one)
        kinds_seen.append((type(first).__name__, ctx.is_replaying))
        second = await two(first[0])
        third = await three(second)
        return {"first": first, "third": third}

    await start_worker(engine_store, [pipeline])
    client = WorkflowClient(engine_store, registry=registry)
    handle = await client.submit("pipeline")
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    assert failed.value.error_type == "pyrula.workflows.errors.Fatal"
    assert calls == {"one": 1, "two": 1, "three": 1}

    broken["three"] = False
    retried = await handle.retry()
    assert retried.status is RunStatus.QUEUED
    assert await handle.result(timeout=10) == {"first": [1, "a"], "third": 22}
    assert calls == {"one": 1, "two": 1, "three": 2}
    # A tuple comes back as a list, live and on replay alike.
    assert kinds_seen == [("list", False), ("list", True)]
    journal = await engine_store.load_journal(handle.run_id)
    assert [(e.name, e.ok) for e in journal] == [("one", True), ("two", True), ("three", True)]


async def test_a_caught_step_error_is_replayed_not_rerun(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    calls = {"flaky": 0, "later": 0}
    caught: list[tuple[str, str]] = []
    broken = {"later": True}

    def flaky() -> None:
        calls["flaky"] += 1
        raise ValueError("flaky said no")

    def later() -> str:
        calls["later"] += 1
        if broken["later"]:
            raise Fatal("later is broken")
        return "later ok"

    @workflow(registry=registry)
    async def tolerant(ctx: WorkflowContext) -> dict[str, Any]:
        try:
            await ctx.step("flaky", flaky, retry=NO_RETRY)
        except ValueError as exc:
            caught.append((type(exc).__name__, str(exc)))
        return {"later": await ctx.step("later", later, retry=NO_RETRY), "caught": len(caught)}

    await start_worker(engine_store, [tolerant])
    client = WorkflowClient(engine_store, registry=registry)
    handle = await client.submit("tolerant")
    with pytest.raises(DurableInvocationError):
        await handle.result(timeout=10)
    broken["later"] = False
    await handle.retry()
    assert await handle.result(timeout=10) == {"later": "later ok", "caught": 2}
    assert calls == {"flaky": 1, "later": 2}
    assert caught == [("ValueError", "flaky said no"), ("ValueError", "flaky said no")]
    journal = await engine_store.load_journal(handle.run_id)
    assert [(e.name, e.ok) for e in journal] == [("flaky", False), ("later", True)]


async def test_a_different_step_at_a_journaled_position_fails_as_nondeterministic(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    code: dict[str, Any] = {"first_step": "a", "fail": True}

    def finish() -> str:
        if code["fail"]:
            raise Fatal("not yet")
        return "done"

    @workflow(registry=registry)
    async def drifting(ctx: WorkflowContext) -> str:
        await ctx.step(code["first_step"], lambda: 1)
        result: str = await ctx.step("finish", finish, retry=NO_RETRY)
        return result

    await start_worker(engine_store, [drifting])
    client = WorkflowClient(engine_store, registry=registry)
    handle = await client.submit("drifting")
    with pytest.raises(DurableInvocationError):
        await handle.result(timeout=10)

    code.update(first_step="b", fail=False)  # "a deploy" changed the step order
    await handle.retry()
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    error = failed.value
    assert error.error_type == "pyrula.workflows.errors.NondeterminismError"
    assert "'a'" in error.error_message and "'b'" in error.error_message
    assert "position 0" in error.error_message
    journal = await engine_store.load_journal(handle.run_id)
    assert [(e.name, e.ok) for e in journal] == [("a", True)]


@pytest.mark.parametrize("ends_by", ["returning", "raising"])
async def test_a_replay_that_ends_before_its_journal_fails_as_nondeterministic(
    engine_store: Store, registry: Registry, start_worker: StartWorker, ends_by: str
) -> None:
    code: dict[str, Any] = {"version": 1}

    def finish() -> str:
        raise Fatal("not yet")

    @workflow(registry=registry)
    async def shrinking(ctx: WorkflowContext) -> str:
        await ctx.step("a", lambda: 1)
        if code["version"] == 2:  # "a deploy" removed step b and what came after it
            if ends_by == "raising":
                raise ValueError("version 2 gives up here")
            return "short"
        await ctx.step("b", lambda: 2)
        result: str = await ctx.step("finish", finish, retry=NO_RETRY)
        return result

    await start_worker(engine_store, [shrinking])
    client = WorkflowClient(engine_store, registry=registry)
    handle = await client.submit("shrinking")
    with pytest.raises(DurableInvocationError):
        await handle.result(timeout=10)

    code["version"] = 2
    await handle.retry()  # the retry drops finish's error; a and b stay journaled
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    error = failed.value
    assert error.error_type == "pyrula.workflows.errors.NondeterminismError"
    assert "after 1 journal positions" in error.error_message
    assert "step 'b' at position 1" in error.error_message
    journal = await engine_store.load_journal(handle.run_id)
    assert [(e.name, e.ok) for e in journal] == [("a", True), ("b", True)]


async def test_step_called_outside_a_workflow_is_refused() -> None:
    @step
    def lonely(ctx: StepContext) -> int:
        return 1

    from pyrula.workflows import WorkflowError

    with pytest.raises(WorkflowError, match="outside a running workflow"):
        await lonely()
    assert lonely.fn(None) == 1


async def test_concurrent_runs_keep_their_own_context(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @step
    async def echo(ctx: StepContext, tag: int) -> list[Any]:
        await asyncio.sleep(0.01 * (tag % 3))
        return [ctx.run_id, tag]

    @workflow(registry=registry)
    async def tagged(ctx: WorkflowContext, tag: int) -> list[Any]:
        first = await echo(tag)
        second = await echo(tag)
        return [first, second, ctx.run_id]

    await start_worker(engine_store, [tagged])
    client = WorkflowClient(engine_store, registry=registry)
    handles = [await client.submit("tagged", {"tag": i}) for i in range(10)]
    results = await asyncio.gather(*(h.result(timeout=10) for h in handles))
    for i, (handle, result) in enumerate(zip(handles, results, strict=True)):
        rid = handle.run_id
        assert result == [[rid, i], [rid, i], rid]
