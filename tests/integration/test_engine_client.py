"""The async client: idempotency, handles, waiting, cancel, terminate and retry."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from pyrula.workflows import (
    DurableInvocationError,
    Fatal,
    IdempotencyConflict,
    InvalidRunState,
    MemoryStore,
    ResultTimeout,
    RetryPolicy,
    RunCancelled,
    RunNotFound,
    RunRecord,
    RunStatus,
    SqliteStore,
    Store,
    WorkflowClient,
    WorkflowContext,
    workflow,
)
from pyrula.workflows import sync as sync_client
from pyrula.workflows.registry import Registry
from tests.conftest import Eventually, StartWorker

NO_RETRY = RetryPolicy(max_attempts=1)


def _echo(registry: Registry) -> object:
    @workflow(registry=registry)
    async def echo(ctx: WorkflowContext, value: int) -> int:
        result: int = await ctx.step("echo", lambda: value)
        return result

    return echo


async def test_an_idempotency_key_maps_to_one_run(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    _echo(registry)

    @workflow(registry=registry)
    async def other(ctx: WorkflowContext, value: int) -> None:
        return None

    client = WorkflowClient(engine_store, registry=registry)
    first = await client.submit("echo", {"value": 1}, idempotency_key="order:1")
    again = await client.submit("echo", {"value": 1}, idempotency_key="order:1")
    assert again.run_id == first.run_id
    with pytest.raises(IdempotencyConflict, match="order:1"):
        await client.submit("echo", {"value": 2}, idempotency_key="order:1")
    with pytest.raises(IdempotencyConflict, match="workflow"):
        await client.submit("other", {"value": 1}, idempotency_key="order:1")
    assert len(await engine_store.list_runs()) == 1

    await start_worker(engine_store, [registry.get("echo")])
    assert await first.result(timeout=10) == 1
    # After the run finished, the key still returns it (and its result).
    done = await client.submit("echo", {"value": 1}, idempotency_key="order:1")
    assert done.run_id == first.run_id
    assert await done.result(timeout=1) == 1


@pytest.mark.parametrize("sharing", ["one-client", "client-per-thread"])
def test_eight_racing_threads_with_one_key_get_one_run(tmp_path: Path, sharing: str) -> None:
    registry = Registry()
    _echo(registry)
    path = tmp_path / "race.db"
    if sharing == "one-client":
        shared = sync_client.WorkflowClient(SqliteStore(path), registry=registry)
        clients = [shared] * 8
    else:  # each thread its own connection to one file: a race between SQLite writers
        clients = [
            sync_client.WorkflowClient(SqliteStore(path), registry=registry) for _ in range(8)
        ]
    barrier = threading.Barrier(len(clients))
    run_ids: list[str] = []
    errors: list[BaseException] = []

    def submit(client: sync_client.WorkflowClient) -> None:
        try:
            barrier.wait(timeout=10)
            run_ids.append(client.submit("echo", {"value": 7}, idempotency_key="k").run_id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(c,)) for c in clients]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert errors == []
        assert len(run_ids) == 8 and len(set(run_ids)) == 1
        check = SqliteStore(path)
        try:
            runs = asyncio.run(check.list_runs())
        finally:
            asyncio.run(check.close())
        assert [r.run_id for r in runs] == run_ids[:1]
    finally:
        for client in clients:
            client.close()


async def test_handle_status_and_result_by_id(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    echo = _echo(registry)
    client = WorkflowClient(engine_store, registry=registry)
    submitted = await client.submit("echo", {"value": 3})
    handle = client.handle("echo", submitted.run_id)
    assert await handle.status() is RunStatus.QUEUED
    began = time.monotonic()
    with pytest.raises(ResultTimeout):
        await handle.result(timeout=0.1)
    # The wait ends at its timeout (a guarantee; generous for a loaded machine: the run
    # would stay queued forever).
    assert time.monotonic() - began < 0.1 * 3 + 2
    with pytest.raises(TimeoutError):  # ResultTimeout is a TimeoutError too
        await handle.result(timeout=0)

    await start_worker(engine_store, [echo])
    assert await handle.result(timeout=10) == 3
    assert await handle.status() is RunStatus.COMPLETED
    record = await handle.record()
    assert record.result == "3" and record.claims == 1
    assert record.started_at is not None and record.finished_at is not None

    with pytest.raises(RunNotFound):
        await client.handle("echo", "no-such-run").status()
    with pytest.raises(RunNotFound):
        await client.handle("echo", "no-such-run").result(timeout=0.1)


async def test_cancel_of_a_queued_run_ends_it_at_once(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    echo = _echo(registry)
    client = WorkflowClient(engine_store, registry=registry)
    handle = await client.submit("echo", {"value": 1})
    record = await handle.cancel()
    assert record.status is RunStatus.CANCELLED
    with pytest.raises(RunCancelled) as cancelled:
        await handle.result(timeout=1)
    assert cancelled.value.status == "cancelled"
    with pytest.raises(InvalidRunState):
        await handle.cancel()

    await handle.retry()  # a cancelled run can be retried, and then it runs
    await start_worker(engine_store, [echo])
    assert await handle.result(timeout=10) == 1


async def test_cancel_of_a_running_run_stops_it_at_the_next_step_boundary(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    entered = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def first() -> str:
        entered.set()
        release.wait(timeout=10)
        ran.append("first")
        return "first done"

    @workflow(registry=registry)
    async def two_steps(ctx: WorkflowContext) -> None:
        await ctx.step("first", first)
        await ctx.step("second", lambda: ran.append("second"))

    await start_worker(engine_store, [two_steps])
    handle = await WorkflowClient(engine_store, registry=registry).submit("two_steps")
    await eventually(entered.is_set, what="the first step starting")
    record = await handle.cancel()
    assert record.status is RunStatus.RUNNING and record.cancel_requested
    release.set()
    with pytest.raises(RunCancelled):
        await handle.result(timeout=10)
    assert ran == ["first"]
    assert await handle.status() is RunStatus.CANCELLED
    journal = await engine_store.load_journal(handle.run_id)
    assert [(e.name, e.ok) for e in journal] == [("first", True)]


async def test_terminate_of_a_running_run_discards_its_step_and_the_worker_goes_on(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    entered = asyncio.Event()
    release = asyncio.Event()
    effects: list[str] = []

    async def long_step() -> str:
        entered.set()
        await release.wait()
        effects.append("long step finished")
        return "discarded"

    @workflow(registry=registry)
    async def terminable(ctx: WorkflowContext) -> None:
        await ctx.step("long", long_step)
        await ctx.step("after", lambda: effects.append("after"))

    echo = _echo(registry)
    # A long lease: the step's journal write, not a renewal, is what finds the run gone.
    worker = await start_worker(engine_store, [terminable, echo], lock_ttl=30)
    client = WorkflowClient(engine_store, registry=registry)
    handle = await client.submit("terminable")
    await asyncio.wait_for(entered.wait(), 10)
    record = await handle.terminate()
    assert record.status is RunStatus.TERMINATED
    assert await handle.status() is RunStatus.TERMINATED
    release.set()
    await eventually(lambda: worker.running == 0, what="the worker letting the run go")
    assert effects == ["long step finished"]  # the step finished its effects...
    assert await engine_store.load_journal(handle.run_id) == []  # ...but its result is gone
    with pytest.raises(RunCancelled) as ended:
        await handle.result(timeout=1)
    assert ended.value.status == "terminated"
    with pytest.raises(InvalidRunState):
        await handle.terminate()

    assert await (await client.submit("echo", {"value": 9})).result(timeout=10) == 9


async def test_retry_of_a_failed_run_and_of_other_statuses(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    calls: list[int] = []

    def sometimes() -> int:
        calls.append(len(calls))
        if len(calls) == 1:
            raise Fatal("first time fails")
        return len(calls)

    @workflow(registry=registry)
    async def once_failing(ctx: WorkflowContext) -> int:
        result: int = await ctx.step("sometimes", sometimes, retry=NO_RETRY)
        return result

    await start_worker(engine_store, [once_failing])
    handle = await WorkflowClient(engine_store, registry=registry).submit("once_failing")
    with pytest.raises(DurableInvocationError):
        await handle.result(timeout=10)
    record = await handle.retry()
    assert record.status is RunStatus.QUEUED and record.error is None
    assert await handle.result(timeout=10) == 2
    with pytest.raises(InvalidRunState, match="completed"):
        await handle.retry()


class CountingMemoryStore(MemoryStore):
    """A MemoryStore that counts get_run calls (to show result() does not poll)."""

    def __init__(self) -> None:
        super().__init__()
        self.get_run_calls = 0

    async def get_run(self, run_id: str) -> RunRecord | None:
        self.get_run_calls += 1
        return await super().get_run(run_id)


async def test_result_waits_without_polling(registry: Registry, start_worker: StartWorker) -> None:
    store = CountingMemoryStore()

    @workflow(registry=registry)
    async def slow(ctx: WorkflowContext) -> str:
        await ctx.step("nap", asyncio.sleep, 0.5)
        return "awake"

    await start_worker(store, [slow])
    handle = await WorkflowClient(store, registry=registry).submit("slow")
    store.get_run_calls = 0
    began = time.monotonic()
    assert await handle.result(timeout=10) == "awake"
    assert time.monotonic() - began >= 0.4  # it waited for the 0.5 s step: a lower bound
    assert store.get_run_calls <= 4
