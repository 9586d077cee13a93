"""ended_runs on a sharded ValkeyStore (the conformance suite uses one shard): the shards'
ended indexes merge into one (finished_at, run_id) order, pages cross shards without
skipping or repeating a run, also among many runs that ended at one instant (on one
shard: a tree cancelled at once; across shards: a fake clock), and entries that no longer
say when a run ended are passed over."""

from __future__ import annotations

import asyncio

import valkey

from pyrula.workflows.records import RunRecord
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.stores.conftest import START, FakeClock
from tests.stores.helpers import COMPLETED, new_run
from tests.stores.test_ended_runs import order, page_all

from .conftest import MakeStore
from .servers import ValkeyProcess, fresh_namespace

LIMITS = (1, 3, 7, 16, 40, 500)


async def cancelled_at(store: ValkeyStore, clock: FakeClock, at: float, count: int) -> list[str]:
    clock.set(at)
    ids = []
    for _ in range(count):
        run, _ = await store.create_run(new_run())
        await store.cancel_run(run.run_id)
        ids.append(run.run_id)
    return ids


def expected(store: ValkeyStore, runs: list[RunRecord | None]) -> list[tuple[float, str]]:
    assert all(run is not None for run in runs)
    return sorted((run.finished_at, run.run_id) for run in runs if run and run.finished_at)


async def test_pages_cross_the_shards_in_end_order(
    make_store: MakeStore, topology: str, clock: FakeClock
) -> None:
    await check_pages(await make_store(topology, shard_count=8, clock=clock), clock)


async def test_pages_over_resp3(clock: FakeClock, valkey_server: ValkeyProcess) -> None:
    """RESP3 replies take valkey-py's parser and callbacks: scores as doubles, pairs."""
    url = f"{valkey_server.url}?protocol=3"
    store = ValkeyStore(url, namespace=fresh_namespace(), shard_count=8, clock=clock)
    await store.open()
    try:
        await check_pages(store, clock)
    finally:
        await store.close()


async def check_pages(store: ValkeyStore, clock: FakeClock) -> None:
    ids = await cancelled_at(store, clock, START + 1, 30)  # one instant, every shard
    for i in range(12):  # one each
        ids += await cancelled_at(store, clock, START + 2 + i / 7, 1)
    ids += await cancelled_at(store, clock, START + 9, 9)
    assert len({store._keys.shard_of(run_id) for run_id in ids}) == 8
    await store.create_run(new_run())  # queued: not listed
    want = expected(store, [await store.get_run(run_id) for run_id in ids])
    assert len(want) == 51
    for limit in LIMITS:
        assert order(await page_all(store, limit)) == want, limit
    # From any cursor on: exactly what follows it.
    for i in (0, 5, 29, 30, 41, 50):
        assert order(await page_all(store, 4, want[i])) == want[i + 1 :], i
    # A cursor between two ids of one instant, whose run is on no shard.
    between = (want[10][0], want[10][1] + "0")
    assert order(await page_all(store, 6, between)) == want[11:]


async def test_a_tree_cancelled_at_once_pages_by_run_id(
    make_store: MakeStore, topology: str, clock: FakeClock
) -> None:
    """A parent and its children share a shard and, cancelled together, an instant."""
    store = await make_store(topology, shard_count=8, clock=clock)
    others = await cancelled_at(store, clock, START + 1, 10)
    parent, _ = await store.create_run(new_run("parent"))
    kids = [
        (
            await store.create_run(
                new_run(run_id=f"{parent.run_id}.{i}", parent_run_id=parent.run_id)
            )
        )[0]
        for i in range(40)
    ]
    await store.cancel_run(parent.run_id)  # the tree ends at START + 1 too
    tree = [parent.run_id, *(kid.run_id for kid in kids)]
    assert {store._keys.shard_of(run_id) for run_id in tree} == {
        store._keys.shard_of(parent.run_id)
    }
    want = expected(store, [await store.get_run(run_id) for run_id in [*others, *tree]])
    assert {at for at, _ in want} == {START + 1}
    for limit in LIMITS:
        assert order(await page_all(store, limit)) == want, limit
    # The cursor's run deleted between two pages: the next page still starts after it.
    page = await store.ended_runs(None, 20)
    assert await store.delete_run(page[-1].run_id) is True
    assert order(await page_all(store, 5, order(page)[-1])) == want[20:]


async def test_entries_that_no_longer_say_when_a_run_ended_are_passed_over(
    make_store: MakeStore, clock: FakeClock, valkey_server: object
) -> None:
    """A purge moves a child it keeps (its parent is still there) to the purge's time; a
    build without the index may leave one of a retried run. Neither is listed there, and
    the runs around them are."""
    store = await make_store("single", shard_count=4, clock=clock)
    clock.set(START)
    parent, _ = await store.create_run(new_run("parent"))
    lease = (await store.claim_runs("w1", ["parent"], 1, 30.0))[0]
    child, _ = await store.create_run(
        new_run("kid", run_id=f"{parent.run_id}.0", parent_run_id=parent.run_id)
    )
    await store.cancel_run(child.run_id)
    before = await cancelled_at(store, clock, START + 1, 5)
    after = await cancelled_at(store, clock, START + 20, 5)
    retried = (await cancelled_at(store, clock, START + 21, 1))[0]
    client = valkey.Valkey(port=int(store.url.rsplit(":", 1)[1]))
    try:
        clock.set(START + 10)
        assert await store.purge_runs(START + 5, 100) == 5  # the child is kept, moved
        key = store._keys.ended(store._keys.shard_of(child.run_id))
        assert client.zscore(key, child.run_id) == START + 10
        await store.retry_run(retried)
        stale = store._keys.ended(store._keys.shard_of(retried))
        client.zadd(stale, {retried: START + 21})  # as an older build would leave it
        client.zadd(stale, {"gone": START + 20})  # a run whose record is gone
    finally:
        client.close()
    runs = await page_all(store, 2)
    assert [run.run_id for run in runs] == [r for _, r in sorted((START + 20, r) for r in after)]
    assert before  # purged, as the parent's child was kept
    # The parent ends: the child is listed no more than before, and purged in its turn.
    await store.finish_run(parent.run_id, lease.token, COMPLETED)
    assert parent.run_id in [run.run_id for run in await page_all(store, 3)]


async def test_paging_while_the_runs_behind_the_cursor_go(
    make_store: MakeStore, topology: str, clock: FakeClock
) -> None:
    """Deletes of the runs already listed race the next pages (their ranks shift under
    the reads): every run ahead of the cursor is still listed once, in order."""
    store = await make_store(topology, shard_count=2, clock=clock)
    ids = await cancelled_at(store, clock, START + 1, 120)
    want = sorted((START + 1, run_id) for run_id in ids)
    seen: list[tuple[float, str]] = []
    after: tuple[float, str] | None = None
    deleting: list[asyncio.Task[bool]] = []
    while page := await store.ended_runs(after, 7):
        seen += order(page)
        after = seen[-1]
        deleting += [asyncio.create_task(store.delete_run(run.run_id)) for run in page]
    assert all(await asyncio.gather(*deleting))
    assert seen == want
