"""Overlapping runs: a schedule's ``overlap`` policy, when a run outlasts the period.

    python examples/schedule_overlap.py

In WorkflowTestEnv (virtual time), a one-minute schedule runs a workflow that takes two
and a half minutes (it sleeps, so it holds no worker meanwhile), for ten minutes:

1. ``overlap="skip"``: a slot that comes due while the last run has not ended starts no
   run (the worker logs the skip); never two runs at once.
2. ``overlap="allow_all"`` (the default): every slot starts a run, up to three at once.
3. Any other value is refused by ``Schedule.create``.
See docs/schedules.md#overlapping-runs.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from pyrula.workflows import RunRecord, WorkflowContext, workflow
from pyrula.workflows.errors import InvalidSchedule
from pyrula.workflows.schedules import OVERLAP_POLICIES, Schedule
from pyrula.workflows.testing import WorkflowTestEnv


@workflow(name="sync_inventory")
async def sync_inventory(ctx: WorkflowContext) -> str:
    await ctx.sleep(150)  # longer than the schedule's period: 2.5 slots
    return "synced"


class Skips(logging.Handler):
    """Keeps the worker's "skipped slot" lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "skipped slot" in record.getMessage():
            self.lines.append(record.getMessage())


def most_at_once(runs: list[RunRecord], end: float) -> int:
    """The most runs that were not ended at one moment (a run not ended yet: until end)."""
    edges = [(run.created_at, 1) for run in runs]
    edges += [(run.finished_at if run.finished_at is not None else end, -1) for run in runs]
    most = current = 0
    for _, step in sorted(edges):  # an end before a start at the same moment
        current += step
        most = max(most, current)
    return most


async def ten_minutes(overlap: str) -> tuple[list[RunRecord], int, list[str]]:
    skips = Skips()
    logger = logging.getLogger("pyrula.workflows.worker")
    logger.addHandler(skips)
    logger.setLevel(logging.INFO)
    try:
        async with WorkflowTestEnv(workflows=[sync_inventory]) as env:
            env.store.schedule_create(
                Schedule.create(
                    sync_inventory, every=timedelta(minutes=1), schedule_id="sync", overlap=overlap
                )
            )
            await env.advance(timedelta(minutes=10))
            runs = await env.store.list_runs(workflow="sync_inventory")
            [record] = env.store.schedule_list()
            assert record.overlap == overlap
            assert record.last_run_id == max(runs, key=lambda r: r.created_at).run_id
            return runs, most_at_once(runs, env.clock()), skips.lines
    finally:
        logger.removeHandler(skips)


async def main() -> None:
    runs, at_once, skipped = await ten_minutes("skip")
    summary = f"{len(runs)} runs in 10 minutes, at most {at_once} at once"
    print(f"skip: {summary}; {len(skipped)} slots skipped")
    print("  e.g.", skipped[0].split(": ", 1)[1])  # its previous run <id> is still sleeping
    # Slots 1, 4, 7 and 10 fire; each run ends 2.5 minutes after its slot.
    assert (len(runs), at_once, len(skipped)) == (4, 1, 6)
    assert all("is still sleeping" in line for line in skipped)

    runs, at_once, skipped = await ten_minutes("allow_all")
    print(f"allow_all: {len(runs)} runs in 10 minutes, at most {at_once} at once")
    assert (len(runs), at_once, skipped) == (10, 3, [])

    try:
        Schedule.create(sync_inventory, every=60, overlap="queue")
        raise AssertionError("overlap='queue' was accepted")
    except InvalidSchedule as exc:
        print("invalid:", exc)
    assert OVERLAP_POLICIES == ("allow_all", "skip")


if __name__ == "__main__":
    asyncio.run(main())
