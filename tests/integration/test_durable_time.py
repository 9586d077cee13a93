"""Durable time on each store: ctx.sleep frees the worker, ctx.now is journaled,
sleep_until, and long retry backoffs that suspend the run on a timer."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pyrula.workflows import (
    DurableInvocationError,
    Fatal,
    MemoryStore,
    RetryPolicy,
    RunCancelled,
    RunHandle,
    RunStatus,
    StepContext,
    Store,
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowWorker,
    step,
    workflow,
)
from pyrula.workflows.engine.execution import RunExecution
from pyrula.workflows.registry import Registry
from tests.conftest import FAST, Eventually, StartWorker


def quick_workflow(registry: Registry) -> WorkflowDefinition:
    @workflow(registry=registry)
    async def quick(ctx: WorkflowContext) -> str:
        result: str = await ctx.step("hello", lambda: "hello")
        return result

    return quick


async def status_is(handle: RunHandle, status: RunStatus) -> bool:
    return await handle.status() is status


async def test_a_sleeping_run_frees_its_worker_and_wakes_on_time(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    @workflow(registry=registry)
    async def napper(ctx: WorkflowContext, seconds: float) -> float:
        before = await ctx.now()
        await ctx.sleep(timedelta(seconds=seconds))
        after = await ctx.now()
        return (after - before).total_seconds()

    quick = quick_workflow(registry)
    await start_worker(engine_store, [napper, quick], max_concurrent_runs=1)
    client = WorkflowClient(engine_store, registry=registry)
    sleeper = await client.submit(napper, {"seconds": 1.0})
    await eventually(lambda: status_is(sleeper, RunStatus.SLEEPING), what="the run sleeping")
    record = await sleeper.record()
    assert record.wake_at is not None and record.lease_expires_at is None

    other = await client.submit(quick)  # the only slot is free while the first run sleeps
    assert await other.result(timeout=5) == "hello"
    assert await sleeper.status() is RunStatus.SLEEPING

    slept = await sleeper.result(timeout=30)
    # Never woken before its time (a correctness bound); woken by its timer, not left
    # asleep (generous: three times the sleep and a second, for a loaded machine).
    assert 1.0 <= slept < 1.0 * 3 + 1
    record = await sleeper.record()
    assert record.claims == 2  # claimed, suspended, woken and claimed again
    kinds = [(e.kind, e.name) for e in await engine_store.load_journal(sleeper.run_id)]
    assert kinds == [("now", "now"), ("sleep", "sleep"), ("now", "now")]


async def test_now_is_journaled_and_a_finished_sleep_is_not_slept_again(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    seen: list[float] = []
    gate = {"closed": True}

    def open_gate() -> str:
        if gate["closed"]:
            raise Fatal("closed the first time")
        return "open"

    @workflow(registry=registry)
    async def stamped(ctx: WorkflowContext) -> list[Any]:
        when = await ctx.now()
        seen.append(when.timestamp())
        await ctx.sleep(0.2)
        state = await ctx.step("gate", open_gate)
        return [when.isoformat(), str(when.tzinfo), state]

    await start_worker(engine_store, [stamped])
    handle = await WorkflowClient(engine_store, registry=registry).submit(stamped)
    with pytest.raises(DurableInvocationError):
        await handle.result(timeout=5)
    claims_before = (await handle.record()).claims
    await asyncio.sleep(0.05)  # the clock moves on before the replay
    gate["closed"] = False
    await handle.retry()
    when_iso, tz, state = await handle.result(timeout=5)

    assert state == "open"
    assert tz == "UTC"
    assert len(seen) == 3  # first run, wake after the sleep, the retry
    assert seen == [seen[0]] * 3  # every replay saw the journaled time
    assert datetime.fromisoformat(when_iso).timestamp() == seen[0]
    assert (await handle.record()).claims == claims_before + 1  # the sleep was not redone
    now_entries = [e for e in await engine_store.load_journal(handle.run_id) if e.kind == "now"]
    assert len(now_entries) == 1


async def test_sleep_until_wakes_at_the_given_time(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    @workflow(registry=registry)
    async def alarm(ctx: WorkflowContext, at: float) -> float:
        await ctx.sleep_until(datetime.fromtimestamp(at, UTC))
        return (await ctx.now()).timestamp()

    await start_worker(engine_store, [alarm])
    client = WorkflowClient(engine_store, registry=registry)
    at = await engine_store.now() + 0.6
    handle = await client.submit(alarm, {"at": at})
    await eventually(lambda: status_is(handle, RunStatus.SLEEPING), what="the run sleeping")
    assert (await handle.record()).wake_at == pytest.approx(at)
    woke = await handle.result(timeout=5)
    assert at <= woke < at + 2.0

    past = await client.submit(alarm, {"at": at - 3600})  # already passed: no suspension
    assert await past.result(timeout=5) >= at
    assert (await past.record()).claims == 1


async def test_sleep_until_a_naive_datetime_fails_the_run(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry)
    async def naive(ctx: WorkflowContext) -> None:
        await ctx.sleep_until(datetime.now() + timedelta(seconds=1))

    @workflow(registry=registry)
    async def negative(ctx: WorkflowContext) -> None:
        await ctx.sleep(-1)

    await start_worker(engine_store, [naive, negative])
    client = WorkflowClient(engine_store, registry=registry)
    for wf in (naive, negative):
        handle = await client.submit(wf)
        with pytest.raises(DurableInvocationError) as caught:
            await handle.result(timeout=5)
        assert caught.value.error_type.endswith("InvalidParams")


async def test_a_long_backoff_suspends_the_run_and_frees_its_slot(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    attempts: list[int] = []

    @step(retry=RetryPolicy(max_attempts=3, initial_backoff=0.6, backoff_coefficient=1, jitter=0))
    def flaky(ctx: StepContext) -> int:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError(f"attempt {ctx.attempt} failed")
        return ctx.attempt

    @workflow(registry=registry)
    async def backing_off(ctx: WorkflowContext) -> int:
        result: int = await flaky()
        return result

    quick = quick_workflow(registry)
    await start_worker(
        engine_store, [backing_off, quick], max_concurrent_runs=1, durable_backoff_after=0.3
    )
    client = WorkflowClient(engine_store, registry=registry)
    handle = await client.submit(backing_off)
    await eventually(lambda: status_is(handle, RunStatus.SLEEPING), what="the backoff suspending")
    assert attempts == [1]
    other = await client.submit(quick)
    assert await other.result(timeout=5) == "hello"  # ran in the slot the backoff freed

    assert await handle.result(timeout=10) == 3
    assert attempts == [1, 2, 3]  # attempt numbers continue across suspensions
    assert (await handle.record()).claims == 3
    journal = await engine_store.load_journal(handle.run_id)
    steps = [e for e in journal if e.kind == "step"]
    assert [(e.position, e.name, e.ok, e.attempts) for e in steps] == [(0, "flaky", True, 3)]
    assert sorted(e.attempts for e in journal if e.kind == "backoff") == [1, 2]


async def test_a_short_backoff_sleeps_in_the_worker(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    attempts: list[int] = []

    @step(retry=RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=0))
    def flaky(ctx: StepContext) -> int:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError("not yet")
        return ctx.attempt

    @workflow(registry=registry)
    async def backing_off(ctx: WorkflowContext) -> int:
        result: int = await flaky()
        return result

    await start_worker(engine_store, [backing_off])  # durable_backoff_after: default 5 s
    handle = await WorkflowClient(engine_store, registry=registry).submit(backing_off)
    assert await handle.result(timeout=5) == 3
    assert attempts == [1, 2, 3]
    assert (await handle.record()).claims == 1
    assert [e.kind for e in await engine_store.load_journal(handle.run_id)] == ["step"]


async def test_cancelling_a_sleeping_run_ends_it_at_once(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    after_sleep: list[str] = []

    @workflow(registry=registry)
    async def long_nap(ctx: WorkflowContext) -> None:
        await ctx.sleep(timedelta(hours=1))
        after_sleep.append("woke")

    await start_worker(engine_store, [long_nap])
    handle = await WorkflowClient(engine_store, registry=registry).submit(long_nap)
    await eventually(lambda: status_is(handle, RunStatus.SLEEPING), what="the run sleeping")
    record = await handle.cancel()
    assert record.status is RunStatus.CANCELLED
    await asyncio.sleep(0.2)
    assert after_sleep == []
    assert (await handle.record()).status is RunStatus.CANCELLED


class _JumpAfterArming:
    """A store clock that, once armed, jumps 10 s ahead from its second reading on."""

    def __init__(self) -> None:
        self.readings: int | None = None

    def __call__(self) -> float:
        if self.readings is None:
            return time.time()
        self.readings += 1
        return time.time() + (0 if self.readings == 1 else 10)


class _CancelDuringSleep:
    """Cancels the run just before its sleep is journaled; arms the clock right after,
    so the sleep is already over when the run tries to suspend (it resumes in place)."""

    def __init__(self, store: Store, clock: _JumpAfterArming) -> None:
        self.store, self.clock = store, clock

    def step_started(self, execution: RunExecution, name: str, attempt: int) -> None:
        return None

    async def checkpoint(self, execution: RunExecution, point: str) -> None:
        if point.startswith("before sleep"):
            await self.store.cancel_run(execution.run_id)
        elif point.startswith("after sleep") and self.clock.readings is None:
            self.clock.readings = 0


async def test_a_cancel_learnt_as_the_run_suspends_survives_a_resume_in_place(
    registry: Registry,
) -> None:
    clock = _JumpAfterArming()
    store = MemoryStore(clock=clock)
    ran: list[str] = []

    @workflow(registry=registry)
    async def nap(ctx: WorkflowContext) -> None:
        await ctx.step("a", lambda: ran.append("a"))
        await ctx.sleep(5)
        await ctx.step("b", lambda: ran.append("b"))

    worker = WorkflowWorker(
        store,
        [nap],
        WorkerOptions(**FAST),
        registry=registry,
        observer=_CancelDuringSleep(store, clock),
    )
    task = asyncio.create_task(worker.run())
    try:
        handle = await WorkflowClient(store, registry=registry).submit(nap)
        with pytest.raises(RunCancelled):
            await handle.result(timeout=5)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert ran == ["a"]  # step b is past a boundary after the cancel was known
