"""Single node: the ready list (lua/common.lua ``list_entry``). Runs of the default owner
due when submitted wait in their workflow's ready list; a claim moves them into the
in-flight list (one LMOVE for a claim of one, an LPOP and an LPUSH for more). These
tests look at the keys themselves, and at what the layout must not cost: fairness once a
tenant shows up, recovery of a crashed claim, and runs in the shards' queues (delayed,
recovered) not left behind a long ready list."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pyrula.workflows.records import FlowControl, RunStatus
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.stores.valkey.queue import HINT_EVERY
from tests.stores.helpers import COMPLETED, TTL, create

from .conftest import MakeStore


def lease_index(store: ValkeyStore, run_id: str) -> str:
    """The lease index of the run's shard (keys.py: ``P l``)."""
    return store._keys.run_shard(run_id) + "l"


async def lengths(store: ValkeyStore, workflow: str = "wf") -> tuple[int, int]:
    """(ready, in flight) list lengths of the workflow."""
    raw = store._server.client()
    hint = store._keys.hint(workflow)
    return int(await raw.llen(hint + "r")), int(await raw.llen(hint + "i"))


async def test_a_run_goes_from_the_ready_list_to_in_flight_and_out(
    make_store: MakeStore,
) -> None:
    store = await make_store("single")
    run_id = await create(store)
    assert await lengths(store) == (1, 0)
    [lease] = await store.claim_runs("w", ["wf"], 5, TTL)
    assert lease.run_id == run_id and await lengths(store) == (0, 1)
    await store.renew_leases("w", [(run_id, lease.token)], TTL)
    await store.finish_run(run_id, lease.token, COMPLETED)
    assert await lengths(store) == (0, 0)
    raw = store._server.client()
    assert await raw.zcard(lease_index(store, run_id)) == 0


async def test_a_tenant_moves_the_workflow_to_the_fair_queues(make_store: MakeStore) -> None:
    store = await make_store("single", shard_count=4)
    default = [await create(store) for _ in range(40)]
    assert await lengths(store) == (40, 0)
    tenant = await create(store, owner="t1")
    # The ready list moved to the shards' queues: the tenant is served within two passes
    # over the 4 shards, not after the 40 runs queued before it (deficit round robin on
    # each shard, stores/flow.py: on its shard the default owner, joining at the same
    # turn, goes first by name).
    assert await lengths(store) == (0, 0)
    first = []
    for _ in range(8):
        first += [lease.run_id for lease in await store.claim_runs("w", ["wf"], 1, TTL)]
    assert tenant in first
    later = await create(store)  # for good: the default owner stays on the fair path
    assert await lengths(store) == (0, 0)
    rest = await store.claim_runs("w", ["wf"], 100, TTL)
    assert sorted(first + [lease.run_id for lease in rest]) == sorted([*default, tenant, later])


async def test_a_long_ready_list_moves_in_batches_of_owned_submissions(
    make_store: MakeStore,
) -> None:
    store = await make_store("single", shard_count=4)
    for _ in range(51):  # 5,100 runs, 100 at a time in flight
        await asyncio.gather(*(create(store) for _ in range(100)))
    await create(store, owner="t1")  # moves the oldest 5,000 (MOVE_BATCH in common.lua)
    assert await lengths(store) == (100, 0)
    later = await create(store)  # the workflow is owned: to its shard
    assert await lengths(store) == (100, 0)
    await create(store, owner="t2")  # moves the rest
    assert await lengths(store) == (0, 0)
    leases = await store.claim_runs("w", ["wf"], 6000, TTL)
    assert len(leases) == 5103 and later in {lease.run_id for lease in leases}


async def test_a_crashed_claim_from_the_ready_list_is_recovered(
    make_store: MakeStore,
) -> None:
    store = await make_store("single")
    run_id = await create(store)
    [lease] = await store.claim_runs("crashed", ["wf"], 1, 0.2)
    assert (await store.recover_expired(5, 10)).requeued == ()  # its lease still holds
    await asyncio.sleep(0.3)
    report = await store.recover_expired(5, 10)
    assert report.requeued == (run_id,)
    assert await lengths(store) == (1, 0)  # requeued at the tail of the ready list
    [again] = await store.claim_runs("w", ["wf"], 1, TTL)
    assert again.run_id == run_id and again.token > lease.token
    assert again.run.recoveries == 1


