"""A schedule's overlap policy with a real worker, on each store: a run that takes longer
than the period. ``overlap="skip"`` skips the slots that come due while the last run has
not ended (and logs each), so no two runs overlap in time; ``"allow_all"`` starts one run
per slot, as before, and they overlap."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging

import pytest

from pyrula.workflows import RunRecord, Store, WorkflowContext, workflow
from pyrula.workflows.registry import Registry, WorkflowDefinition
from pyrula.workflows.schedules import Schedule
from tests.conftest import StartWorker

PERIOD = 0.5
"""Seconds between slots: under Schedule.create's one-second floor, so the record is written
to the store directly (the loop fires any finite period)."""
WORK = 1.3
"""Seconds each run takes: longer than two periods."""
WATCH = 3.0
"""Seconds the schedule is left to fire."""


def slow(registry: Registry) -> WorkflowDefinition:
    async def work() -> str:
        await asyncio.sleep(WORK)
        return "done"

    @workflow(registry=registry)
    async def slow_report(ctx: WorkflowContext) -> str:
        return str(await ctx.step("work", work))

    return slow_report


async def run_schedule(
    store: Store, registry: Registry, start_worker: StartWorker, overlap: str
) -> list[RunRecord]:
    """Every run of a PERIOD schedule of a WORK-long workflow left to fire for WATCH
    seconds, each once it ended, by start time."""
    definition = slow(registry)
    schedule = Schedule.create(definition, every=1, schedule_id="slow", overlap=overlap)
    now = await store.now()
    record = dataclasses.replace(schedule.to_record(now), every=PERIOD, next_fire_at=now + 0.1)
    await store.create_schedule(record)
    await start_worker(store, [definition], schedule_poll_interval=0.05)
    await asyncio.sleep(WATCH)
    assert await store.delete_schedule("slow")
    runs = await store.list_runs(workflow=definition.name, limit=1000)
    ended = [await store.wait_run(run.run_id, 10) for run in runs]
    assert all(run is not None and run.result == '"done"' for run in ended), ended
    return sorted((run for run in ended if run is not None), key=lambda r: r.started_at or 0)


async def test_skip_never_overlaps_and_logs_the_skipped_slots(
    engine_store: Store,
    registry: Registry,
    start_worker: StartWorker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="pyrula.workflows.worker"):
        runs = await run_schedule(engine_store, registry, start_worker, "skip")
    assert 2 <= len(runs) <= 3, [(r.started_at, r.finished_at) for r in runs]
    for earlier, later in itertools.pairwise(runs):
        assert earlier.finished_at is not None and later.started_at is not None
        assert later.created_at >= earlier.finished_at  # fired only once the last one ended
        assert later.started_at >= earlier.finished_at
    skipped = [m for m in caplog.messages if m.startswith("schedule slow skipped slot")]
    assert len(skipped) >= 2, caplog.messages
    run_ids = {run.run_id for run in runs}
    for message in skipped:
        previous = message.split("its previous run ", 1)[1].split(" ", 1)[0]
        assert previous in run_ids and message.endswith(("is still queued", "is still running"))


async def test_allow_all_starts_a_run_per_slot_and_they_overlap(
    engine_store: Store,
    registry: Registry,
    start_worker: StartWorker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="pyrula.workflows.worker"):
        runs = await run_schedule(engine_store, registry, start_worker, "allow_all")
    assert len(runs) >= 5, [(r.started_at, r.finished_at) for r in runs]  # ~6 slots in 3 s
    overlapping = [
        (earlier.run_id, later.run_id)
        for earlier, later in itertools.pairwise(runs)
        if later.started_at is not None
        and earlier.finished_at is not None
        and later.started_at < earlier.finished_at
    ]
    assert len(overlapping) >= 4
    assert not [m for m in caplog.messages if "skipped slot" in m]
