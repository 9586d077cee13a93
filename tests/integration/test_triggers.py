"""Batch triggers: definitions and bad input, the firer's batches (size, wait, a crash
between the run and the consume, two firers racing, payload limits) and the worker's
trigger loop end to end, on each engine store."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest

from pyrula.workflows import (
    ConfigurationError,
    InvalidParams,
    MemoryStore,
    NotJSONSerializable,
    PayloadTooLarge,
    Store,
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.records import RunStatus
from pyrula.workflows.registry import Registry, WorkflowDefinition
from pyrula.workflows.triggering import TriggerFirer, batch_run_id
from pyrula.workflows.triggers import BatchTrigger, TriggerRegistry, batch_trigger
from tests.conftest import FAST, Eventually
from tests.stores.conftest import START, FakeClock


def collector(registry: Registry, name: str = "collect") -> WorkflowDefinition:
    @workflow(name=name, registry=registry)
    async def collect(ctx: WorkflowContext, events: list[Any]) -> int:
        return len(events)

    return collect


def batches(runs: list[Any]) -> list[list[Any]]:
    """The runs' event lists in the order the runs were created (list_runs gives the
    newest first)."""
    ordered = sorted(reversed(runs), key=lambda r: r.created_at)
    return [json.loads(run.params)["events"] for run in ordered]


# -- definitions and bad input -------------------------------------------------------------
def test_a_trigger_checks_its_definition() -> None:
    for bad in ({"name": ""}, {"name": "a\nb"}, {"name": "x" * 201}, {"name": 5}):
        with pytest.raises(ConfigurationError):
            BatchTrigger(**{"workflow": "w", **bad})  # type: ignore[arg-type]
    for size in (0, -1, 10_001, 2.5, True):
        with pytest.raises(ConfigurationError, match="max_size"):
            BatchTrigger("t", "w", max_size=size)  # type: ignore[arg-type]
    for wait in (-1, math.nan, math.inf, "1"):
        with pytest.raises(ConfigurationError, match="max_wait"):
            BatchTrigger("t", "w", max_wait=wait)  # type: ignore[arg-type]
    assert BatchTrigger("t", "w", max_wait=0).max_wait == 0.0


def test_a_workflow_without_the_parameter_is_refused() -> None:
    registry = Registry()

    @workflow(registry=registry)
    async def wrong(ctx: WorkflowContext, items: list[Any]) -> None:
        return None

    with pytest.raises(ConfigurationError, match="no parameter 'events'"):
        batch_trigger("t", wrong, registry=TriggerRegistry())
    trigger = batch_trigger("t", wrong, param="items", registry=TriggerRegistry())
    assert trigger.workflow == "wrong" and trigger.param == "items"


def test_one_name_holds_one_definition() -> None:
    triggers = TriggerRegistry()
    batch_trigger("t", "w", registry=triggers)
    batch_trigger("t", "w", registry=triggers)  # the same again: fine (a re-import)
    with pytest.raises(ConfigurationError, match="already defined"):
        batch_trigger("t", "w", max_size=5, registry=triggers)


async def test_sending_checks_every_event_before_storing_any() -> None:
    store = MemoryStore()
    client = WorkflowClient(store, require_registered=False, max_payload_bytes=1_000)
    with pytest.raises(NotJSONSerializable):
        await client.send_events("t", [{"ok": 1}, {"bad": {1, 2}}])
    with pytest.raises(PayloadTooLarge):
        await client.send_events("t", [{"ok": 1}, "x" * 2_000])
    with pytest.raises(InvalidParams, match="trigger name"):
        await client.send_events("", [1])
    with pytest.raises(InvalidParams, match="list of JSON values"):
        await client.send_events("t", "abc")
    with pytest.raises(InvalidParams, match="list of JSON values"):
        await client.send_events("t", {"a": 1})
    assert await store.read_events("t", 10) == []  # nothing of a refused call was stored
    assert await client.send_events("t", []) == []
    seq = await client.send_event("t", {"b": 2, "a": 1})
    assert [(e.seq, e.payload) for e in await store.read_events("t", 10)] == [
        (seq, '{"a":1,"b":2}')
    ]


# -- the firer -----------------------------------------------------------------------------
async def send(store: Store, trigger: str, values: list[Any]) -> list[int]:
    client = WorkflowClient(store, require_registered=False)
    return await client.send_events(trigger, values)


async def all_runs(store: Store) -> list[Any]:
    return await store.list_runs(limit=1000)


async def test_a_batch_waits_for_its_size_or_its_time(store: Store, clock: FakeClock) -> None:
    trigger = BatchTrigger("t", "collect", max_size=3, max_wait=10.0)
    firer = TriggerFirer(store)
    assert await firer.fire_ready(trigger) is None  # nothing buffered
    await send(store, "t", [1, 2])
    clock.advance(4)
    assert await firer.fire_ready(trigger) == pytest.approx(6.0)  # the oldest is due in 6 s
    assert await all_runs(store) == []
    await send(store, "t", [3, 4])  # a full batch of three is ready now
    assert await firer.fire_ready(trigger) == pytest.approx(10.0)  # [4] waits from now
    assert batches(await all_runs(store)) == [[1, 2, 3]]
    clock.advance(10)
    assert await firer.fire_ready(trigger) is None  # [4] went on its time, nothing left
    assert batches(await all_runs(store)) == [[1, 2, 3], [4]]
    assert await store.read_events("t", 10) == []
    run = min(await all_runs(store), key=lambda r: r.created_at)
    assert run.workflow == "collect" and run.status is RunStatus.QUEUED
    assert run.created_at == START + 4


async def test_a_long_backlog_goes_out_in_full_batches(store: Store) -> None:
    await send(store, "t", list(range(25)))
    trigger = BatchTrigger("t", "collect", max_size=10, max_wait=60.0)
    assert await TriggerFirer(store).fire_ready(trigger) == pytest.approx(60.0)
    assert batches(await all_runs(store)) == [list(range(10)), list(range(10, 20))]
    assert [e.payload for e in await store.read_events("t", 10)] == [str(i) for i in range(20, 25)]


async def test_a_crash_after_the_run_before_the_consume_runs_no_batch_twice(
    store: Store, clock: FakeClock
) -> None:
    trigger = BatchTrigger("t", "collect", max_size=3, max_wait=0.0)
    await send(store, "t", [1, 2, 3, 4, 5])

    class Crash(Exception):
        pass

    async def crash(*args: Any) -> bool:
        raise Crash

    # A store whose consume "crashes": the real store's other calls, that one replaced.
    crashy = type("S", (), {})()
    kept = ("read_events", "now", "create_run", "get_run")
    for name in (*kept, "append_events", "get_cursor", "swap_cursor", "ended_runs"):
        setattr(crashy, name, getattr(store, name))
    crashy.consume_events = crash
    crashing = TriggerFirer(crashy)
    with pytest.raises(Crash):
        await crashing.fire_ready(trigger)
    assert batches(await all_runs(store)) == [[1, 2, 3]]  # the run exists, events remain
    assert len(await store.read_events("t", 10)) == 5
    await TriggerFirer(store).fire_ready(trigger)  # another worker takes over
    assert batches(await all_runs(store)) == [[1, 2, 3], [4, 5]]
    assert await store.read_events("t", 10) == []


async def test_a_firer_that_read_more_consumes_what_the_run_holds(store: Store) -> None:
    # Worker A read [1, 2] and created the batch's run; B read [1, 2, 3, 4] (more came in)
    # before A consumed. B must consume two, not four, then fire [3, 4] as its own run.
    trigger = BatchTrigger("t", "collect", max_size=10, max_wait=0.0)
    await send(store, "t", [1, 2])
    early = await store.read_events("t", 10)
    await send(store, "t", [3, 4])
    late = await store.read_events("t", 10)
    a, b = TriggerFirer(store), TriggerFirer(store)
    first = await a.fire(trigger, early)
    again = await b.fire(trigger, late)
    assert first is not None and again is not None and again.run_id == first.run_id
    assert await store.consume_events("t", early[0].seq, 2) is False  # B consumed them
    assert [e.payload for e in await store.read_events("t", 10)] == ["3", "4"]
    await a.fire_ready(trigger)
    assert batches(await all_runs(store)) == [[1, 2], [3, 4]]


async def test_batches_stay_within_the_payload_limit(store: Store) -> None:
    trigger = BatchTrigger("t", "collect", max_size=100, max_wait=0.0)
    await send(store, "t", ["x" * 300] * 10)
    await TriggerFirer(store, max_payload_bytes=1_000).fire_ready(trigger)
    sizes = [len(batch) for batch in batches(await all_runs(store))]
    assert sum(sizes) == 10 and max(sizes) <= 3
    assert all(len(run.params) <= 1_000 for run in await all_runs(store))


async def test_a_run_id_taken_by_something_else_keeps_the_batch(store: Store) -> None:
    trigger = BatchTrigger("t", "collect", max_size=2, max_wait=0.0)
    await send(store, "t", [1, 2])
    events = await store.read_events("t", 10)
    client = WorkflowClient(store, require_registered=False)
    await client.submit("other", {}, run_id=batch_run_id("t", events[0]))
    assert await TriggerFirer(store).fire_ready(trigger) is None  # logged, not fired
    assert len(await store.read_events("t", 10)) == 2


# -- the worker's trigger loop --------------------------------------------------------------
async def start(store: Store, registry: Registry, triggers: list[BatchTrigger]) -> WorkflowWorker:
    options = WorkerOptions(**{**FAST, "trigger_poll_interval": 0.05})
    worker = WorkflowWorker(
        store=store,
        workflows=registry.all(),
        options=options,
        registry=registry,
        triggers=triggers,
    )
    asyncio.get_running_loop().create_task(worker.run())
    await asyncio.sleep(0)
    return worker


async def test_workers_run_every_event_once_in_batches(
    engine_store: Store, registry: Registry, eventually: Eventually
) -> None:
    seen: list[list[int]] = []

    @workflow(registry=registry)
    async def ingest(ctx: WorkflowContext, events: list[int]) -> int:
        seen.append(events)
        return sum(events)

    trigger = batch_trigger("ingest-trigger", ingest, max_size=10, max_wait=0.2,
                            registry=TriggerRegistry())  # fmt: skip
    workers = [await start(engine_store, registry, [trigger]) for _ in range(2)]
    client = WorkflowClient(engine_store, registry=registry)
    try:
        sent = 0
        for chunk in ([*range(0, 7)], [*range(7, 23)], [*range(23, 25)]):
            await client.send_events("ingest-trigger", chunk)
            sent += len(chunk)

        async def done() -> bool:
            runs = await engine_store.list_runs(workflow="ingest", limit=100)
            return sum(len(b) for b in batches(runs)) == sent and all(
                r.status is RunStatus.COMPLETED for r in runs
            )

        await eventually(done, timeout=10, what="every event in a completed run")
        runs = await engine_store.list_runs(limit=100)
        got = [event for batch in batches(runs) for event in batch]
        assert got == list(range(25))  # each once, in the order sent
        assert all(len(batch) <= 10 for batch in seen)
        assert await engine_store.read_events("ingest-trigger", 10) == []
    finally:
        for worker in workers:
            worker.stop()
        await asyncio.sleep(0.2)


async def test_a_worker_takes_the_triggers_given_and_refuses_anything_else(
    engine_store: Store, registry: Registry
) -> None:
    collect = collector(registry)
    mine = BatchTrigger("mine", collect.name, max_size=1, max_wait=0.0)
    other = BatchTrigger("other", "someone-else", max_size=1, max_wait=0.0)
    worker = WorkflowWorker(
        store=engine_store, workflows=[collect], registry=registry, triggers=[mine, other]
    )
    assert worker.triggers == [mine, other]
    with pytest.raises(ConfigurationError, match="triggers="):
        WorkflowWorker(store=engine_store, triggers=["mine"])  # type: ignore[list-item]
