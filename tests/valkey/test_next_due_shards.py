"""next_due_at on a sharded ValkeyStore (the conformance suite uses one shard): a future
queued-run hint is only a lower bound (flow control may hold the run longer), so the
shards are asked in the order of their hints until one answers before the next hint;
the answer stays exact when the earliest shards' runs are held by an owner's cap."""

from __future__ import annotations

from pyrula.workflows.records import FlowControl
from tests.stores.conftest import START, FakeClock
from tests.stores.helpers import COMPLETED, TTL, create

from .conftest import MakeStore


async def test_the_earliest_delayed_run_of_many_shards(
    make_store: MakeStore, topology: str, clock: FakeClock
) -> None:
    store = await make_store(topology, shard_count=16, clock=clock)
    for i in range(60):  # spread over the shards, latest first
        await create(store, delay=100.0 - i)
    assert await store.next_due_at(["wf"]) == START + 41.0


async def test_runs_held_by_a_cap_are_passed_over_on_every_shard(
    make_store: MakeStore, topology: str, clock: FakeClock
) -> None:
    store = await make_store(topology, shard_count=16, clock=clock)
    capped = FlowControl(owner_concurrency=1)
    await create(store, owner="a", flow=capped)
    (lease,) = await store.claim_runs("w", ["wf"], 10, TTL)
    for i in range(20):  # owner a, at its cap: on many shards, the earliest hints
        await create(store, owner="a", flow=capped, delay=5.0 + i * 0.1)
    await create(store, owner="b", delay=9.0)
    assert await store.next_due_at(["wf"]) == START + 9.0
    await store.finish_run(lease.run_id, lease.token, COMPLETED)
    assert await store.next_due_at(["wf"]) == START + 5.0
