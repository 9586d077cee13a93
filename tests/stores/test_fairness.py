"""Conformance: fair claiming across owners, and flow control (rate and concurrency)."""

from __future__ import annotations

import asyncio

import pytest

from pyrula.workflows.records import DEFAULT_OWNER, FlowControl, RunStatus, Wait
from pyrula.workflows.stores.base import Store

from .conftest import START, FakeClock
from .helpers import COMPLETED, TTL, create, status


@pytest.fixture(params=["a", DEFAULT_OWNER], ids=["named", "default-owner"])
def a(request: pytest.FixtureRequest) -> str:
    """The owner the tests call "a": a named one, or the default owner (no tenant), which
    a store may track apart while it is alone (ValkeyStore's solo default owner); both
    sort before "b", so every expected order holds for either."""
    return str(request.param)


async def owners_of(store: Store, n: int = 1, limit: int = 1, workflow: str = "wf") -> list[str]:
    """The owners of the runs ``n`` successive claims of ``limit`` got, in order."""
    got: list[str] = []
    for _ in range(n):
        got += [lease.run.owner for lease in await store.claim_runs("w", [workflow], limit, TTL)]
    return got


async def queue(store: Store, owner: str, count: int, **kwargs: object) -> list[str]:
    return [await create(store, owner=owner, **kwargs) for _ in range(count)]  # type: ignore[arg-type]


# -- fairness ------------------------------------------------------------------------
async def test_two_owners_alternate(a: str, store: Store) -> None:
    await queue(store, a, 4)
    await queue(store, "b", 3)
    assert await owners_of(store, 4) == [a, "b", a, "b"]
    assert await owners_of(store, 1, limit=10) == [a, "b", a]


async def test_one_claim_of_many_is_fair_too(a: str, store: Store) -> None:
    await queue(store, a, 3)
    await queue(store, "b", 1)
    await queue(store, "c", 2)
    assert await owners_of(store, 1, limit=10) == [a, "b", "c", a, "c", a]


async def test_fifo_within_an_owner(a: str, store: Store, clock: FakeClock) -> None:
    first = await queue(store, a, 2)
    early = await create(store, owner=a, start_at=START - 5)  # due before the others
    clock.advance(1)
    later = await create(store, owner=a)
    await queue(store, "b", 4)
    leases = await store.claim_runs("w", ["wf"], 8, TTL)
    assert [lease.run_id for lease in leases if lease.run.owner == a] == [early, *first, later]
    assert [lease.run.owner for lease in leases] == [a, "b"] * 4


async def test_an_owner_alone_then_others_join_and_leave(a: str, store: Store) -> None:
    await queue(store, a, 7)
    assert await owners_of(store, 2) == [a, a]
    await queue(store, "b", 2)  # joins: neither has banked credit, the tie goes by name
    assert await owners_of(store, 5) == [a, "b", a, "b", a]
    assert await owners_of(store, 1, limit=2) == [a, a]  # alone again
    await queue(store, a, 2)
    await queue(store, "b", 2)
    assert await owners_of(store, 1, limit=10) == [a, "b", a, "b"]


async def test_an_idle_owner_banks_no_credit(a: str, store: Store) -> None:
    await queue(store, a, 1)
    await queue(store, "b", 20)
    assert await owners_of(store, 6) == [a, "b", "b", "b", "b", "b"]
    await queue(store, a, 5)  # back after being idle while b was served five times
    assert await owners_of(store, 6) == [a, "b", a, "b", a, "b"]


async def test_a_new_owner_waits_its_turn_but_within_one_round(a: str, store: Store) -> None:
    await queue(store, "x", 10)
    await queue(store, "y", 10)
    assert await owners_of(store, 3) == ["x", "y", "x"]
    await queue(store, a, 2)  # sorts first by name, yet y has waited longest
    assert await owners_of(store, 6) == ["y", a, "x", "y", a, "x"]
    assert await owners_of(store, 2) == ["y", "x"]  # a is done