async def test_past_max_recoveries_a_claim_from_the_ready_list_is_dead_lettered(
    make_store: MakeStore,
) -> None:
    store = await make_store("single")
    run_id = await create(store)
    await store.claim_runs("crashed", ["wf"], 1, 0.2)
    await asyncio.sleep(0.3)
    report = await store.recover_expired(0, 10)
    assert report.dead == (run_id,) and report.requeued == ()
    run = await store.get_run(run_id)
    assert run is not None and run.status is RunStatus.DEAD
    assert await lengths(store) == (0, 0)


async def test_a_due_run_in_a_shard_queue_is_not_left_behind_the_ready_list(
    make_store: MakeStore,
) -> None:
    store = await make_store("single")
    for _ in range(20):
        await create(store)
    await store.claim_runs("w", ["wf"], 1, TTL)
    late = await create(store, start_at=time.time() - 5)  # in its shard's queue
    await asyncio.sleep(2 * HINT_EVERY)
    # The shards are read first at least every HINT_EVERY: the run due first comes first.
    [lease] = await store.claim_runs("w", ["wf"], 1, TTL)
    assert lease.run_id == late


async def test_due_runs_in_the_shards_drain_before_the_ready_list_goes_on(
    make_store: MakeStore,
) -> None:
    store = await make_store("single", shard_count=4)
    await create(store)
    await store.claim_runs("w", ["wf"], 1, TTL)  # the ready list first from now on
    delayed = {await create(store, start_at=time.time() - 5) for _ in range(100)}
    ready = {await create(store) for _ in range(100)}
    await asyncio.sleep(2 * HINT_EVERY)
    order = []
    while len(order) < 200:
        order += [lease.run_id for lease in await store.claim_runs("w", ["wf"], 1, TTL)]
    # Once the shards are read, their due runs (which came due before the ready list's
    # runs were queued) all go first, however long that takes.
    assert set(order[:100]) == delayed and set(order[100:]) == ready


async def test_an_expired_run_in_the_ready_list_ends_at_its_claim(make_store: MakeStore) -> None:
    store = await make_store("single")
    gone = await create(store, expires_at=time.time() - 1)
    kept = await create(store)
    [lease] = await store.claim_runs("w", ["wf"], 5, TTL)
    assert lease.run_id == kept and await lengths(store) == (0, 1)
    run = await store.get_run(gone)
    assert run is not None and run.status is RunStatus.CANCELLED


async def test_a_batch_claim_takes_the_oldest_runs_in_order(make_store: MakeStore) -> None:
    store = await make_store("single")
    ids = [await create(store) for _ in range(6)]
    gone = await create(store, expires_at=time.time() - 1)
    ids.append(await create(store))
    first = await store.claim_runs("w", ["wf"], 3, TTL)
    assert [lease.run_id for lease in first] == ids[:3] and await lengths(store) == (5, 3)
    # Newest claim at the head (the finish looks from the tail, the oldest claims).
    raw = store._server.client()
    flight = [e.decode() for e in await raw.lrange(store._keys.hint("wf") + "i", 0, -1)]
    assert [e.split(":", 1)[1] for e in flight] == ids[2::-1]
    # The expired run in the next batch ends and is not counted: the claim goes on.
    rest = await store.claim_runs("w", ["wf"], 4, TTL)
    assert [lease.run_id for lease in rest] == ids[3:] and await lengths(store) == (0, 7)
    expired = await store.get_run(gone)
    assert expired is not None and expired.status is RunStatus.CANCELLED
    assert await store.claim_runs("w", ["wf"], 4, TTL) == []
    await store.finish_run(ids[0], first[0].token, COMPLETED)
    assert await lengths(store) == (0, 6)


