"""Conformance: ended_runs lists the terminal runs in the order they ended, by pages whose
cursor is the last run's (finished_at, run_id)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from pyrula.workflows.records import Outcome, RunRecord, RunStatus, Wait
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.sqlite import SqliteStore
from pyrula.workflows.stores.sqlite.sql import Q

from .conftest import START, FakeClock
from .helpers import COMPLETED, claim_one, create, entry, new_run, running
from .test_delete import end_run
from .test_purge import ended


def cursor(run: RunRecord) -> tuple[float, str]:
    assert run.finished_at is not None
    return (run.finished_at, run.run_id)


async def page_all(
    store: Store, limit: int, after: tuple[float, str] | None = None
) -> list[RunRecord]:
    """Every ended run from ``after`` on, ``limit`` a page; checks each page's size."""
    out: list[RunRecord] = []
    while True:
        page = await store.ended_runs(after, limit)
        assert len(page) <= limit
        out += page
        if len(page) < limit:  # a short page: there was no more
            assert await store.ended_runs(cursor(page[-1]) if page else after, limit) == []
            return out
        after = cursor(page[-1])


def order(runs: list[RunRecord]) -> list[tuple[float, str]]:
    return [cursor(run) for run in runs]


async def test_an_empty_store_lists_nothing(store: Store) -> None:
    assert await store.ended_runs(None, 10) == []
    assert await store.ended_runs((START, "x"), 10) == []


async def test_runs_come_in_the_order_they_ended(store: Store, clock: FakeClock) -> None:
    # Created a, b, c; ended c, a, b: the listing follows the ends, not the ids.
    ids = {name: await create(store, run_id=name) for name in ("a", "b", "c")}
    clock.set(START + 1)
    await store.cancel_run(ids["c"])
    clock.set(START + 2)
    await store.cancel_run(ids["a"])
    clock.set(START + 3)
    await store.cancel_run(ids["b"])
    runs = await store.ended_runs(None, 10)
    assert order(runs) == [(START + 1, "c"), (START + 2, "a"), (START + 3, "b")]
    assert runs == [await store.get_run(name) for name in ("c", "a", "b")]  # whole records
    # From a cursor on: strictly after it.
    assert order(await store.ended_runs((START + 1, "c"), 10)) == order(runs[1:])
    assert order(await store.ended_runs((START + 1.5, "zzz"), 10)) == order(runs[1:])
    assert order(await store.ended_runs((START + 2, ""), 1)) == [(START + 2, "a")]
    assert await store.ended_runs((START + 3, "b"), 10) == []
    assert order(await store.ended_runs(None, 2)) == order(runs[:2])


async def test_paging_visits_runs_ended_at_one_instant_once(store: Store, clock: FakeClock) -> None:
    """Many runs share a finished_at (a fake clock, or a tree cancelled at once): the run
    id orders them, so a small page never skips nor repeats one."""
    clock.set(START + 5)
    same = [await create(store) for _ in range(23)]
    for run_id in same:
        await store.cancel_run(run_id)
    clock.set(START + 6)
    later = [await create(store) for _ in range(3)]
    for run_id in later:
        await store.cancel_run(run_id)
    first = await ended(store, clock, "completed", START + 1)  # ended before them, made last

    expected = [(START + 1, first)]
    expected += sorted((START + 5, run_id) for run_id in same)
    expected += sorted((START + 6, run_id) for run_id in later)
    for limit in (1, 4, 7, 23, 100):
        assert order(await page_all(store, limit)) == expected, limit
    # A cursor in the middle of the instant goes on right after it.
    assert order(await page_all(store, 3, expected[10])) == expected[11:]


async def test_paging_goes_on_when_the_cursors_run_is_gone(store: Store, clock: FakeClock) -> None:
    clock.set(START + 5)
    same = [await create(store) for _ in range(12)]
    for run_id in same:
        await store.cancel_run(run_id)
    expected = sorted((START + 5, run_id) for run_id in same)
    page = await store.ended_runs(None, 5)
    assert order(page) == expected[:5]
    assert await store.delete_run(page[-1].run_id) is True
    assert order(await page_all(store, 4, cursor(page[-1]))) == expected[5:]


