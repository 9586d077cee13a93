"""purge_runs on a sharded ValkeyStore (the conformance suite uses one shard): each call
splits its limit over the shards, the shards given one more take turns, and the runs'
idempotency keys (on other shards, on a cluster on other nodes) are released with them,
so a key may be used again and never brings a purged run back."""

from __future__ import annotations

import valkey

from pyrula.workflows.records import Outcome, RunStatus
from tests.stores.conftest import FakeClock
from tests.stores.helpers import new_run

from .conftest import MakeStore


def leftover_keys(client: valkey.Valkey, namespace: str, family: str) -> list[bytes]:
    """Keys of ``namespace`` whose name has ``family`` after its shard's tag."""
    return [key for key in client.scan_iter(match=f"{namespace}:*}}:{family}*", count=1000)]


async def test_purges_spread_over_the_shards_and_free_the_keys(
    make_store: MakeStore, topology: str, clock: FakeClock
) -> None:
    store = await make_store(topology, shard_count=8, clock=clock)
    runs = []
    for i in range(40):
        run, created = await store.create_run(
            new_run(params=f'{{"i":{i}}}', idempotency_key=f"k{i}")
        )
        assert created
        runs.append(run.run_id)
        await store.cancel_run(run.run_id)
    keep = await store.create_run(new_run(idempotency_key="live"))  # queued: stays
    clock.advance(60)
    cutoff = await store.now()

    first = await store.purge_runs(cutoff, 10)
    assert 0 < first <= 10
    total, calls = first, 1
    while (batch := await store.purge_runs(cutoff, 10)) > 0:
        assert batch <= 10
        total, calls = total + batch, calls + 1
    assert total == 40 and calls >= 4
    assert [r.run_id for r in await store.list_runs()] == [keep[0].run_id]
    assert all([await store.get_run(run_id) is None for run_id in runs])

    # Every key went with its run: reused with other params, it makes a new run.
    again, created = await store.create_run(new_run(params='{"i":"new"}', idempotency_key="k7"))
    assert created and again.run_id != runs[7] and again.status is RunStatus.QUEUED
    repeat, created = await store.create_run(new_run(idempotency_key="live"))
    assert not created and repeat.run_id == keep[0].run_id


async def test_the_index_of_ended_runs_is_emptied_by_purges_and_deletes(
    make_store: MakeStore, clock: FakeClock, valkey_server: object
) -> None:
    store = await make_store("single", shard_count=4, clock=clock)
    namespace = store.namespace
    ids = []
    for _ in range(6):
        run, _ = await store.create_run(new_run())
        ids.append(run.run_id)
    for run_id in ids[:3]:
        await store.cancel_run(run_id)
    leases = await store.claim_runs("w1", ["wf"], 3, 30.0)
    for lease in leases:
        await store.finish_run(lease.run_id, lease.token, Outcome(RunStatus.COMPLETED, '"ok"'))
    client = valkey.Valkey(port=int(store.url.rsplit(":", 1)[1]))
    try:
        index = leftover_keys(client, namespace, "e")
        assert sum(client.zcard(key) for key in index) == 6
        assert await store.delete_run(ids[0]) is True
        clock.advance(5)
        assert await store.purge_runs(await store.now(), 100) == 5
        assert leftover_keys(client, namespace, "e") == []
        assert leftover_keys(client, namespace, "r:") == []
        assert leftover_keys(client, namespace, "j:") == []
    finally:
        client.close()


async def test_runs_that_ended_without_the_index_are_found(
    make_store: MakeStore, clock: FakeClock, valkey_server: object
) -> None:
    """A run that ended under a build with no ended index (before an upgrade, or on an
    old-build worker during a rolling deploy) is not in it: the purge's backfill walks the
    listing index, a hundred runs a call, and finds it."""
    store = await make_store("single", shard_count=1, clock=clock)
    ids = []
    for _ in range(250):
        run, _ = await store.create_run(new_run())
        ids.append(run.run_id)
        await store.cancel_run(run.run_id)
    live, _ = await store.create_run(new_run())
    client = valkey.Valkey(port=int(store.url.rsplit(":", 1)[1]))
    try:
        [index] = leftover_keys(client, store.namespace, "e")
        assert client.zcard(index) == 250
        client.delete(index)  # as an old build would have left them
        clock.advance(60)
        cutoff = await store.now()
        purged = [await store.purge_runs(cutoff, 1000) for _ in range(4)]
        assert purged == [100, 100, 50, 0]  # the backfill's steps
        assert [r.run_id for r in await store.list_runs()] == [live.run_id]
        # The walk went round: a run ended without the index later is found again.
        late, _ = await store.create_run(new_run())
        await store.cancel_run(late.run_id)
        client.zrem(index, late.run_id)
        clock.advance(60)
        cutoff = await store.now()
        assert sum([await store.purge_runs(cutoff, 1000) for _ in range(3)]) == 1
        assert leftover_keys(client, store.namespace, "e") == []
    finally:
        client.close()


async def test_an_entry_older_than_the_run_s_end_is_moved_not_purged(
    make_store: MakeStore, clock: FakeClock, valkey_server: object
) -> None:
    """A run retried and ended again by a build that kept its old index entry: the purge
    goes by the run's own end, and moves the entry there."""
    store = await make_store("single", shard_count=1, clock=clock)
    run, _ = await store.create_run(new_run())
    await store.cancel_run(run.run_id)  # indexed at START
    ended = (await store.get_run(run.run_id)).finished_at  # type: ignore[union-attr]
    client = valkey.Valkey(port=int(store.url.rsplit(":", 1)[1]))
    try:
        [key] = [k for k in leftover_keys(client, store.namespace, "r:")]
        client.hset(key, "fa", repr(ended + 100))  # as the old build's second end left it
        clock.advance(50)
        assert await store.purge_runs(await store.now(), 10) == 0
        assert await store.get_run(run.run_id) is not None
        [index] = leftover_keys(client, store.namespace, "e")
        assert client.zscore(index, run.run_id) == ended + 100
        clock.advance(100)
        assert await store.purge_runs(await store.now(), 10) == 1
    finally:
        client.close()
