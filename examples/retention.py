"""Retention: a worker deletes the runs that ended longer ago than ``run_retention``.

    python examples/retention.py

A worker with a one-second retention runs in a thread on a temporary SQLite file. Three
quick runs finish and are still there; a run that sleeps has not ended, so it stays
however old it gets; a second later the three are gone, journal and all, and their ids
read as unknown. See docs/worker.md ("Retention").
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time

from pyrula.workflows import (
    RunNotFound,
    RunStatus,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    open_store,
    workflow,
)
from pyrula.workflows.sync import SyncRunHandle, WorkflowClient

WAIT_LIMIT = 30.0


@workflow(name="quick_job")
async def quick_job(ctx: WorkflowContext, n: int) -> int:
    return int(await ctx.step("square", lambda: n * n))


@workflow(name="long_nap")
async def long_nap(ctx: WorkflowContext) -> str:
    await ctx.sleep(3600)
    return "rested"


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        store = open_store(f"sqlite:///{directory}/retention.db")
        worker = WorkflowWorker(
            store=store,
            workflows=[quick_job, long_nap],
            options=WorkerOptions(run_retention=1.0, claim_poll_interval=0.05),
        )
        thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
        thread.start()
        client = WorkflowClient(store)
        try:
            napping = client.submit("long_nap", {})
            handles = [client.submit("quick_job", {"n": n}) for n in (2, 3, 4)]
            print("results:", [handle.result(timeout=WAIT_LIMIT) for handle in handles])
            print("right after:", [handle.status().value for handle in handles])
            deadline = time.monotonic() + WAIT_LIMIT
            while time.monotonic() < deadline and deleted(handles) < 3:
                time.sleep(0.1)
            gone = deleted(handles)
            print(
                f"a moment later: {gone} of 3 deleted; the sleeping run is {napping.status().value}"
            )
            assert gone == 3 and napping.status() is RunStatus.SLEEPING
        finally:
            worker.stop()
            thread.join(timeout=30)
            client.close()


def deleted(handles: list[SyncRunHandle]) -> int:
    """How many of the runs are gone (their ids read as unknown)."""
    gone = 0
    for handle in handles:
        try:
            handle.status()
        except RunNotFound:
            gone += 1
    return gone


if __name__ == "__main__":
    main()
