"""Conformance: ``wait_schedule_change``, the marker schedule loops wait on so that a
schedule created or resumed elsewhere fires its first slot on time."""

from __future__ import annotations

import asyncio
import time

import pytest

from pyrula.workflows.errors import ScheduleExists, ScheduleNotFound
from pyrula.workflows.schedules import Schedule
from pyrula.workflows.stores.base import Store

from .conftest import START
from .test_schedules import record, slot_run


async def marker(store: Store) -> str:
    return await store.wait_schedule_change(None, 0)


async def test_every_change_moves_the_marker_and_refusals_do_not(store: Store) -> None:
    seen = [await marker(store)]
    assert isinstance(seen[0], str)
    assert await store.wait_schedule_change(seen[0], 0) == seen[0]  # no change, no wait

    async def moved() -> str:
        now = await marker(store)
        assert now not in seen, f"the marker did not move: {now!r} in {seen!r}"
        assert await store.wait_schedule_change(seen[-1], 0) == now
        seen.append(now)
        return now

    await store.create_schedule(record("a"))
    await moved()
    await store.create_schedule(record("a", every=30.0), replace=True)
    await moved()
    await store.update_schedule("a", enabled=False)
    await moved()
    await store.update_schedule("a", next_fire_at=START + 5)
    await moved()
    await store.create_schedule(record("b"))
    await moved()
    assert await store.delete_schedule("b") is True
    await moved()

    with pytest.raises(ScheduleExists):
        await store.create_schedule(record("a"))
    with pytest.raises(ScheduleNotFound):
        await store.update_schedule("nope", enabled=True)
    assert await store.delete_schedule("nope") is False
    assert await marker(store) == seen[-1]  # refused changes change nothing


async def test_a_wait_returns_when_another_client_changes_a_schedule(store: Store) -> None:
    seen = await marker(store)
    started = time.monotonic()
    waiting = asyncio.ensure_future(store.wait_schedule_change(seen, 20))
    await asyncio.sleep(0.2)
    assert not waiting.done(), "returned with nothing changed"
    # The blocking API, from another thread and event loop: another client of the store.
    schedule = Schedule.create("wf", every=5, schedule_id="elsewhere")
    await asyncio.to_thread(store.schedule_create, schedule)  # type: ignore[attr-defined]
    current = await asyncio.wait_for(waiting, timeout=10)
    assert current != seen and current == await marker(store)
    assert time.monotonic() - started < 10


async def test_a_change_before_the_wait_is_not_missed(store: Store) -> None:
    seen = await marker(store)
    await store.create_schedule(record("early"))
    started = time.monotonic()
    current = await store.wait_schedule_change(seen, 20)
    assert current != seen
    assert time.monotonic() - started < 5, "waited out a change it had not seen"


async def test_a_wait_without_changes_lasts_its_timeout(store: Store) -> None:
    await store.create_schedule(record("a"))
    seen = await marker(store)
    # A fire moves next_fire_at only; it need not move the marker. Either way the wait
    # then runs its course or returns the new marker.
    fired = await store.fire_schedule("a", START + 60, START + 60, START + 120, slot_run("a", 60))
    assert fired is not None
    seen = await marker(store)
    started = time.monotonic()
    assert await store.wait_schedule_change(seen, 0.4) == seen
    elapsed = time.monotonic() - started
    assert 0.35 <= elapsed < 5, f"returned after {elapsed:.3f} s"


async def test_closing_the_store_ends_a_wait(store: Store) -> None:
    seen = await marker(store)
    waiting = asyncio.ensure_future(store.wait_schedule_change(seen, 30))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await store.close()
    assert await asyncio.wait_for(waiting, timeout=5) == seen
