"""PostgresArchive on a real Postgres: the schema and its version rule, idempotent writes,
reads, the cursor and purges; ArchivingStore.open() and a worker refusing a bad schema."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from pyrula.workflows import (
    ArchiveSchemaMismatch,
    ArchivingStore,
    MemoryStore,
    PostgresArchive,
    RunStatus,
    StoreUnavailable,
    WorkflowWorker,
)
from pyrula.workflows.records import FlowControl, JournalEntry, RunRecord
from pyrula.workflows.stores.archive import ArchiveCursor
from pyrula.workflows.stores.archive.base import ArchivedStamp
from pyrula.workflows.stores.archive.postgres.sql import pyrula_version

T0 = 1_700_000_000.25


def ended(run_id: str, finished_at: float = T0 + 10, **fields: object) -> RunRecord:
    """A completed run with every optional field set (so the round trip checks them)."""
    run = RunRecord(
        run_id=run_id,
        workflow="wf",
        params='{"big": 123456789012345678901234567890, "s": "h\\u00e9 \\u0000"}',
        status=RunStatus.COMPLETED,
        owner="acme",
        idempotency_key=f"key-{run_id}",
        created_at=T0,
        available_at=T0 + 0.5,
        updated_at=finished_at,
        started_at=T0 + 1,
        finished_at=finished_at,
        result='{"ok": [ ]}',
        error=None,
        worker_id="w-1",
        lease_token=2**40,
        lease_expires_at=T0 + 30,
        cancel_requested=True,
        recoveries=1,
        claims=2,
        parent_run_id=None,
        wake_at=T0 + 5,
        wait_signal="go",
        wait_child="kid",
        flow=FlowControl(rate_key="r", rate_per_second=2.5, rate_burst=3.0, owner_concurrency=4),
        expires_at=T0 + 99,
        progress_state="half",
        progress_info='{"p": 0.5}',
        failed_position=7,
    )
    return replace(run, **fields)  # type: ignore[arg-type]


def journal(run_id: str, *values: str) -> list[JournalEntry]:
    return [
        JournalEntry(run_id, i, "step", f"s{i}", True, v, attempts=2, token=9, recorded_at=T0 + i)
        for i, v in enumerate(values)
    ]


@pytest.fixture
async def archive(archive_dsn: str) -> AsyncIterator[PostgresArchive]:
    archive = PostgresArchive(archive_dsn)
    await archive.open()
    try:
        yield archive
    finally:
        await archive.close()


async def test_migrate_is_idempotent_and_records_the_version(empty_dsn: str) -> None:
    archive = PostgresArchive(empty_dsn)
    try:
        with pytest.raises(ArchiveSchemaMismatch, match="pyrula db migrate"):
            await archive.check()
        await asyncio.gather(archive.migrate(), archive.migrate())  # concurrent, too
        await archive.migrate()
        await archive.check()
        with psycopg.connect(empty_dsn) as conn:
            rows = conn.execute("SELECT pyrula_version FROM pyrula_schema").fetchall()
        assert rows == [(pyrula_version(),)]
    finally:
        await archive.close()


async def test_another_versions_schema_is_refused_everywhere(archive_dsn: str) -> None:
    with psycopg.connect(archive_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pyrula_schema SET pyrula_version = '0.0.1-other'")
    archive = PostgresArchive(archive_dsn)
    try:
        for attempt in (archive.open, archive.check, archive.migrate):
            with pytest.raises(ArchiveSchemaMismatch, match="There is no upgrade path") as info:
                await attempt()
            assert "0.0.1-other" in str(info.value) and "recreate the database" in str(info.value)
    finally:
        await archive.close()
    store = ArchivingStore(MemoryStore(), PostgresArchive(archive_dsn))
    with pytest.raises(ArchiveSchemaMismatch):
        await store.open()
    await store.close()


async def test_the_workers_first_run_fails_without_a_schema(empty_dsn: str) -> None:
    store = ArchivingStore(MemoryStore(), PostgresArchive(empty_dsn))
    worker = WorkflowWorker(store=store, workflows=[])
    with pytest.raises(ArchiveSchemaMismatch, match="has no pyrula schema"):
        await asyncio.wait_for(worker.run(), timeout=10)
    await store.close()


async def test_an_unreachable_archive_is_store_unavailable_with_the_password_masked(
    tmp_path: object,
) -> None:
    dsn = f"postgresql://me:s3cret@/nodb?host={tmp_path}&connect_timeout=2"
    archive = PostgresArchive(dsn)
    assert "s3cret" not in archive.url and "s3cret" not in repr(archive)
    with pytest.raises(StoreUnavailable) as info:
        await archive.check()
    assert "s3cret" not in str(info.value) and archive.url in str(info.value)
    # ArchivingStore.open() logs it and carries on: the live store works without it.
    store = ArchivingStore(MemoryStore(), archive)
    await store.open()
    await store.close()


async def test_runs_round_trip_exactly_and_writes_are_idempotent(
    archive: PostgresArchive,
) -> None:
    run = ended("r1")
    assert await archive.write_runs([(run, journal("r1", '"a"', "[ ]"))]) == 1
    assert await archive.get_run("r1") == run
    assert await archive.load_journal("r1") == journal("r1", '"a"', "[ ]")
    # The same end again, or an older one: nothing changes.
    assert await archive.write_runs([(run, journal("r1", '"other"'))]) == 0
    older = replace(run, finished_at=T0 + 5, result='"older"')
    assert await archive.write_runs([(older, [])]) == 0
    assert await archive.get_run("r1") == run
    assert len(await archive.load_journal("r1")) == 2
    # Retried and ended again: the run and its journal are replaced.
    later = replace(run, finished_at=T0 + 20, status=RunStatus.FAILED, error='{"e": 1}')
    assert await archive.write_runs([(later, journal("r1", '"b"'))]) == 1
    assert await archive.get_run("r1") == later
    assert await archive.load_journal("r1") == journal("r1", '"b"')
    assert await archive.finished_times(["r1", "nope"]) == {"r1": T0 + 20}
    # A run that has not ended is not archived.
    assert await archive.write_runs([(replace(run, run_id="r2", finished_at=None), [])]) == 0
    assert await archive.get_run("r2") is None and await archive.load_journal("r2") == []


async def test_another_run_of_the_same_id_never_replaces_the_archived_one(
    archive: PostgresArchive,
) -> None:
    run = ended("r1")
    assert await archive.write_runs([(run, journal("r1", '"a"'))]) == 1
    # Same id, created later (another run, not this one retried), ended later: refused.
    other = replace(run, created_at=T0 + 50, finished_at=T0 + 60, result='"other"')
    assert await archive.write_runs([(other, journal("r1", '"b"'))]) == 0
    assert await archive.get_run("r1") == run
    assert await archive.load_journal("r1") == journal("r1", '"a"')
    assert await archive.archived_stamps(["r1", "nope"]) == {
        "r1": ArchivedStamp(created_at=T0, finished_at=T0 + 10)
    }


async def test_list_runs_filters_newest_first(archive: PostgresArchive) -> None:
    runs = [
        ended("a", created_at=T0 + 1, workflow="x", owner="o1"),
        ended("b", created_at=T0 + 2, workflow="y", owner="o1", status=RunStatus.FAILED),
        ended("c", created_at=T0 + 3, workflow="x", owner="o2"),
    ]
    await archive.write_runs([(r, []) for r in runs])
    assert [r.run_id for r in await archive.list_runs()] == ["c", "b", "a"]
    assert [r.run_id for r in await archive.list_runs(workflow="x")] == ["c", "a"]
    assert [r.run_id for r in await archive.list_runs(owner="o1", limit=1)] == ["b"]
    assert [r.run_id for r in await archive.list_runs(status=RunStatus.FAILED)] == ["b"]
    assert await archive.list_runs(limit=0) == []
    assert await archive.delete_run("b") is True and await archive.delete_run("b") is False
    assert [r.run_id for r in await archive.list_runs()] == ["c", "a"]


async def test_purge_candidates_keep_children_of_archived_parents(
    archive: PostgresArchive,
) -> None:
    await archive.write_runs(
        [
            (ended("p", finished_at=T0 + 3), journal("p", "1")),
            (ended("p.0", finished_at=T0 + 1, parent_run_id="p"), []),
            (ended("q", finished_at=T0 + 2), []),
            (ended("late", finished_at=T0 + 50), []),
        ]
    )
    found = await archive.purge_candidates(T0 + 10, None, 10)
    assert [c.run_id for c in found] == ["q", "p"]
    assert [c.run_id for c in await archive.purge_candidates(T0 + 10, (T0 + 2, "q"), 10)] == ["p"]
    await archive.delete_run("p")  # its journal goes with it
    assert await archive.load_journal("p") == []
    assert [c.run_id for c in await archive.purge_candidates(T0 + 10, None, 1)] == ["p.0"]


async def test_the_cursor_only_moves_forward(archive: PostgresArchive) -> None:
    assert await archive.load_cursor() is None
    await archive.save_cursor(ArchiveCursor(T0 + 5, "b", T0 + 6))
    await archive.save_cursor(ArchiveCursor(T0 + 5, "a", T0 + 4))  # a slower worker's
    assert await archive.load_cursor() == ArchiveCursor(T0 + 5, "b", T0 + 6)
    await archive.save_cursor(ArchiveCursor(T0 + 7, "a", T0 + 7))
    assert await archive.load_cursor() == ArchiveCursor(T0 + 7, "a", T0 + 7)


async def test_event_loops_sharing_the_archive_keep_their_own_connections(
    archive_dsn: str,
) -> None:
    # A worker's loop and a blocking client's loop thread use one archive at once: each
    # keeps its pooled connection (neither closes the other's, nor reconnects each time).
    connects = 0

    class Counting(PostgresArchive):
        async def _connect(self) -> psycopg.AsyncConnection[Any]:
            nonlocal connects
            connects += 1
            return await super()._connect()

    archive = Counting(archive_dsn, pool_size=1)
    await archive.open()
    stop = threading.Event()
    errors: list[BaseException] = []

    async def other_loop() -> None:
        while not stop.is_set():
            try:
                assert await archive.get_run("b") is None
            except BaseException as exc:  # reported below
                errors.append(exc)
                return
            await asyncio.sleep(0)

    thread = threading.Thread(target=lambda: asyncio.run(other_loop()))
    thread.start()
    try:
        for _ in range(200):
            assert await archive.get_run("a") is None
    finally:
        stop.set()
        thread.join(10)
        await archive.close()
    assert errors == []
    assert connects == 2  # one per loop
