"""The worker: graceful stop, workflows it doesn't serve, delayed runs, dead-lettering,
lease renewal, options."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pyrula.workflows import (
    ConfigurationError,
    DurableInvocationError,
    MemoryStore,
    RunDeadLettered,
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
from pyrula.workflows.records import WorkerInfo
from pyrula.workflows.registry import Registry
from tests.conftest import FAST, Eventually, StartWorker, StoreFactory


class FakeClock:
    """A store clock that moves only when told to."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_graceful_stop_requeues_a_run_whose_step_outlasts_the_grace(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    calls = {"quick": 0, "slow": 0}
    slow_entered = asyncio.Event()
    slow_seconds = {"value": 30.0}

    def quick() -> str:
        calls["quick"] += 1
        return "quick done"

    async def slow() -> str:
        calls["slow"] += 1
        slow_entered.set()
        await asyncio.sleep(slow_seconds["value"])
        return "slow done"

    @workflow(registry=registry)
    async def handover(ctx: WorkflowContext) -> list[str]:
        return [await ctx.step("quick", quick), await ctx.step("slow", slow)]

    first = await start_worker(engine_store, [handover], shutdown_grace=0.2)
    handle = await WorkflowClient(engine_store, registry=registry).submit("handover")
    await asyncio.wait_for(slow_entered.wait(), 10)
    first.stop()
    await eventually(lambda: first.running == 0, what="the first worker draining")
    record = await handle.record()
    assert record.status is RunStatus.QUEUED  # handed back at once, not left running
    assert record.recoveries == 0
    assert [e.name for e in await engine_store.load_journal(handle.run_id)] == ["quick"]

    slow_seconds["value"] = 0.0
    await start_worker(engine_store, [handover])
    assert await handle.result(timeout=10) == ["quick done", "slow done"]
    assert calls == {"quick": 1, "slow": 2}
    assert (await handle.record()).claims == 2


async def test_a_run_of_a_workflow_the_worker_does_not_serve_stays_queued(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry)
    async def served(ctx: WorkflowContext) -> str:
        return "served"

    @workflow(registry=registry)
    async def elsewhere(ctx: WorkflowContext) -> str:
        return "elsewhere"

    await start_worker(engine_store, [served])
    client = WorkflowClient(engine_store, registry=registry)
    other = await client.submit("elsewhere")
    for _ in range(3):  # the worker is busy and polling all along
        assert await (await client.submit("served")).result(timeout=10) == "served"
    await asyncio.sleep(10 * FAST["claim_poll_interval"])
    record = await other.record()
    assert record.status is RunStatus.QUEUED and record.claims == 0

    await start_worker(engine_store, [elsewhere])
    assert await other.result(timeout=10) == "elsewhere"


@pytest.mark.parametrize("how", ["delay", "start_at"])
async def test_a_delayed_run_starts_on_time(
    engine_store: Store, registry: Registry, start_worker: StartWorker, how: str
) -> None:
    @workflow(registry=registry)
    async def later(ctx: WorkflowContext) -> str:
        return "ran"

    await start_worker(engine_store, [later])
    client = WorkflowClient(engine_store, registry=registry)
    timing: dict[str, Any] = (
        {"delay": timedelta(seconds=0.5)}
        if how == "delay"
        else {"start_at": datetime.now(UTC) + timedelta(seconds=0.5)}
    )
    handle = await client.submit("later", **timing)
    queued = await handle.record()
    assert queued.available_at - queued.created_at == pytest.approx(0.5, abs=0.1)
    await asyncio.sleep(0.2)
    assert (await handle.record()).status is RunStatus.QUEUED
    assert await handle.result(timeout=10) == "ran"
    record = await handle.record()
    assert record.started_at is not None
    assert record.started_at >= record.available_at
    # Within a claim interval plus generous slack: the timer loop wakes the claimers.
    assert record.started_at - record.available_at < FAST["claim_poll_interval"] + 0.5


