"""``WorkflowWorker.run_schedules``: the schedule loop alone (``pyrula beat``), on a
MemoryStore on the real clock. It fires due schedules, claims and executes nothing,
never registers as a worker, and returns promptly on ``stop()``."""

from __future__ import annotations

import asyncio
import threading

from pyrula.workflows import (
    MemoryStore,
    RunStatus,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.registry import Registry
from pyrula.workflows.schedules import Schedule
from tests.conftest import Eventually


async def test_it_fires_due_schedules_and_serves_none_of_their_runs(
    registry: Registry, eventually: Eventually
) -> None:
    @workflow(registry=registry, name="beat.tick")
    async def tick(ctx: WorkflowContext) -> str:
        return "ran"

    store = MemoryStore()
    await store.open()
    schedule = Schedule.create(tick, params={"n": 1}, schedule_id="every-second", every=1)
    await store.create_schedule(schedule.to_record(await store.now()))
    # A worker of this process would serve beat.tick: run_schedules must not.
    scheduler = WorkflowWorker(store=store, workflows=[tick], registry=registry)
    task = asyncio.create_task(scheduler.run_schedules())
    try:

        async def fired() -> bool:
            return bool(await store.list_runs(workflow="beat.tick"))

        await eventually(fired, timeout=5, what="a fired run")
        assert await store.list_workers() == []  # no heartbeat: not a worker
        await asyncio.sleep(0.3)  # time a worker would take to claim and finish it
        runs = await store.list_runs(workflow="beat.tick")
        assert [run.status for run in runs] == [RunStatus.QUEUED] * len(runs)
        keys = [run.idempotency_key or "" for run in runs]
        assert all(key.startswith("schedule:every-second:") for key in keys), keys
        assert scheduler.running == 0
    finally:
        scheduler.stop()
        await asyncio.wait_for(task, timeout=5)
    assert await store.list_workers() == []
    await store.close()


async def test_stop_before_it_starts_returns_at_once() -> None:
    store = MemoryStore()
    scheduler = WorkflowWorker(store=store, workflows=[], registry=Registry())
    scheduler.stop()
    await asyncio.wait_for(scheduler.run_schedules(), timeout=5)
    await store.close()


async def test_stop_from_another_thread_ends_it_with_no_slot_fired_after(
    eventually: Eventually,
) -> None:
    store = MemoryStore()
    await store.open()
    schedule = Schedule.create("beat.other", schedule_id="later", every=3600)
    await store.create_schedule(schedule.to_record(await store.now()))
    options = WorkerOptions(schedule_poll_interval=0.05)
    scheduler = WorkflowWorker(store=store, workflows=[], options=options, registry=Registry())
    task = asyncio.create_task(scheduler.run_schedules())
    await asyncio.sleep(0.2)  # a few looks of the loop
    assert not task.done()
    stopper = threading.Thread(target=scheduler.stop)
    stopper.start()
    await asyncio.wait_for(task, timeout=5)
    stopper.join()
    assert await store.list_runs() == []  # the hourly slot is not due
    await store.close()
