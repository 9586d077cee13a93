"""Conformance under concurrency: threads and event loops for every store; processes
for the SQLite store (each opening its own SqliteStore on the same file)."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pyrula.workflows.records import NewRun, RunRecord, RunStatus, ScheduleRecord
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.sqlite import SqliteStore

from . import procs
from .helpers import COMPLETED, TTL, create, entry, running

T = TypeVar("T")
SPAWN = multiprocessing.get_context("spawn")


async def in_threads(n: int, body: Callable[[int], Coroutine[Any, Any, T]]) -> list[T]:
    """Run ``body(i)`` for i in range(n), each on its own event loop in its own thread."""
    results: dict[int, T] = {}
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            results[i] = asyncio.run(body(i))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join, 30)
    if errors:
        raise errors[0]
    return [results[i] for i in range(n)]


async def test_threads_racing_one_idempotency_key(store: Store) -> None:
    barrier = threading.Barrier(8)

    async def body(i: int) -> tuple[str, bool]:
        new = NewRun(run_id=f"r{i}", workflow="wf", params='{"a":1}', idempotency_key="same")
        barrier.wait(10)
        run, created = await store.create_run(new)
        return run.run_id, created

    results = await in_threads(8, body)
    assert len({run_id for run_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert len(await store.list_runs()) == 1


async def test_threads_claiming_one_queue(store: Store) -> None:
    for _ in range(100):
        await create(store)
    barrier = threading.Barrier(8)

    async def body(i: int) -> list[str]:
        barrier.wait(10)
        claimed: list[str] = []
        while leases := await store.claim_runs(f"w{i}", ["wf"], 3, TTL):
            claimed += [lease.run_id for lease in leases]
        return claimed

    counts = Counter(run_id for claimed in await in_threads(8, body) for run_id in claimed)
    assert len(counts) == 100 and set(counts.values()) == {1}


async def test_two_event_loops_at_once(store: Store) -> None:
    """A client loop submits and waits while a worker loop claims, journals and finishes,
    each in its own thread, while the test's own loop reads too."""

    async def client() -> list[RunRecord]:
        done = []
        for n in range(20):
            new = NewRun(run_id=f"r{n}", workflow="wf", params=f'{{"n":{n}}}')
            run, _ = await store.create_run(new)
            done.append(await store.wait_run(run.run_id, timeout=10))
        return done

    async def worker() -> int:
        finished = 0
        while finished < 20:
            await store.wait_for_work(["wf"], timeout=0.05)
            for lease in await store.claim_runs("w1", ["wf"], 5, TTL):
                await store.append_journal(lease.token, entry(lease.run_id, 0, value="1"))
                await store.finish_run(lease.run_id, lease.token, COMPLETED)
                finished += 1
        return finished

    async def both(i: int) -> object:
        return await (client() if i == 0 else worker())

    async def reader() -> None:
        for _ in range(20):
            await store.list_runs()
            await asyncio.sleep(0.005)

    results, _ = await asyncio.wait_for(asyncio.gather(in_threads(2, both), reader()), 20)
    runs, finished = results
    assert [run.status for run in runs] == [RunStatus.COMPLETED] * 20  # type: ignore[attr-defined]
    assert finished == 20


# -- SQLite: several instances and processes on one file -------------------------------
async def test_sqlite_instances_share_wake_ups(sqlite_path: Path) -> None:
    a, b = SqliteStore(sqlite_path), SqliteStore(str(sqlite_path.parent / "." / "pyrula.db"))
    await a.open()
    await b.open()
    try:
        lease = await running(a)
        waiter = asyncio.create_task(b.wait_run(lease.run_id, timeout=10))
        work = asyncio.create_task(b.wait_for_work(["other"], timeout=10))
        await asyncio.sleep(0.05)
        assert not waiter.done() and not work.done()
        await a.finish_run(lease.run_id, lease.token, COMPLETED)
        await create(a, "other")
        assert (await asyncio.wait_for(waiter, 5)).status is RunStatus.COMPLETED
        await asyncio.wait_for(work, 5)
    finally:
        await a.close()
        await b.close()


def _start(target: Callable[..., None], *args: Any) -> multiprocessing.process.BaseProcess:
    proc = SPAWN.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def _join(procs_: list[multiprocessing.process.BaseProcess]) -> None:
    for proc in procs_:
        proc.join(60)
        assert proc.exitcode == 0, f"{proc.name} exited with {proc.exitcode}"


