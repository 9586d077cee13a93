"""The overlap policy of a schedule: the values Schedule.create accepts, their round trip
through a record, and what the engine's fire does with "skip" (on a MemoryStore whose
clock moves only when told to)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from pyrula.workflows import MemoryStore, RunStatus, WorkflowWorker
from pyrula.workflows.errors import InvalidSchedule
from pyrula.workflows.loops import fire
from pyrula.workflows.records import ScheduleRecord, Wait
from pyrula.workflows.registry import Registry
from pyrula.workflows.schedules import (
    OVERLAP_ALLOW_ALL,
    OVERLAP_POLICIES,
    OVERLAP_SKIP,
    Schedule,
)
from tests.stores.conftest import START, FakeClock


def test_the_allowed_values() -> None:
    assert OVERLAP_POLICIES == ("allow_all", "skip") == (OVERLAP_ALLOW_ALL, OVERLAP_SKIP)


def test_the_default_fires_every_slot() -> None:
    schedule = Schedule.create("tick", every=60)
    assert schedule.overlap == "allow_all"
    assert schedule.to_record(START).overlap == "allow_all"
    assert Schedule.create("tick", "0 * * * *").overlap == "allow_all"


@pytest.mark.parametrize("overlap", OVERLAP_POLICIES)
def test_each_value_round_trips_through_a_record(overlap: str) -> None:
    schedule = Schedule.create("tick", every=60, schedule_id="s", overlap=overlap)
    record = schedule.to_record(START)
    assert record.overlap == overlap and record.last_run_id is None
    assert Schedule.from_record(record) == schedule


@pytest.mark.parametrize("overlap", ["", "SKIP", "buffer_one", "allow-all", None, 1, True])
def test_anything_else_is_refused_naming_the_allowed_values(overlap: Any) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        Schedule.create("tick", every=60, overlap=overlap)
    assert str(caught.value) == (
        f"unknown overlap policy {overlap!r}; use one of 'allow_all', 'skip'"
    )


def test_the_overlap_does_not_change_the_derived_id() -> None:
    """Like the owner: changing the policy replaces the schedule, it makes no second one."""
    assert (
        Schedule.create("tick", every=60).schedule_id
        == Schedule.create("tick", every=60, overlap="skip").schedule_id
    )


# -- the engine's fire -----------------------------------------------------------------------
@pytest.fixture
async def store(clock: FakeClock) -> MemoryStore:
    built = MemoryStore(clock=clock)
    await built.open()
    return built


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def worker_on(store: MemoryStore) -> WorkflowWorker:
    return WorkflowWorker(store=store, workflows=[], registry=Registry())


async def move_on(store: MemoryStore, run_id: str, status: RunStatus) -> None:
    """Take the run, through the store's own operations, from the status before
    ``status`` in ``UNDER_WAY`` (or from queued) to ``status``."""
    if status is RunStatus.RUNNING:
        await store.claim_runs("w", ["tick"], 1, FOREVER)
    elif status is RunStatus.WAITING:
        running = await store.get_run(run_id)
        assert running is not None
        assert await store.suspend_run(run_id, running.lease_token, Wait(signal="go"))
    elif status is RunStatus.SLEEPING:
        await store.send_signal(run_id, "go", "null")  # queued again
        [lease] = await store.claim_runs("w", ["tick"], 1, FOREVER)
        now = await store.now()
        assert await store.suspend_run(run_id, lease.token, Wait(wake_at=now + FOREVER))
    elif status is RunStatus.CANCELLED:
        await store.cancel_run(run_id)
    run = await store.get_run(run_id)
    assert run is not None and run.status is status


FOREVER = 1e9
UNDER_WAY = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.SLEEPING)


async def due(store: MemoryStore, clock: FakeClock, schedule_id: str) -> ScheduleRecord:
    record = await store.get_schedule(schedule_id)
    assert record is not None
    clock.set(record.next_fire_at)
    return record


async def test_skip_skips_while_the_last_run_has_not_ended(
    store: MemoryStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    worker = worker_on(store)
    store.schedule_create(Schedule.create("tick", every=60, schedule_id="s", overlap="skip"))
    await fire(worker, await due(store, clock, "s"))  # no last run: fires
    [first] = await store.list_runs()
    assert (await store.get_schedule("s")).last_run_id == first.run_id  # type: ignore[union-attr]
    for status in UNDER_WAY:
        await move_on(store, first.run_id, status)
        record = await due(store, clock, "s")
        with caplog.at_level(logging.INFO, logger="pyrula.workflows.worker"):
            await fire(worker, record)
        assert [r.run_id for r in await store.list_runs()] == [first.run_id], status
        after = await store.get_schedule("s")
        assert after is not None and after.next_fire_at == record.next_fire_at + 60
        assert after.last_fire_at == START + 60 and after.last_run_id == first.run_id
        assert (
            f"schedule s skipped slot {record.next_fire_at:.0f}: its previous run "
            f"{first.run_id} is still {status.value}"
        ) in caplog.text
    # It ended: the next slot fires.
    await move_on(store, first.run_id, RunStatus.CANCELLED)
    record = await due(store, clock, "s")
    await fire(worker, record)
    runs = await store.list_runs()
    assert len(runs) == 2
    second = next(r for r in runs if r.run_id != first.run_id)
    after = await store.get_schedule("s")
    assert after is not None and after.last_run_id == second.run_id
    assert after.last_fire_at == record.next_fire_at


async def test_a_last_run_that_no_longer_exists_has_ended(
    store: MemoryStore, clock: FakeClock
) -> None:
    schedule = Schedule.create("tick", every=60, schedule_id="s", overlap="skip")
    stored = dataclasses.replace(schedule.to_record(START), last_run_id="purged")
    record = await store.create_schedule(stored)
    assert record.last_run_id == "purged" and await store.get_run("purged") is None
    clock.set(record.next_fire_at)
    await fire(worker_on(store), record)
    [run] = await store.list_runs()
    assert (await store.get_schedule("s")).last_run_id == run.run_id  # type: ignore[union-attr]


async def test_allow_all_fires_whatever_the_last_run_is_doing(
    store: MemoryStore, clock: FakeClock
) -> None:
    worker = worker_on(store)
    store.schedule_create(Schedule.create("tick", every=60, schedule_id="s"))
    for _ in range(3):
        await fire(worker, await due(store, clock, "s"))  # the runs stay queued
    runs = await store.list_runs()
    assert len(runs) == 3 and {r.status for r in runs} == {RunStatus.QUEUED}


async def test_a_record_with_an_unknown_policy_is_paused(
    store: MemoryStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Written to the store directly, bypassing Schedule.create: the loop pauses it."""
    record = await store.create_schedule(
        ScheduleRecord(
            schedule_id="odd",
            workflow="tick",
            params="{}",
            cron=None,
            every=60.0,
            timezone="UTC",
            enabled=True,
            next_fire_at=START,
            overlap="buffer_one",
        )
    )
    with caplog.at_level(logging.ERROR, logger="pyrula.workflows.worker"):
        await fire(worker_on(store), record)
    assert (await store.get_schedule("odd")).enabled is False  # type: ignore[union-attr]
    assert await store.list_runs() == []
    assert "unknown overlap policy 'buffer_one'" in caplog.text
