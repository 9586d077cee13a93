"""A schedule created or resumed by another process while a worker idles fires its first
slot on time, not up to ``schedule_poll_interval`` (30 s by default) late.

The worker runs in this process with the default ``schedule_poll_interval``; the change
comes from the ``pyrula schedules`` CLI in a process of its own (SQLite file, Valkey
namespace), or from the test's own task on a MemoryStore (nothing else can share one).
Each test logs how late the first fire was; the assertion bound is generous (timing on
a loaded 2-core box), far below the 30 s poll it guards against.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunRecord, Store, WorkflowContext, open_store, workflow
from pyrula.workflows.registry import Registry
from pyrula.workflows.schedules import Schedule
from tests.conftest import StartWorker
from tests.valkey.servers import ValkeyProcess, fresh_namespace, valkey_server  # noqa: F401

log = logging.getLogger(__name__)

LATE_BOUND = 10.0
"""Seconds after its slot the first fire must come by: the change wakes the schedule loop,
which otherwise looks again only after its 30 s poll (generous, for a loaded machine)."""
CLI = "import sys; from pyrula.cli.main import main; sys.argv[0] = 'pyrula'; main()"


class Target:
    """A store of one kind for the worker, and how another client changes schedules."""

    def __init__(self, kind: str, url: str, store: Store) -> None:
        self.kind = kind
        self.url = url
        self.store = store

    async def cli(self, *args: str) -> None:
        """``pyrula schedules ARGS --store URL`` in a process of its own (the MemoryStore:
        the same call on this process's store, from this task)."""
        if self.kind == "memory":
            await self._in_process(*args)
            return
        command = [sys.executable, "-c", CLI, "schedules", *args, "--store", self.url]
        proc = await asyncio.create_subprocess_exec(
            *command, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, (out + err).decode()

    async def _in_process(self, action: str, *args: str) -> None:
        store = self.store
        if action == "create":
            workflow_name, _, every, _, schedule_id = args
            schedule = Schedule.create(workflow_name, every=float(every), schedule_id=schedule_id)
            await store.create_schedule(schedule.to_record(await store.now()))
        elif action == "resume":
            schedule_id = args[0]
            record = await store.get_schedule(schedule_id)
            assert record is not None
            following = Schedule.from_record(record).next_slot_after(await store.now())
            await store.update_schedule(schedule_id, enabled=True, next_fire_at=following)
        else:
            raise AssertionError(action)


@pytest.fixture(params=["memory", "sqlite", "valkey"])
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Target]:
    kind: str = request.param
    if kind == "memory":
        url = "memory://"
    elif kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'schedules.db'}"
    else:
        server: ValkeyProcess = request.getfixturevalue("valkey_server")
        url = f"{server.url}?namespace={fresh_namespace()}&shard_count=8"
    store = open_store(url)
    await store.open()
    try:
        yield Target(kind, url, store)
    finally:
        await store.close()


async def first_run(store: Store, workflow_name: str, timeout: float) -> RunRecord:
    deadline = time.monotonic() + timeout
    while True:
        runs = await store.list_runs(workflow=workflow_name, limit=10)
        if runs:
            return min(runs, key=lambda r: r.created_at)
        if time.monotonic() > deadline:
            pytest.fail(f"no fire of {workflow_name} within {timeout} s")
        await asyncio.sleep(0.01)


def slot_of(run: RunRecord) -> float:
    assert run.idempotency_key is not None
    return float(run.idempotency_key.rsplit(":", 1)[1])


Change = Callable[[Target], Awaitable[Any]]


async def create_every_two_seconds(target: Target) -> None:
    await target.cli("create", "sc_tick", "--every", "2", "--id", "sc")


async def resume_a_paused_schedule(target: Target) -> None:
    await target.cli("resume", "sc")


@pytest.mark.parametrize("change", [create_every_two_seconds, resume_a_paused_schedule])
async def test_a_schedule_changed_elsewhere_fires_its_first_slot_on_time(
    target: Target, registry: Registry, start_worker: StartWorker, change: Change
) -> None:
    @workflow(name="sc_tick", registry=registry)
    async def tick(ctx: WorkflowContext) -> None:
        return None

    store = target.store
    if change is resume_a_paused_schedule:
        paused = Schedule.create(tick, every=2, schedule_id="sc", enabled=False)
        await store.create_schedule(paused.to_record(await store.now()))
    worker = await start_worker(store, [tick])  # the default schedule_poll_interval: 30 s
    assert worker.options.schedule_poll_interval == 30.0
    await asyncio.sleep(0.5)  # idle: its schedule loop is asleep with nothing due
    await change(target)
    record = await store.get_schedule("sc")
    assert record is not None and record.enabled
    # Without the change marker the loop would look again only after its 30 s poll.
    run = await first_run(store, tick.name, timeout=record.next_fire_at - time.time() + 10)
    late = run.created_at - record.next_fire_at
    log.warning(
        "%s, %s: the first fire came %.3f s after the first slot",
        target.kind,
        change.__name__,
        late,
    )
    print(f"\nLATENESS {target.kind} {change.__name__}: {late:.3f} s")
    assert -1e-3 <= late < LATE_BOUND, f"the first fire came {late:.3f} s after the first slot"
    # The first slot, or (on a machine loaded past a 2 s period) a later one on its grid:
    # the slot loop fires the latest slot due, never one before the change's first.
    periods = (slot_of(run) - record.next_fire_at) / 2
    assert periods > -1e-3 and abs(periods - round(periods)) < 1e-3, (slot_of(run), record)
