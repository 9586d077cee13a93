"""The worker's one claim loop: fairness across workflows, idle cost, prompt delayed runs,
a store wait kept across local wake-ups, and a graceful stop.

Each test runs on a MemoryStore, a SqliteStore file and a ValkeyStore on a real
valkey-server (session-wide, a fresh namespace per store). Store calls are counted by
subclasses of the real stores, never mocks.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import (
    MemoryStore,
    RunStatus,
    SqliteStore,
    StoreUnavailable,
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.stores.valkey.keys import Keys
from pyrula.workflows.stores.valkey.queue import WAKE_READY
from tests.conftest import FAST, StartWorker
from tests.valkey.servers import ValkeyProcess, fresh_namespace, valkey_server  # noqa: F401

COUNTED = (
    "claim_runs",
    "wait_for_work",
    "next_due_at",
    "fire_timers",
    "now",
    "heartbeat",
    "renew_leases",
    "recover_expired",
    "due_schedules",
    "next_schedule_at",
)
"""The calls a worker makes on its own (the ones executing runs are left out)."""


def _counting(base: type[Any]) -> type[Any]:
    """A subclass of the real store ``base`` that counts the worker's calls, and the
    ``wait_for_work`` calls that were cancelled before they returned."""

    def counted(name: str) -> Callable[..., Awaitable[Any]]:
        async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            try:
                return await getattr(super(cls, self), name)(*args, **kwargs)
            except asyncio.CancelledError:
                self.calls[f"{name} cancelled"] += 1
                raise

        return call

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        base.__init__(self, *args, **kwargs)
        self.calls = Counter()

    namespace: dict[str, Any] = {"__init__": init}
    namespace.update({name: counted(name) for name in COUNTED})
    cls = type(f"Counting{base.__name__}", (base,), namespace)
    return cls


CountingMemory = _counting(MemoryStore)
CountingSqlite = _counting(SqliteStore)
CountingValkey = _counting(ValkeyStore)

Open = Callable[[], Awaitable[Any]]


@pytest.fixture(params=["memory", "sqlite", "valkey"])
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Open]:
    """``await open_store()``: a counting store of this test's kind; a second call gives
    another client of the same data (SQLite: the same file; Valkey: the same namespace;
    memory: the same object, as nothing else can share it)."""
    kind: str = request.param
    built: list[Any] = []
    namespace = fresh_namespace()

    async def make() -> Any:
        if kind == "memory" and built:
            return built[0]
        if kind == "memory":
            store = CountingMemory()
        elif kind == "sqlite":
            store = CountingSqlite(tmp_path / "claims.db")
        else:
            server: ValkeyProcess = request.getfixturevalue("valkey_server")
            store = CountingValkey(server.url, namespace=namespace, shard_count=8)
        await store.open()
        built.append(store)
        return store

    try:
        yield make
    finally:
        for store in reversed(built):
            await store.close()


async def test_one_claim_loop_serves_a_workflow_behind_another_ones_backlog(
    open_store: Open, registry: Registry, start_worker: StartWorker
) -> None:
    """Each claim names the workflows in a rotated order: with a backlog of ``busy``
    runs filling every slot as it frees, ``quiet``'s runs still start within a few
    claims, long before the backlog drains."""
    store = await open_store()
    finished: list[str] = []

    async def pause() -> None:
        await asyncio.sleep(0.02)

    @workflow(registry=registry)
    async def busy(ctx: WorkflowContext, n: int) -> None:
        await ctx.step("pause", pause)
        finished.append("busy")

    @workflow(registry=registry)
    async def quiet(ctx: WorkflowContext, n: int) -> None:
        await ctx.step("pause", pause)
        finished.append("quiet")

    client = WorkflowClient(store, registry=registry)
    backlog = [await client.submit(busy, {"n": n}) for n in range(60)]
    worker = await start_worker(store, [busy, quiet], max_concurrent_runs=2)
    while "busy" not in finished:
        await asyncio.sleep(0.005)
    claimers = [t for t in asyncio.all_tasks() if t.get_name().startswith("pyrula-claim")]
    assert len(claimers) == 1, "one claim loop for all the worker's workflows"
    handles = [await client.submit(quiet, {"n": n}) for n in range(4)]
    for handle in handles:
        await handle.result(timeout=20)
    busy_done = finished.count("busy")
    assert busy_done <= 40, f"quiet waited for {busy_done} of the 60 busy runs"
    for handle in backlog:
        await handle.result(timeout=20)
    assert worker.running == 0


async def test_idle_worker_makes_few_store_calls_however_many_workflows(
    open_store: Open, registry: Registry, start_worker: StartWorker
) -> None:
    """Idle, the worker's cost does not grow with its workflows: one claim and one store
    wait per ``claim_poll_interval`` (0.1 s, the default) for all twenty of them."""
    store = await open_store()
    definitions = []
    for index in range(20):

        async def nothing(ctx: WorkflowContext) -> None:
            return None

        definitions.append(workflow(name=f"idle_{index}", registry=registry)(nothing))
    await start_worker(
        store,
        definitions,
        claim_poll_interval=0.1,
        timer_poll_interval_s=5.0,
        orphan_scan_interval=60.0,
        lock_ttl=30.0,
    )
    await asyncio.sleep(0.5)  # started: registered, first claims and scans made
    before = Counter(store.calls)
    started = time.monotonic()
    await asyncio.sleep(2.0)
    elapsed = time.monotonic() - started
    calls = store.calls - before
    per_second = sum(calls.values()) / elapsed
    # One loop: <= 10 claims + 10 waits a second (fewer where a store's wait outlasts its
    # timeout); a loop per workflow would make twenty times that.
    assert per_second <= 30, f"{per_second:.0f} store calls/s idle: {dict(calls)}"
    assert calls["claim_runs"] >= 1, "the idle worker still polls"


async def test_a_delayed_run_from_another_client_starts_on_time(
    open_store: Open, registry: Registry, start_worker: StartWorker, request: pytest.FixtureRequest
) -> None:
    """A run delayed by another client while the worker idles: the store wakes the
    claim loop, which finds nothing due and hints the timer loop, which sleeps until the
    run's time. It starts then, not at the next claim poll (3 s here) or timer poll (5 s).
    SQLite's ``wait_for_work`` only returns for work that is due, so there the claim poll
    finds it: that store is left out."""
    if "sqlite" in request.node.callspec.id:
        pytest.skip("SqliteStore.wait_for_work does not return for a delayed run")
    store = await open_store()

    @workflow(registry=registry)
    async def later(ctx: WorkflowContext) -> str:
        return "ran"

    await start_worker(store, [later], claim_poll_interval=30.0, timer_poll_interval_s=30.0)
    await asyncio.sleep(0.5)  # idle: a claim found nothing, the timer loop sleeps 30 s
    other = WorkflowClient(await open_store(), registry=registry)
    handle = await other.submit(later, delay=0.4)
    assert await handle.result(timeout=10) == "ran"
    record = await handle.record()
    assert record.started_at is not None
    late = record.started_at - record.available_at
    # Not before its due time (a correctness bound); woken for it, not by either 30 s
    # poll (generous: ten seconds, for a loaded machine).
    assert -0.01 <= late < 10, f"started {late:.3f}s after its due time"


async def test_a_burst_of_delayed_runs_costs_few_timer_looks(
    open_store: Open, registry: Registry, start_worker: StartWorker, request: pytest.FixtureRequest
) -> None:
    """Fifty delayed runs submitted at once wake the claim loop fifty times, each claim
    finding nothing due; the timer loop coalesces the hints into a few looks."""
    if "sqlite" in request.node.callspec.id:
        pytest.skip("SqliteStore.wait_for_work does not return for a delayed run")
    store = await open_store()

    @workflow(registry=registry)
    async def much_later(ctx: WorkflowContext, n: int) -> None:
        return None

    await start_worker(store, [much_later], claim_poll_interval=3.0, timer_poll_interval_s=5.0)
    await asyncio.sleep(0.5)
    other = WorkflowClient(await open_store(), registry=registry)
    before = Counter(store.calls)
    for n in range(50):
        await other.submit(much_later, {"n": n}, delay=60)
        await asyncio.sleep(0.002)
    await asyncio.sleep(0.3)
    calls = store.calls - before
    assert calls["claim_runs"] >= 5, f"the submits did not wake the claim loop: {dict(calls)}"
    assert 1 <= calls["next_due_at"] <= 10, dict(calls)


class NamingValkey(CountingValkey):  # type: ignore[misc, valid-type]
    """Records the workflows each claim names."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claimed: list[list[str]] = []

    async def claim_runs(
        self, worker_id: str, workflows: Any, limit: int, ttl: float, ahead: float = 0.0
    ) -> Any:
        self.claimed.append(list(workflows))
        return await super().claim_runs(worker_id, workflows, limit, ttl, ahead)


