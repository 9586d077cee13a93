"""A store shared by threads, event loops and forked processes; closing it."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading

from pyrula.workflows.records import NewRun, RunStatus
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.stores.helpers import COMPLETED, TTL, create

from .conftest import MakeStore


def _use_after_fork(store: ValkeyStore, run_id: str, results: object) -> None:
    async def main() -> str:
        run = await store.get_run(run_id)
        assert run is not None
        created, _ = await store.create_run(NewRun("from-child", "wf", "{}"))
        return created.run_id

    results.put(asyncio.run(main()))  # type: ignore[attr-defined]


async def test_a_forked_child_gets_its_own_connections(make_store: MakeStore) -> None:
    store = await make_store("single", shard_count=4)
    run_id = await create(store)  # the parent's connections exist now
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_use_after_fork, args=(store, run_id, results), daemon=True)
    child.start()
    try:
        assert await asyncio.to_thread(results.get, True, 30) == "from-child"
        await asyncio.to_thread(child.join, 30)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join(5)
    # The parent's own connections were not disturbed.
    assert await store.get_run("from-child") is not None
    assert (await store.get_run(run_id)).status is RunStatus.QUEUED  # type: ignore[union-attr]


async def test_many_short_lived_loops(make_store: MakeStore) -> None:
    """Each ``asyncio.run`` (the blocking schedule API does that) gets a client of its
    own; the clients of loops that are gone are dropped, not reused."""
    store = await make_store("single", shard_count=4)

    def body() -> None:
        for _ in range(5):
            asyncio.run(create(store))

    thread = threading.Thread(target=body)
    thread.start()
    await asyncio.to_thread(thread.join, 30)
    assert len(await store.list_runs()) == 5
    assert len(store._server._clients) <= 2  # this loop's and the last one's at most


async def test_close_wakes_a_waiter_on_another_loop(make_store: MakeStore, topology: str) -> None:
    store = await make_store(topology, shard_count=4)
    run_id = await create(store)
    got: list[RunStatus] = []

    def wait_elsewhere() -> None:
        got.append(asyncio.run(store.wait_run(run_id, timeout=None)).status)

    thread = threading.Thread(target=wait_elsewhere)
    thread.start()
    await asyncio.sleep(1.0)  # time for the thread's loop to reach the wait, on a busy box too
    assert thread.is_alive()
    await store.close()
    await asyncio.to_thread(thread.join, 10)
    assert got == [RunStatus.QUEUED]


async def test_a_waiter_in_another_store_is_woken(make_store: MakeStore, topology: str) -> None:
    a = await make_store(topology, shard_count=4)
    b = await make_store(topology, namespace=a.namespace, shard_count=4)
    run_id = await create(a)
    waiter = asyncio.create_task(b.wait_run(run_id, timeout=30))
    work = asyncio.create_task(b.wait_for_work(["later"], timeout=30))
    await asyncio.sleep(0.2)
    assert not waiter.done() and not work.done()
    [lease] = await a.claim_runs("w", ["wf"], 1, TTL)
    await a.finish_run(run_id, lease.token, COMPLETED)
    await create(a, "later")
    assert (await asyncio.wait_for(waiter, 5)).status is RunStatus.COMPLETED
    await asyncio.wait_for(work, 5)


async def test_delete_run_across_shards(make_store: MakeStore, topology: str) -> None:
    store = await make_store(topology, shard_count=8)
    await create(store, run_id="parent")
    child, _ = await store.create_run(
        NewRun("zz-child", "wf", "{}", parent_run_id="parent", idempotency_key="ck")
    )
    await store.send_signal(child.run_id, "poke", "1")
    await store.cancel_run("parent")  # the tree, across shards
    assert (await store.get_run("zz-child")).status is RunStatus.CANCELLED  # type: ignore[union-attr]
    assert await store.delete_run("zz-child")
    assert not await store.delete_run("zz-child")
    assert await store.get_run("zz-child") is None
    again, created = await store.create_run(NewRun("zz-2", "wf", "{}", idempotency_key="ck"))
    assert created and again.run_id == "zz-2"  # the key was freed with the run
