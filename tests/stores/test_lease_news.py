"""Conformance: lease news (``wait_lease_news``). A cancel or a terminate of a running run
wakes its holder's wait at once, so the worker renews (and learns of it) without waiting
for its next renewal; nothing else does."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

from pyrula.workflows.stores.base import LeaseNews, Store, lease_news_of
from pyrula.workflows.stores.sqlite import SqliteStore

from .helpers import PARAMS, TTL, create, new_run

WAIT = 10.0  # far longer than the test may take: it must end early


def news(store: Store) -> LeaseNews:
    """The store's lease news: every bundled store has them (an archiving store, its
    live store's)."""
    found = lease_news_of(store)
    assert found is not None, store
    return found


async def test_a_terminate_wakes_the_holder_at_once(store: Store) -> None:
    run_id = await create(store)
    [lease] = await store.claim_runs("w1", ["wf"], 1, TTL)
    other = asyncio.ensure_future(news(store).wait_lease_news("w2", WAIT))
    holder = asyncio.ensure_future(news(store).wait_lease_news("w1", WAIT))
    await asyncio.sleep(0.05)  # both waiting
    started = time.monotonic()
    await store.terminate_run(lease.run_id)
    assert await asyncio.wait_for(holder, 5) is True
    assert time.monotonic() - started < 5
    assert not other.done()  # another worker's wait goes on
    other.cancel()
    renewed = await store.renew_leases("w1", [(run_id, lease.token)], TTL)
    assert list(renewed.lost) == [run_id]  # what the renewal it prompts finds


async def test_a_cancel_of_a_running_run_wakes_the_holder(store: Store) -> None:
    run_id = await create(store)
    [lease] = await store.claim_runs("w1", ["wf"], 1, TTL)
    holder = asyncio.ensure_future(news(store).wait_lease_news("w1", WAIT))
    await asyncio.sleep(0.05)
    await store.cancel_run(run_id)
    assert await asyncio.wait_for(holder, 5) is True
    renewed = await store.renew_leases("w1", [(run_id, lease.token)], TTL)
    assert list(renewed.cancel_requested) == [run_id]


async def test_without_news_the_wait_times_out(store: Store) -> None:
    queued = await create(store)
    await store.terminate_run(queued)  # not running: nobody to tell
    started = time.monotonic()
    assert await news(store).wait_lease_news("w1", 0.3) is False
    assert time.monotonic() - started >= 0.25


async def test_news_waits_for_a_worker_that_was_not_waiting(store: Store) -> None:
    await create(store)
    [lease] = await store.claim_runs("w1", ["wf"], 1, TTL)
    await store.terminate_run(lease.run_id)  # while the worker renews, say
    started = time.monotonic()
    assert await news(store).wait_lease_news("w1", WAIT) is True
    assert time.monotonic() - started < 5
    # Taken: the next wait has nothing (a renewal answered it).
    assert await news(store).wait_lease_news("w1", 0.3) is False


async def test_the_holder_of_a_running_child_hears_of_its_parents_terminate(
    store: Store,
) -> None:
    parent = await create(store)
    [held] = await store.claim_runs("w1", ["wf"], 1, TTL)
    assert held.run_id == parent
    child, _ = await store.create_run(
        new_run("kid", PARAMS, run_id=f"{parent}.1", parent_run_id=parent)
    )
    [kid] = await store.claim_runs("w2", ["kid"], 1, TTL)
    assert kid.run_id == child.run_id
    holder = asyncio.ensure_future(news(store).wait_lease_news("w2", WAIT))
    await asyncio.sleep(0.05)
    await store.terminate_run(parent)  # the tree: the child too
    assert await asyncio.wait_for(holder, 5) is True


async def test_a_closed_store_has_no_news(store: Store) -> None:
    await store.close()
    assert await news(store).wait_lease_news("w1", 0.2) is False


async def test_sqlite_news_from_another_process(tmp_path: Path) -> None:
    """SQLite: a terminate made by another process reaches the holder through its
    ``lease_news`` row, found when ``data_version`` moves (no shared notifier)."""
    path = tmp_path / "news.db"
    store = SqliteStore(path)
    await store.open()
    try:
        run_id = await create(store)
        [lease] = await store.claim_runs("w1", ["wf"], 1, TTL)
        holder = asyncio.ensure_future(news(store).wait_lease_news("w1", WAIT))
        await asyncio.sleep(0.1)
        script = (
            "import asyncio, sys\n"
            "from pyrula.workflows.stores.sqlite import SqliteStore\n"
            "async def main():\n"
            "    store = SqliteStore(sys.argv[1])\n"
            "    await store.open()\n"
            "    await store.terminate_run(sys.argv[2])\n"
            "    await store.close()\n"
            "asyncio.run(main())\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, str(path), lease.run_id], timeout=60, check=False
        )
        assert done.returncode == 0
        # Woken by the other process's terminate, well before its WAIT (10 s) ran out; the
        # clock starts once that process is done (its start takes long on a loaded machine).
        started = time.monotonic()
        assert await asyncio.wait_for(holder, WAIT) is True
        assert time.monotonic() - started < 5
        assert await news(store).wait_lease_news("w1", 0.3) is False  # the row was taken
        assert (await store.get_run(run_id)).status.value == "terminated"  # type: ignore[union-attr]
    finally:
        await store.close()
