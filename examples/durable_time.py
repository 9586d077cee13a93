"""Durable time: ``ctx.sleep``, ``ctx.sleep_until``, ``ctx.now`` and long retry backoffs.

    python examples/durable_time.py

Part 1 runs a two-week trial in WorkflowTestEnv, where virtual time skips the sleeps.
Part 2 runs a real worker (in a thread, on a temporary SQLite file) to show that a
sleeping run holds no worker slot, and that a long retry backoff is a timer too.
See docs/durable-time.md.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from datetime import timedelta
from typing import Any

from pyrula.workflows import (
    RetryPolicy,
    RunStatus,
    StepContext,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    open_store,
    step,
    workflow,
)
from pyrula.workflows.sync import SyncRunHandle, WorkflowClient
from pyrula.workflows.testing import WorkflowTestEnv

WAIT_LIMIT = 30.0


@workflow(name="free_trial")
async def free_trial(ctx: WorkflowContext, user: str) -> dict[str, Any]:
    started = await ctx.now()  # journaled: a replay sees the same time
    await ctx.step("welcome", lambda: f"welcome mail to {user}")
    await ctx.sleep(timedelta(days=7))  # the run is suspended; no worker holds it
    await ctx.step("reminder", lambda: f"reminder to {user}")
    await ctx.sleep_until(started + timedelta(days=14))  # an aware datetime
    ended = await ctx.now()
    await ctx.step("trial_over", lambda: f"trial over for {user}")
    return {"user": user, "days": (ended - started) / timedelta(days=1)}


@workflow(name="nap")
async def nap(ctx: WorkflowContext, seconds: float) -> str:
    await ctx.sleep(seconds)
    return "rested"


@step(retry=RetryPolicy(max_attempts=2, initial_backoff=1.0, jitter=0.0))
def call_partner(ctx: StepContext) -> dict[str, int]:
    if ctx.attempt == 1:
        raise ConnectionError("partner API down")  # retried after a 1 s backoff
    return {"attempt": ctx.attempt}


@workflow(name="sync_partner")
async def sync_partner(ctx: WorkflowContext) -> dict[str, int]:
    return await call_partner()  # type: ignore[no-any-return]


async def two_week_trial() -> None:
    async with WorkflowTestEnv(workflows=[free_trial]) as env:
        began = time.monotonic()
        result = await env.run("free_trial", {"user": "ana"})
        print("trial:", result, f"in {time.monotonic() - began:.2f}s of real time")
        assert result == {"user": "ana", "days": 14.0}


def wait_for_status(handle: SyncRunHandle, status: RunStatus) -> None:
    deadline = time.monotonic() + WAIT_LIMIT
    while handle.status() is not status:
        assert time.monotonic() < deadline, f"run never became {status.value}"
        time.sleep(0.02)


def real_worker(path: str) -> None:
    store = open_store(f"sqlite:///{path}")
    client = WorkflowClient(store)
    worker = WorkflowWorker(
        store=store,
        workflows=[nap, sync_partner],
        options=WorkerOptions(
            max_concurrent_runs=1,  # one slot: a sleeping run must not hold it
            claim_poll_interval=0.05,
            timer_poll_interval_s=1.0,  # longest the timer loop sleeps between looks
            timer_max_batch=100,  # most runs it wakes per look
            durable_backoff_after=0.5,  # backoffs of 0.5 s or more are timers
        ),
    )
    thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
    thread.start()
    try:
        sleeper = client.submit("nap", {"seconds": 2.0})
        wait_for_status(sleeper, RunStatus.SLEEPING)
        # The only slot is free while it sleeps, so another run goes ahead of it.
        assert client.submit("nap", {"seconds": 0}).result(timeout=WAIT_LIMIT) == "rested"
        assert sleeper.status() is RunStatus.SLEEPING
        print("nap:", sleeper.result(timeout=WAIT_LIMIT))

        partner = client.submit("sync_partner")
        wait_for_status(partner, RunStatus.SLEEPING)  # the 1 s backoff is a timer
        print("partner:", partner.result(timeout=WAIT_LIMIT))
    finally:
        worker.stop()
        thread.join(timeout=30)
        client.close()


def main() -> None:
    asyncio.run(two_week_trial())
    with tempfile.TemporaryDirectory() as directory:
        real_worker(f"{directory}/durable_time.db")


if __name__ == "__main__":
    main()
