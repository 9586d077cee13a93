"""``@workflow(on_expired=hook)``: the worker whose claim ends a run still queued past its
``expires_at`` awaits the hook with the run as it ended, once; a hook that raises is
logged and the worker goes on serving (memory and SQLite stores, real clock)."""

from __future__ import annotations

import asyncio
import time

import pytest

from pyrula.workflows import RunCancelled, RunRecord, RunStatus, Store, WorkflowClient, workflow
from pyrula.workflows.registry import Registry
from tests.conftest import Eventually, StartWorker


async def test_the_claiming_worker_awaits_on_expired_once_per_run(
    engine_store: Store,
    registry: Registry,
    start_worker: StartWorker,
    eventually: Eventually,
    caplog: pytest.LogCaptureFixture,
) -> None:
    told: list[RunRecord] = []

    async def hook(run: RunRecord) -> None:
        told.append(run)
        if run.params == '{"n":2}':
            raise RuntimeError("hook bug")

    @workflow(registry=registry, on_expired=hook)
    async def late(ctx: object, n: int) -> int:
        return n

    client = WorkflowClient(engine_store, registry=registry)
    first = await client.submit(late, {"n": 1}, delay=0.3, expires_at=time.time() + 0.1)
    second = await client.submit(late, {"n": 2}, expires_at=time.time() - 1)
    on_time = await client.submit(late, {"n": 3}, expires_at=time.time() + 60)
    await start_worker(engine_store, [late])
    await start_worker(engine_store, [late])  # two claimers: still once per run
    assert await on_time.result(timeout=5) == 3
    for handle in (first, second):
        with pytest.raises(RunCancelled):
            await handle.result(timeout=5)
    await eventually(lambda: len(told) >= 2, what="both hooks")
    await asyncio.sleep(0.3)
    assert sorted(run.run_id for run in told) == sorted([first.run_id, second.run_id])
    for run in told:
        assert run.status is RunStatus.CANCELLED and run.error is not None
        assert "RunExpired" in run.error
    assert "on_expired of workflow 'late' failed" in caplog.text
    again = await client.submit(late, {"n": 4})
    assert await again.result(timeout=5) == 4  # the failing hook stopped nothing
