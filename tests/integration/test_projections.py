"""Projections: definitions and bad input, the runner (order, settle, workflow filter,
a failing function, the lease between workers) and the worker's projection loop end to
end, on each engine store."""

from __future__ import annotations

import asyncio
import math

import pytest

from pyrula.workflows import (
    ConfigurationError,
    MemoryStore,
    RunRecord,
    Store,
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.projections import (
    LEASE_TTL,
    Projection,
    ProjectionRegistry,
    ProjectionRunner,
    projection,
)
from pyrula.workflows.registry import Registry
from tests.conftest import FAST, Eventually
from tests.stores.conftest import FakeClock


def test_a_projection_checks_its_definition() -> None:
    def fn(runs: list[RunRecord]) -> None:
        return None

    for size in (0, 10_001, 1.5, True):
        with pytest.raises(ConfigurationError, match="batch_size"):
            Projection("p", fn, batch_size=size)  # type: ignore[arg-type]
    for settle in (-1, math.nan, math.inf):
        with pytest.raises(ConfigurationError, match="settle"):
            Projection("p", fn, settle=settle)
    with pytest.raises(ConfigurationError, match="function"):
        Projection("p", 5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="list of names"):
        projection(workflows="checkout")
    registry = ProjectionRegistry()
    made = projection(registry=registry)(fn)
    assert made.name.endswith("fn") and registry.all() == [made]

    def other(runs: list[RunRecord]) -> None:
        return None

    with pytest.raises(ConfigurationError, match="already defined"):
        projection(made.name, registry=registry)(other)


async def end(store: Store, clock: FakeClock, workflow: str, run_id: str) -> None:
    client = WorkflowClient(store, require_registered=False)
    await client.submit(workflow, {}, run_id=run_id)
    await store.cancel_run(run_id)  # ends it at the clock's time
    clock.advance(1)


async def test_runs_come_in_the_order_they_ended_once_settled(
    store: Store, clock: FakeClock
) -> None:
    got: list[str] = []
    item = Projection("p", lambda runs: got.extend(r.run_id for r in runs), batch_size=2)
    runner = ProjectionRunner(store, item, "w1")
    assert await runner.hold()
    assert await runner.step() == 0  # nothing ended
    for run_id in ("a", "b", "c"):
        await end(store, clock, "wf", run_id)
    # c ended at the clock's time minus one second: just settled (settle is 1 s).
    assert await runner.step() == 2 and got == ["a", "b"]
    assert await runner.step() == 1 and got == ["a", "b", "c"]
    assert await runner.step() == 0
    await end(store, clock, "wf", "d")
    clock.advance(-0.5)  # d ended 0.5 s ago: not settled yet
    assert await runner.step() == 0 and got == ["a", "b", "c"]
    clock.advance(0.5)
    assert await runner.step() == 1 and got == ["a", "b", "c", "d"]


async def test_only_the_named_workflows_are_delivered_and_the_cursor_moves_on(
    store: Store, clock: FakeClock
) -> None:
    got: list[str] = []

    async def keep(runs: list[RunRecord]) -> None:
        got.extend(f"{r.workflow}:{r.run_id}:{r.status.value}" for r in runs)

    item = Projection("p", keep, workflows=frozenset({"checkout"}), settle=0.0)
    runner = ProjectionRunner(store, item, "w1")
    await end(store, clock, "other", "x")
    await end(store, clock, "checkout", "y")
    await end(store, clock, "other", "z")
    assert await runner.hold()
    assert await runner.step() == 3
    assert got == ["checkout:y:cancelled"]
    assert await runner.step() == 0


async def test_a_failing_function_gets_the_same_batch_again(store: Store, clock: FakeClock) -> None:
    calls: list[list[str]] = []

    def flaky(runs: list[RunRecord]) -> None:
        calls.append([r.run_id for r in runs])
        if len(calls) == 1:
            raise RuntimeError("the read model is down")

    runner = ProjectionRunner(store, Projection("p", flaky, settle=0.0), "w1")
    await end(store, clock, "wf", "a")
    assert await runner.hold()
    with pytest.raises(RuntimeError):
        await runner.step()
    assert await runner.step() == 1
    assert calls == [["a"], ["a"]]


async def test_one_worker_at_a_time_holds_a_projection(store: Store, clock: FakeClock) -> None:
    item = Projection("p", lambda runs: None)
    one, two = ProjectionRunner(store, item, "w1"), ProjectionRunner(store, item, "w2")
    assert await one.hold()
    assert not await two.hold()
    assert await one.hold()  # renewed
    clock.advance(LEASE_TTL + 1)  # w1 went quiet: w2 takes over
    assert await two.hold()
    assert not await one.hold()
    await two.release()
    assert await one.hold()  # a clean stop hands it over at once


async def test_a_worker_delivers_every_ended_run_once(
    engine_store: Store, registry: Registry, eventually: Eventually
) -> None:
    @workflow(registry=registry)
    async def job(ctx: WorkflowContext, n: int) -> int:
        if n % 5 == 0:
            raise ValueError(f"bad {n}")
        return n * 2

    seen: list[tuple[str, str]] = []

    async def record(runs: list[RunRecord]) -> None:
        seen.extend((run.run_id, run.status.value) for run in runs)

    item = Projection("job-states", record, workflows=frozenset({"job"}), batch_size=4,
                      settle=0.0)  # fmt: skip
    options = WorkerOptions(**{**FAST, "projection_poll_interval": 0.05})
    workers = [
        WorkflowWorker(engine_store, [job], options, registry=registry, projections=[item])
        for _ in range(2)
    ]
    tasks = [asyncio.get_running_loop().create_task(w.run()) for w in workers]
    client = WorkflowClient(engine_store, registry=registry)
    try:
        handles = [await client.submit(job, {"n": n}) for n in range(1, 13)]

        async def all_seen() -> bool:
            return len(seen) >= len(handles)

        await eventually(all_seen, timeout=10, what="every run delivered")
        await asyncio.sleep(0.2)  # and nothing twice afterwards
        assert sorted(seen) == sorted(
            (h.run_id, "failed" if n % 5 == 0 else "completed")
            for n, h in zip(range(1, 13), handles, strict=True)
        )
        ended = await engine_store.ended_runs(None, 100)
        assert [run_id for run_id, _ in seen] == [r.run_id for r in ended]  # their end order
    finally:
        for worker in workers:
            worker.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=15)


def test_a_worker_refuses_what_is_not_a_projection() -> None:
    with pytest.raises(ConfigurationError, match="projections="):
        WorkflowWorker(store=MemoryStore(), projections=[print])  # type: ignore[list-item]


async def test_the_lease_is_renewed_while_a_slow_batch_is_delivered() -> None:
    store = MemoryStore()  # the real clock: the lease lapses in real time
    await store.open()
    await WorkflowClient(store, require_registered=False).submit("wf", {}, run_id="a")
    await store.cancel_run("a")

    async def slow(runs: list[RunRecord]) -> None:
        await asyncio.sleep(1.0)  # over three lease TTLs

    one = ProjectionRunner(store, Projection("p", slow, settle=0.0), "w1", lease_ttl=0.3)
    two = ProjectionRunner(store, Projection("p", slow, settle=0.0), "w2", lease_ttl=0.3)
    assert await one.hold()
    delivering = asyncio.create_task(one.step())
    taken = []
    while not delivering.done():
        taken.append(await two.hold())
        await asyncio.sleep(0.05)
    assert await delivering == 1
    assert len(taken) > 10 and not any(taken)
