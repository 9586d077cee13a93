"""A real WorkflowWorker on ArchivingStore(ValkeyStore, PostgresArchive): ended runs are
copied to Postgres with their journals, expire from Valkey, and still read the same
through the store and the client. Postgres down: nothing is lost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from pyrula.workflows import (
    ArchivingStore,
    DurableInvocationError,
    Fatal,
    InvalidRunState,
    PostgresArchive,
    RunNotFound,
    RunStatus,
    StoreUnavailable,
    WorkflowClient,
    WorkflowContext,
    WorkflowDefinition,
    workflow,
)
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.archive.postgres import PostgresProcess, fresh_schema, migrate
from tests.conftest import Eventually, StartWorker
from tests.valkey.servers import ValkeyProcess, fresh_namespace

FAST_ARCHIVE = {"live_ttl_after_archive": 0.5, "reconcile_interval": 0.1, "clock_skew": 0.2}

MakeArchiving = Callable[..., Awaitable[ArchivingStore]]


@pytest.fixture
async def make_archiving(valkey_server: ValkeyProcess) -> AsyncIterator[MakeArchiving]:
    """``await make_archiving(dsn, **options)``: an opened ArchivingStore over a fresh
    Valkey namespace and the archive at ``dsn``; closed at teardown."""
    built: list[ArchivingStore] = []

    async def make(dsn: str, **options: Any) -> ArchivingStore:
        live = ValkeyStore(valkey_server.url, namespace=fresh_namespace(), shard_count=4)
        store = ArchivingStore(live, PostgresArchive(dsn), **{**FAST_ARCHIVE, **options})
        built.append(store)
        await store.open()
        return store

    try:
        yield make
    finally:
        for store in built:
            await store.close()


def workflows(registry: Registry) -> tuple[WorkflowDefinition, WorkflowDefinition]:
    @workflow(registry=registry, name="double")
    async def double(ctx: WorkflowContext, n: int) -> int:
        half = await ctx.step("copy", lambda: n)
        return int(await ctx.step("double", lambda: half * 2))

    @workflow(registry=registry, name="boom")
    async def boom(ctx: WorkflowContext, n: int) -> int:
        await ctx.step("ok", lambda: n)

        def fail() -> int:
            raise Fatal(f"no {n}")

        return int(await ctx.step("fail", fail))

    return double, boom


async def test_ended_runs_move_to_postgres_and_still_read_the_same(
    make_archiving: MakeArchiving,
    archive_dsn: str,
    registry: Registry,
    start_worker: StartWorker,
    eventually: Eventually,
) -> None:
    store = await make_archiving(archive_dsn)
    double, boom = workflows(registry)
    await start_worker(store, [double, boom])
    client = WorkflowClient(store, registry=registry)
    handles = [await client.submit("double", {"n": n}, owner="acme") for n in range(5)]
    failing = await client.submit("boom", {"n": 7})
    assert [await h.result(timeout=20) for h in handles] == [0, 2, 4, 6, 8]
    with pytest.raises(DurableInvocationError):
        await failing.result(timeout=20)
    ids = [h.run_id for h in [*handles, failing]]

    async def archived() -> bool:
        return all([await store.archive.get_run(i) is not None for i in ids])

    async def expired() -> bool:
        return all([await store.live.get_run(i) is None for i in ids])

    await eventually(archived, timeout=10, what="every run archived")
    await eventually(expired, timeout=10, what="every run expired from Valkey")

    # Postgres holds each run with its journal.
    first = await store.archive.get_run(handles[1].run_id)
    assert first is not None and first.status is RunStatus.COMPLETED and first.result == "2"
    journal = await store.archive.load_journal(handles[1].run_id)
    assert [(e.position, e.name, e.ok, e.value) for e in journal] == [
        (0, "copy", True, "1"),
        (1, "double", True, "2"),
    ]
    # Reads fall through to the archive.
    assert await store.get_run(handles[1].run_id) == first
    assert await store.load_journal(handles[1].run_id) == journal
    assert await store.wait_run(handles[1].run_id, timeout=1) == first
    listed = await store.list_runs(workflow="double")
    assert [r.run_id for r in listed] == [h.run_id for h in reversed(handles)]
    assert [r.run_id for r in await store.list_runs(owner="acme", limit=2)] == [
        handles[4].run_id,
        handles[3].run_id,
    ]
    failed = await store.list_runs(status=RunStatus.FAILED)
    assert [r.run_id for r in failed] == [failing.run_id]
    assert await store.list_runs(status=RunStatus.QUEUED) == []
    # The client reads results (and errors) of archived runs, in another process too.
    other = WorkflowClient(store, registry=registry)
    assert await other.handle("double", handles[3].run_id).result(timeout=1) == 6
    with pytest.raises(DurableInvocationError, match="no 7"):
        await other.handle("boom", failing.run_id).result(timeout=1)
    # Archived runs are read-only; deleting forgets them.
    with pytest.raises(InvalidRunState, match="archived runs are read-only"):
        await store.retry_run(failing.run_id)
    with pytest.raises(InvalidRunState, match="read-only"):
        await store.cancel_run(handles[0].run_id)
    with pytest.raises(RunNotFound):
        await store.retry_run("no-such-run")
    assert await store.delete_run(handles[0].run_id) is True
    assert await store.get_run(handles[0].run_id) is None
    with pytest.raises(RunNotFound):
        await store.wait_run(handles[0].run_id, timeout=1)


async def test_a_run_retried_before_it_expired_is_archived_again(
    make_archiving: MakeArchiving,
    archive_dsn: str,
    registry: Registry,
    start_worker: StartWorker,
    eventually: Eventually,
) -> None:
    attempts: list[int] = []

    @workflow(registry=registry, name="flaky")
    async def flaky(ctx: WorkflowContext) -> str:
        def once() -> str:
            attempts.append(1)
            if len(attempts) == 1:
                raise Fatal("first time")
            return "fine"

        return str(await ctx.step("once", once))

    store = await make_archiving(archive_dsn, live_ttl_after_archive=60)
    await start_worker(store, [flaky])
    client = WorkflowClient(store, registry=registry)
    handle = await client.submit("flaky", {})
    with pytest.raises(DurableInvocationError):
        await handle.result(timeout=20)

    async def archived_as(status: RunStatus) -> bool:
        run = await store.archive.get_run(handle.run_id)
        return run is not None and run.status is status

    await eventually(lambda: archived_as(RunStatus.FAILED), timeout=10, what="failure archived")
    await handle.retry()
    assert await handle.result(timeout=20) == "fine"
    await eventually(lambda: archived_as(RunStatus.COMPLETED), timeout=10, what="re-archived")
    journal = await store.archive.load_journal(handle.run_id)
    assert [(e.name, e.ok, e.value) for e in journal] == [("once", True, '"fine"')]
    assert await store.live.get_run(handle.run_id) is not None  # its TTL is a minute


@pytest.mark.slow
async def test_postgres_down_keeps_runs_live_until_it_is_back(
    make_archiving: MakeArchiving,
    registry: Registry,
    start_worker: StartWorker,
    eventually: Eventually,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Any,
) -> None:
    postgres = PostgresProcess(tmp_path / "pg")
    base = postgres.start()
    try:
        _, dsn = fresh_schema(base)
        migrate(dsn)
        postgres.stop()  # the archive is down before the worker starts
        caplog.set_level(logging.WARNING, logger="pyrula")
        store = await make_archiving(dsn)  # opens: the outage is logged, not raised
        double, _ = workflows(registry)
        await start_worker(store, [double])
        client = WorkflowClient(store, registry=registry)
        handles = [await client.submit("double", {"n": n}) for n in range(4)]
        assert [await h.result(timeout=20) for h in handles] == [0, 2, 4, 6]
        await eventually(
            lambda: "archival failed" in caplog.text, timeout=10, what="the failure logged"
        )
        await asyncio.sleep(1.0)  # well past live_ttl_after_archive
        for n, h in enumerate(handles):  # nothing left Valkey, every read still works
            assert await store.live.get_run(h.run_id) is not None
            assert await h.result(timeout=1) == n * 2
            assert len(await store.load_journal(h.run_id)) == 2
        with pytest.raises(StoreUnavailable, match="unavailable"):
            await store.get_run("not-in-valkey")  # a miss needs the archive

        postgres.start()  # back: the loop's backoff is at most a few seconds here

        async def expired() -> bool:
            return all([await store.live.get_run(h.run_id) is None for h in handles])

        await eventually(expired, timeout=30, what="runs archived and expired")
        for n, h in enumerate(handles):
            assert await h.result(timeout=1) == n * 2
            assert [e.name for e in await store.load_journal(h.run_id)] == ["copy", "double"]
    finally:
        postgres.remove()


async def test_pooled_connections_from_before_a_postgres_restart_are_not_used(
    tmp_path: Any,
) -> None:
    """The server's goodbye on every idle pooled connection is noticed at checkout: the
    first reads after a restart succeed instead of each failing once."""
    postgres = PostgresProcess(tmp_path / "pg")
    base = postgres.start()
    try:
        _, dsn = fresh_schema(base)
        migrate(dsn)
        archive = PostgresArchive(dsn, pool_size=3)

        async def read_at_once() -> None:  # three connections busy at once: three pooled
            reads = await asyncio.gather(*(archive.get_run(f"x{i}") for i in range(3)))
            assert reads == [None] * 3

        await read_at_once()
        postgres.stop()
        postgres.start()  # the same DSN
        await read_at_once()  # no StoreUnavailable from the old connections
        assert await archive.get_run("y") is None
        await archive.close()
    finally:
        postgres.remove()
