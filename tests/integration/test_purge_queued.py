"""``purge_queued`` (what ``pyrula purge`` and ``pyrula worker --purge`` do) on real
stores: every run of the given workflows that waits to start, due or delayed, is
cancelled a page at a time; running, sleeping and ended runs, other workflows' runs and
runs submitted after the purge began are left as they are."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pyrula.workflows import MemoryStore, RunStatus, SqliteStore, Store, ValkeyStore
from pyrula.workflows.purging import purge_queued
from pyrula.workflows.records import NewRun, Outcome, RunRecord, Wait
from tests.valkey.servers import fresh_namespace, valkey_server  # noqa: F401

KINDS = ["memory", "sqlite", "valkey"]


@pytest.fixture(params=KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    kind: str = request.param
    built: Store
    if kind == "memory":
        built = MemoryStore()
    elif kind == "sqlite":
        built = SqliteStore(tmp_path / "purge.db")
    else:
        url = request.getfixturevalue("valkey_server").url
        built = ValkeyStore(url, namespace=fresh_namespace(), shard_count=4)
    await built.open()
    try:
        yield built
    finally:
        await built.close()


async def queue(store: Store, workflow: str, count: int, delay: float = 0.0) -> list[str]:
    ids = []
    for _ in range(count):
        new = NewRun(uuid.uuid4().hex, workflow, "{}", delay=delay)
        run, created = await store.create_run(new)
        assert created
        ids.append(run.run_id)
    return ids


async def statuses(store: Store, ids: list[str]) -> list[RunStatus]:
    records = [await store.get_run(run_id) for run_id in ids]
    return [record.status for record in records if record is not None]


async def test_queued_and_delayed_runs_go_running_sleeping_and_ended_ones_stay(
    store: Store,
) -> None:
    due = await queue(store, "mail", 7)
    delayed = await queue(store, "mail", 5, delay=3600)
    other = await queue(store, "report", 2)
    # Two running, one sleeping (a retry's wait), one completed run of "mail", and one
    # queued again after it started (handed back by its worker): under way, left too.
    held = await queue(store, "mail", 5)
    leases = await store.claim_runs("w1", ["mail"], 5, 600.0)
    assert len(leases) == 5 and {lease.run_id for lease in leases} <= set(due + held)
    by_id = {lease.run_id: lease for lease in leases}
    sleeping, finished, requeued, *running = list(by_id)
    assert await store.suspend_run(sleeping, by_id[sleeping].token, Wait(wake_at=9e9))
    done = Outcome(RunStatus.COMPLETED, result="null")
    await store.finish_run(finished, by_id[finished].token, done)
    await store.release_run(requeued, by_id[requeued].token)
    waiting = [run_id for run_id in due + held if run_id not in by_id]

    purged = await purge_queued(store, ["mail", "mail"], page_size=3)

    assert purged == len(waiting) + len(delayed) == 12
    assert await statuses(store, waiting + delayed) == [RunStatus.CANCELLED] * 12
    assert await statuses(store, running) == [RunStatus.RUNNING] * 2
    for run_id in running:  # not even asked to stop
        record = await store.get_run(run_id)
        assert record is not None and not record.cancel_requested
    assert await statuses(store, [sleeping, finished, requeued]) == [
        RunStatus.SLEEPING,
        RunStatus.COMPLETED,
        RunStatus.QUEUED,
    ]
    assert await statuses(store, other) == [RunStatus.QUEUED] * 2
    assert await purge_queued(store, ["mail"], page_size=3) == 0  # nothing left


async def test_several_workflows_each_paged(store: Store) -> None:
    first = await queue(store, "a", 5)
    second = await queue(store, "b", 4, delay=60)
    assert await purge_queued(store, ["a", "b", "absent"], page_size=2) == 9
    assert await statuses(store, first + second) == [RunStatus.CANCELLED] * 9
    assert await store.list_runs(status=RunStatus.QUEUED) == []


async def test_page_size_must_be_positive(store: Store) -> None:
    with pytest.raises(ValueError, match="page_size"):
        await purge_queued(store, ["a"], page_size=0)


class ProducingStore(SqliteStore):
    """A real SQLite store with a producer that sends two more runs just before each of
    the purge's first reads, as a client sending during a purge would."""

    reads = 0

    async def list_runs(self, **filters: object) -> list[RunRecord]:  # type: ignore[override]
        self.reads += 1
        if self.reads <= 2:
            await queue(self, "mail", 2)
        return await super().list_runs(**filters)  # type: ignore[arg-type]


async def test_runs_sent_after_the_purge_began_are_left(tmp_path: Path) -> None:
    store = ProducingStore(tmp_path / "produced.db")
    await store.open()
    try:
        before = await queue(store, "mail", 5)
        purged = await purge_queued(store, ["mail"], page_size=2)
        assert purged == 5
        assert await statuses(store, before) == [RunStatus.CANCELLED] * 5
        after = await store.list_runs(workflow="mail", status=RunStatus.QUEUED)
        assert len(after) == 4  # the producer's, sent while the purge ran
    finally:
        await store.close()


@pytest.mark.slow
async def test_a_valkey_backlog_past_the_queue_read_limit(
    valkey_server: object,  # noqa: F811
) -> None:
    """Over ``QUEUE_READ_MAX`` queued runs, ValkeyStore lists queued runs from its
    history walk rather than its queues: the purge pages through it all the same."""
    from pyrula.workflows.stores.valkey.runs import QUEUE_READ_MAX

    store = ValkeyStore(valkey_server.url, namespace=fresh_namespace())  # type: ignore[attr-defined]
    await store.open()
    try:
        count = QUEUE_READ_MAX + 300
        new = [NewRun(uuid.uuid4().hex, "bulk", "{}", delay=i % 2 * 3600) for i in range(count)]
        for start in range(0, count, 200):
            for run in new[start : start + 200]:
                await store.create_run(run)
        assert await purge_queued(store, ["bulk"], page_size=1000) == count
        assert await store.list_runs(workflow="bulk", status=RunStatus.QUEUED) == []
    finally:
        await store.close()
