"""Conformance: schedules. CRUD, due schedules, the compare-and-set fire (and its skip
form, for overlap="skip"), the overlap policy and last run kept, the blocking API."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections import Counter

import pytest

from pyrula.workflows.errors import IdempotencyConflict, ScheduleExists, ScheduleNotFound
from pyrula.workflows.records import NewRun, RunStatus, ScheduleRecord
from pyrula.workflows.schedules import Schedule
from pyrula.workflows.serialization import decode
from pyrula.workflows.stores.base import Store

from .conftest import BUILDERS, START, FakeClock
from .test_concurrency import in_threads
from .test_runs import PAYLOAD


def record(schedule_id: str = "s1", *, workflow: str = "wf", **changes: object) -> ScheduleRecord:
    base = ScheduleRecord(
        schedule_id=schedule_id,
        workflow=workflow,
        params='{"a":1}',
        cron=None,
        every=60.0,
        timezone="UTC",
        enabled=True,
        next_fire_at=START + 60,
        owner="acme",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def slot_run(schedule_id: str, offset: float, params: str = '{"a":1}') -> NewRun:
    """The run of the slot ``offset`` seconds after START; its key names schedule and slot."""
    slot = START + offset
    return NewRun(
        run_id=f"{schedule_id}@{offset}",
        workflow="wf",
        params=params,
        owner="acme",
        idempotency_key=f"schedule:{schedule_id}:{slot:.3f}",
    )


# -- create, get, list, update, delete -----------------------------------------------
async def test_create_and_get(store: Store, clock: FakeClock) -> None:
    cron = record("c", cron="0 9 * * 1-5", every=None, timezone="Europe/Berlin", params=PAYLOAD)
    stored = await store.create_schedule(cron)
    assert stored == dataclasses.replace(cron, created_at=START, updated_at=START)
    assert await store.get_schedule("c") == stored
    assert await store.get_schedule("nope") is None
    every = await store.create_schedule(record("e", enabled=False, last_fire_at=START - 60))
    assert every.every == 60.0 and every.cron is None and not every.enabled
    assert every.last_fire_at == START - 60


async def test_create_an_existing_id(store: Store, clock: FakeClock) -> None:
    first = await store.create_schedule(record())
    fired = await store.fire_schedule("s1", START + 60, START + 60, START + 120, slot_run("s1", 60))
    assert fired is not None
    with pytest.raises(ScheduleExists, match="s1"):
        await store.create_schedule(record(params='{"a":2}'))
    assert (await store.get_schedule("s1")).params == '{"a":1}'  # type: ignore[union-attr]
    clock.advance(5)
    changed = record(params='{"a":2}', every=30.0, next_fire_at=START + 35, owner="other")
    replaced = await store.create_schedule(changed, replace=True)
    assert replaced == dataclasses.replace(
        changed,
        created_at=first.created_at,
        updated_at=START + 5,
        last_fire_at=START + 60,
        last_run_id=fired.run_id,
    )
    assert await store.get_schedule("s1") == replaced


async def test_list_schedules_by_id(store: Store) -> None:
    for schedule_id, workflow in [("b", "wf"), ("c", "other"), ("a", "wf")]:
        await store.create_schedule(record(schedule_id, workflow=workflow))
    assert [s.schedule_id for s in await store.list_schedules()] == ["a", "b", "c"]
    assert [s.schedule_id for s in await store.list_schedules(workflow="wf")] == ["a", "b"]
    assert await store.list_schedules(workflow="missing") == []


async def test_update_schedule(store: Store, clock: FakeClock) -> None:
    created = await store.create_schedule(record())
    clock.advance(1)
    paused = await store.update_schedule("s1", enabled=False)
    assert paused == dataclasses.replace(created, enabled=False, updated_at=START + 1)
    clock.advance(1)
    moved = await store.update_schedule("s1", enabled=True, next_fire_at=START + 500)
    assert moved.enabled and moved.next_fire_at == START + 500 and moved.params == '{"a":1}'
    repriced = await store.update_schedule("s1", params=PAYLOAD)
    assert repriced.params == PAYLOAD and repriced.next_fire_at == START + 500
    assert repriced.updated_at == START + 2 and repriced.created_at == START
    assert await store.update_schedule("s1") == repriced  # nothing to change
    assert await store.get_schedule("s1") == repriced
    with pytest.raises(ScheduleNotFound, match="nope"):
        await store.update_schedule("nope", enabled=False)


async def test_delete_schedule(store: Store) -> None:
    await store.create_schedule(record())
    assert await store.delete_schedule("s1") is True
    assert await store.delete_schedule("s1") is False
    assert await store.get_schedule("s1") is None
    assert await store.list_schedules() == []
    await store.create_schedule(record())  # the id is free again


# -- due schedules -------------------------------------------------------------------
async def test_due_schedules_and_next_schedule_at(store: Store, clock: FakeClock) -> None:
    assert await store.due_schedules(10) == [] and await store.next_schedule_at() is None
    await store.create_schedule(record("late", next_fire_at=START + 30))
    await store.create_schedule(record("b-early", next_fire_at=START + 10))
    await store.create_schedule(record("a-early", next_fire_at=START + 10))
    await store.create_schedule(record("paused", next_fire_at=START + 1, enabled=False))
    assert await store.next_schedule_at() == START + 10
    assert await store.due_schedules(10) == []
    clock.advance(10)  # due exactly at next_fire_at
    assert [s.schedule_id for s in await store.due_schedules(10)] == ["a-early", "b-early"]
    clock.advance(100)
    assert [s.schedule_id for s in await store.due_schedules(10)] == [
        "a-early",
        "b-early",
        "late",
    ]
    assert [s.schedule_id for s in await store.due_schedules(1)] == ["a-early"]
    await store.update_schedule("a-early", enabled=False)
    await store.update_schedule("b-early", next_fire_at=START + 500)
    assert [s.schedule_id for s in await store.due_schedules(10)] == ["late"]
    assert await store.next_schedule_at() == START + 30  # in the past: due now
    await store.update_schedule("paused", enabled=True)
    assert await store.next_schedule_at() == START + 1


# -- fire ------------------------------------------------------------------------------
async def test_fire_schedule_creates_the_run_and_moves_on(store: Store, clock: FakeClock) -> None:
    await store.create_schedule(record())
    clock.advance(61)
    waiter = asyncio.create_task(store.wait_for_work(["wf"], timeout=10))
    await asyncio.sleep(0.05)
    run = await store.fire_schedule("s1", START + 60, START + 60, START + 120, slot_run("s1", 60))
    assert run is not None and run.status is RunStatus.QUEUED and run.owner == "acme"
    assert run.idempotency_key == f"schedule:s1:{START + 60:.3f}"
    assert await store.get_run(run.run_id) == run
    await asyncio.wait_for(waiter, 5)  # claimers hear of the new run
    schedule = await store.get_schedule("s1")
    assert schedule is not None
    assert schedule.last_fire_at == START + 60 and schedule.next_fire_at == START + 120
    assert schedule.updated_at == START + 61
    assert await store.due_schedules(10) == []


async def test_fire_schedule_is_compare_and_set(store: Store, clock: FakeClock) -> None:
    await store.create_schedule(record())
    clock.advance(60)
    first = await store.fire_schedule("s1", START + 60, START + 60, START + 120, slot_run("s1", 60))
    assert first is not None
    # Another worker that read the same next_fire_at loses, and creates nothing.
    again = await store.fire_schedule(
        "s1", START + 60, START + 60, START + 120, slot_run("s1-other", 60)
    )
    assert again is None
    assert [r.run_id for r in await store.list_runs()] == [first.run_id]
    schedule = await store.get_schedule("s1")
    assert schedule is not None and schedule.next_fire_at == START + 120
    # Unknown, disabled, or a wrong expectation: None, nothing changes.
    assert await store.fire_schedule("nope", START, START, START + 1, slot_run("x", 0)) is None
    await store.update_schedule("s1", enabled=False)
    assert (
        await store.fire_schedule("s1", START + 120, START + 120, START + 180, slot_run("s1", 120))
        is None
    )
    await store.update_schedule("s1", enabled=True)
    assert (
        await store.fire_schedule("s1", START + 999, START + 120, START + 180, slot_run("s1", 120))
        is None
    )
    assert len(await store.list_runs()) == 1
    assert (await store.get_schedule("s1")).last_fire_at == START + 60  # type: ignore[union-attr]


async def test_fire_schedule_is_atomic(store: Store, clock: FakeClock) -> None:
    await store.create_schedule(record())
    # The slot's idempotency key is taken by a different request: the fire fails whole.
    await store.create_run(slot_run("s1", 60, params='{"a":"other"}'))
    with pytest.raises(IdempotencyConflict):
        await store.fire_schedule("s1", START + 60, START + 60, START + 120, slot_run("s1", 60))
    schedule = await store.get_schedule("s1")
    assert schedule is not None and schedule.next_fire_at == START + 60
    assert schedule.last_fire_at is None


async def test_threads_racing_to_fire_each_slot_once(store: Store) -> None:
    await store.create_schedule(record(next_fire_at=START))
    barrier = threading.Barrier(4)

    async def body(i: int) -> list[float]:
        barrier.wait(10)
        fired: list[float] = []
        while True:
            current = await store.get_schedule("s1")
            assert current is not None
            if current.next_fire_at >= START + 30:
                return fired
            slot = current.next_fire_at
            run = NewRun(
                run_id=f"t{i}-{slot}",
                workflow="wf",
                params="{}",
                idempotency_key=f"schedule:s1:{slot:.3f}",
            )
            if await store.fire_schedule("s1", slot, slot, slot + 1, run) is not None:
                fired.append(slot)

    counts = Counter(slot for fired in await in_threads(4, body) for slot in fired)
    assert counts == Counter({START + n: 1 for n in range(30)})
    assert len(await store.list_runs(limit=100)) == 30


# -- overlap policy, last run, skipping a slot ------------------------------------------
async def test_overlap_is_stored_and_returned(store: Store) -> None:
    skip = await store.create_schedule(record("skip", overlap="skip"))
    default = await store.create_schedule(record("default"))
    assert (skip.overlap, default.overlap) == ("skip", "allow_all")
    assert skip.last_run_id is None and default.last_run_id is None
    assert (await store.get_schedule("skip")) == skip
    assert [s.overlap for s in await store.list_schedules()] == ["allow_all", "skip"]
    # A replace takes the new definition's policy, either way.
    back = await store.create_schedule(record("skip", overlap="allow_all"), replace=True)
    assert back.overlap == "allow_all" and (await store.get_schedule("skip")) == back
    again = await store.create_schedule(record("skip", overlap="skip"), replace=True)
    assert again.overlap == "skip"
    await store.update_schedule("skip", enabled=False, params='{"a":2}')
    assert (await store.get_schedule("skip")).overlap == "skip"  # type: ignore[union-attr]


async def test_a_new_schedule_takes_the_given_last_run_id(store: Store) -> None:
    created = await store.create_schedule(record(last_run_id="earlier"))
    assert created.last_run_id == "earlier"
    assert (await store.get_schedule("s1")) == created


async def test_fire_records_the_run_that_holds_the_slot(store: Store, clock: FakeClock) -> None:
    await store.create_schedule(record(overlap="skip"))
    clock.advance(60)
    run = await store.fire_schedule("s1", START + 60, START + 60, START + 120, slot_run("s1", 60))
    assert run is not None and run.run_id == "s1@60"
    schedule = await store.get_schedule("s1")
    assert schedule is not None and schedule.last_run_id == "s1@60"
    assert schedule.overlap == "skip"  # a fire keeps the definition
    # A slot whose key an earlier run holds (a replayed fire): that run holds the slot.
    clock.advance(60)
    held = await store.create_run(slot_run("s1", 120, params='{"a":1}'))
    replay = dataclasses.replace(slot_run("s1", 120), run_id="another-id")
    again = await store.fire_schedule("s1", START + 120, START + 120, START + 180, replay)
    assert again is not None and again.run_id == held[0].run_id == "s1@120"
    assert (await store.get_schedule("s1")).last_run_id == "s1@120"  # type: ignore[union-attr]
    # A replace keeps it, as it keeps last_fire_at.
    replaced = await store.create_schedule(record(overlap="allow_all"), replace=True)
    assert (replaced.last_run_id, replaced.last_fire_at) == ("s1@120", START + 120)
    assert (await store.get_schedule("s1")) == replaced


async def test_fire_without_a_run_skips_the_slot(store: Store, clock: FakeClock) -> None:
    await store.create_schedule(record(overlap="skip"))
    clock.advance(60)
    fired = await store.fire_schedule("s1", START + 60, START + 60, START + 120, slot_run("s1", 60))
    assert fired is not None
    before = await store.get_schedule("s1")
    assert before is not None
    clock.advance(60)
    skipped = await store.fire_schedule("s1", START + 120, START + 120, START + 180, None)
    assert skipped is None
    after = await store.get_schedule("s1")
    # Only next_fire_at moved (and updated_at, as with any fire).
    assert after == dataclasses.replace(before, next_fire_at=START + 180, updated_at=START + 120)
    assert after.last_fire_at == START + 60 and after.last_run_id == "s1@60"
    assert [r.run_id for r in await store.list_runs()] == ["s1@60"]  # no run
    assert await store.due_schedules(10) == [] and await store.next_schedule_at() == START + 180


async def test_skipping_a_slot_is_compare_and_set(store: Store, clock: FakeClock) -> None:
    await store.create_schedule(record(overlap="skip"))
    clock.advance(60)
    created = await store.get_schedule("s1")
    # A stale expectation, an unknown id or a paused schedule: nothing changes.
    assert await store.fire_schedule("s1", START + 999, START + 60, START + 120, None) is None
    assert await store.fire_schedule("nope", START + 60, START + 60, START + 120, None) is None
    assert (await store.get_schedule("s1")) == created
    await store.update_schedule("s1", enabled=False)
    paused = await store.get_schedule("s1")
    assert await store.fire_schedule("s1", START + 60, START + 60, START + 120, None) is None
    assert (await store.get_schedule("s1")) == paused
    await store.update_schedule("s1", enabled=True)
    # One worker skips the slot; another that read the same next_fire_at fires nothing.
    assert await store.fire_schedule("s1", START + 60, START + 60, START + 120, None) is None
    late = await store.fire_schedule("s1", START + 60, START + 60, START + 120, slot_run("s1", 60))
    assert late is None and await store.list_runs() == []
    schedule = await store.get_schedule("s1")
    assert schedule is not None and schedule.next_fire_at == START + 120
    assert schedule.last_fire_at is None and schedule.last_run_id is None
    # ...and the other way round: a fired slot cannot be skipped again.
    clock.advance(60)
    run = await store.fire_schedule(
        "s1", START + 120, START + 120, START + 180, slot_run("s1", 120)
    )
    assert run is not None
    assert await store.fire_schedule("s1", START + 120, START + 120, START + 180, None) is None
    schedule = await store.get_schedule("s1")
    assert schedule is not None and schedule.next_fire_at == START + 180
    assert (schedule.last_fire_at, schedule.last_run_id) == (START + 120, "s1@120")


# -- the blocking API (seed usage: store.schedule_create(...)) ---------------------------
def exercise_blocking_api(store: Store, clock: FakeClock) -> None:
    admin = store  # every store mixes in ScheduleAdmin
    schedule = Schedule.create(
        "wf", every=60, params={"a": 1}, schedule_id="nightly", overlap="skip"
    )
    created = admin.schedule_create(schedule)  # type: ignore[attr-defined]
    assert created.schedule_id == "nightly" and created.next_fire_at == START + 60
    assert created.overlap == "skip"
    with pytest.raises(ScheduleExists):
        admin.schedule_create(schedule)  # type: ignore[attr-defined]
    clock.advance(10)
    replaced = admin.schedule_create(schedule, replace=True)  # type: ignore[attr-defined]
    assert replaced.next_fire_at == START + 70 and replaced.created_at == START
    assert [s.schedule_id for s in admin.schedule_list()] == ["nightly"]  # type: ignore[attr-defined]
    assert admin.schedule_list(workflow="other") == []  # type: ignore[attr-defined]
    assert admin.schedule_get("nightly") == replaced  # type: ignore[attr-defined]
    paused = admin.schedule_update("nightly", enabled=False)  # type: ignore[attr-defined]
    assert not paused.enabled
    clock.advance(1000)
    resumed = admin.schedule_update("nightly", enabled=True)  # type: ignore[attr-defined]
    assert resumed.enabled and resumed.next_fire_at == START + 1070  # no backfill
    changed = admin.schedule_update("nightly", params={"a": 2})  # type: ignore[attr-defined]
    assert decode(changed.params) == {"a": 2}
    with pytest.raises(ScheduleNotFound):
        admin.schedule_update("nope", enabled=False)  # type: ignore[attr-defined]
    assert admin.schedule_delete("nightly") is True  # type: ignore[attr-defined]
    assert admin.schedule_get("nightly") is None  # type: ignore[attr-defined]


def test_blocking_api_without_an_event_loop(
    request: pytest.FixtureRequest, store_kind: str, clock: FakeClock
) -> None:
    store = BUILDERS[store_kind](request, clock)
    try:
        exercise_blocking_api(store, clock)
    finally:
        asyncio.run(store.close())


async def test_blocking_api_inside_a_running_event_loop(store: Store, clock: FakeClock) -> None:
    exercise_blocking_api(store, clock)
    assert await store.list_schedules() == []  # the async API sees the same store
