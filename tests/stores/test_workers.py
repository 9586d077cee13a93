"""Conformance: worker heartbeats."""

from __future__ import annotations

from dataclasses import replace

from pyrula.workflows.records import WorkerInfo
from pyrula.workflows.stores.base import Store

from .conftest import START, FakeClock


def info(worker_id: str, running: int = 0, workflows: tuple[str, ...] = ("a", "b")) -> WorkerInfo:
    return WorkerInfo(
        worker_id=worker_id,
        workflows=workflows,
        hostname="h\u00f6st",
        pid=4242,
        started_at=START - 100,
        last_seen=0.0,
        running=running,
    )


async def test_heartbeat_records_store_time(store: Store, clock: FakeClock) -> None:
    assert await store.list_workers() == []
    await store.heartbeat(replace(info("w1", running=2), lock_ttl=90.5))
    [seen] = await store.list_workers()
    assert seen == WorkerInfo(
        worker_id="w1",
        workflows=("a", "b"),
        hostname="h\u00f6st",
        pid=4242,
        started_at=START - 100,
        last_seen=START,
        running=2,
        lock_ttl=90.5,
    )


async def test_list_workers_most_recent_first(store: Store, clock: FakeClock) -> None:
    await store.heartbeat(info("w1"))
    await store.heartbeat(info("w2", workflows=()))
    clock.advance(1)
    await store.heartbeat(info("w3"))
    assert [w.worker_id for w in await store.list_workers()] == ["w3", "w1", "w2"]
    clock.advance(1)
    await store.heartbeat(info("w1", running=7, workflows=("c",)))
    workers = await store.list_workers()
    assert [w.worker_id for w in workers] == ["w1", "w3", "w2"]
    assert workers[0].running == 7 and workers[0].workflows == ("c",)
    assert workers[0].last_seen == START + 2
    assert workers[2].workflows == ()


async def test_remove_worker(store: Store) -> None:
    await store.heartbeat(info("w1"))
    await store.heartbeat(info("w2"))
    await store.remove_worker("w1")
    await store.remove_worker("never-seen")
    assert [w.worker_id for w in await store.list_workers()] == ["w2"]