async def test_a_wake_up_for_runs_another_worker_took_costs_one_targeted_claim(
    registry: Registry,
    start_worker: StartWorker,
    valkey_server: ValkeyProcess,  # noqa: F811
) -> None:
    """ValkeyStore names the workflow of a wake-up for runs put on its ready list: the
    claim loop claims that workflow alone, and when another worker took the runs first
    it does not go on to claim the other workflows. (The wake-up is pushed here as a
    submit pushes it, the run itself gone to the other worker.)"""
    store = NamingValkey(valkey_server.url, namespace=fresh_namespace(), shard_count=8)
    await store.open()
    try:
        definitions = []
        for name in ("a", "b", "c"):

            async def nothing(ctx: WorkflowContext) -> None:
                return None

            definitions.append(workflow(name=name, registry=registry)(nothing))
        await start_worker(store, definitions, claim_poll_interval=60.0, timer_poll_interval_s=60.0)
        await asyncio.sleep(0.5)  # idle: blocked on the wake-up lists
        claims = len(store.claimed)
        # Pushed from a client of the test's own, under the key schema's name for it.
        with valkey_server.client() as raw:
            raw.lpush(Keys(store.namespace, store.shard_count).wake("b"), WAKE_READY)
        deadline = time.monotonic() + 20  # woken: the poll is 60 s
        while len(store.claimed) == claims:
            assert time.monotonic() < deadline, "the wake-up made no claim"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # any claim it went on to make lands
        assert store.claimed[claims:] == [["b"]], store.claimed[claims:]
        # A run submitted now is claimed at once all the same: woken, not at the 60 s poll
        # (generous for a loaded machine).
        handle = await WorkflowClient(store, registry=registry).submit(definitions[0])
        assert (await handle.result(timeout=20)) is None
        assert store.claimed[-1][0] == "a", store.claimed[claims:]
    finally:
        await store.close()


