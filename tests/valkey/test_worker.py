"""Workflows end to end on ValkeyStore: a WorkflowWorker and a client on a real server
and on a real cluster, with several shards."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from pyrula.workflows import (
    RunStatus,
    StoreUnavailable,
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.registry import Registry
from tests.conftest import Eventually, StartWorker

from .conftest import MakeStore


async def test_steps_sleep_signal_and_children(
    make_store: MakeStore, topology: str, registry: Registry, start_worker: StartWorker
) -> None:
    store = await make_store(topology, shard_count=4)
    calls: dict[str, int] = {}

    def count(name: str, value: Any) -> Any:
        calls[name] = calls.get(name, 0) + 1
        return value

    @workflow(registry=registry, name="kid")
    async def kid(ctx: WorkflowContext, n: int) -> int:
        return int(await ctx.step("square", lambda: count("square", n * n)))

    @workflow(registry=registry, name="parent")
    async def parent(ctx: WorkflowContext, n: int) -> dict[str, Any]:
        first = await ctx.step("first", lambda: count("first", n + 1))
        await ctx.sleep(0.2)
        word = await ctx.wait_for_signal("go", timeout=30)
        squared = await ctx.run_child(kid, {"n": first})
        return {"first": first, "word": word, "squared": squared}

    worker = await start_worker(store, [parent, kid])
    client = WorkflowClient(store, registry=registry)
    handle = await client.submit("parent", {"n": 4}, owner="acme")
    await asyncio.sleep(0.5)
    await handle.signal("go", "hello")
    result = await handle.result(timeout=20)
    assert result == {"first": 5, "word": "hello", "squared": 25}
    assert calls == {"first": 1, "square": 1}
    run = await store.get_run(handle.run_id)
    assert run is not None and run.status is RunStatus.COMPLETED and run.owner == "acme"
    assert worker.running == 0


async def test_many_runs_across_two_workers(
    make_store: MakeStore, topology: str, registry: Registry, start_worker: StartWorker
) -> None:
    store = await make_store(topology, shard_count=8)
    done: list[int] = []

    @workflow(registry=registry, name="work")
    async def work(ctx: WorkflowContext, i: int) -> int:
        value = int(await ctx.step("double", lambda: i * 2))
        done.append(i)
        return value

    await start_worker(store, [work], max_concurrent_runs=10)
    await start_worker(store, [work], max_concurrent_runs=10)
    client = WorkflowClient(store, registry=registry)
    handles = [await client.submit("work", {"i": i}, owner=f"t{i % 4}") for i in range(60)]
    results = await asyncio.gather(*(h.result(timeout=30) for h in handles))
    assert results == [i * 2 for i in range(60)]
    assert sorted(done) == list(range(60))


async def test_waiting_for_a_result_does_not_poll(
    make_store: MakeStore, registry: Registry, start_worker: StartWorker
) -> None:
    """A client waiting for a slow run, and an idle worker, cost the server a handful of
    commands per second (blocking pops), not a stream of reads."""
    store = await make_store("single", shard_count=4)
    gate = asyncio.Event()

    @workflow(registry=registry, name="slow")
    async def slow(ctx: WorkflowContext) -> str:
        await ctx.step("wait", gate.wait)
        return "done"

    await start_worker(
        store, [slow], claim_poll_interval=5.0, timer_poll_interval_s=5.0, orphan_scan_interval=5.0
    )
    client = WorkflowClient(store, registry=registry)
    handle = await client.submit("slow", {})
    waiter = asyncio.ensure_future(handle.result(timeout=30))
    await asyncio.sleep(0.5)
    before = await _commands(store)
    started = time.monotonic()
    await asyncio.sleep(2.0)
    during = await _commands(store) - before - 1
    seconds = time.monotonic() - started  # 2 s, or more on a loaded machine
    assert not waiter.done()
    gate.set()
    assert await asyncio.wait_for(waiter, 10) == "done"
    # Renewals and heartbeats every lock_ttl/3 (2 s / 3), the schedule loop, blocking
    # pops in 5 s slices: a few dozen commands in 2 s, where a 10 ms poll would be hundreds.
    assert during < 20 * seconds, (during, seconds)


async def _commands(store: Any) -> int:
    info = await store._server.client().info("stats")
    return int(info["total_commands_processed"])


@pytest.mark.parametrize("workflows", [1, 3])
async def test_an_idle_worker_wakes_on_new_work(
    make_store: MakeStore,
    registry: Registry,
    start_worker: StartWorker,
    topology: str,
    workflows: int,
) -> None:
    """Every submit wakes the idle worker, whichever of its workflows it is for: on a
    cluster each workflow has its own wake-up list (another slot), and the waits on the
    others must not take the next wake-up away from the worker."""
    store = await make_store(topology, shard_count=4)
    names = [f"quick{i}" for i in range(workflows)]
    for name in names:

        @workflow(registry=registry, name=name)
        async def quick(ctx: WorkflowContext) -> str:
            return "ok"

    await start_worker(store, registry.all(), claim_poll_interval=60.0, timer_poll_interval_s=60.0)
    await asyncio.sleep(0.3)
    client = WorkflowClient(store, registry=registry)
    for i in range(3 * workflows):
        started = time.monotonic()
        handle = await client.submit(names[i % workflows], {})
        assert await handle.result(timeout=70) == "ok"
        # Woken by the submit, not by the 60 s poll (generous for a loaded machine).
        assert time.monotonic() - started < 20


@pytest.mark.slow
async def test_server_down_for_a_while_mid_run(
    registry: Registry, start_worker: StartWorker, eventually: Eventually, tmp_path: Any
) -> None:
    """The server stops for ~2 s while a run is between steps; with persistence on, the
    worker retries with backoff and the run completes, no finished step running twice."""
    from pyrula.workflows.stores.valkey import ValkeyStore
    from tests.valkey.servers import ValkeyProcess, fresh_namespace

    server = ValkeyProcess(persist=True)
    server.start()
    store = ValkeyStore(server.url, namespace=fresh_namespace(), shard_count=4)
    calls = {"a": 0, "b": 0}
    in_b = asyncio.Event()
    release_b = asyncio.Event()

    async def step_b() -> str:
        calls["b"] += 1
        in_b.set()
        await release_b.wait()
        return "B"

    def step_a() -> str:
        calls["a"] += 1
        return "A"

    @workflow(registry=registry, name="outage")
    async def outage(ctx: WorkflowContext) -> list[str]:
        return [await ctx.step("a", step_a), await ctx.step("b", step_b)]

    try:
        await store.open()
        await start_worker(store, [outage], lock_ttl=6.0)
        client = WorkflowClient(store, registry=registry)
        handle = await client.submit("outage", {})
        await asyncio.wait_for(in_b.wait(), 10)
        server.stop()  # SIGTERM: an append-only file keeps what was acknowledged
        with pytest.raises(StoreUnavailable):
            await store.get_run(handle.run_id)
        release_b.set()  # step b ends while the server is down: its write is retried
        await asyncio.sleep(2.0)
        server.start()
        assert await handle.result(timeout=30) == ["A", "B"]
        assert calls == {"a": 1, "b": 1}
        assert store.data_loss == []
    finally:
        await store.close()
        server.cleanup()


async def test_worker_uses_and_releases_shard_leases(make_store: MakeStore) -> None:
    store = await make_store("single", shard_count=8)
    registry = Registry()

    @workflow(registry=registry, name="noop")
    async def noop(ctx: WorkflowContext) -> None:
        return None

    worker = WorkflowWorker(store, [noop], registry=registry)
    task = asyncio.create_task(worker.run())
    try:
        deadline = time.monotonic() + 10
        while len(await store.shard_holders()) < 8:
            assert time.monotonic() < deadline, await store.shard_holders()
            await asyncio.sleep(0.05)
        assert set((await store.shard_holders()).values()) == {worker.worker_id}
    finally:
        worker.stop()
        await asyncio.wait_for(task, 15)
    assert await store.shard_holders() == {}  # released at once on a clean stop


async def test_seed_example_worker_with_a_stored_schedule(make_store: MakeStore) -> None:
    """Seed 000's examples on a real server: a minimal worker stopped the way a signal
    handler would, and a schedule created with the blocking API that every worker sees."""
    from pyrula.workflows.schedules import Schedule

    store = await make_store("single", shard_count=4)
    registry = Registry()
    fired: list[str] = []

    @workflow(registry=registry, name="nightly_report")
    async def nightly_report(ctx: WorkflowContext, window: str) -> str:
        fired.append(window)
        return window

    # Blocking, as at deploy time (it runs in a helper thread here: a loop is running).
    created = store.schedule_create(
        Schedule.create("nightly_report", every=1, params={"window": "24h"})
    )
    assert [s.schedule_id for s in store.schedule_list()] == [created.schedule_id]
    worker = WorkflowWorker(
        store, registry=registry, options=WorkerOptions(schedule_poll_interval=0.2)
    )
    task = asyncio.create_task(worker.run())
    try:
        deadline = time.monotonic() + 10
        while not fired:
            assert time.monotonic() < deadline, "the schedule never fired"
            await asyncio.sleep(0.05)
    finally:
        asyncio.get_running_loop().call_soon(worker.stop)  # as loop.add_signal_handler would
        await asyncio.wait_for(task, 15)
    assert fired[0] == "24h"
    assert store.schedule_update(created.schedule_id, enabled=False).enabled is False
    assert store.schedule_delete(created.schedule_id)


async def test_a_terminate_stops_the_run_at_once_whatever_the_lease(
    make_store: MakeStore, topology: str, registry: Registry, start_worker: StartWorker
) -> None:
    store = await make_store(topology, shard_count=4)
    entered, stopped = asyncio.Event(), asyncio.Event()

    async def forever() -> None:
        entered.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stopped.set()
            raise

    @workflow(registry=registry, name="stuck")
    async def stuck(ctx: WorkflowContext) -> None:
        await ctx.step("forever", forever)

    # A 30 s lease is renewed every 10 s: the terminate's lease news (pushed through the
    # server by another store object, as from another process) makes it renew now.
    worker = await start_worker(store, [stuck], lock_ttl=30)
    other = await make_store(topology, shard_count=4, namespace=store.namespace)
    handle = await WorkflowClient(store, registry=registry).submit("stuck")
    await asyncio.wait_for(entered.wait(), 10)
    await WorkflowClient(other, registry=registry).handle("stuck", handle.run_id).terminate()
    await asyncio.wait_for(stopped.wait(), 5)  # not 10 s: the next plain renewal
    assert await _ended(worker)


async def _ended(worker: WorkflowWorker) -> bool:
    for _ in range(50):
        if worker.running == 0:
            return True
        await asyncio.sleep(0.05)
    return False
