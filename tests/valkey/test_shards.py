"""Behaviour that only shows with several shards, on one node and on a cluster.

(The conformance suite runs ValkeyStore with one shard, where queue orders are exact.)
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest

from pyrula.workflows.errors import InvalidRunState, RunNotFound
from pyrula.workflows.records import JournalEntry, NewRun, RunStatus, Wait
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.stores.valkey.codec import new_run_args
from tests.stores.conftest import START, FakeClock
from tests.stores.helpers import COMPLETED, TTL, create, entry, new_run

from .conftest import MakeStore

SHARDS = 8


def ids_on_other_shards(store: ValkeyStore, run_id: str, count: int) -> list[str]:
    """``count`` run ids whose shard differs from ``run_id``'s."""
    home = store._keys.shard_of(run_id)
    found = []
    n = 0
    while len(found) < count:
        candidate = f"other{n}"
        n += 1
        if store._keys.shard_of(candidate) != home:
            found.append(candidate)
    return found


async def test_runs_spread_over_shards_and_each_is_claimed_once(
    make_store: MakeStore, topology: str
) -> None:
    store = await make_store(topology, shard_count=SHARDS)
    created = [await create(store, owner=f"o{i % 3}") for i in range(40)]
    assert len({store._keys.shard_of(run_id) for run_id in created}) > SHARDS // 2
    claimed = []
    while leases := await store.claim_runs("w1", ["wf"], 7, TTL):
        claimed += [lease.run_id for lease in leases]
    assert Counter(claimed) == Counter(created)
    listed = await store.list_runs(limit=100)
    assert [run.run_id for run in listed] == created[::-1]
    assert {run.status for run in listed} == {RunStatus.RUNNING}
    of_o1 = [run_id for i, run_id in enumerate(created) if i % 3 == 1]
    assert [r.run_id for r in await store.list_runs(owner="o1", limit=5)] == of_o1[::-1][:5]


async def test_a_child_shares_its_parents_shard(make_store: MakeStore, topology: str) -> None:
    store = await make_store(topology, shard_count=SHARDS)
    keys = store._keys
    assert all(keys.shard_of(f"parent.{n}") == keys.shard_of("parent") for n in range(50))
    assert keys.shard_of("parent.3.7") == keys.shard_of("parent")
    await create(store)
    [lease] = await store.claim_runs("w1", ["wf"], 1, TTL)
    child_id = f"{lease.run_id}.0"
    start = JournalEntry(lease.run_id, 0, "child", "kid", True, f'"{child_id}"')
    child = await store.start_child(
        lease.token, start, NewRun(child_id, "kid", "{}", parent_run_id=lease.run_id)
    )
    assert child.parent_run_id == lease.run_id and child.status is RunStatus.QUEUED
    assert await store.suspend_run(lease.run_id, lease.token, Wait(child=child_id))
    [kid] = await store.claim_runs("w1", ["kid"], 1, TTL)
    await store.finish_run(kid.run_id, kid.token, COMPLETED)
    parent = await store.get_run(lease.run_id)
    assert parent is not None and parent.status is RunStatus.QUEUED


async def test_a_child_on_another_shard(make_store: MakeStore, topology: str) -> None:
    """Child ids need not follow the engine's ``<parent>.<n>``: then the child lives on
    another shard and the store carries the links across (start, wake, cancel)."""
    store = await make_store(topology, shard_count=SHARDS)
    await create(store, run_id="p1")
    [lease] = await store.claim_runs("w1", ["wf"], 1, TTL)
    kid_id, grandkid_id = ids_on_other_shards(store, "p1", 2)
    start = JournalEntry("p1", 0, "child", "kid", True, f'"{kid_id}"')
    kid = await store.start_child(
        lease.token, start, NewRun(kid_id, "kid", "{}", parent_run_id="p1")
    )
    again = await store.start_child(
        lease.token, start, NewRun(kid_id, "kid", "{}", parent_run_id="p1")
    )
    assert again.run_id == kid.run_id == kid_id
    assert [(e.position, e.kind) for e in await store.load_journal("p1")] == [(0, "child")]
    assert await store.suspend_run("p1", lease.token, Wait(child=kid_id))
    # The child ends on its shard; its parent, waiting on another, is queued.
    [kid_lease] = await store.claim_runs("w2", ["kid"], 1, TTL)
    await store.finish_run(kid_id, kid_lease.token, COMPLETED)
    parent = await store.get_run("p1")
    assert parent is not None and parent.status is RunStatus.QUEUED
    # Waiting for a child that already ended is refused (the wait is over).
    [lease] = await store.claim_runs("w1", ["wf"], 1, TTL)
    assert not await store.suspend_run("p1", lease.token, Wait(child=kid_id))
    # Cancelling a tree crosses shards too.
    await store.create_run(NewRun(grandkid_id, "kid", "{}", parent_run_id="p1"))
    await store.cancel_run("p1")
    grandkid = await store.get_run(grandkid_id)
    assert grandkid is not None and grandkid.status is RunStatus.CANCELLED
    with pytest.raises(RunNotFound):
        await store.suspend_run("p1", lease.token, Wait(child="missing-child"))


