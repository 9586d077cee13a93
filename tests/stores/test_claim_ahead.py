"""Conformance: ``claim_runs(..., ahead=)`` also takes queued runs due within ``ahead``
seconds, starting them at their time; without it nothing is claimed before its time."""

from __future__ import annotations

from pyrula.workflows.records import DEFAULT_OWNER, FlowControl, RunStatus
from pyrula.workflows.stores.base import Store

from .conftest import START, FakeClock
from .helpers import TTL, create


async def test_a_run_not_due_is_claimed_only_within_ahead(store: Store, clock: FakeClock) -> None:
    run_id = await create(store, delay=10.0)
    assert await store.claim_runs("w1", ["wf"], 5, TTL) == []
    assert await store.claim_runs("w1", ["wf"], 5, TTL, 5.0) == []  # due in 10 s
    clock.advance(6.0)  # due in 4 s
    assert await store.claim_runs("w1", ["wf"], 5, TTL) == []
    (lease,) = await store.claim_runs("w1", ["wf"], 5, TTL, 5.0)
    assert lease.run_id == run_id
    assert lease.expires_at == START + 6.0 + TTL  # the lease runs from the claim
    run = await store.get_run(run_id)
    assert run is not None and run.status is RunStatus.RUNNING
    assert run.available_at == START + 10.0
    assert run.started_at == START + 10.0  # it starts at its time, not at the claim
    assert run.claims == 1 and run.lease_token == lease.token


async def test_due_and_soon_runs_are_claimed_together(store: Store, clock: FakeClock) -> None:
    later = await create(store, delay=3.0)
    now = await create(store)
    soon = await create(store, delay=1.0)
    leases = await store.claim_runs("w1", ["wf"], 5, TTL, 5.0)
    started = {lease.run_id: lease.run.started_at for lease in leases}
    assert started == {now: START, soon: START + 1.0, later: START + 3.0}


async def test_ahead_does_not_take_a_run_past_its_owner_cap(store: Store, clock: FakeClock) -> None:
    capped = FlowControl(owner_concurrency=1)
    first = await create(store, owner="t1", flow=capped)
    await create(store, owner="t1", flow=capped, delay=1.0)
    (lease,) = await store.claim_runs("w1", ["wf"], 5, TTL, 5.0)
    assert lease.run_id == first
    assert await store.claim_runs("w1", ["wf"], 5, TTL, 5.0) == []


async def test_a_run_claimed_ahead_keeps_its_owner_fifo(store: Store, clock: FakeClock) -> None:
    ids = [await create(store, owner=DEFAULT_OWNER, delay=0.5 * i) for i in range(1, 5)]
    leases = await store.claim_runs("w1", ["wf"], 2, TTL, 1.5)
    assert [lease.run_id for lease in leases] == ids[:2]  # due in 0.5 and 1 s, the first two
    leases = await store.claim_runs("w1", ["wf"], 10, TTL, 1.5)
    assert [lease.run_id for lease in leases] == ids[2:3]  # 1.5 s: within 1.5 s
    clock.advance(1.0)
    leases = await store.claim_runs("w1", ["wf"], 10, TTL, 1.0)
    assert [lease.run_id for lease in leases] == ids[3:]
