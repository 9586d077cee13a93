"""Conformance: the queue, claims, leases, renewals, releases, recovery and wake-ups."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from pyrula.workflows.errors import LeaseLost, RunNotFound
from pyrula.workflows.records import Lease, Outcome, RecoveryReport, RunStatus
from pyrula.workflows.stores.base import RenewResult, Store

from .conftest import START, FakeClock
from .helpers import COMPLETED, TTL, claim_one, create, entry, idle_wait, running


def ids(leases: list[Lease]) -> list[str]:
    return [lease.run_id for lease in leases]


async def test_claim_makes_the_run_running(store: Store, clock: FakeClock) -> None:
    run_id = await create(store)
    clock.advance(3)
    [lease] = await store.claim_runs("w1", ["wf"], 5, 30)
    run = lease.run
    assert lease.run_id == run_id and lease.token == run.lease_token > 0
    assert lease.expires_at == run.lease_expires_at == START + 33
    assert run.status is RunStatus.RUNNING and run.worker_id == "w1"
    assert run.claims == 1 and run.started_at == START + 3 and run.updated_at == START + 3
    assert await store.get_run(run_id) == run


async def test_claim_order_is_fifo_by_available_at(store: Store, clock: FakeClock) -> None:
    a = await create(store)
    b = await create(store)
    c = await create(store, start_at=START - 10)  # due earlier than a and b
    clock.advance(1)
    d = await create(store)
    e = await create(store, delay=5)  # not yet due
    assert ids(await store.claim_runs("w1", ["wf"], 2, TTL)) == [c, a]
    assert ids(await store.claim_runs("w1", ["wf"], 10, TTL)) == [b, d]
    clock.advance(5)
    assert ids(await store.claim_runs("w1", ["wf"], 10, TTL)) == [e]


async def test_claim_order_across_workflows(store: Store, clock: FakeClock) -> None:
    a = await create(store, "one")
    clock.advance(1)
    b = await create(store, "two")
    c = await create(store, "one")
    d = await create(store, "two", start_at=START)
    # Workflows in the order given (repeats ignored), each one's runs in its own order.
    leases = await store.claim_runs("w1", ["two", "one", "two"], 10, TTL)
    assert ids(leases) == [d, b, a, c]
    e = await create(store, "one")
    f = await create(store, "two")
    assert ids(await store.claim_runs("w1", ["one", "two"], 1, TTL)) == [e]
    assert ids(await store.claim_runs("w1", ["one", "two"], 1, TTL)) == [f]


async def test_claim_limit(store: Store) -> None:
    for _ in range(5):
        await create(store)
    assert await store.claim_runs("w1", ["wf"], 0, TTL) == []
    assert len(await store.claim_runs("w1", ["wf"], 3, TTL)) == 3
    assert len(await store.claim_runs("w1", ["wf"], 3, TTL)) == 2
    assert await store.claim_runs("w1", ["wf"], 3, TTL) == []


async def test_claim_takes_only_the_given_workflows(store: Store) -> None:
    mine = await create(store, "mine")
    theirs = await create(store, "theirs")
    assert ids(await store.claim_runs("w1", ["mine", "unknown"], 10, TTL)) == [mine]
    assert await store.claim_runs("w1", ["mine"], 10, TTL) == []
    assert await store.claim_runs("w1", [], 10, TTL) == []
    run = await store.get_run(theirs)
    assert run is not None and run.status is RunStatus.QUEUED and run.claims == 0


async def test_tokens_strictly_increase(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    tokens = [lease.token]
    await store.release_run(lease.run_id, lease.token)
    lease = await claim_one(store)
    tokens.append(lease.token)
    clock.advance(TTL)
    await store.recover_expired(max_recoveries=10, limit=10)
    lease = await claim_one(store)
    tokens.append(lease.token)
    assert lease.run.claims == 3 and lease.run.started_at == START
    tokens.append((await store.terminate_run(lease.run_id)).lease_token)
    await store.retry_run(lease.run_id)
    tokens.append((await claim_one(store)).token)
    assert tokens == sorted(set(tokens)), tokens


async def test_other_runs_do_not_share_a_lease(store: Store) -> None:
    await create(store)
    await create(store)
    first, second = await store.claim_runs("w1", ["wf"], 2, TTL)
    with pytest.raises(LeaseLost):
        await store.finish_run(second.run_id, second.token + 1000, COMPLETED)
    await store.finish_run(first.run_id, first.token, COMPLETED)
    await store.finish_run(second.run_id, second.token, COMPLETED)


# -- renew ---------------------------------------------------------------------------
async def test_renew_extends_the_lease(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    clock.advance(20)
    result = await store.renew_leases("w1", [(lease.run_id, lease.token)], 30)
    assert result.lost == () and result.cancel_requested == ()
    run = await store.get_run(lease.run_id)
    assert run is not None and run.lease_expires_at == START + 50
    clock.advance(25)  # past the first expiry, not the renewed one
    assert await store.recover_expired(5, 10) == RecoveryReport()


async def test_renew_reports_lost_and_cancel_requested(store: Store, clock: FakeClock) -> None:
    await create(store)
    await create(store)
    await create(store)
    keep, cancel, gone = await store.claim_runs("w1", ["wf"], 3, TTL)
    await store.cancel_run(cancel.run_id)
    await store.terminate_run(gone.run_id)
    queued = await create(store)
    result = await store.renew_leases(
        "w1",
        [
            (keep.run_id, keep.token),
            (cancel.run_id, cancel.token),
            (gone.run_id, gone.token),
            (keep.run_id, keep.token - 1),
            (queued, 0),
            ("nope", 1),
        ],
        TTL,
    )
    assert result.lost == (gone.run_id, keep.run_id, queued, "nope")
    assert result.cancel_requested == (cancel.run_id,)
    assert await store.renew_leases("w1", [], TTL) == RenewResult()


async def test_renew_racing_the_runs_own_finish_is_not_lost(store: Store) -> None:
    # The worker's renewal was on its way when its own finish landed: the run ended under
    # this very lease, so nothing was lost (terminate gives the run a new token: lost).
    done, killed = await running(store), await running(store)
    await store.finish_run(done.run_id, done.token, COMPLETED)
    await store.terminate_run(killed.run_id)
    result = await store.renew_leases(
        "w1", [(done.run_id, done.token), (killed.run_id, killed.token)], TTL
    )
    assert result == RenewResult(lost=(killed.run_id,))
    finished = await store.get_run(done.run_id)
    assert finished is not None and finished.lease_expires_at is None


async def test_renew_after_recovery_is_lost(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    clock.advance(TTL + 1)
    await store.recover_expired(5, 10)
    result = await store.renew_leases("w1", [(lease.run_id, lease.token)], TTL)
    assert result.lost == (lease.run_id,)
    run = await store.get_run(lease.run_id)
    assert run is not None and run.status is RunStatus.QUEUED and run.lease_expires_at is None


# -- release -------------------------------------------------------------------------
async def test_release_requeues_now(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    clock.advance(4)
    await store.release_run(lease.run_id, lease.token)
    run = await store.get_run(lease.run_id)
    assert run is not None and run.status is RunStatus.QUEUED
    assert run.available_at == run.updated_at == START + 4 and run.lease_expires_at is None
    again = await claim_one(store, worker="w2")
    assert again.run_id == lease.run_id and again.token > lease.token
    assert again.run.worker_id == "w2" and again.run.claims == 2


async def test_release_with_available_at(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    await store.release_run(lease.run_id, lease.token, available_at=START + 10)
    assert (await store.get_run(lease.run_id)).available_at == START + 10  # type: ignore[union-attr]
    assert await store.claim_runs("w1", ["wf"], 1, TTL) == []
    assert await store.next_due_at(["wf"]) == START + 10
    clock.advance(10)
    assert ids(await store.claim_runs("w1", ["wf"], 1, TTL)) == [lease.run_id]


async def test_release_is_fenced(store: Store) -> None:
    lease = await running(store)
    with pytest.raises(LeaseLost):
        await store.release_run(lease.run_id, lease.token + 1)
    await store.release_run(lease.run_id, lease.token)
    with pytest.raises(LeaseLost):  # no longer running
        await store.release_run(lease.run_id, lease.token)
    with pytest.raises(RunNotFound):
        await store.release_run("nope", 1)


# -- finish --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "outcome",
    [
        COMPLETED,
        Outcome(RunStatus.COMPLETED, result="null"),
        Outcome(RunStatus.FAILED, error='{"type_name":"ValueError"}'),
        Outcome(RunStatus.CANCELLED),
    ],
    ids=["completed", "completed-null", "failed", "cancelled"],
)
async def test_finish_outcomes(store: Store, clock: FakeClock, outcome: Outcome) -> None:
    lease = await running(store)
    clock.advance(2)
    run = await store.finish_run(lease.run_id, lease.token, outcome)
    assert run.status is outcome.status and run.is_terminal
    assert run.result == outcome.result and run.error == outcome.error
    assert run.finished_at == run.updated_at == START + 2 and run.lease_expires_at is None
    assert run.worker_id == "w1" and run.lease_token == lease.token
    assert await store.get_run(lease.run_id) == run
    with pytest.raises(LeaseLost):  # finished: no second outcome
        await store.finish_run(lease.run_id, lease.token, outcome)


async def test_finish_is_fenced_and_checked(store: Store) -> None:
    lease = await running(store)
    with pytest.raises(ValueError):
        await store.finish_run(lease.run_id, lease.token, Outcome(RunStatus.RUNNING))
    with pytest.raises(ValueError):
        await store.finish_run(lease.run_id, lease.token, Outcome(RunStatus.DEAD))
    with pytest.raises(LeaseLost):
        await store.finish_run(lease.run_id, lease.token - 1, COMPLETED)
    with pytest.raises(RunNotFound):
        await store.finish_run("nope", 1, COMPLETED)
    queued = await create(store)
    with pytest.raises(LeaseLost):
        await store.finish_run(queued, 0, COMPLETED)
    run = await store.get_run(lease.run_id)
    assert run is not None and run.status is RunStatus.RUNNING


# -- recover_expired -----------------------------------------------------------------
async def test_recover_requeues_expired_leases(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    other = await running(store)
    await store.renew_leases("w1", [(other.run_id, other.token)], TTL * 10)
    clock.advance(TTL - 1)
    assert (await store.recover_expired(3, 10)).requeued == ()
    clock.advance(1)  # exactly at expiry counts as expired
    report = await store.recover_expired(3, 10)
    assert report.requeued == (lease.run_id,) and report.dead == ()
    run = await store.get_run(lease.run_id)
    assert run is not None and run.status is RunStatus.QUEUED and run.recoveries == 1
    assert run.available_at == run.updated_at == START + TTL and run.lease_expires_at is None
    with pytest.raises(LeaseLost):
        await store.append_journal(lease.token, entry(lease.run_id, 0))
    again = await claim_one(store, worker="w2")
    assert again.run_id == lease.run_id and again.token > lease.token
    assert again.run.recoveries == 1
    with pytest.raises(LeaseLost):
        await store.finish_run(lease.run_id, lease.token, COMPLETED)
    await store.finish_run(lease.run_id, again.token, COMPLETED)


async def test_recover_dead_letters_beyond_max_recoveries(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    for expected in (1, 2):
        clock.advance(TTL)
        assert (await store.recover_expired(2, 10)).requeued == (lease.run_id,)
        lease = await claim_one(store)
        assert lease.run.recoveries == expected
    clock.advance(TTL)
    report = await store.recover_expired(2, 10)
    assert report == RecoveryReport(requeued=(), dead=(lease.run_id,))
    run = await store.get_run(lease.run_id)
    assert run is not None and run.status is RunStatus.DEAD and run.is_terminal
    assert run.recoveries == 3 and run.finished_at == clock() and run.lease_expires_at is None
    assert run.error is not None and "max_recoveries=2" in json.loads(run.error)["message"]
    assert await store.claim_runs("w1", ["wf"], 10, TTL) == []


async def test_recover_with_zero_max_recoveries(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    clock.advance(TTL)
    assert (await store.recover_expired(0, 10)).dead == (lease.run_id,)


async def test_recover_respects_limit(store: Store, clock: FakeClock) -> None:
    for _ in range(3):
        await create(store)
    leases = await store.claim_runs("w1", ["wf"], 3, TTL)
    clock.advance(TTL)
    first = await store.recover_expired(5, 2)
    second = await store.recover_expired(5, 2)
    assert len(first.requeued) == 2 and len(second.requeued) == 1
    assert sorted(first.requeued + second.requeued) == sorted(ids(leases))
    assert (await store.recover_expired(5, 2)).requeued == ()
    assert (await store.recover_expired(5, 0)).requeued == ()


async def test_recover_leaves_other_statuses(store: Store, clock: FakeClock) -> None:
    done = await running(store)
    await store.finish_run(done.run_id, done.token, COMPLETED)
    queued = await create(store)
    clock.advance(TTL * 10)
    assert await store.recover_expired(0, 10) == RecoveryReport()
    assert (await store.get_run(queued)).status is RunStatus.QUEUED  # type: ignore[union-attr]


# -- next_due_at ---------------------------------------------------------------------
async def test_next_due_at(store: Store, clock: FakeClock) -> None:
    assert await store.next_due_at(["wf"]) is None
    await create(store, delay=30)
    await create(store, "other", delay=5)
    assert await store.next_due_at(["wf"]) == START + 30
    assert await store.next_due_at(["wf", "other"]) == START + 5
    assert await store.next_due_at([]) is None
    soon = await create(store, delay=10)
    assert await store.next_due_at(["wf"]) == START + 10
    clock.advance(10)
    assert (await claim_one(store)).run_id == soon  # running runs no longer count
    assert await store.next_due_at(["wf"]) == START + 30


# -- wait_for_work -------------------------------------------------------------------
async def test_wait_for_work_is_woken_by_create(store: Store) -> None:
    waiter = asyncio.create_task(store.wait_for_work(["other", "wf"], timeout=10))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    started = time.monotonic()
    await create(store, "wf")
    await asyncio.wait_for(waiter, 5)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("how", ["release", "retry", "recover"])
async def test_wait_for_work_is_woken_by_requeue(store: Store, clock: FakeClock, how: str) -> None:
    lease = await running(store)
    if how == "retry":
        await store.terminate_run(lease.run_id)
    waiter = idle_wait(store, ["wf"])
    await asyncio.sleep(0.05)
    assert not waiter.done()
    if how == "release":
        await store.release_run(lease.run_id, lease.token)
    elif how == "retry":
        await store.retry_run(lease.run_id)
    else:
        clock.advance(TTL)
        await store.recover_expired(5, 10)
    await asyncio.wait_for(waiter, 5)


async def test_wait_for_work_times_out(store: Store) -> None:
    await create(store, "other")
    started = time.monotonic()
    await store.wait_for_work(["wf"], timeout=0.1)
    assert 0.05 <= time.monotonic() - started < 5
    await asyncio.wait_for(store.wait_for_work([], timeout=10), 5)


async def test_wait_for_work_ignores_other_workflows(store: Store) -> None:
    waiter = asyncio.create_task(store.wait_for_work(["wf"], timeout=10))
    await asyncio.sleep(0.02)
    await create(store, "other")
    await asyncio.sleep(0.1)
    assert not waiter.done()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_close_wakes_wait_for_work(store: Store) -> None:
    waiter = asyncio.create_task(store.wait_for_work(["wf"], timeout=30))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await store.close()
    await asyncio.wait_for(waiter, 5)
