"""A worker that claims a run again while its own older execution of it is still going.

This happens after any stall longer than the lease (a hung store, a paused process): an
orphan scan requeues the run, and the next claim of the same worker may take it back,
with a new token, while the old execution (old token) is still inside a step or retrying
its journal write. The old execution's next write is refused (LeaseLost) and it ends;
the new one must go on as the worker's: counted in ``worker.running``, its lease renewed
(docs/worker.md, Lease renewal loop: "the renewal of every run this worker holds").

Found by ``tests/chaos/test_valkey_outages.py`` (a run left ``running`` forever after a
server hang), reduced here to a deterministic sequence on a store clock moved by hand.
"""

from __future__ import annotations

import asyncio
import time

from pyrula.workflows import RunStatus, WorkflowClient, WorkflowContext, workflow
from pyrula.workflows.registry import Registry
from tests.conftest import Eventually, StartWorker, StoreFactory
from tests.stores.conftest import FakeClock

LOCK_TTL = 3.0


async def test_a_run_claimed_back_by_its_own_worker_stays_tracked_and_renewed(
    store_factory: StoreFactory,
    registry: Registry,
    start_worker: StartWorker,
    eventually: Eventually,
) -> None:
    clock = FakeClock(start=time.time())
    store = await store_factory(clock=clock)
    first_done, second_done = asyncio.Event(), asyncio.Event()
    calls: list[int] = []

    async def slow() -> str:
        calls.append(len(calls) + 1)
        await (first_done if len(calls) == 1 else second_done).wait()
        return "S"

    @workflow(registry=registry, name="reclaimed")
    async def reclaimed(ctx: WorkflowContext) -> str:
        a = await ctx.step("a", lambda: "A")
        return str(a) + str(await ctx.step("slow", slow))

    worker = await start_worker(store, [reclaimed], lock_ttl=LOCK_TTL, orphan_scan_interval=3600.0)
    handle = await WorkflowClient(store, registry=registry).submit("reclaimed")
    await eventually(lambda: len(calls) == 1, what="the first execution in its step")

    # The lease lapses by the store's clock; an orphan scan requeues the run and the same
    # worker claims it again (token 2) while execution 1 is still in its step.
    clock.advance(LOCK_TTL + 5)
    assert (await store.recover_expired(5, 10)).requeued == (handle.run_id,)
    await eventually(lambda: len(calls) == 2, what="the second execution in its step")
    assert (await handle.record()).lease_token == 2

    # Execution 1 ends: its journal write is refused, and it stops.
    first_done.set()
    await asyncio.sleep(0.3)
    assert worker.running == 1, "the worker lost track of execution 2"

    # Execution 2 is alive: its lease must be renewed, so nothing is there to recover.
    clock.advance(LOCK_TTL + 5)
    await asyncio.sleep(LOCK_TTL / 3 + 0.5)  # one renewal round
    assert (await store.recover_expired(5, 10)).requeued == (), "a live run was recovered"
    second_done.set()
    assert await handle.result(timeout=10) == "AS"
    record = await handle.record()
    assert record.status is RunStatus.COMPLETED
    assert (record.claims, record.recoveries, len(calls)) == (2, 1, 2)
