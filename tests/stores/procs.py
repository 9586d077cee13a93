"""Child-process bodies for the multi-process tests (importable, so "spawn" can run them)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from pyrula.workflows.records import NewRun, Outcome, RunStatus
from pyrula.workflows.stores.sqlite import SqliteStore


def race_create(path: str, key: str, barrier: Any, results: Any) -> None:
    async def main() -> tuple[str, bool]:
        store = SqliteStore(path)
        await store.open()
        try:
            barrier.wait(30)
            new = NewRun(
                run_id=f"run-{os.getpid()}", workflow="wf", params='{"n":1}', idempotency_key=key
            )
            run, created = await store.create_run(new)
            return run.run_id, created
        finally:
            await store.close()

    results.put(asyncio.run(main()))


def claim_all(path: str, worker: str, barrier: Any, results: Any) -> None:
    async def main() -> list[str]:
        store = SqliteStore(path)
        await store.open()
        claimed: list[str] = []
        try:
            barrier.wait(30)
            while leases := await store.claim_runs(worker, ["wf"], 2, 60):
                for lease in leases:
                    claimed.append(lease.run_id)
                    await store.finish_run(lease.run_id, lease.token, Outcome(RunStatus.COMPLETED))
                # A breath between claims: on a loaded box one process could otherwise
                # drain all 200 runs before the other is scheduled, and nothing raced.
                await asyncio.sleep(0.002)
            return claimed
        finally:
            await store.close()

    results.put(asyncio.run(main()))


def finish_later(path: str, run_id: str, token: int, delay: float) -> None:
    async def main() -> None:
        store = SqliteStore(path)
        await store.open()
        time.sleep(delay)
        await store.finish_run(run_id, token, Outcome(RunStatus.COMPLETED, result='"remote"'))
        await store.close()

    asyncio.run(main())


def create_later(path: str, workflow: str, delay: float) -> None:
    async def main() -> None:
        store = SqliteStore(path)
        await store.open()
        time.sleep(delay)
        await store.create_run(NewRun(run_id="remote", workflow=workflow, params="{}"))
        await store.close()

    asyncio.run(main())


def use_after_fork(store: SqliteStore, run_id: str) -> None:
    async def main() -> None:
        run = await store.get_run(run_id)
        assert run is not None and run.run_id == run_id
        await store.create_run(NewRun(run_id="from-child", workflow="wf", params="{}"))
        await store.close()

    asyncio.run(main())


def fire_slots(path: str, schedule_id: str, end: float, barrier: Any, results: Any) -> None:
    """Act as a worker's schedule loop: fire whatever slot is next until ``end``."""

    async def main() -> list[float]:
        store = SqliteStore(path)
        await store.open()
        fired: list[float] = []
        try:
            barrier.wait(30)
            while True:
                schedule = await store.get_schedule(schedule_id)
                assert schedule is not None
                slot = schedule.next_fire_at
                if slot >= end:
                    return fired
                run = NewRun(
                    run_id=f"{os.getpid()}-{slot}",
                    workflow="wf",
                    params="{}",
                    idempotency_key=f"schedule:{schedule_id}:{slot:.3f}",
                )
                if await store.fire_schedule(schedule_id, slot, slot, slot + 1, run) is not None:
                    fired.append(slot)
        finally:
            await store.close()

    results.put(asyncio.run(main()))