@pytest.mark.parametrize("how", ["completed", "failed", "cancelled", "terminated", "dead"])
async def test_only_terminal_runs_are_listed(store: Store, clock: FakeClock, how: str) -> None:
    done = await create(store)
    await end_run(store, clock, done, how)
    # Live runs of every kind: queued, running, sleeping, waiting, asked to cancel.
    await create(store)
    live = await running(store)
    sleeper = await running(store)
    assert await store.suspend_run(sleeper.run_id, sleeper.token, Wait(wake_at=START + 1e6))
    waiter = await running(store)
    assert await store.suspend_run(waiter.run_id, waiter.token, Wait(signal="go"))
    await store.cancel_run(live.run_id)  # running: only asked to cancel
    runs = await store.ended_runs(None, 100)
    assert [(run.run_id, run.status.value) for run in runs] == [(done, how)]
    assert runs[0].finished_at is not None and runs[0].is_terminal


async def test_a_retried_run_leaves_and_comes_back_at_its_new_end(
    store: Store, clock: FakeClock
) -> None:
    retried = await ended(store, clock, "failed", START)
    other = await ended(store, clock, "completed", START + 5)
    assert order(await store.ended_runs(None, 10)) == [(START, retried), (START + 5, other)]
    clock.set(START + 10)
    await store.retry_run(retried)
    assert order(await store.ended_runs(None, 10)) == [(START + 5, other)]
    lease = await claim_one(store)
    assert lease.run_id == retried
    assert order(await store.ended_runs(None, 10)) == [(START + 5, other)]  # running
    clock.set(START + 20)
    await store.append_journal(lease.token, entry(retried, 1, "b"))
    await store.finish_run(retried, lease.token, COMPLETED)
    runs = await store.ended_runs(None, 10)
    assert order(runs) == [(START + 5, other), (START + 20, retried)]
    assert runs[1].status is RunStatus.COMPLETED
    # A reader whose cursor had passed its first end meets it again at its new one.
    assert order(await store.ended_runs((START + 5, other), 10)) == [(START + 20, retried)]


async def test_purged_and_deleted_runs_are_gone(store: Store, clock: FakeClock) -> None:
    old = [await ended(store, clock, "completed", START + i) for i in range(3)]
    deleted = await ended(store, clock, "cancelled", START + 10)
    kept = await ended(store, clock, "failed", START + 20)
    clock.set(START + 100)
    assert await store.purge_runs(START + 5, 100) == 3
    assert await store.delete_run(deleted) is True
    assert order(await store.ended_runs(None, 10)) == [(START + 20, kept)]
    assert await store.ended_runs((START, old[0]), 10) == await store.ended_runs(None, 10)


async def test_a_child_is_listed_like_any_run(store: Store, clock: FakeClock) -> None:
    parent = await running(store, "parent")
    child, _ = await store.create_run(
        new_run("kid", run_id=f"{parent.run_id}.0", parent_run_id=parent.run_id)
    )
    clock.set(START + 1)
    await store.cancel_run(child.run_id)
    clock.set(START + 2)
    await store.finish_run(parent.run_id, parent.token, Outcome(RunStatus.COMPLETED, '"ok"'))
    runs = await store.ended_runs(None, 10)
    assert order(runs) == [(START + 1, child.run_id), (START + 2, parent.run_id)]
    assert runs[0].parent_run_id == parent.run_id


async def test_a_limit_of_zero_or_less_lists_nothing(store: Store, clock: FakeClock) -> None:
    await ended(store, clock, "completed", START)
    assert await store.ended_runs(None, 0) == []
    assert await store.ended_runs(None, -1) == []
    assert len(await store.ended_runs(None, 1)) == 1


async def test_sqlite_reads_a_range_of_the_ended_index(sqlite_path: Path) -> None:
    """Only the runs that ended at the cursor's instant are sorted (by run id): no scan,
    no sort of the whole history."""
    store = SqliteStore(sqlite_path)
    await store.open()
    await store.close()
    conn = sqlite3.connect(sqlite_path)
    try:
        params = {"at": START, "run_id": "r", "limit": 10}
        plan = " | ".join(
            str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + Q["ended_after"], params)
        )
    finally:
        conn.close()
    assert "SEARCH runs USING INDEX runs_ended (finished_at>?)" in plan, plan
    assert "SCAN" not in plan and "TEMP B-TREE FOR ORDER BY" not in plan, plan
