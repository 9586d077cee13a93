"""Schedules: cron and interval schedules kept in the store and fired by workers.

    python examples/schedules.py

1. Manage schedules with the store's blocking API, as a deploy script would.
2. The DST rule, shown on Europe/Paris slots around both clock changes.
3. In WorkflowTestEnv: a nightly schedule over three virtual days, and the no-backfill
   rule after an hour of "downtime".
4. Two real workers and a scheduler-only process (``run_schedules``, what ``pyrula
   beat`` runs), threads on one SQLite file, fire each slot of a 1-second interval
   schedule exactly once; the workers run them.
See docs/schedules.md.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
import threading
import time
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from pyrula.workflows import (
    RunStatus,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    open_store,
    workflow,
)
from pyrula.workflows.errors import InvalidSchedule, ScheduleExists
from pyrula.workflows.schedules import Schedule
from pyrula.workflows.testing import WorkflowTestEnv


@workflow(name="nightly_report")
async def nightly_report(ctx: WorkflowContext, window: str) -> str:
    return await ctx.step("build", lambda: f"report over {window}")  # type: ignore[no-any-return]


@workflow(name="heartbeat")
async def heartbeat(ctx: WorkflowContext) -> str:
    return "ok"


def manage(path: str) -> None:
    store = open_store(f"sqlite:///{path}")
    # Keep the id fixed: re-running this deploy step must find the same schedule.
    nightly = Schedule.create(
        "nightly_report",
        "0 2 * * *",
        {"window": "24h"},
        schedule_id="nightly-report",
        timezone="Europe/Paris",
    )
    store.schedule_create(nightly, replace=True)  # idempotent: safe on every deploy
    try:
        store.schedule_create(nightly)
        raise AssertionError("expected ScheduleExists")
    except ScheduleExists as exc:
        print("exists:", exc)
    every_5_min = Schedule.create(heartbeat, every=timedelta(minutes=5), schedule_id="heartbeat")
    store.schedule_create(every_5_min)

    for record in store.schedule_list():
        nxt = datetime.fromtimestamp(record.next_fire_at, ZoneInfo(record.timezone))
        print(f"{record.schedule_id}: {record.cron or record.every} next {nxt.isoformat()}")

    paused = store.schedule_update("nightly-report", enabled=False)
    assert not paused.enabled
    resumed = store.schedule_update("nightly-report", enabled=True)  # from the next slot
    assert resumed.enabled and resumed.next_fire_at > time.time()
    assert store.schedule_delete("heartbeat") is True
    assert [r.schedule_id for r in store.schedule_list()] == ["nightly-report"]

    # A bad expression fails here, never at fire time.
    for cron in ("", "* * * *", "*/0 * * * *", "0 0 30 2 *", "61 * * * *"):
        try:
            Schedule.create("nightly_report", cron, {"window": "24h"})
            raise AssertionError(f"{cron!r} was accepted")
        except InvalidSchedule as exc:
            print("invalid:", exc)
    asyncio.run(store.close())


def slots(cron: str, start: datetime, count: int) -> list[str]:
    """The next ``count`` slots of ``cron`` after ``start``, as Paris wall-clock times."""
    schedule = Schedule.create("nightly_report", cron, timezone="Europe/Paris")
    moment, found = start.timestamp(), []
    for _ in range(count):
        moment = schedule.next_slot_after(moment)
        found.append(datetime.fromtimestamp(moment, start.tzinfo).strftime("%d %H:%M%z"))
    return found


def dst_rule() -> None:
    paris = ZoneInfo("Europe/Paris")
    # 27 Oct 2024: at 03:00 CEST clocks go back to 02:00 CET; 02:30 happens twice.
    fall_back = slots("30 2 * * *", datetime(2024, 10, 26, 12, tzinfo=paris), 3)
    print("fall back:", fall_back)
    assert fall_back == ["27 02:30+0200", "28 02:30+0100", "29 02:30+0100"]  # once, not twice
    # 31 Mar 2024: at 02:00 CET clocks jump to 03:00 CEST; 02:30 does not exist.
    spring = slots("30 2 * * *", datetime(2024, 3, 30, 12, tzinfo=paris), 3)
    print("spring forward:", spring)
    assert spring == ["31 03:00+0200", "01 02:30+0200", "02 02:30+0200"]  # once, after the gap
    # An hourly cron skips the repeated hour: slots follow the wall clock, not elapsed time.
    hourly = slots("0 * * * *", datetime(2024, 10, 27, 0, 30, tzinfo=paris), 4)
    assert hourly == ["27 01:00+0200", "27 02:00+0200", "27 03:00+0100", "27 04:00+0100"]


async def virtual_days() -> None:
    async with WorkflowTestEnv(workflows=[nightly_report, heartbeat]) as env:
        env.store.schedule_create(
            Schedule.create(nightly_report, "0 2 * * *", {"window": "24h"}, schedule_id="n")
        )
        await env.advance(timedelta(days=3))
        runs = await env.store.list_runs(workflow="nightly_report", status=RunStatus.COMPLETED)
        print("nightly runs in 3 virtual days:", len(runs))
        assert len(runs) == 3

        env.store.schedule_create(
            Schedule.create(heartbeat, every=timedelta(minutes=1), schedule_id="hb")
        )
        await env.advance(timedelta(minutes=1))
        assert len(await env.store.list_runs(workflow="heartbeat")) == 1
        # An hour passes with no worker looking: 60 slots are missed...
        env.clock.set(env.clock() + 3600)
        await env.advance(0)
        # ...and the schedule fires once, not 60 times, then goes on from the next slot.
        assert len(await env.store.list_runs(workflow="heartbeat")) == 2
        [record] = env.store.schedule_list(workflow="heartbeat")
        assert env.clock() < record.next_fire_at <= env.clock() + 60


def two_workers(path: str) -> None:
    store = open_store(f"sqlite:///{path}")
    options = WorkerOptions(claim_poll_interval=0.05, schedule_poll_interval=0.5)
    workers = [WorkflowWorker(store=store, workflows=[heartbeat], options=options) for _ in "ab"]
    # A scheduler-only process as `pyrula beat` runs one: it fires, the workers run.
    scheduler = WorkflowWorker(store=store, workflows=[heartbeat], options=options)
    threads = [threading.Thread(target=asyncio.run, args=(w.run(),), daemon=True) for w in workers]
    threads.append(threading.Thread(target=asyncio.run, args=(scheduler.run_schedules(),)))
    store.schedule_create(Schedule.create(heartbeat, every=1, schedule_id="every-second"))
    for thread in threads:
        thread.start()
    time.sleep(4.5)
    for worker in [*workers, scheduler]:
        worker.stop()
    for thread in threads:
        thread.join(timeout=30)
    runs: list[Any] = asyncio.run(store.list_runs(workflow="heartbeat"))
    asyncio.run(store.close())
    # Each run's idempotency key names its schedule and slot: schedule:<id>:<slot>.
    fired = sorted(float(run.idempotency_key.rsplit(":", 1)[1]) for run in runs)
    gaps = [round(later - earlier, 3) for earlier, later in itertools.pairwise(fired)]
    print(f"{len(runs)} runs from 2 workers and a scheduler; seconds between slots: {gaps}")
    assert len(runs) >= 3
    oldest_first = sorted(runs, key=lambda run: run.created_at)
    assert all(run.status is RunStatus.COMPLETED for run in oldest_first[:-1])  # the last
    # slot's run may have been fired just before the workers stopped
    # One run per slot: no slot fired twice (a worker stalled for over a second would
    # skip a slot rather than backfill it, hence whole seconds rather than exactly 1).
    assert all(gap >= 1 and gap == int(gap) for gap in gaps)


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        manage(f"{directory}/manage.db")
        dst_rule()
        asyncio.run(virtual_days())
        two_workers(f"{directory}/workers.db")


if __name__ == "__main__":
    main()