async def test_a_batch_claim_past_one_lpush_of_4000_keeps_the_order(
    make_store: MakeStore,
) -> None:
    store = await make_store("single")
    for _ in range(21):
        await asyncio.gather(*(create(store) for _ in range(200)))
    raw = store._server.client()
    hint = store._keys.hint("wf")
    queued = [e.decode() for e in await raw.lrange(hint + "r", 0, -1)]
    leases = await store.claim_runs("w", ["wf"], 5000, TTL)
    assert [lease.run_id for lease in leases] == [e.split(":", 1)[1] for e in queued]
    assert [e.decode() for e in await raw.lrange(hint + "i", 0, -1)] == queued[::-1]


async def test_a_ready_run_is_not_held_behind_rate_limited_ones(make_store: MakeStore) -> None:
    """A claim that reads the shards first and finds a run held by its rate limit still
    takes the runs on the ready list (the held run was once counted against the whole
    limit, and the ready list was skipped)."""
    store = await make_store("single")
    flow = FlowControl(rate_key="k", rate_per_second=0.01, rate_burst=1)
    held = [await create(store, flow=flow) for _ in range(2)]
    [first] = await store.claim_runs("w", ["wf"], 5, TTL)  # the bucket's one token
    assert first.run_id in held  # (their shards are visited in no set order)
    plain = await create(store)
    await asyncio.sleep(HINT_EVERY * 3)  # the next claim reads the shards first
    assert [lease.run_id for lease in await store.claim_runs("w", ["wf"], 5, TTL)] == [plain]


async def test_wait_for_work_names_a_workflow_woken_for_its_ready_list(
    make_store: MakeStore,
) -> None:
    """A wake-up for runs on a ready list names its workflow (the claim loop then skips
    the others when they are gone); one for a delayed run names none, so the worker's
    timer loop looks again."""
    store = await make_store("single")
    waiter = asyncio.create_task(store.wait_for_work(["other", "wf"], timeout=10))
    await asyncio.sleep(0.05)
    await create(store)
    assert await asyncio.wait_for(waiter, 5) == ["wf"]
    assert len(await store.claim_runs("w", ["wf"], 5, TTL)) == 1  # short: clears the list
    waiter = asyncio.create_task(store.wait_for_work(["other", "wf"], timeout=10))
    await asyncio.sleep(0.05)
    await create(store, delay=30)
    assert await asyncio.wait_for(waiter, 5) is None


# -- a previous build beside this one (rolling deploy) ----------------------------------
# A build from before the ready list does not know the run field q: a run it queues in
# its shard or claims through the shards can keep a stale q='i' from an earlier claim
# from the ready list. Written here as that build leaves it.
async def mark_stale(store: ValkeyStore, run_id: str) -> None:
    raw = store._server.client()
    await raw.hset(store._keys.run(run_id), "q", "i")


async def in_lease_index(store: ValkeyStore, run_id: str) -> float | None:
    raw = store._server.client()
    score = await raw.zscore(lease_index(store, run_id), run_id)
    return None if score is None else float(score)


async def test_a_stale_mark_on_a_queued_run_is_cleared_by_its_claim(
    make_store: MakeStore,
) -> None:
    store = await make_store("single")
    run_id = await create(store, start_at=time.time() - 1)  # in its shard's queue
    await mark_stale(store, run_id)
    [lease] = await store.claim_runs("w", ["wf"], 1, 0.5)
    assert lease.run_id == run_id and await in_lease_index(store, run_id) is not None
    for _ in range(3):  # renewed past its first TTL: never taken from its holder
        await asyncio.sleep(0.3)
        await store.renew_leases("w", [(run_id, lease.token)], 0.5)
        assert (await store.recover_expired(5, 10)).requeued == ()
    await store.finish_run(run_id, lease.token, COMPLETED)
    assert await in_lease_index(store, run_id) is None