async def test_a_run_claimed_ahead_of_its_time_starts_at_it(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    """The timer loop wakes the claim loop CLAIM_AHEAD before a delayed run's time and
    the claim takes it then; the worker holds it until its time. Its first step reads
    the store's clock: never before the run's available_at."""

    @step
    async def clock(ctx: StepContext) -> float:
        return time.time()

    @workflow(registry=registry)
    async def stamp(ctx: WorkflowContext) -> float:
        return await clock()

    await start_worker(engine_store, [stamp])
    client = WorkflowClient(engine_store, registry=registry)
    handles = [await client.submit("stamp", delay=0.2 + 0.03 * i) for i in range(10)]
    ahead = 0
    for handle in handles:
        began = await handle.result(timeout=10)
        record = await handle.record()
        assert record.started_at is not None and record.started_at >= record.available_at
        ahead += record.started_at == record.available_at  # claimed before its time
        assert began >= record.available_at, f"began {record.available_at - began:.4f}s early"
    assert ahead, "no run was claimed ahead of its time"


@pytest.fixture
def far_ahead(monkeypatch: pytest.MonkeyPatch) -> float:
    """Claims look 1.5 s ahead, so a test can act while a claimed run is held."""
    from pyrula.workflows import claiming, loops

    monkeypatch.setattr(loops, "CLAIM_AHEAD", 1.5)
    monkeypatch.setattr(claiming, "CLAIM_AHEAD", 1.5)
    return 1.5


async def test_a_held_run_released_at_stop_keeps_its_time(
    engine_store: Store,
    registry: Registry,
    start_worker: StartWorker,
    eventually: Eventually,
    far_ahead: float,
) -> None:
    @workflow(registry=registry)
    async def later(ctx: WorkflowContext) -> float:
        return (await ctx.now()).timestamp()

    first = await start_worker(engine_store, [later], shutdown_grace=0.1)
    handle = await WorkflowClient(engine_store, registry=registry).submit("later", delay=1.0)
    due = (await handle.record()).available_at
    await eventually(
        lambda: _status(handle, RunStatus.RUNNING), what="the run claimed ahead and held"
    )
    first.stop()
    await eventually(lambda: first.running == 0, what="the worker draining")
    record = await handle.record()
    assert record.status is RunStatus.QUEUED and record.available_at == due
    await start_worker(engine_store, [later])
    assert await handle.result(timeout=10) >= due  # never before its time


async def test_a_run_cancelled_while_held_is_cancelled_not_run(
    engine_store: Store,
    registry: Registry,
    start_worker: StartWorker,
    eventually: Eventually,
    far_ahead: float,
) -> None:
    ran: list[str] = []

    @step
    async def effect(ctx: StepContext) -> str:
        ran.append("effect")
        return "done"

    @workflow(registry=registry)
    async def held(ctx: WorkflowContext) -> str:
        return await effect()

    await start_worker(engine_store, [held])
    client = WorkflowClient(engine_store, registry=registry)
    handle = await client.submit("held", delay=1.0)
    await eventually(lambda: _status(handle, RunStatus.RUNNING), what="the run claimed and held")
    await handle.cancel()
    await eventually(lambda: _status(handle, RunStatus.CANCELLED), timeout=10, what="cancelled")
    assert ran == []  # its step never ran


async def _status(handle: Any, status: RunStatus) -> bool:
    return bool((await handle.record()).status is status)


async def test_a_run_that_keeps_losing_its_worker_is_dead_lettered(
    store_factory: StoreFactory, registry: Registry
) -> None:
    clock = FakeClock()
    store = await store_factory(clock=clock)

    @workflow(registry=registry)
    async def crashing(ctx: WorkflowContext) -> None:
        return None

    handle = await WorkflowClient(store, registry=registry).submit("crashing")
    for crash in range(2):  # claimed by a worker that then dies, twice
        [lease] = await store.claim_runs(f"doomed-{crash}", ["crashing"], 1, lease_ttl=10)
        assert lease.run_id == handle.run_id
        clock.now += 5
        assert (await store.recover_expired(max_recoveries=1, limit=10)).requeued == ()
        clock.now += 6
        report = await store.recover_expired(max_recoveries=1, limit=10)
        if crash == 0:
            assert report.requeued == (handle.run_id,)
            assert (await handle.record()).recoveries == 1
        else:
            assert report.dead == (handle.run_id,)
    assert await handle.status() is RunStatus.DEAD
    with pytest.raises(DurableInvocationError) as dead:
        await handle.result(timeout=1)
    assert dead.value.error_type == "pyrula.workflows.errors.RunDeadLettered"
    assert "max_recoveries=1" in dead.value.error_message
    assert isinstance(dead.value.original, RunDeadLettered)
    record = await handle.retry()  # a dead run can be retried once fixed
    assert record.status is RunStatus.QUEUED and record.recoveries == 0


async def test_lease_renewal_keeps_a_long_step_with_its_worker(
    store_factory: StoreFactory, registry: Registry, start_worker: StartWorker
) -> None:
    effects: list[str] = []
    lock_ttl = 0.5

    async def long_step() -> str:
        effects.append(threading.current_thread().name)
        await asyncio.sleep(3 * lock_ttl)
        return "long done"

    @workflow(registry=registry)
    async def long_running(ctx: WorkflowContext) -> str:
        result: str = await ctx.step("long", long_step)
        return result

    timings = {"lock_ttl": lock_ttl, "orphan_scan_interval": 0.05}
    first_store, second_store = await store_factory(), await store_factory()
    await start_worker(first_store, [long_running], **timings)
    await start_worker(second_store, [long_running], **timings)
    handle = await WorkflowClient(first_store, registry=registry).submit("long_running")
    assert await handle.result(timeout=10) == "long done"
    assert len(effects) == 1
    record = await handle.record()
    assert record.claims == 1 and record.recoveries == 0


async def test_a_worker_with_several_workflows_serves_them_all(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    definitions: list[WorkflowDefinition] = []
    for index in range(4):

        async def numbered(ctx: WorkflowContext, index: int = index) -> int:
            result: int = await ctx.step("n", lambda: index)
            return result

        definitions.append(workflow(name=f"numbered_{index}", registry=registry)(numbered))
    await start_worker(engine_store, definitions, max_concurrent_runs=2)
    client = WorkflowClient(engine_store, registry=registry)
    handles = [await client.submit(f"numbered_{i % 4}") for i in range(20)]
    results = await asyncio.gather(*(h.result(timeout=10) for h in handles))
    assert results == [i % 4 for i in range(20)]


async def test_each_workflow_is_served_when_only_it_has_work(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    """Regression: a claim loop that found every slot reserved by another workflow's
    in-flight claim waited for a run to finish, so with no run finishing it never
    claimed again."""

    @workflow(registry=registry)
    async def idle_one(ctx: WorkflowContext) -> None:
        return None

    @workflow(registry=registry)
    async def busy_one(ctx: WorkflowContext, n: int) -> int:
        return n

    await start_worker(engine_store, [idle_one, busy_one])
    await asyncio.sleep(0.1)  # both claim loops have started and found nothing
    client = WorkflowClient(engine_store, registry=registry)
    handles = [await client.submit("busy_one", {"n": n}) for n in range(3)]
    assert [await h.result(timeout=10) for h in handles] == [0, 1, 2]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_concurrent_runs": 0},
        {"max_concurrent_runs": 2.5},
        {"max_concurrent_runs": True},
        {"lock_ttl": -1},
        {"lock_ttl": 0},
        {"lock_ttl": float("nan")},
        {"claim_poll_interval": "0.1"},
        {"shutdown_grace": None},
        {"max_recoveries": 1.5},
        {"max_payload_bytes": 0},
        {"worker_id": ""},
        {"worker_id": 7},
    ],
    ids=repr,
)
def test_invalid_worker_options_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        WorkerOptions(**kwargs)


def test_workers_take_only_workflow_definitions() -> None:
    async def not_decorated(ctx: WorkflowContext) -> None:
        return None

    with pytest.raises(ConfigurationError, match="workflow"):
        WorkflowWorker(store=None, workflows=[not_decorated])  # type: ignore[list-item]


def test_lease_renewal_runs_at_a_third_of_the_ttl() -> None:
    assert WorkerOptions(lock_ttl=3.0).lease_renew_interval == pytest.approx(1.0)


async def test_the_orphan_scan_forgets_a_worker_killed_over_a_day_ago(
    registry: Registry, start_worker: StartWorker
) -> None:
    now = [time.time()]
    store = MemoryStore(clock=lambda: now[0])

    @workflow(registry=registry)
    async def idle(ctx: WorkflowContext) -> None:
        return None

    ghost = WorkerInfo("ghost", ("idle",), "web-9", 99, now[0], now[0], 0)
    await store.heartbeat(ghost)  # a worker that was SIGKILLed and never deregistered
    now[0] += 86_400 + 60
    worker = await start_worker(store, [idle], orphan_scan_interval=0.05)
    for _ in range(200):
        ids = {w.worker_id for w in await store.list_workers()}
        if "ghost" not in ids:
            break
        await asyncio.sleep(0.02)
    assert ids == {worker.worker_id}


async def test_a_worker_serving_no_workflow_stops_cleanly(engine_store: Store) -> None:
    """A scheduler-only worker (no workflow to claim) stops, deregisters and leaves no
    loop running (its stop waited on an empty set of claim loops: ValueError)."""
    worker = WorkflowWorker(engine_store, workflows=[], options=WorkerOptions(**FAST))
    running = asyncio.create_task(worker.run())
    try:
        deadline = time.monotonic() + 10
        while worker.worker_id not in {w.worker_id for w in await engine_store.list_workers()}:
            assert time.monotonic() < deadline and not running.done()
            await asyncio.sleep(0.02)
        worker.stop()
        await asyncio.wait_for(running, 10)
        assert worker.worker_id not in {w.worker_id for w in await engine_store.list_workers()}
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("pyrula-")]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
