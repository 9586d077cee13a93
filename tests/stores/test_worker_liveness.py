"""Conformance: which workers count as alive, and what inspection reads of them.

Every store keeps a worker that never deregistered (a SIGKILLed one) in
``list_workers`` with its last heartbeat; ``pyrula.workflows.inspection`` judges its
age by the store's clock, the same way on every store.
"""

from __future__ import annotations

from pyrula.workflows.inspection import (
    DEAD_WORKER_KEPT,
    STORE_NODE,
    Inspector,
    forget_dead_workers,
    live_workers,
)
from pyrula.workflows.records import DEFAULT_LOCK_TTL as STALE_AFTER
from pyrula.workflows.records import WorkerInfo
from pyrula.workflows.stores.base import Store

from .conftest import START, FakeClock
from .helpers import claim_one, create


def info(
    worker_id: str,
    hostname: str = "web-1",
    workflows: tuple[str, ...] = ("wf",),
    lock_ttl: float = STALE_AFTER,
) -> WorkerInfo:
    return WorkerInfo(
        worker_id=worker_id,
        workflows=workflows,
        hostname=hostname,
        pid=4242,
        started_at=START - 100,
        last_seen=0.0,
        running=0,
        lock_ttl=lock_ttl,
    )


async def live_ids(store: Store, stale_after: float | None = None) -> list[str]:
    return [w.worker_id for w in await live_workers(store, stale_after)]


async def test_a_worker_counts_until_its_heartbeat_is_older_than_stale_after(
    store: Store, clock: FakeClock
) -> None:
    await store.heartbeat(info("w1"))
    clock.advance(STALE_AFTER)
    assert await live_ids(store) == ["w1"]  # exactly stale_after old: still alive
    clock.advance(0.5)
    assert await live_ids(store) == []
    assert [w.worker_id for w in await store.list_workers()] == ["w1"]  # the store keeps it
    assert await live_ids(store, stale_after=STALE_AFTER + 1) == ["w1"]
    await store.heartbeat(info("w1"))
    assert await live_ids(store) == ["w1"]


async def test_each_worker_is_judged_by_its_own_lock_ttl(store: Store, clock: FakeClock) -> None:
    """A worker heartbeats every third of its lock_ttl and says which: one with a long
    lock_ttl is not dead between two heartbeats, one with a short one is soon dead."""
    await store.heartbeat(info("patient", lock_ttl=120))
    await store.heartbeat(info("eager", lock_ttl=6))
    clock.advance(45)  # past the default's 30 s, within a 120 s lock_ttl
    assert await live_ids(store) == ["patient"]
    assert await live_ids(store, stale_after=50) == ["patient", "eager"]  # given: for all
    assert (await Inspector().ping(store)).nodes == {"patient": {"ok": "pong"}}
    clock.advance(120 - 45 + 0.5)
    assert await live_ids(store) == []


async def test_only_the_stale_worker_drops_out(store: Store, clock: FakeClock) -> None:
    await store.heartbeat(info("killed"))
    clock.advance(2)
    await store.heartbeat(info("alive"))
    clock.advance(1.5)
    assert await live_ids(store, stale_after=2) == ["alive"]
    answer = await Inspector(stale_after=2).ping(store)
    assert answer.nodes == {"alive": {"ok": "pong"}}


async def test_a_worker_that_deregistered_is_gone_at_once(store: Store, clock: FakeClock) -> None:
    await store.heartbeat(info("w1"))
    await store.heartbeat(info("w2"))
    await store.remove_worker("w1")
    assert await live_ids(store) == ["w2"]


async def test_destinations_name_a_worker_id_a_hostname_or_a_celery_node(
    store: Store, clock: FakeClock
) -> None:
    await store.heartbeat(info("w1", hostname="web-1"))
    await store.heartbeat(info("w2", hostname="web-2"))

    async def pinged(destination: str | list[str] | None) -> set[str]:
        return set((await Inspector(destination).ping(store)).nodes)

    assert await pinged(None) == {"w1", "w2"}
    assert await pinged("w2") == {"w2"}
    assert await pinged("web-1") == {"w1"}
    assert await pinged("celery@web-2") == {"w2"}
    assert await pinged("celery@web-1, w2") == {"w1", "w2"}
    assert await pinged(["celery@web-1", "nobody"]) == {"w1"}
    assert await pinged("celery@w1") == set()  # the part after @ is a hostname
    assert await pinged("celery@nowhere") == set()
    assert await pinged("") == await pinged([]) == {"w1", "w2"}  # no destination
    assert await pinged([""]) == await pinged("celery@") == set()  # an unset $HOSTNAME


async def test_active_and_query_task_show_runs_of_live_workers(
    store: Store, clock: FakeClock
) -> None:
    run_id = await create(store, "wf", params='{"x": 1}')
    lease = await claim_one(store, "wf", worker="w1")
    later = await create(store, "wf", delay=600)
    await store.heartbeat(info("w1"))
    await store.heartbeat(info("w2", hostname="web-2"))
    inspector = Inspector()
    active = (await inspector.active(store)).nodes
    assert [r["id"] for r in active["w1"]] == [lease.run_id] == [run_id] and active["w2"] == []
    [request] = active["w1"]
    assert request["kwargs"] == {"x": 1} and request["hostname"] == "w1"
    found = await inspector.query_task(store, [run_id, later, "unknown"])
    assert found.nodes["w1"][run_id][0] == "active" and found.nodes["w2"] == {}
    assert found.store == {later: ["scheduled", found.store[later][1]]}
    scheduled = (await inspector.scheduled(store)).replies()
    assert [e["request"]["id"] for e in scheduled[STORE_NODE]] == [later]
    assert STORE_NODE not in (await Inspector("w2").scheduled(store)).replies()
    clock.advance(STALE_AFTER + 1)
    await store.heartbeat(info("w2", hostname="web-2"))
    assert (await inspector.active(store)).nodes == {"w2": []}  # w1 is stale: not shown


async def test_workers_killed_over_a_day_ago_are_forgotten(store: Store, clock: FakeClock) -> None:
    await store.heartbeat(info("killed"))
    clock.advance(DEAD_WORKER_KEPT)
    await store.heartbeat(info("alive"))
    assert await forget_dead_workers(store) == []  # exactly a day: kept
    clock.advance(1)
    assert await forget_dead_workers(store) == ["killed"]
    assert [w.worker_id for w in await store.list_workers()] == ["alive"]
    await store.heartbeat(info("killed"))  # a worker that was only paused comes back
    assert {w.worker_id for w in await store.list_workers()} == {"alive", "killed"}