async def test_a_stale_mark_on_a_running_run_keeps_the_shard_lease_index(
    make_store: MakeStore,
) -> None:
    store = await make_store("single")
    run_id = await create(store, start_at=time.time() - 1)
    [lease] = await store.claim_runs("w", ["wf"], 1, 0.5)
    await mark_stale(store, run_id)  # claimed through the shards by the previous build
    await asyncio.sleep(0.3)
    await store.renew_leases("w", [(run_id, lease.token)], 0.5)
    await asyncio.sleep(0.3)
    assert (await store.recover_expired(5, 10)).requeued == ()  # the renewal counted
    await store.finish_run(run_id, lease.token, COMPLETED)
    assert await in_lease_index(store, run_id) is None
    await asyncio.sleep(0.6)
    assert (await store.recover_expired(5, 10)).requeued == ()  # ended: never requeued
    run = await store.get_run(run_id)
    assert run is not None and run.status is RunStatus.COMPLETED


async def test_the_orphan_scan_skips_an_ended_run_left_in_the_lease_index(
    make_store: MakeStore,
) -> None:
    store = await make_store("single")
    run_id = await create(store)
    [lease] = await store.claim_runs("w", ["wf"], 1, TTL)
    await store.finish_run(run_id, lease.token, COMPLETED)
    raw = store._server.client()
    index = lease_index(store, run_id)
    await raw.zadd(index, {run_id: 1.0})  # as a previous build's finish could leave it
    assert (await store.recover_expired(5, 10)).requeued == ()
    assert await raw.zscore(index, run_id) is None
    run = await store.get_run(run_id)
    assert run is not None and run.status is RunStatus.COMPLETED


async def commands_during(store: ValkeyStore, call: Any) -> dict[str, int]:
    """Server commands (INFO commandstats deltas, those scripts ran too) while call runs."""
    raw = store._server.client()
    before = await raw.info("commandstats")
    result = await call
    after = await raw.info("commandstats")
    out = {name[len("cmdstat_") :]: stats["calls"] - before.get(name, {}).get("calls", 0)
           for name, stats in after.items()}  # fmt: skip
    out = {name: n for name, n in out.items() if n and name != "info"}
    out["result"] = result
    return out


async def test_an_idle_claim_over_many_workflows_is_one_probe(make_store: MakeStore) -> None:
    store = await make_store("single", shard_count=4)
    names = [f"wf{i}" for i in range(10)]
    assert await store.claim_runs("w", names, 50, TTL) == []  # each workflow noted once
    seen = await commands_during(store, store.claim_runs("w", names, 50, TTL))
    # The call and one EXISTS over the 30 keys: not an LPOP and a ZRANGEBYSCORE each.
    assert seen == {"fcall": 1, "exists": 1, "result": []}


async def test_a_probe_that_finds_anything_claims_as_before(make_store: MakeStore) -> None:
    store = await make_store("single", shard_count=4)
    names = [f"wf{i}" for i in range(6)]
    await store.claim_runs("w", names, 5, TTL)
    raw = store._server.client()
    # Only a wake list left (its run taken by another worker): the claim spends it.
    await raw.lpush(store._keys.hint("wf2") + "wake", "r")
    assert await store.claim_runs("w", names, 5, TTL) == []
    assert await raw.exists(store._keys.hint("wf2") + "wake") == 0
    # A delayed run in a shard of the last workflow, once due; a ready run of another.
    delayed = await create(store, "wf5", delay=0.3)
    assert await store.claim_runs("w", names, 5, TTL) == []
    ready = await create(store, "wf1")
    [lease] = await store.claim_runs("w", names, 5, TTL)
    assert lease.run_id == ready
    await asyncio.sleep(0.35)
    [lease] = await store.claim_runs("w", names, 5, TTL)
    assert lease.run_id == delayed
    # A ready run alone (no wake list: deleted) is found too.
    await raw.delete(store._keys.hint("wf3") + "wake")
    run_id = await create(store, "wf3")
    await raw.delete(store._keys.hint("wf3") + "wake")
    [lease] = await store.claim_runs("w", names, 5, TTL)
    assert lease.run_id == run_id
