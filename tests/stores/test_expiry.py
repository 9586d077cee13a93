"""Conformance: a queued run past its ``expires_at`` is never claimed; the claim that
finds it ends it cancelled with a RunExpired error and moves on."""

from __future__ import annotations

import asyncio

import pytest

from pyrula.workflows.records import FlowControl, RunRecord, RunStatus, Wait
from pyrula.workflows.serialization import ErrorInfo
from pyrula.workflows.stores.base import Store

from .conftest import START, FakeClock
from .helpers import COMPLETED, TTL, claim_one, create, entry, new_run, running


async def get(store: Store, run_id: str) -> RunRecord:
    run = await store.get_run(run_id)
    assert run is not None, run_id
    return run


def assert_expired(run: RunRecord, at: float) -> None:
    assert run.status is RunStatus.CANCELLED and run.is_terminal
    assert run.error is not None
    error = ErrorInfo.from_json(run.error)
    assert error.qualified_type == "pyrula.workflows.errors.RunExpired"
    assert run.run_id in error.message
    assert run.finished_at == at and run.updated_at == at
    assert run.started_at is None and run.claims == 0 and run.worker_id is None
    assert run.result is None and run.lease_expires_at is None


async def test_expires_at_is_kept(store: Store) -> None:
    run, _ = await store.create_run(new_run(run_id="r1", expires_at=START + 10.5))
    assert run.expires_at == START + 10.5
    assert (await get(store, "r1")).expires_at == START + 10.5
    assert (await store.list_runs())[0].expires_at == START + 10.5
    plain, _ = await store.create_run(new_run(run_id="r2"))
    assert plain.expires_at is None


async def test_an_expired_run_is_cancelled_not_claimed(store: Store, clock: FakeClock) -> None:
    run_id = await create(store, expires_at=START + 10)
    clock.advance(10)  # expires_at <= now: expired
    assert await store.claim_runs("w1", ["wf"], 10, TTL) == []
    assert_expired(await get(store, run_id), START + 10)
    # It stays ended: nothing claims it later, and its journal is empty.
    clock.advance(100)
    assert await store.claim_runs("w1", ["wf"], 10, TTL) == []
    assert await store.load_journal(run_id) == []
    assert await store.next_due_at(["wf"]) is None


async def test_a_run_not_expired_yet_is_claimed(store: Store, clock: FakeClock) -> None:
    run_id = await create(store, expires_at=START + 10)
    clock.advance(9.5)
    lease = await claim_one(store)
    assert lease.run_id == run_id and lease.run.status is RunStatus.RUNNING
    assert lease.run.expires_at is None  # the claim clears it: a started run never expires
    # Once started, the expiry passing does not touch it, even after a requeue.
    clock.advance(5)
    assert (await store.renew_leases("w1", [(run_id, lease.token)], TTL)).lost == ()
    await store.release_run(run_id, lease.token)
    again = await claim_one(store)
    assert again.run_id == run_id
    await store.append_journal(again.token, entry(run_id, 0))
    done = await store.finish_run(run_id, again.token, COMPLETED)
    assert done.status is RunStatus.COMPLETED and done.error is None


async def test_the_claim_moves_on_to_the_owners_next_run(store: Store, clock: FakeClock) -> None:
    first = await create(store, owner="acme", expires_at=START + 1)
    second = await create(store, owner="acme", expires_at=START + 2)
    third = await create(store, owner="acme")
    fourth = await create(store, owner="acme", expires_at=START + 100)
    clock.advance(5)
    leases = await store.claim_runs("w1", ["wf"], 1, TTL)
    assert [lease.run_id for lease in leases] == [third]
    assert_expired(await get(store, first), START + 5)
    assert_expired(await get(store, second), START + 5)
    assert (await get(store, fourth)).status is RunStatus.QUEUED
    assert (await claim_one(store)).run_id == fourth


async def test_an_expired_run_costs_its_owner_no_turn(store: Store, clock: FakeClock) -> None:
    await create(store, owner="a", run_id="a1", expires_at=START + 1)
    await create(store, owner="a", run_id="a2")
    await create(store, owner="b", run_id="b1")
    await create(store, owner="a", run_id="a3")
    clock.advance(2)
    leases = await store.claim_runs("w1", ["wf"], 3, TTL)
    assert [lease.run_id for lease in leases] == ["a2", "b1", "a3"]
    assert (await get(store, "a1")).status is RunStatus.CANCELLED


