"""The worker's schedule loop on each store: interval fires, no backfill, pause and resume,
records it cannot compute, and the blocking ``store.schedule_*`` API."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from pyrula.workflows import RunRecord, Store, WorkflowContext, workflow
from pyrula.workflows.records import ScheduleRecord
from pyrula.workflows.registry import Registry, WorkflowDefinition
from pyrula.workflows.schedules import Schedule
from tests.conftest import Eventually, StartWorker

SCHEDULE_FAST = {"schedule_poll_interval": 0.05}


def ticker(registry: Registry) -> WorkflowDefinition:
    @workflow(registry=registry)
    async def tick(ctx: WorkflowContext, label: str = "") -> str:
        return label

    return tick


async def fired(store: Store, workflow_name: str) -> list[RunRecord]:
    runs = await store.list_runs(workflow=workflow_name, limit=10_000)
    return sorted(runs, key=lambda r: r.created_at)


def slot_of(run: RunRecord, schedule_id: str) -> float:
    prefix = f"schedule:{schedule_id}:"
    assert run.idempotency_key is not None and run.idempotency_key.startswith(prefix)
    return float(run.idempotency_key[len(prefix) :])


async def test_an_interval_of_one_second_fires_once_a_second(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    tick = ticker(registry)
    schedule = Schedule.create(tick, every=timedelta(seconds=1), params={"label": "x"})
    record = engine_store.schedule_create(schedule)
    assert record.next_fire_at > await engine_store.now()
    first = record.next_fire_at - 1  # due now: the test needs two periods, not three
    await engine_store.update_schedule(schedule.schedule_id, next_fire_at=first)
    await start_worker(engine_store, [tick], **SCHEDULE_FAST)

    async def three() -> bool:
        return len(await fired(engine_store, tick.name)) >= 3

    await eventually(three, timeout=8, what="three fires")
    runs = (await fired(engine_store, tick.name))[:3]
    slots = [slot_of(run, schedule.schedule_id) for run in runs]
    assert slots == pytest.approx([first, first + 1, first + 2], abs=1e-3)  # one per slot
    for run, slot in zip(runs, slots, strict=True):
        # Never before its slot. How late is the machine's load: a fire later than the
        # next slot would have skipped one, which the slots above rule out.
        assert slot - 1e-3 <= run.created_at
        assert run.params == '{"label":"x"}'
    for run in runs:
        assert await engine_store.wait_run(run.run_id, 5) is not None
    assert [(await engine_store.get_run(r.run_id)).result for r in runs] == ['"x"'] * 3  # type: ignore[union-attr]


async def test_a_schedule_an_hour_behind_fires_once_not_sixty_times(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    tick = ticker(registry)
    schedule = Schedule.create(tick, every=timedelta(minutes=1), schedule_id="minutely")
    created = engine_store.schedule_create(schedule)
    behind = created.next_fire_at - 3600
    await engine_store.update_schedule("minutely", next_fire_at=behind)
    cron = Schedule.create(tick, "* * * * *", {"label": "cron"}, schedule_id="cron-minutely")
    cron_created = engine_store.schedule_create(cron)
    await engine_store.update_schedule(
        "cron-minutely", next_fire_at=cron_created.next_fire_at - 3600
    )

    started = await engine_store.now()
    await start_worker(engine_store, [tick], **SCHEDULE_FAST)

    async def both_fired() -> bool:
        return len(await fired(engine_store, tick.name)) >= 2

    await eventually(both_fired, timeout=5, what="a fire of each schedule")
    await asyncio.sleep(0.5)  # many loop ticks: any backfill would show now
    # One catch-up fire per schedule for the hour it missed. A slot that falls due while the
    # test runs (it can straddle a minute boundary) fires on time and is not a backfill.
    runs = await fired(engine_store, tick.name)
    keys = [r.idempotency_key for r in runs]
    caught_up = {
        sid: [r for r in runs if (r.idempotency_key or "").startswith(f"schedule:{sid}:")]
        for sid in ("minutely", "cron-minutely")
    }
    for sid, its_runs in caught_up.items():
        missed = [r for r in its_runs if slot_of(r, sid) < started]
        assert len(missed) <= 1 and 1 <= len(its_runs) <= 2, keys
    now = await engine_store.now()

    interval = await engine_store.get_schedule("minutely")
    assert interval is not None and interval.last_fire_at is not None
    assert now - 60 < interval.last_fire_at <= now  # the latest slot that passed
    assert (interval.last_fire_at - behind) % 60 == 0  # on the schedule's grid
    assert interval.next_fire_at == interval.last_fire_at + 60 > now

    minute = await engine_store.get_schedule("cron-minutely")
    assert minute is not None and minute.last_fire_at is not None
    assert minute.last_fire_at % 60 == 0 and now - 60 < minute.last_fire_at <= now
    assert minute.next_fire_at == minute.last_fire_at + 60 > now


async def test_pause_stops_fires_and_resume_does_not_backfill(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    tick = ticker(registry)
    sid = engine_store.schedule_create(Schedule.create(tick, every=1, schedule_id="p")).schedule_id
    await engine_store.update_schedule(sid, next_fire_at=await engine_store.now())
    await start_worker(engine_store, [tick], **SCHEDULE_FAST)

    async def count() -> int:
        return len(await fired(engine_store, tick.name))

    await eventually(lambda: _at_least(count, 1), timeout=5, what="the first fire")
    paused = engine_store.schedule_update(sid, enabled=False)
    assert paused.enabled is False
    before = await count()
    # Due long ago while paused: a paused schedule must still not fire.
    await engine_store.update_schedule(sid, next_fire_at=await engine_store.now() - 600)
    await asyncio.sleep(0.4)
    assert await count() == before
    assert [r.schedule_id for r in engine_store.schedule_list()] == [sid]

    resumed = engine_store.schedule_update(sid, enabled=True)
    now = await engine_store.now()
    assert resumed.enabled and now < resumed.next_fire_at <= now + 1  # no backfill
    await asyncio.sleep(0.2)
    assert await count() == before  # resuming does not fire the paused slots
    await eventually(lambda: _at_least(count, before + 1), timeout=5, what="a fire after resume")
    latest = (await fired(engine_store, tick.name))[-1]
    assert slot_of(latest, sid) == pytest.approx(resumed.next_fire_at, abs=1e-3)


async def _at_least(count: object, n: int) -> bool:
    assert callable(count)
    return bool(await count() >= n)


async def test_the_loop_pauses_records_it_cannot_compute_and_fires_the_others(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    tick = ticker(registry)
    now = await engine_store.now()
    broken = {
        "garbage-cron": {"cron": "every tuesday", "every": None},
        "out-of-range": {"cron": "61 * * * *", "every": None},
        "never-fires": {"cron": "0 0 30 2 *", "every": None},
        "bad-timezone": {"cron": "* * * * *", "every": None, "timezone": "Mars/Olympus"},
        "zero-interval": {"cron": None, "every": 0.0},
        "negative-interval": {"cron": None, "every": -5.0},
        "nan-interval": {"cron": None, "every": float("nan")},
        "no-timing": {"cron": None, "every": None},
        "bad-params": {"cron": None, "every": 1.0, "params": "{not json"},
    }
    for sid, fields in broken.items():
        await engine_store.create_schedule(
            ScheduleRecord(
                schedule_id=sid,
                workflow=tick.name,
                params=str(fields.get("params", "{}")),
                cron=fields["cron"],  # type: ignore[arg-type]
                every=fields["every"],  # type: ignore[arg-type]
                timezone=str(fields.get("timezone", "UTC")),
                enabled=True,
                next_fire_at=now - 10,
            )
        )
    engine_store.schedule_create(Schedule.create(tick, every=1, schedule_id="good"))
    # Due after every broken record: a loop that died on one of them never gets here.
    await engine_store.update_schedule("good", next_fire_at=now - 5)
    await start_worker(engine_store, [tick], **SCHEDULE_FAST)

    async def good_fired() -> bool:
        runs = await fired(engine_store, tick.name)
        return any(slot_of_any(r) == "good" for r in runs)

    await eventually(good_fired, timeout=5, what="a fire of the good schedule")
    for sid in broken:
        record = await engine_store.get_schedule(sid)
        assert record is not None
        assert record.enabled is False, f"{sid} was not paused"
    others = [r for r in await fired(engine_store, tick.name) if slot_of_any(r) != "good"]
    assert [r.idempotency_key for r in others] == []  # paused before firing, never a runaway


def slot_of_any(run: RunRecord) -> str:
    assert run.idempotency_key is not None
    return run.idempotency_key.split(":")[1]


async def test_the_blocking_schedule_api_round_trips(
    engine_store: Store, registry: Registry
) -> None:
    tick = ticker(registry)
    schedule = Schedule.create(tick, "0 3 * * *", {"label": "nightly"}, timezone="Europe/Paris")
    created = engine_store.schedule_create(schedule)
    assert created.next_fire_at > await engine_store.now()
    assert engine_store.schedule_get(schedule.schedule_id) == created
    assert [r.schedule_id for r in engine_store.schedule_list(workflow=tick.name)] == [
        schedule.schedule_id
    ]
    assert engine_store.schedule_list(workflow="other") == []
    updated = engine_store.schedule_update(schedule.schedule_id, params={"label": "changed"})
    assert updated.params == '{"label":"changed"}'
    assert engine_store.schedule_delete(schedule.schedule_id) is True
    assert engine_store.schedule_delete(schedule.schedule_id) is False
    assert engine_store.schedule_get(schedule.schedule_id) is None
