"""Signals on each store: kept until waited for, FIFO per name, consumed once (also across
a replay), timeouts, bad targets, and the blocking client's ``handle.signal``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula.workflows import (
    DurableInvocationError,
    Fatal,
    InvalidParams,
    InvalidRunState,
    NotJSONSerializable,
    RunNotFound,
    RunStatus,
    Store,
    WorkflowClient,
    WorkflowContext,
    workflow,
)
from pyrula.workflows.errors import SignalTimeout
from pyrula.workflows.registry import Registry
from pyrula.workflows.sync import WorkflowClient as SyncWorkflowClient
from tests.conftest import Eventually, StartWorker, StoreFactory


async def test_a_signal_sent_before_the_run_waits_is_received(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    entered = asyncio.Event()
    release = asyncio.Event()

    async def busy() -> str:
        entered.set()
        await release.wait()
        return "done"

    @workflow(registry=registry)
    async def approval(ctx: WorkflowContext) -> list[Any]:
        first = await ctx.step("busy", busy)
        return [first, await ctx.wait_for_signal("approve", timeout=30)]

    await start_worker(engine_store, [approval])
    handle = await WorkflowClient(engine_store, registry=registry).submit(approval)
    await asyncio.wait_for(entered.wait(), 5)
    await handle.signal("approve", {"by": "ann"})  # the run is inside a step, not waiting yet
    release.set()
    assert await handle.result(timeout=5) == ["done", {"by": "ann"}]
    assert (await handle.record()).claims == 1  # received without suspending


async def test_a_signal_sent_before_the_run_starts_is_received(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry)
    async def approval(ctx: WorkflowContext) -> Any:
        return await ctx.wait_for_signal("approve")

    handle = await WorkflowClient(engine_store, registry=registry).submit(approval)
    await handle.signal("approve", "yes")  # no worker yet: the run is queued
    await start_worker(engine_store, [approval])
    assert await handle.result(timeout=5) == "yes"


async def test_a_waiting_run_wakes_only_for_its_signal(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    @workflow(registry=registry)
    async def approval(ctx: WorkflowContext) -> Any:
        return await ctx.wait_for_signal("approve")

    await start_worker(engine_store, [approval])
    handle = await WorkflowClient(engine_store, registry=registry).submit(approval)

    async def waiting() -> bool:
        return await handle.status() is RunStatus.WAITING

    await eventually(waiting, what="the run waiting")
    record = await handle.record()
    assert record.wait_signal == "approve" and record.wake_at is None
    await handle.signal("reject", "no")  # another name: kept, but does not wake the run
    await asyncio.sleep(0.2)
    assert await handle.status() is RunStatus.WAITING
    await handle.signal("approve", 42)
    assert await handle.result(timeout=5) == 42


async def test_signals_of_one_name_arrive_in_order_each_once_even_across_a_replay(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    gate = {"closed": True}

    def check_gate() -> None:
        if gate["closed"]:
            raise Fatal("closed the first time")

    @workflow(registry=registry)
    async def collector(ctx: WorkflowContext) -> list[Any]:
        got = [await ctx.wait_for_signal("item"), await ctx.wait_for_signal("item")]
        await ctx.step("gate", check_gate)  # fails once; the retry replays the two signals
        got.append(await ctx.wait_for_signal("item", timeout=5))
        try:
            got.append(await ctx.wait_for_signal("item", timeout=0.2))
        except SignalTimeout:
            got.append("no more")
        return got

    handle = await WorkflowClient(engine_store, registry=registry).submit(collector)
    for payload in ("a", "b", "c"):
        await handle.signal("item", payload)
    await start_worker(engine_store, [collector])
    with pytest.raises(DurableInvocationError):
        await handle.result(timeout=5)
    gate["closed"] = False
    await handle.retry()
    assert await handle.result(timeout=5) == ["a", "b", "c", "no more"]
    journal = await engine_store.load_journal(handle.run_id)
    assert [e.value for e in journal if e.kind == "signal"] == ['"a"', '"b"', '"c"']
    assert [e.kind for e in journal].count("timeout") == 1


async def test_a_signal_timeout_raises_signal_timeout_in_the_workflow(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    @workflow(registry=registry)
    async def impatient(ctx: WorkflowContext) -> Any:
        return await ctx.wait_for_signal("approve", timeout=0.5)

    await start_worker(engine_store, [impatient])
    client = WorkflowClient(engine_store, registry=registry)
    handle = await client.submit(impatient)

    async def waiting() -> bool:
        return await handle.status() is RunStatus.WAITING

    await eventually(waiting, what="the run waiting")
    record = await handle.record()
    assert record.wait_signal == "approve" and record.wake_at is not None
    with pytest.raises(DurableInvocationError) as caught:
        await handle.result(timeout=5)
    assert caught.value.error_type.endswith("SignalTimeout")
    assert isinstance(caught.value.original, TimeoutError)
    # The run ended: a late signal is refused, not silently kept.
    with pytest.raises(InvalidRunState):
        await handle.signal("approve", "too late")


async def test_signals_to_missing_or_ended_runs_and_bad_payloads_are_refused(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry)
    async def done(ctx: WorkflowContext) -> str:
        return "done"

    await start_worker(engine_store, [done])
    client = WorkflowClient(engine_store, registry=registry)
    with pytest.raises(RunNotFound):
        await client.handle("done", "no-such-run").signal("approve", 1)
    handle = await client.submit(done)
    assert await handle.result(timeout=5) == "done"
    with pytest.raises(InvalidRunState):
        await handle.signal("approve", 1)
    with pytest.raises(InvalidParams):
        await handle.signal("", 1)
    with pytest.raises(NotJSONSerializable):
        await handle.signal("approve", {"x": object()})


async def test_the_blocking_client_sends_signals(
    store_factory: StoreFactory, registry: Registry, start_worker: StartWorker
) -> None:
    store = await store_factory()
    # A SQLite client gets its own connection to the file; a MemoryStore must be shared.
    client_store = store if store_factory.kind == "memory" else await store_factory()

    @workflow(registry=registry)
    async def approval(ctx: WorkflowContext) -> Any:
        return await ctx.wait_for_signal("approve")

    await start_worker(store, [approval])
    sync_client = SyncWorkflowClient(client_store, registry=registry)

    def from_sync_code() -> Any:
        handle = sync_client.submit("approval")
        handle.signal("approve", {"ok": True})
        result = handle.result(timeout=5)
        with pytest.raises(InvalidRunState):
            handle.signal("approve", "again")
        with pytest.raises(RunNotFound):
            sync_client.handle("approval", "no-such-run").signal("approve")
        return result

    try:
        assert await asyncio.to_thread(from_sync_code) == {"ok": True}
    finally:
        await asyncio.to_thread(sync_client.close)