@pytest.mark.slow
async def test_processes_racing_one_idempotency_key(sqlite_path: Path) -> None:
    store = SqliteStore(sqlite_path)
    await store.open()  # create the file first so the race is about the key only
    barrier, results = SPAWN.Barrier(8), SPAWN.Queue()
    children = [
        _start(procs.race_create, str(sqlite_path), "key", barrier, results) for _ in range(8)
    ]
    outcomes = [await asyncio.to_thread(results.get, True, 60) for _ in children]
    await asyncio.to_thread(_join, children)
    assert len({run_id for run_id, _ in outcomes}) == 1
    assert sum(created for _, created in outcomes) == 1
    runs = await store.list_runs()
    assert [run.run_id for run in runs] == [outcomes[0][0]]
    await store.close()


@pytest.mark.slow
async def test_processes_never_claim_a_run_twice(sqlite_path: Path) -> None:
    store = SqliteStore(sqlite_path)
    await store.open()
    for _ in range(200):
        await create(store)
    barrier, results = SPAWN.Barrier(2), SPAWN.Queue()
    children = [
        _start(procs.claim_all, str(sqlite_path), f"w{i}", barrier, results) for i in range(2)
    ]
    claimed = [await asyncio.to_thread(results.get, True, 60) for _ in children]
    await asyncio.to_thread(_join, children)
    assert all(claimed), "both processes should have claimed some runs"
    counts = Counter(run_id for ids in claimed for run_id in ids)
    assert len(counts) == 200 and set(counts.values()) == {1}
    runs = await store.list_runs(limit=1000)
    assert {run.status for run in runs} == {RunStatus.COMPLETED}
    assert {run.claims for run in runs} == {1}
    await store.close()


@pytest.mark.slow
async def test_processes_racing_to_fire_each_slot_once(sqlite_path: Path) -> None:
    store = SqliteStore(sqlite_path)
    first = 1_000.0
    await store.create_schedule(
        ScheduleRecord(
            schedule_id="s",
            workflow="wf",
            params="{}",
            cron=None,
            every=1.0,
            timezone="UTC",
            enabled=True,
            next_fire_at=first,
        )
    )
    slots = 60
    barrier, results = SPAWN.Barrier(3), SPAWN.Queue()
    children = [
        _start(procs.fire_slots, str(sqlite_path), "s", first + slots, barrier, results)
        for _ in range(3)
    ]
    try:
        fired = [await asyncio.to_thread(results.get, True, 60) for _ in children]
        await asyncio.to_thread(_join, children)
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
    counts = Counter(slot for slots_ in fired for slot in slots_)
    assert counts == Counter({first + n: 1 for n in range(slots)})
    runs = await store.list_runs(limit=1000)
    assert sorted(run.idempotency_key or "" for run in runs) == sorted(
        f"schedule:s:{first + n:.3f}" for n in range(slots)
    )
    schedule = await store.get_schedule("s")
    assert schedule is not None and schedule.next_fire_at == first + slots
    assert schedule.last_fire_at == first + slots - 1
    await store.close()


@pytest.mark.slow
async def test_waiter_woken_by_another_process(sqlite_path: Path) -> None:
    store = SqliteStore(sqlite_path)
    await store.open()
    lease = await running(store)
    waiter = asyncio.create_task(store.wait_run(lease.run_id, timeout=120))
    work = asyncio.create_task(store.wait_for_work(["later"], timeout=120))
    child = _start(procs.finish_later, str(sqlite_path), lease.run_id, lease.token, 0.2)
    other = _start(procs.create_later, str(sqlite_path), "later", 0.2)
    started = time.monotonic()
    run = await asyncio.wait_for(waiter, 110)
    await asyncio.wait_for(work, 110)
    # Woken, not timed out: the waits last 120 s; the two processes start, sleep 0.2 s and
    # write (generous: a loaded machine can take seconds to start a Python process).
    assert time.monotonic() - started < 60
    assert run.status is RunStatus.COMPLETED and run.result == '"remote"'
    await asyncio.to_thread(_join, [child, other])
    await store.close()


@pytest.mark.slow
async def test_store_inherited_through_fork(sqlite_path: Path) -> None:
    """A forked child gets a fresh thread and connection instead of hanging."""
    store = SqliteStore(sqlite_path)
    run_id = await create(store)  # the parent's thread and connection now exist
    child = multiprocessing.get_context("fork").Process(
        target=procs.use_after_fork, args=(store, run_id), daemon=True
    )
    child.start()
    await asyncio.to_thread(_join, [child])
    assert await store.get_run("from-child") is not None
    await store.close()
