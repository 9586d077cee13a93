"""Composition on each store: ctx.gather of steps and child runs, ctx.run_child on any
worker, and cancel/terminate cascading from a parent to its running child."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections import Counter
from typing import Any

import pytest

from pyrula.workflows import (
    DurableInvocationError,
    Fatal,
    RetryPolicy,
    RunCancelled,
    RunHandle,
    RunStatus,
    Store,
    WorkflowClient,
    WorkflowContext,
    workflow,
)
from pyrula.workflows.registry import Registry
from tests.conftest import Eventually, StartWorker

ONCE = RetryPolicy(max_attempts=1)


async def test_gather_returns_results_in_argument_order_and_replays_them(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    calls: Counter[str] = Counter()
    finished: list[str] = []
    gate = {"closed": True}

    def timed(name: str, seconds: float) -> Any:
        async def run() -> str:
            calls[name] += 1
            await asyncio.sleep(seconds)
            finished.append(name)
            return name.upper()

        return run

    def check_gate() -> None:
        if gate["closed"]:
            raise Fatal("closed the first time")

    @workflow(registry=registry)
    async def fan_out(ctx: WorkflowContext) -> list[Any]:
        results = await ctx.gather(
            ctx.step("slow", timed("slow", 0.3)),
            ctx.step("fast", timed("fast", 0.0)),
            ctx.step("middle", timed("middle", 0.15)),
        )
        await ctx.step("gate", check_gate)
        return results

    await start_worker(engine_store, [fan_out])
    handle = await WorkflowClient(engine_store, registry=registry).submit(fan_out)
    with pytest.raises(DurableInvocationError):
        await handle.result(timeout=5)
    assert finished == ["fast", "middle", "slow"]  # they really ran concurrently
    journal = await engine_store.load_journal(handle.run_id)
    assert [(e.position, e.name) for e in journal] == [
        (0, "slow"),
        (1, "fast"),
        (2, "middle"),
        (3, "gate"),
    ]

    gate["closed"] = False
    await handle.retry()
    assert await handle.result(timeout=5) == ["SLOW", "FAST", "MIDDLE"]
    assert calls == {"slow": 1, "fast": 1, "middle": 1}  # replayed, not run again


async def test_gather_raises_a_branch_error_after_every_branch_finished(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    finished: list[str] = []

    def bad() -> None:
        raise ValueError("bad branch")

    async def slow() -> str:
        await asyncio.sleep(0.2)
        finished.append("slow")
        return "slow"

    @workflow(registry=registry)
    async def fan_out(ctx: WorkflowContext) -> list[Any]:
        try:
            await ctx.gather(ctx.step("bad", bad, retry=ONCE), ctx.step("slow", slow))
        except ValueError as exc:
            caught = [type(exc).__name__, str(exc), list(finished)]
        else:
            caught = ["no error"]
        inline = await ctx.gather(
            ctx.step("bad2", bad, retry=ONCE), ctx.step("ok", lambda: 1), return_exceptions=True
        )
        return [caught, [type(x).__name__ if isinstance(x, Exception) else x for x in inline]]

    await start_worker(engine_store, [fan_out])
    handle = await WorkflowClient(engine_store, registry=registry).submit(fan_out)
    assert await handle.result(timeout=5) == [
        ["ValueError", "bad branch", ["slow"]],  # raised only once the slow branch finished
        ["ValueError", 1],
    ]
    journal = {e.name: e.ok for e in await engine_store.load_journal(handle.run_id)}
    assert journal == {"bad": False, "slow": True, "bad2": False, "ok": True}


async def test_gather_of_something_else_than_an_operation_fails_the_run(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    ran: list[str] = []

    @workflow(registry=registry)
    async def misuse(ctx: WorkflowContext) -> Any:
        return await ctx.gather(ctx.step("a", lambda: ran.append("a")), 42)  # type: ignore[arg-type]

    await start_worker(engine_store, [misuse])
    handle = await WorkflowClient(engine_store, registry=registry).submit(misuse)
    with pytest.raises(DurableInvocationError) as caught:
        await handle.result(timeout=5)
    assert caught.value.error_type.endswith("WorkflowError")
    assert ran == []  # refused before any branch started


async def test_gather_of_a_coroutine_fails_the_run_and_closes_the_coroutine(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    async def plain() -> int:  # not a step: a mistake gather refuses
        return 1

    @workflow(registry=registry)
    async def misuse(ctx: WorkflowContext) -> Any:
        return await ctx.gather(plain())  # type: ignore[arg-type]

    await start_worker(engine_store, [misuse])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        handle = await WorkflowClient(engine_store, registry=registry).submit(misuse)
        with pytest.raises(DurableInvocationError, match=r"ctx\.gather takes step calls"):
            await handle.result(timeout=5)
        gc.collect()
    assert not [w for w in seen if "never awaited" in str(w.message)]


async def test_run_child_returns_its_result_and_raises_its_error(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry)
    async def square(ctx: WorkflowContext, n: int) -> int:
        if n < 0:
            await ctx.step("refuse", _refuse)
        result: int = await ctx.step("square", lambda: n * n)
        return result

    @workflow(registry=registry)
    async def parent(ctx: WorkflowContext) -> list[Any]:
        both = await ctx.gather(ctx.run_child(square, {"n": 3}), ctx.step("side", lambda: "s"))
        try:
            await ctx.run_child("square", {"n": -1})
        except DurableInvocationError as exc:
            failure = [exc.error_type.rsplit(".", 1)[-1], exc.error_message]
        return [*both, await ctx.run_child(square, {"n": 4}), failure]

    await start_worker(engine_store, [parent, square])
    handle = await WorkflowClient(engine_store, registry=registry).submit(parent, owner="acme")
    assert await handle.result(timeout=10) == [9, "s", 16, ["Fatal", "negative"]]
    children = await engine_store.list_runs(workflow="square")
    assert len(children) == 3
    for child in children:
        assert child.parent_run_id == handle.run_id
        assert child.owner == "acme"  # children inherit the parent's tenant
        assert child.run_id.startswith(f"{handle.run_id}.")


def _refuse() -> None:
    raise Fatal("negative")


async def test_a_child_runs_on_a_worker_that_knows_its_workflow(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry)
    async def child(ctx: WorkflowContext, text: str) -> str:
        return text[::-1]

    @workflow(registry=registry)
    async def parent(ctx: WorkflowContext) -> str:
        result: str = await ctx.run_child("child", {"text": "stressed"})
        return result

    parents = await start_worker(engine_store, [parent])
    children = await start_worker(engine_store, [child])
    handle = await WorkflowClient(engine_store, registry=registry).submit(parent)
    assert await handle.result(timeout=10) == "desserts"
    [kid] = await engine_store.list_runs(workflow="child")
    assert kid.worker_id == children.worker_id
    assert (await handle.record()).worker_id == parents.worker_id


def blocked_child(registry: Registry) -> tuple[Any, asyncio.Event, asyncio.Event, list[str]]:
    entered, release = asyncio.Event(), asyncio.Event()
    after: list[str] = []

    async def hold() -> str:
        entered.set()
        await release.wait()
        return "held"

    @workflow(registry=registry)
    async def child(ctx: WorkflowContext) -> str:
        await ctx.step("hold", hold)
        await ctx.step("after", lambda: after.append("after"))
        return "child done"

    @workflow(registry=registry)
    async def parent(ctx: WorkflowContext) -> str:
        result: str = await ctx.run_child(child)
        after.append("parent resumed")
        return result

    return (parent, child), entered, release, after  # type: ignore[return-value]


async def _started(
    store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> tuple[RunHandle, RunHandle, asyncio.Event, list[str]]:
    (parent, child), entered, release, after = blocked_child(registry)
    await start_worker(store, [parent, child])
    client = WorkflowClient(store, registry=registry)
    handle = await client.submit(parent)
    await asyncio.wait_for(entered.wait(), 5)

    async def parent_waiting() -> bool:
        return await handle.status() is RunStatus.WAITING

    await eventually(parent_waiting, what="the parent waiting for its child")
    [kid] = await store.list_runs(workflow="child")
    assert kid.status is RunStatus.RUNNING and kid.parent_run_id == handle.run_id
    return handle, client.handle("child", kid.run_id), release, after


async def test_cancelling_a_parent_cancels_its_running_child(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    parent, child, release, after = await _started(engine_store, registry, start_worker, eventually)
    assert (await parent.cancel()).status is RunStatus.CANCELLED
    assert (await child.record()).cancel_requested
    release.set()  # the child's step finishes; it stops at its next boundary
    with pytest.raises(RunCancelled):
        await child.result(timeout=5)
    assert (await child.record()).status is RunStatus.CANCELLED
    with pytest.raises(RunCancelled) as caught:
        await parent.result(timeout=1)
    assert caught.value.status == "cancelled"
    await asyncio.sleep(0.1)
    assert after == []  # neither the child's next step nor the parent went on


async def test_terminating_a_parent_terminates_its_running_child(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    parent, child, release, after = await _started(engine_store, registry, start_worker, eventually)
    assert (await parent.terminate()).status is RunStatus.TERMINATED
    assert (await child.record()).status is RunStatus.TERMINATED  # at once, not at a boundary
    release.set()
    await asyncio.sleep(0.2)
    assert after == []
    assert (await child.record()).status is RunStatus.TERMINATED
    journal = await engine_store.load_journal(child.run_id)
    assert journal == []  # the held step's late result was fenced off
    with pytest.raises(RunCancelled) as caught:
        await parent.result(timeout=1)
    assert caught.value.status == "terminated"


async def test_a_child_cancelled_on_its_own_raises_run_cancelled_in_the_parent(
    engine_store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    parent, child, release, _ = await _started(engine_store, registry, start_worker, eventually)
    await child.terminate()
    with pytest.raises(DurableInvocationError) as caught:
        await parent.result(timeout=5)
    assert caught.value.error_type.endswith("RunCancelled")
    release.set()


async def test_cancelling_a_parent_running_beside_its_child_cancels_both(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    """The parent is running (a gathered step), not waiting, when it is cancelled: the
    child's cancellation must end the parent as cancelled, not as failed."""
    entered, child_entered, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def hold(flag: asyncio.Event) -> str:
        flag.set()
        await release.wait()
        return "held"

    @workflow(registry=registry)
    async def child(ctx: WorkflowContext) -> str:
        await ctx.step("child_hold", hold, child_entered)
        await ctx.step("child_next", lambda: "next")  # the boundary where the cancel lands
        return "child done"

    @workflow(registry=registry)
    async def parent(ctx: WorkflowContext) -> list[Any]:
        both = await ctx.gather(ctx.run_child(child), ctx.step("hold", hold, entered))
        await ctx.step("parent_next", lambda: "next")
        return both

    await start_worker(engine_store, [parent, child])
    handle = await WorkflowClient(engine_store, registry=registry).submit(parent)
    await asyncio.wait_for(asyncio.gather(entered.wait(), child_entered.wait()), 5)
    assert await handle.status() is RunStatus.RUNNING
    await handle.cancel()
    release.set()
    with pytest.raises(RunCancelled):
        await handle.result(timeout=5)
    assert (await handle.record()).status is RunStatus.CANCELLED
    [kid] = await engine_store.list_runs(workflow="child")
    assert kid.status is RunStatus.CANCELLED
    names = {e.name for e in await engine_store.load_journal(handle.run_id)}
    assert "parent_next" not in names
