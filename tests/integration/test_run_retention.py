"""WorkerOptions.run_retention: a worker deletes the runs that ended longer ago than that,
in batches, and leaves the rest alone; without it every run is kept."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pyrula.workflows import (
    ConfigurationError,
    RunStatus,
    Store,
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    workflow,
)
from pyrula.workflows.registry import Registry
from tests.conftest import Eventually, StartWorker


async def test_ended_runs_go_after_the_retention(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    @workflow(registry=registry, name="quick")
    async def quick(ctx: WorkflowContext, n: int) -> int:
        return int(await ctx.step("double", lambda: n * 2))

    @workflow(registry=registry, name="slow")
    async def slow(ctx: WorkflowContext) -> str:
        await ctx.sleep(30)
        return "late"

    client = WorkflowClient(engine_store, registry=registry)
    await start_worker(engine_store, [quick, slow], run_retention=2.0)
    sleeper = await client.submit("slow", {})
    done = [await client.submit("quick", {"n": i}) for i in range(3)]
    assert [await h.result(timeout=10) for h in done] == [0, 2, 4]
    # Kept for the retention (the purge runs every second here)...
    await asyncio.sleep(0.3)
    assert all([await engine_store.get_run(h.run_id) is not None for h in done])

    # ... then gone, journal and all; the live run stays.
    async def purged() -> bool:
        return all([await engine_store.get_run(h.run_id) is None for h in done])

    await eventually(purged, timeout=10)
    assert await engine_store.load_journal(done[0].run_id) == []
    live = await engine_store.get_run(sleeper.run_id)
    assert live is not None and live.status is RunStatus.SLEEPING


@pytest.mark.parametrize("retention", [None, 0])
async def test_without_a_retention_every_run_is_kept(
    engine_store: Store, registry: Registry, start_worker: StartWorker, retention: float | None
) -> None:
    @workflow(registry=registry, name="quick")
    async def quick(ctx: WorkflowContext) -> int:
        return 1

    client = WorkflowClient(engine_store, registry=registry)
    worker = await start_worker(engine_store, [quick], run_retention=retention)
    handle = await client.submit("quick", {})
    assert await handle.result(timeout=10) == 1
    assert not any(task.get_name() == "pyrula-purge" for task in asyncio.all_tasks())
    assert worker.options.run_retention == retention
    await asyncio.sleep(0.5)
    assert await engine_store.get_run(handle.run_id) is not None


async def test_a_failing_purge_is_logged_and_retried(
    engine_store: Store,
    registry: Registry,
    start_worker: StartWorker,
    eventually: Eventually,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from pyrula.workflows.errors import StoreUnavailable

    real = engine_store.purge_runs
    calls: list[float] = []

    async def flaky(ended_before: float, limit: int) -> int:
        calls.append(ended_before)
        if len(calls) == 1:
            raise StoreUnavailable("the store went away for a moment")
        return await real(ended_before, limit)

    engine_store.purge_runs = flaky  # type: ignore[method-assign]

    @workflow(registry=registry, name="quick")
    async def quick(ctx: WorkflowContext) -> int:
        return 1

    caplog.set_level(logging.WARNING, "pyrula.workflows.worker")
    await start_worker(engine_store, [quick], run_retention=0.2)

    async def retried() -> bool:
        return len(calls) >= 2

    await eventually(retried, timeout=5)
    assert "purging ended runs failed: the store went away" in caplog.text


@pytest.mark.parametrize("bad", [-1, float("nan"), "1d", True])
def test_a_retention_must_be_a_number_of_seconds(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="run_retention"):
        WorkerOptions(run_retention=bad)  # type: ignore[arg-type]


def test_the_purge_interval_follows_the_retention() -> None:
    assert WorkerOptions(run_retention=None).run_retention is None
    assert WorkerOptions(run_retention=0).run_retention == 0  # kept, as None
    assert WorkerOptions(run_retention=86400).purge_interval == 60.0
    assert WorkerOptions(run_retention=10).purge_interval == 5.0
    assert WorkerOptions(run_retention=0.001).purge_interval == 1.0  # never a busy loop
