"""Conformance: purge_runs forgets the runs that ended before a time, as delete_run
forgets one, and nothing else."""

from __future__ import annotations

import pytest

from pyrula.workflows.records import Outcome, RunStatus
from pyrula.workflows.stores.base import Store

from .conftest import START, FakeClock
from .helpers import COMPLETED, TTL, claim_one, create, entry, new_run, running
from .test_delete import end_run


async def ended(store: Store, clock: FakeClock, how: str, at: float) -> str:
    """A run (of workflow "wf", with a journal entry unless it never ran) that ended as
    ``how`` at store time ``at``."""
    clock.set(at)
    run_id = await create(store)
    if how in ("completed", "failed"):
        lease = await claim_one(store)
        await store.append_journal(lease.token, entry(run_id, 0, "a"))
        outcome = COMPLETED if how == "completed" else Outcome(RunStatus.FAILED, error="{}")
        await store.finish_run(run_id, lease.token, outcome)
    else:
        await end_run(store, clock, run_id, how)  # dead: a lease later (recovered)
    return run_id


@pytest.mark.parametrize("how", ["cancelled", "terminated", "dead"])
async def test_only_runs_that_ended_before_the_time_go(
    store: Store, clock: FakeClock, how: str
) -> None:
    first = await ended(store, clock, "completed", START)
    second = await ended(store, clock, "failed", START + 10)
    third = await ended(store, clock, how, START + 20 - (TTL if how == "dead" else 0))
    third_end = (await store.get_run(third)).finished_at  # type: ignore[union-attr]
    assert third_end is not None and START + 10 < third_end <= START + 20
    clock.set(START + 30)
    live = await running(store)
    queued = await create(store)
    clock.set(START + 1000)

    assert await store.purge_runs(START + 15, 100) == 2
    assert await store.get_run(first) is None and await store.get_run(second) is None
    assert await store.load_journal(first) == [] and await store.load_journal(second) == []
    assert {r.run_id for r in await store.list_runs()} == {third, live.run_id, queued}

    assert await store.purge_runs(third_end, 100) == 0  # strictly before
    assert await store.purge_runs(third_end + 0.5, 100) == 1
    assert await store.purge_runs(START + 1000, 100) == 0  # the others have not ended
    assert {r.run_id for r in await store.list_runs()} == {live.run_id, queued}
    # The running run finishes as usual.
    await store.finish_run(live.run_id, live.token, COMPLETED)
    assert await store.purge_runs(START + 1000, 100) == 0  # it ended at START + 1000
    assert await store.purge_runs(START + 1001, 100) == 1


async def test_limit_bounds_each_call(store: Store, clock: FakeClock) -> None:
    ids = [await ended(store, clock, "completed", START + i) for i in range(12)]
    clock.set(START + 100)
    purged = await store.purge_runs(START + 100, 5)
    assert purged == 5
    gone = {run_id for run_id in ids if await store.get_run(run_id) is None}
    assert gone == set(ids[:5])  # those that ended first
    total = purged
    while (more := await store.purge_runs(START + 100, 5)) > 0:
        assert more <= 5
        total += more
    assert total == 12 and await store.list_runs() == []
    assert await store.purge_runs(START + 100, 0) == 0


async def test_a_retried_run_is_not_purged(store: Store, clock: FakeClock) -> None:
    run_id = await ended(store, clock, "failed", START)
    clock.set(START + 50)
    await store.retry_run(run_id)
    assert await store.purge_runs(START + 100, 10) == 0
    run = await store.get_run(run_id)
    assert run is not None and run.status is RunStatus.QUEUED
    # Ended again, later: it goes by its new end.
    lease = await claim_one(store)
    await store.finish_run(run_id, lease.token, COMPLETED)
    assert await store.purge_runs(START + 50, 10) == 0
    assert await store.purge_runs(START + 51, 10) == 1


async def test_the_idempotency_key_is_free_again(store: Store, clock: FakeClock) -> None:
    first, created = await store.create_run(new_run(params='{"n":1}', idempotency_key="k"))
    assert created
    await store.cancel_run(first.run_id)
    clock.advance(10)
    assert await store.purge_runs(await store.now(), 10) == 1
    second, created = await store.create_run(new_run(params='{"n":2}', idempotency_key="k"))
    assert created and second.run_id != first.run_id


async def test_a_child_is_kept_while_its_parent_is_there(store: Store, clock: FakeClock) -> None:
    """The parent may not have read a child's result yet (a gather waits on a slower
    sibling first): the child stays while the parent does, however long ago it ended."""
    parent = await running(store, "parent")
    child, _ = await store.create_run(
        new_run("kid", run_id=f"{parent.run_id}.0", parent_run_id=parent.run_id)
    )
    await store.cancel_run(child.run_id)
    clock.advance(10)
    assert await store.purge_runs(await store.now(), 10) == 0
    assert await store.get_run(child.run_id) is not None
    await store.finish_run(parent.run_id, parent.token, COMPLETED)
    clock.advance(10)
    purged = 0
    while (batch := await store.purge_runs(await store.now(), 10)) > 0:
        purged += batch
    assert purged == 2 and await store.list_runs() == []


async def test_a_child_of_a_deleted_parent_goes(store: Store, clock: FakeClock) -> None:
    parent = await running(store, "parent")
    child, _ = await store.create_run(
        new_run("kid", run_id=f"{parent.run_id}.0", parent_run_id=parent.run_id)
    )
    await store.cancel_run(child.run_id)
    await store.finish_run(parent.run_id, parent.token, COMPLETED)
    assert await store.delete_run(parent.run_id) is True
    clock.advance(10)
    assert await store.purge_runs(await store.now(), 10) == 1
    assert await store.list_runs() == []