async def test_a_small_owner_is_not_stuck_behind_a_backlog(store: Store) -> None:
    await queue(store, "big", 2_000)
    small = await queue(store, "small", 10)
    order = await owners_of(store, 20)
    assert order[:2].count("small") == 1, order[:2]  # its first run goes at once
    assert order == ["big", "small"] * 10 or order == ["small", "big"] * 10, order
    claimed = {lease.run_id for lease in await store.claim_runs("w", ["wf"], 5, TTL)}
    assert not claimed & set(small)


async def test_fairness_is_per_workflow(a: str, store: Store) -> None:
    await queue(store, a, 3)
    await create(store, "other", owner="b")
    await queue(store, "b", 1)
    assert await owners_of(store, 1, limit=10, workflow="other") == ["b"]
    # b's claim in "other" does not count against it in "wf".
    assert await owners_of(store, 1, limit=10) == [a, "b", a, a]


# -- owner concurrency -----------------------------------------------------------------
CAP2 = FlowControl(owner_concurrency=2)


async def test_owner_concurrency_caps_running_runs(a: str, store: Store) -> None:
    a_runs = await queue(store, a, 5, flow=CAP2)
    await queue(store, "b", 1, flow=CAP2)
    first = await store.claim_runs("w1", ["wf"], 10, TTL)
    assert [lease.run.owner for lease in first] == [a, "b", a]
    assert await store.claim_runs("w2", ["wf"], 10, TTL) == []  # across claims and workers
    assert [await status(store, run_id) for run_id in a_runs[2:]] == [RunStatus.QUEUED] * 3
    done = first[0]
    await store.finish_run(done.run_id, done.token, COMPLETED)
    [next_one] = await store.claim_runs("w2", ["wf"], 10, TTL)
    assert next_one.run_id == a_runs[2]  # FIFO kept while held back
    # A suspended run holds no slot either.
    await store.suspend_run(next_one.run_id, next_one.token, Wait(wake_at=START + 60))
    assert [lease.run_id for lease in await store.claim_runs("w2", ["wf"], 10, TTL)] == [a_runs[3]]


async def test_owner_concurrency_counts_one_workflow(a: str, store: Store) -> None:
    await create(store, "other", owner=a, flow=CAP2)
    await create(store, "other", owner=a, flow=CAP2)
    assert len(await store.claim_runs("w", ["other"], 10, TTL)) == 2
    await queue(store, a, 3, flow=CAP2)
    assert await owners_of(store, 1, limit=10) == [a, a]


async def test_a_freed_slot_wakes_claimers(a: str, store: Store) -> None:
    await queue(store, a, 2, flow=FlowControl(owner_concurrency=1))
    [lease] = await store.claim_runs("w", ["wf"], 10, TTL)
    waiter = asyncio.create_task(store.wait_for_work(["wf"], timeout=10))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await store.finish_run(lease.run_id, lease.token, COMPLETED)
    await asyncio.wait_for(waiter, 5)
    assert len(await store.claim_runs("w", ["wf"], 10, TTL)) == 1


async def test_next_due_at_leaves_out_an_owner_at_its_cap(
    a: str, store: Store, clock: FakeClock
) -> None:
    cap1 = FlowControl(owner_concurrency=1)
    await create(store, owner=a, flow=cap1)
    [lease] = await store.claim_runs("w", ["wf"], 10, TTL)
    await create(store, owner=a, flow=cap1, delay=5)
    assert await store.next_due_at(["wf"]) is None
    await create(store, owner="b", delay=8)
    assert await store.next_due_at(["wf"]) == START + 8
    await store.finish_run(lease.run_id, lease.token, COMPLETED)
    assert await store.next_due_at(["wf"]) == START + 5


# -- rate limits -----------------------------------------------------------------------
RATE = FlowControl(rate_key="api", rate_per_second=10, rate_burst=1)