async def test_the_claim_loop_outlives_store_errors(registry: Registry) -> None:
    """Claims that fail (the store unreachable, or any other error) are retried with a
    backoff by the one claim loop, which goes on serving every workflow."""

    class Flaky(CountingMemory):  # type: ignore[misc, valid-type]
        failures = [StoreUnavailable("down"), StoreUnavailable("still down"), ValueError("bug")]

        async def claim_runs(self, *args: Any, **kwargs: Any) -> Any:
            if self.failures:
                raise self.failures.pop(0)
            return await super().claim_runs(*args, **kwargs)

    store = Flaky()
    await store.open()

    @workflow(registry=registry)
    async def one(ctx: WorkflowContext) -> str:
        return "one"

    @workflow(registry=registry)
    async def two(ctx: WorkflowContext) -> str:
        return "two"

    client = WorkflowClient(store, registry=registry)
    handles = [await client.submit(one), await client.submit(two)]
    worker = WorkflowWorker(
        store, [one, two], WorkerOptions(**{**FAST, "claim_poll_interval": 0.01}), registry=registry
    )
    task = asyncio.create_task(worker.run())
    try:
        assert [await h.result(timeout=10) for h in handles] == ["one", "two"]
        assert not store.failures
    finally:
        worker.stop()
        await asyncio.wait_for(task, timeout=10)
        await store.close()


async def test_local_wake_ups_keep_the_pending_store_wait(
    open_store: Open, registry: Registry, start_worker: StartWorker
) -> None:
    """``wake_claimers`` makes the idle loop claim at once, but the store wait it was
    in is kept and awaited again, not cancelled and re-issued (cancelling a blocking
    Valkey command costs its connection)."""
    store = await open_store()

    @workflow(registry=registry)
    async def quick(ctx: WorkflowContext) -> int:
        return 1

    worker = await start_worker(store, [quick], claim_poll_interval=5.0)
    await asyncio.sleep(0.3)
    before = Counter(store.calls)
    for _ in range(20):
        worker.wake_claimers()
        await asyncio.sleep(0.02)
    calls = store.calls - before
    assert calls["claim_runs"] >= 10, f"wake-ups did not make claims: {dict(calls)}"
    assert calls["wait_for_work cancelled"] == 0
    assert calls["wait_for_work"] <= 2, dict(calls)


async def test_graceful_stop_with_one_claim_loop(open_store: Open, registry: Registry) -> None:
    """Stop with runs of two workflows in flight and more queued: the in-flight ones
    finish, the rest stay queued, nothing is left claimed; a worker whose claim loop
    idles on a long poll stops at once."""
    store = await open_store()

    async def pause() -> None:
        await asyncio.sleep(0.3)

    @workflow(registry=registry)
    async def first(ctx: WorkflowContext, n: int) -> int:
        await ctx.step("pause", pause)
        return n

    @workflow(registry=registry)
    async def second(ctx: WorkflowContext, n: int) -> int:
        await ctx.step("pause", pause)
        return n

    def worker(max_concurrent_runs: int) -> WorkflowWorker:
        options = WorkerOptions(
            **{**FAST, "claim_poll_interval": 30.0, "max_concurrent_runs": max_concurrent_runs}
        )
        return WorkflowWorker(store, [first, second], options, registry=registry)

    client = WorkflowClient(store, registry=registry)
    handles = [await client.submit(wf, {"n": n}) for n in range(6) for wf in (first, second)]
    busy = worker(3)
    task = asyncio.create_task(busy.run())
    deadline = time.monotonic() + 10
    while busy.running < 3:
        assert time.monotonic() < deadline, "the worker never filled its slots"
        await asyncio.sleep(0.01)
    busy.stop()
    await asyncio.wait_for(task, timeout=10)
    statuses = Counter([(await h.record()).status for h in handles])
    assert statuses == {RunStatus.COMPLETED: 3, RunStatus.QUEUED: len(handles) - 3}

    idle = worker(50)
    task = asyncio.create_task(idle.run())
    try:
        assert [await h.result(timeout=10) for h in handles] == [n for n in range(6) for _ in "ab"]
        await asyncio.sleep(0.3)  # idle: the claim loop waits on the store, up to 30 s
    finally:
        started = time.monotonic()
        idle.stop()
        await asyncio.wait_for(task, timeout=40)
    # Stopped at once, not after the idle claim loop's 30 s poll (generous: 10 s).
    assert time.monotonic() - started < 10, "stop waited for the idle claim loop's poll"
    assert not await store.list_runs(status=RunStatus.RUNNING)