async def test_an_expired_run_takes_no_rate_token(store: Store, clock: FakeClock) -> None:
    rate = FlowControl(rate_key="api", rate_per_second=0.001, rate_burst=1)
    expired = await create(store, flow=rate, expires_at=START + 1)
    live = await create(store, flow=rate)
    clock.advance(1)
    assert [lease.run_id for lease in await store.claim_runs("w1", ["wf"], 5, TTL)] == [live]
    assert (await get(store, expired)).status is RunStatus.CANCELLED


async def test_the_expiry_wakes_wait_run(store: Store, clock: FakeClock) -> None:
    run_id = await create(store, expires_at=START + 10)
    waiter = asyncio.create_task(store.wait_run(run_id, timeout=None))
    bounded = asyncio.create_task(store.wait_run(run_id, timeout=60))
    await asyncio.sleep(0.05)
    assert not waiter.done() and not bounded.done()
    clock.advance(10)
    assert await store.claim_runs("w1", ["wf"], 1, TTL) == []
    for task in (waiter, bounded):
        assert_expired(await asyncio.wait_for(task, 5), START + 10)


@pytest.mark.parametrize("child_workflow", ["child", "wf"])  # "wf": the parent's own
async def test_the_expiry_of_a_child_wakes_its_waiting_parent(
    store: Store, clock: FakeClock, child_workflow: str
) -> None:
    parent = await running(store)
    child = new_run(child_workflow, run_id="c1", parent_run_id=parent.run_id, expires_at=START + 5)
    child_entry = entry(parent.run_id, 0, "child", kind="child", value='"c1"')
    await store.start_child(parent.token, child_entry, child)
    assert await store.suspend_run(parent.run_id, parent.token, Wait(child="c1"))
    work = asyncio.create_task(store.wait_for_work(["wf"], timeout=10))
    await asyncio.sleep(0.05)
    clock.advance(5)
    claimed = await store.claim_runs("w2", [child_workflow], 1, TTL)
    assert [lease.run_id for lease in claimed] in ([], [parent.run_id])
    assert_expired(await get(store, "c1"), START + 5)
    await asyncio.wait_for(work, 5)
    if claimed:  # the same claim went on to the parent its expiry had just queued
        return
    woken = await get(store, parent.run_id)
    assert woken.status is RunStatus.QUEUED and woken.wait_child is None
    again = await claim_one(store)
    assert again.run_id == parent.run_id and again.token > parent.token


async def test_only_the_claimed_workflows_expire(store: Store, clock: FakeClock) -> None:
    other = await create(store, "other", expires_at=START + 1)
    mine = await create(store, expires_at=START + 100)
    clock.advance(2)
    assert (await claim_one(store)).run_id == mine
    assert (await get(store, other)).status is RunStatus.QUEUED
    assert await store.claim_runs("w1", ["other"], 1, TTL) == []
    assert (await get(store, other)).status is RunStatus.CANCELLED


async def test_the_claim_reports_the_runs_it_expired(store: Store, clock: FakeClock) -> None:
    """``Claimed.expired``: each run the claim ended instead of claiming, as it ended
    (due now, delayed, of a named owner, of another workflow named), and only that
    claim reports it; runs not expired, and runs of workflows not named, are not there."""
    due = await create(store, params='{"n":1}', expires_at=START + 1)
    delayed = await create(store, delay=2, expires_at=START + 1)
    owned = await create(store, owner="acme", expires_at=START + 1)
    other = await create(store, "other", expires_at=START + 1)
    unnamed = await create(store, "unnamed", expires_at=START + 1)
    live = await create(store, expires_at=START + 100)
    clock.advance(5)
    claimed = await store.claim_runs("w1", ["wf", "other"], 10, TTL)
    assert [lease.run_id for lease in claimed] == [live]
    assert sorted(run.run_id for run in claimed.expired) == sorted([due, delayed, owned, other])
    for run in claimed.expired:
        assert_expired(run, START + 5)
        assert run == await get(store, run.run_id)  # the record as it ended
    assert next(r for r in claimed.expired if r.run_id == due).params == '{"n":1}'
    again = await store.claim_runs("w1", ["wf", "other", "unnamed"], 10, TTL)
    assert [run.run_id for run in again.expired] == [unnamed] and list(again) == []
    assert (await store.claim_runs("w1", ["wf", "other", "unnamed"], 10, TTL)).expired == []