async def test_a_rate_limited_claim_waits_for_the_next_token(
    a: str, store: Store, clock: FakeClock
) -> None:
    runs = await queue(store, a, 3, flow=RATE)
    assert [lease.run_id for lease in await store.claim_runs("w", ["wf"], 10, TTL)] == runs[:1]
    assert await store.claim_runs("w", ["wf"], 10, TTL) == []
    assert await store.next_due_at(["wf"]) == pytest.approx(START + 0.1)
    clock.advance(0.05)
    assert await store.claim_runs("w", ["wf"], 10, TTL) == []
    assert await store.next_due_at(["wf"]) == pytest.approx(START + 0.1)
    clock.advance(0.05)
    assert [lease.run_id for lease in await store.claim_runs("w", ["wf"], 10, TTL)] == runs[1:2]
    held = await store.get_run(runs[2])
    assert held is not None and held.status is RunStatus.QUEUED and held.claims == 0
    clock.advance(10)  # a long pause refills to the burst only
    assert [lease.run_id for lease in await store.claim_runs("w", ["wf"], 10, TTL)] == runs[2:]


async def test_a_claim_at_next_due_at_gets_its_token(
    a: str, store: Store, clock: FakeClock
) -> None:
    """Woken exactly when next_due_at said, the claim must not miss the token by a
    float rounding of epoch seconds (the timer loop would then sleep a poll interval)."""
    runs = await queue(store, a, 8, flow=FlowControl("api", rate_per_second=7))
    clock.advance(0.0123)
    claimed = [lease.run_id for lease in await store.claim_runs("w", ["wf"], 10, TTL)]
    for _ in range(7):
        due = await store.next_due_at(["wf"])
        assert due is not None and due > clock()
        clock.set(due)
        claimed += [lease.run_id for lease in await store.claim_runs("w", ["wf"], 10, TTL)]
    assert claimed == runs


async def test_a_burst_then_the_rate(a: str, store: Store, clock: FakeClock) -> None:
    burst = FlowControl(rate_key="api", rate_per_second=2, rate_burst=3)
    await queue(store, a, 6, flow=burst)
    assert len(await store.claim_runs("w", ["wf"], 10, TTL)) == 3
    assert await store.next_due_at(["wf"]) == pytest.approx(START + 0.5)
    clock.advance(1)
    assert len(await store.claim_runs("w", ["wf"], 10, TTL)) == 2


async def test_a_rate_bucket_is_shared_by_its_key(a: str, store: Store, clock: FakeClock) -> None:
    await create(store, "one", owner=a, flow=RATE)
    await create(store, "two", owner="b", flow=RATE)
    other_key = FlowControl(rate_key="other", rate_per_second=10)
    free = await create(store, "two", owner="c", flow=other_key)
    assert len(await store.claim_runs("w", ["one"], 10, TTL)) == 1
    # b's head waits for the shared bucket; c uses its own and is not held up.
    assert [lease.run_id for lease in await store.claim_runs("w", ["two"], 10, TTL)] == [free]
    clock.advance(0.1)
    assert len(await store.claim_runs("w", ["two"], 10, TTL)) == 1


async def test_a_rate_held_run_keeps_its_place_while_other_keys_go_by(a: str, store: Store) -> None:
    await create(store, owner=a, flow=RATE)
    held = await create(store, owner=a, flow=RATE)
    after = await create(store, owner=a)  # no limit itself: not blocked by the held key
    other = await create(store, owner="b")
    leases = await store.claim_runs("w", ["wf"], 10, TTL)
    assert sorted(lease.run.owner for lease in leases) == [a, a, "b"]
    assert {other, after} <= {lease.run_id for lease in leases}
    assert await status(store, held) is RunStatus.QUEUED


async def test_an_owner_at_its_cap_is_held_whole(a: str, store: Store) -> None:
    capped = FlowControl(owner_concurrency=1)
    await create(store, owner=a, flow=capped)
    second = await create(store, owner=a, flow=capped)
    after = await create(store, owner=a)  # behind the capped owner's held run
    other = await create(store, owner="b")
    leases = await store.claim_runs("w", ["wf"], 10, TTL)
    assert [lease.run.owner for lease in leases] == [a, "b"]
    assert other in {lease.run_id for lease in leases}
    assert await status(store, second) is RunStatus.QUEUED
    assert await status(store, after) is RunStatus.QUEUED
