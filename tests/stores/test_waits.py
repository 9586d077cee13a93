"""Conformance: durable time. Suspending a run, firing its timer, and next_due_at."""

from __future__ import annotations

import asyncio

import pytest

from pyrula.workflows.errors import LeaseLost, RunNotFound
from pyrula.workflows.records import RunStatus, Wait
from pyrula.workflows.stores.base import Store

from .conftest import START, FakeClock
from .helpers import COMPLETED, TTL, create, entry, idle_wait, running, status


async def test_suspend_to_sleep(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    clock.advance(1)
    assert await store.suspend_run(lease.run_id, lease.token, Wait(wake_at=START + 60)) is True
    run = await store.get_run(lease.run_id)
    assert run is not None and run.status is RunStatus.SLEEPING and not run.is_terminal
    assert run.wake_at == START + 60 and run.wait_signal is None and run.wait_child is None
    assert run.lease_expires_at is None and run.updated_at == START + 1
    assert run.finished_at is None
    # It holds no lease: nothing more may be written with the old token.
    with pytest.raises(LeaseLost):
        await store.append_journal(lease.token, entry(lease.run_id, 0))
    with pytest.raises(LeaseLost):
        await store.finish_run(lease.run_id, lease.token, COMPLETED)
    assert (await store.renew_leases("w1", [(lease.run_id, lease.token)], TTL)).lost == (
        lease.run_id,
    )
    assert await store.claim_runs("w1", ["wf"], 10, TTL) == []
    clock.advance(TTL * 10)
    assert (await store.recover_expired(0, 10)).dead == ()  # not a lost lease


async def test_suspend_to_wait_for_a_signal(store: Store) -> None:
    lease = await running(store)
    wait = Wait(signal="approve", wake_at=START + 3600)
    assert await store.suspend_run(lease.run_id, lease.token, wait) is True
    run = await store.get_run(lease.run_id)
    assert run is not None and run.status is RunStatus.WAITING
    assert run.wait_signal == "approve" and run.wake_at == START + 3600
    assert run.wait_child is None and run.lease_expires_at is None


async def test_suspend_to_wait_for_a_child_without_deadline(store: Store) -> None:
    child = await create(store, "child")
    lease = await running(store)
    assert await store.suspend_run(lease.run_id, lease.token, Wait(child=child)) is True
    run = await store.get_run(lease.run_id)
    assert run is not None and run.status is RunStatus.WAITING
    assert run.wait_child == child and run.wake_at is None and run.wait_signal is None


async def test_suspend_refused_when_the_wait_is_over(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    before = await store.get_run(lease.run_id)
    # A time already reached (exactly now counts).
    assert await store.suspend_run(lease.run_id, lease.token, Wait(wake_at=START)) is False
    assert await store.suspend_run(lease.run_id, lease.token, Wait(wake_at=START - 5)) is False
    # A signal of that name already pending.
    await store.send_signal(lease.run_id, "go", '"now"')
    assert await store.suspend_run(lease.run_id, lease.token, Wait(signal="go")) is False
    # A child that already ended.
    child = await running(store, "child")
    await store.finish_run(child.run_id, child.token, COMPLETED)
    assert await store.suspend_run(lease.run_id, lease.token, Wait(child=child.run_id)) is False
    # Nothing changed: the run is still running under the same lease.
    assert await store.get_run(lease.run_id) == before
    await store.append_journal(lease.token, entry(lease.run_id, 0))
    # Another signal name is not pending, so that wait goes ahead.
    assert await store.suspend_run(lease.run_id, lease.token, Wait(signal="other")) is True


async def test_suspend_is_fenced(store: Store) -> None:
    lease = await running(store)
    with pytest.raises(LeaseLost):
        await store.suspend_run(lease.run_id, lease.token + 1, Wait(wake_at=START + 1))
    with pytest.raises(RunNotFound):
        await store.suspend_run("nope", 1, Wait(wake_at=START + 1))
    queued = await create(store)
    with pytest.raises(LeaseLost):
        await store.suspend_run(queued, 0, Wait(wake_at=START + 1))
    assert await store.suspend_run(lease.run_id, lease.token, Wait(wake_at=START + 1))
    with pytest.raises(LeaseLost):  # suspended: the lease is gone
        await store.suspend_run(lease.run_id, lease.token, Wait(wake_at=START + 2))
    await store.terminate_run(queued)
    assert await status(store, lease.run_id) is RunStatus.SLEEPING


async def test_fire_timers_wakes_due_runs_oldest_first(store: Store, clock: FakeClock) -> None:
    late = await running(store)
    await store.suspend_run(late.run_id, late.token, Wait(wake_at=START + 30))
    early = await running(store)
    await store.suspend_run(early.run_id, early.token, Wait(wake_at=START + 10))
    middle = await running(store)
    await store.suspend_run(middle.run_id, middle.token, Wait(wake_at=START + 20))
    assert await store.fire_timers(10) == 0  # none due yet
    clock.advance(9)
    assert await store.fire_timers(10) == 0
    clock.advance(21)  # all three due
    assert await store.fire_timers(1) == 1
    assert await status(store, early.run_id) is RunStatus.QUEUED
    assert await status(store, middle.run_id) is RunStatus.SLEEPING
    assert await store.fire_timers(0) == 0
    clock.advance(1)
    assert await store.fire_timers(10) == 2
    assert await store.fire_timers(10) == 0
    run = await store.get_run(late.run_id)
    assert run is not None and run.status is RunStatus.QUEUED
    assert run.available_at == run.updated_at == START + 31 and run.wake_at is None
    # Woken runs are claimable again, with a new token: FIFO by (available_at, submission).
    leases = await store.claim_runs("w2", ["wf"], 10, TTL)
    assert [lease.run_id for lease in leases] == [early.run_id, late.run_id, middle.run_id]
    assert leases[0].token > early.token and leases[0].run.claims == 2


async def test_fire_timers_ends_a_waiting_runs_deadline(store: Store, clock: FakeClock) -> None:
    timed = await running(store)
    await store.suspend_run(timed.run_id, timed.token, Wait(signal="s", wake_at=START + 5))
    forever = await running(store)
    await store.suspend_run(forever.run_id, forever.token, Wait(signal="s"))
    clock.advance(10_000)
    assert await store.fire_timers(10) == 1
    run = await store.get_run(timed.run_id)
    assert run is not None and run.status is RunStatus.QUEUED
    assert run.wait_signal is None and run.wake_at is None
    assert await status(store, forever.run_id) is RunStatus.WAITING


async def test_fire_timers_wakes_claimers(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    await store.suspend_run(lease.run_id, lease.token, Wait(wake_at=START + 1))
    waiter = idle_wait(store, ["wf"])
    await asyncio.sleep(0.05)
    assert not waiter.done()
    clock.advance(1)
    assert await store.fire_timers(10) == 1
    await asyncio.wait_for(waiter, 5)


async def test_next_due_at_counts_sleeping_and_waiting_runs(store: Store, clock: FakeClock) -> None:
    sleeper = await running(store)
    await store.suspend_run(sleeper.run_id, sleeper.token, Wait(wake_at=START + 50))
    assert await store.next_due_at(["wf"]) == START + 50
    waiter = await running(store)
    await store.suspend_run(waiter.run_id, waiter.token, Wait(signal="s", wake_at=START + 40))
    assert await store.next_due_at(["wf"]) == START + 40
    patient = await running(store)
    await store.suspend_run(patient.run_id, patient.token, Wait(signal="s"))
    assert await store.next_due_at(["wf"]) == START + 40  # no deadline: no time
    assert await store.next_due_at(["other"]) is None
    await create(store, delay=45)
    assert await store.next_due_at(["wf"]) == START + 40
    clock.advance(40)  # only times strictly after now count, fired or not
    assert await store.next_due_at(["wf"]) == START + 45
    await store.fire_timers(10)
    assert await store.next_due_at(["wf"]) == START + 45
    clock.advance(5)
    assert await store.next_due_at(["wf"]) == START + 50
    clock.advance(5)
    assert await store.next_due_at(["wf"]) is None
