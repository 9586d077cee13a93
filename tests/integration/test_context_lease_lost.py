"""WorkflowContext.lease_lost: True once the worker lost the run's lease, by either path
the engine notices it on (a refused journal write, or a lease renewal), and False when
the worker stops the run itself (shutdown) or the run is cancelled. Real runs, on the
memory and SQLite stores."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula.workflows import (
    RunCancelled,
    RunHandle,
    RunStatus,
    Store,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.engine.control import CancelRequested, LeaseGone
from pyrula.workflows.registry import Registry
from pyrula_compat import worker_signals
from tests.conftest import Eventually, StartWorker


async def started(
    engine_store: Store,
    registry: Registry,
    start_worker: StartWorker,
    seen: list[tuple[str, bool]],
    **options: Any,
) -> tuple[WorkflowWorker, RunHandle, asyncio.Event]:
    """A worker with ``options`` running a workflow whose first step waits for the
    returned event, and a run of it inside that step. The workflow records
    ``ctx.lease_lost`` in ``seen`` before the step and after whatever ends it."""
    entered = asyncio.Event()
    release = asyncio.Event()

    async def long_step() -> str:
        entered.set()
        await release.wait()
        return "done"

    @workflow(registry=registry)
    async def blocking(ctx: WorkflowContext) -> None:
        seen.append(("before", ctx.lease_lost))
        try:
            await ctx.step("long", long_step)
            await ctx.step("after", lambda: None)
        except (LeaseGone, CancelRequested, asyncio.CancelledError) as exc:
            assert worker_signals.lease_lost(ctx) is ctx.lease_lost
            seen.append((type(exc).__name__, ctx.lease_lost))
            raise

    worker = await start_worker(engine_store, [blocking], **options)
    handle = await WorkflowClient(engine_store, registry=registry).submit("blocking")
    await asyncio.wait_for(entered.wait(), 10)
    return worker, handle, release


async def test_a_terminate_found_by_the_steps_journal_write_is_a_lost_lease(
    engine_store: Store,
    registry: Registry,
    start_worker: StartWorker,
    eventually: Eventually,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[str, bool]] = []
    # A long lease, and no lease news (as from another process on SQLite): the step's
    # journal write, not a renewal, finds the run gone.
    no_news(engine_store, monkeypatch)
    worker, handle, release = await started(engine_store, registry, start_worker, seen, lock_ttl=30)
    assert (await handle.terminate()).status is RunStatus.TERMINATED
    release.set()
    await eventually(lambda: worker.running == 0, what="the worker letting the run go")
    assert seen == [("before", False), ("LeaseGone", True)]


async def test_a_terminate_reaches_the_worker_at_once_through_lease_news(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    seen: list[tuple[str, bool]] = []
    # A long lease (renewed every 10 s): the terminate's news makes the worker renew at
    # once, which finds the run gone and cancels it while its step is still blocked.
    worker, handle, release = await started(engine_store, registry, start_worker, seen, lock_ttl=30)
    await handle.terminate()
    await eventually(lambda: worker.running == 0, what="the news stopping the run", timeout=5)
    assert seen == [("before", False), ("CancelledError", True)]
    release.set()


def no_news(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``store`` a store that carries no lease news (its waits just time out)."""

    async def sleep_out(worker_id: str, timeout: float) -> bool:
        await asyncio.sleep(timeout)
        return False

    monkeypatch.setattr(store, "wait_lease_news", sleep_out)


async def test_a_terminate_found_by_lease_renewal_is_a_lost_lease(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    seen: list[tuple[str, bool]] = []
    # A short lease, renewed every 0.2 s: the renewal finds the run gone and cancels it
    # while the step is still blocked (it is never released).
    worker, handle, release = await started(
        engine_store, registry, start_worker, seen, lock_ttl=0.6
    )
    await handle.terminate()
    await eventually(lambda: worker.running == 0, what="the renewal stopping the run")
    assert seen == [("before", False), ("CancelledError", True)]
    release.set()


async def test_a_cancel_is_not_a_lost_lease(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    seen: list[tuple[str, bool]] = []
    worker, handle, release = await started(engine_store, registry, start_worker, seen, lock_ttl=30)
    await handle.cancel()
    release.set()
    with pytest.raises(RunCancelled):
        await handle.result(timeout=10)
    await eventually(lambda: worker.running == 0, what="the worker ending the run")
    assert seen == [("before", False), ("CancelRequested", False)]


async def test_a_shutdown_is_not_a_lost_lease(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    seen: list[tuple[str, bool]] = []
    worker, handle, release = await started(
        engine_store, registry, start_worker, seen, lock_ttl=30, shutdown_grace=0.1
    )
    worker.stop()  # the grace runs out with the step still blocked: the run is cancelled
    await eventually(lambda: worker.running == 0, what="the worker stopping the run")
    assert seen == [("before", False), ("CancelledError", False)]
    assert await handle.status() is not RunStatus.TERMINATED
    release.set()