async def test_threads_racing_one_key_across_shards(make_store: MakeStore, topology: str) -> None:
    store = await make_store(topology, shard_count=SHARDS)
    barrier = threading.Barrier(6)

    def body(i: int, out: list[tuple[str, bool]]) -> None:
        async def main() -> tuple[str, bool]:
            barrier.wait(10)
            run, created = await store.create_run(new_run(run_id=f"r{i}", idempotency_key="k"))
            return run.run_id, created

        out.append(asyncio.run(main()))

    results: list[tuple[str, bool]] = []
    threads = [threading.Thread(target=body, args=(i, results)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join, 30)
    assert len({run_id for run_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert len(await store.list_runs()) == 1


async def test_a_half_made_keyed_run_is_finished_by_the_next_caller(
    make_store: MakeStore, topology: str
) -> None:
    """A process that reserved a key and died before creating the run leaves a
    reservation holding the whole NewRun; the next caller with that key creates it."""
    store = await make_store(topology, shard_count=SHARDS)
    first = new_run(run_id="dead-creator", idempotency_key="k1", owner="acme")
    args = new_run_args(first)
    shard = store._keys.shard(store._keys.shard_of_key("k1"))
    await store._server.call("idem_reserve", shard, "k1", args[0], *args[1:4], *args[6:])
    assert await store.get_run("dead-creator") is None
    run, created = await store.create_run(new_run(run_id="second", idempotency_key="k1"))
    assert not created and run.run_id == "dead-creator" and run.owner == "acme"
    assert await store.get_run("second") is None
    # A duplicate run id under a fresh key frees the key again.
    with pytest.raises(InvalidRunState):
        await store.create_run(new_run(run_id="dead-creator", idempotency_key="k2"))
    again, created = await store.create_run(new_run(run_id="third", idempotency_key="k2"))
    assert created and again.run_id == "third"


async def test_timers_and_next_due_across_shards(
    make_store: MakeStore, topology: str, clock: FakeClock
) -> None:
    store = await make_store(topology, shard_count=SHARDS, clock=clock)
    for n in range(12):
        await create(store, run_id=f"s{n}")
    leases = await store.claim_runs("w1", ["wf"], 12, TTL)
    for n, lease in enumerate(leases):
        assert await store.suspend_run(lease.run_id, lease.token, Wait(wake_at=START + 10 + n))
    await create(store, "wf", delay=30)
    assert await store.next_due_at(["wf"]) == START + 10
    clock.advance(15)  # s-runs waking at +10 .. +15 are due
    assert await store.next_due_at(["wf"]) == START + 16
    assert await store.fire_timers(100) == 6
    assert await store.fire_timers(100) == 0
    assert len(await store.claim_runs("w1", ["wf"], 100, TTL)) == 6
    clock.advance(100)
    assert await store.fire_timers(4) == 4
    assert await store.fire_timers(100) == 2
    assert await store.next_due_at(["wf"]) is None


async def test_recovery_across_shards_respects_its_limit(
    make_store: MakeStore, topology: str, clock: FakeClock
) -> None:
    store = await make_store(topology, shard_count=SHARDS, clock=clock)
    for _ in range(10):
        await create(store)
    claimed = await store.claim_runs("w1", ["wf"], 10, TTL)
    clock.advance(TTL)
    first = await store.recover_expired(5, 4)
    second = await store.recover_expired(5, 100)
    assert len(first.requeued) == 4 and len(second.requeued) == 6
    assert sorted(first.requeued + second.requeued) == sorted(x.run_id for x in claimed)


async def test_namespaces_never_see_each_other(make_store: MakeStore, topology: str) -> None:
    a = await make_store(topology, shard_count=SHARDS)
    b = await make_store(topology, shard_count=SHARDS)
    run_id = await create(a, run_id="shared-id")
    assert await b.get_run(run_id) is None
    assert await b.list_runs() == [] and await b.claim_runs("w", ["wf"], 10, TTL) == []
    await create(b, run_id="shared-id")  # the same id is a different run there
    [lease] = await a.claim_runs("w", ["wf"], 10, TTL)
    await a.append_journal(lease.token, entry(run_id, 0))
    assert await b.load_journal(run_id) == []
    assert (await b.get_run(run_id)).status is RunStatus.QUEUED  # type: ignore[union-attr]
    assert len(await b.claim_runs("w", ["wf"], 10, TTL)) == 1


async def test_keys_are_where_keys_py_says(make_store: MakeStore) -> None:
    store = await make_store("single", shard_count=SHARDS)
    run_id = await create(store)
    [lease] = await store.claim_runs("w", ["wf"], 1, TTL)
    await store.append_journal(lease.token, entry(run_id, 0))
    await store.send_signal(run_id, "go", "1")
    raw = store._server.client()
    keys = store._keys
    for key in (keys.run(run_id), keys.journal(run_id), keys.signal(run_id, "go"), keys.meta):
        assert await raw.exists(key) == 1, key
    found = [k.decode() async for k in raw.scan_iter(match=f"*{run_id}*")]
    assert found and all(k.startswith(store.namespace + ":") for k in found)


async def test_one_claim_serves_many_workflows_in_the_order_given(
    make_store: MakeStore, topology: str
) -> None:
    store = await make_store(topology, shard_count=SHARDS)
    names = [f"wf{i}" for i in range(6)]
    assert await store.claim_runs("w", names, 5, TTL) == []  # each workflow noted once
    for name in ("wf1", "wf3", "wf4"):
        for _ in range(3):
            await create(store, name)
    raw = store._server.client()
    before = await raw.info("commandstats")
    leases = await store.claim_runs("w", names, 7, TTL)
    after = await raw.info("commandstats")
    # The limit is filled in the order given: all of wf1 and wf3, one run of wf4.
    assert [lease.run.workflow for lease in leases] == ["wf1"] * 3 + ["wf3"] * 3 + ["wf4"]
    if topology == "single":

        def fcalls(stats: dict[str, dict[str, int]]) -> int:
            return stats.get("cmdstat_fcall", {}).get("calls", 0)

        assert fcalls(after) - fcalls(before) == 1  # one call for all six workflows
    rest = await store.claim_runs("w", list(reversed(names)), 10, TTL)
    assert [lease.run.workflow for lease in rest] == ["wf4", "wf4"]
