"""A run id an archived run holds stays taken on an ArchivingStore(Valkey, Postgres).

Once a run was archived and expired from Valkey, ``create_run`` with its id raises
InvalidRunState, as the hot store does for a run it holds; with the archived run's own
idempotency key (the Celery drop-in's ``task_id``) it returns the archived run. The
archiver never overwrites an archived run with another run of the same id.
Real Valkey and Postgres; the live store runs on a fake clock, archival is forced.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from pyrula.workflows import (
    ArchivingStore,
    IdempotencyConflict,
    InvalidRunState,
    PostgresArchive,
)
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.archive.archiving_helpers import (
    SKEW,
    CountingArchive,
    counting,
    ended_and_archived,
)
from tests.stores.conftest import FakeClock
from tests.stores.helpers import COMPLETED, new_run
from tests.valkey.servers import ValkeyProcess, fresh_namespace


async def test_an_archived_run_id_is_taken(store: ArchivingStore, clock: FakeClock) -> None:
    first = await ended_and_archived(store, clock, new_run(run_id="fixed-id"))
    clock.advance(5)
    with pytest.raises(InvalidRunState, match="a run with id 'fixed-id' already exists"):
        await store.create_run(new_run(params='{"n":50}', run_id="fixed-id"))
    # Nothing was created, and the archived run is as it was.
    assert await store.live.get_run("fixed-id") is None
    assert await store.get_run("fixed-id") == first
    # Another key does not make it free either.
    with pytest.raises(InvalidRunState, match="already exists"):
        await store.create_run(new_run(run_id="fixed-id", idempotency_key="other"))
    assert await store.live.get_run("fixed-id") is None


async def test_the_archived_runs_own_key_returns_it(
    store: ArchivingStore, clock: FakeClock
) -> None:
    # The Celery drop-in's task_id is the run id and the key: a repeat finds the first run.
    new = new_run(run_id="task-1", idempotency_key="task-1")
    first = await ended_and_archived(store, clock, new)
    clock.advance(5)
    run, created = await store.create_run(new)
    assert (run, created) == (first, False)
    assert await store.live.get_run("task-1") is None
    # The same key with other params is a conflict, as in the hot store.
    with pytest.raises(IdempotencyConflict, match="task-1"):
        await store.create_run(replace(new, params='{"x":2}'))
    assert await store.live.get_run("task-1") is None


async def test_an_id_freed_by_retention_or_delete_can_be_used_again(
    store: ArchivingStore, clock: FakeClock
) -> None:
    await ended_and_archived(store, clock, new_run(run_id="gone"))
    assert await store.delete_run("gone")
    run, created = await store.create_run(new_run(params='{"n":2}', run_id="gone"))
    assert created and run.params == '{"n":2}'

    await ended_and_archived(store, clock, new_run("other", run_id="old"))
    assert await store.purge_runs(await store.now(), 10) >= 1
    assert await store.get_run("old") is None
    _, created = await store.create_run(new_run("other", run_id="old"))
    assert created


async def test_a_generated_id_is_not_looked_up(store: ArchivingStore) -> None:
    archive = counting(store)
    before = archive.lookups
    _, created = await store.create_run(replace(new_run(), generated_id=True))
    assert created and archive.lookups == before
    # A chosen id is looked up once, and only once on the usual path.
    _, created = await store.create_run(new_run(run_id="chosen"))
    assert created and archive.lookups == before + 1


async def test_an_archival_racing_the_create_is_caught(
    valkey_server: ValkeyProcess, archive_dsn: str, clock: FakeClock
) -> None:
    # live_ttl_after_archive 0: a run may leave Valkey right after it was archived, so a
    # lookup that missed is checked again after the create, which is undone if the id
    # turned out to be archived meanwhile.
    live = ValkeyStore(valkey_server.url, namespace=fresh_namespace(), shard_count=2, clock=clock)
    store = ArchivingStore(live, CountingArchive(archive_dsn), 0.0, clock_skew=0.0)
    await store.open()
    try:
        new = new_run(run_id="raced", idempotency_key="raced")
        await store.create_run(new)
        (lease,) = await store.claim_runs("w1", ["wf"], 1, 30.0)
        await store.finish_run("raced", lease.token, COMPLETED)
        clock.advance(1)
        assert await store.archive_ended() == 1
        clock.advance(1)
        assert await store.expire_archived() == 1
        archived = await store.archive.get_run("raced")
        assert archived is not None
        counting(store).misses = 1  # the first lookup misses: as if archived just after it
        with pytest.raises(InvalidRunState, match="already exists"):
            await store.create_run(new_run(run_id="raced"))
        assert await store.live.get_run("raced") is None
        counting(store).misses = 1
        assert await store.create_run(new) == (archived, False)
        assert await store.live.get_run("raced") is None
        assert await store.archive.get_run("raced") == archived
    finally:
        await store.close()


async def test_an_unreachable_archive_lets_creates_through(
    valkey_server: ValkeyProcess, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    live = ValkeyStore(valkey_server.url, namespace=fresh_namespace(), shard_count=2, clock=clock)
    archive = PostgresArchive("postgresql://nobody@127.0.0.1:1/none", connect_timeout=1)
    store = ArchivingStore(live, archive)
    await store.open()
    try:
        with caplog.at_level(logging.WARNING, "pyrula.workflows.stores.archive"):
            _, created = await store.create_run(new_run(run_id="while-down"))
        assert created
        assert "could not check" in caplog.text
    finally:
        await store.close()


async def test_the_archiver_never_overwrites_another_run_of_the_same_id(
    store: ArchivingStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    first = await ended_and_archived(store, clock, new_run(run_id="twice"))
    first_journal = await store.archive.load_journal("twice")
    # A second run under the same id reaches Valkey behind the ArchivingStore's back.
    clock.advance(5)
    _, created = await store.live.create_run(new_run(params='{"n":50}', run_id="twice"))
    assert created
    (lease,) = await store.live.claim_runs("w1", ["wf"], 1, 30.0)
    await store.live.finish_run("twice", lease.token, replace(COMPLETED, result="100"))
    clock.advance(SKEW + 1)
    with caplog.at_level(logging.ERROR, "pyrula.workflows.stores.archive"):
        assert await store.archive_ended() == 0
        await store.archive_ended()  # re-read within the skew window: reported once
    assert await store.archive.get_run("twice") == first
    assert await store.archive.load_journal("twice") == first_journal
    refusals = [r for r in caplog.records if "NOT archived" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelno == logging.ERROR
    assert "'twice'" in refusals[0].getMessage()
