"""Durability across processes: a worker SIGKILLed mid-task, and beat with two workers."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from pyrula.workflows import RunRecord, open_store
from pyrula_compat import states
from tests.compat.conftest import Workers, broker_url, lines, proj_workers, wait_until

pytestmark = pytest.mark.slow
T = 30


@pytest.fixture(params=["sqlite", "valkey"])
def kind(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture
def workers(kind: str, tmp_path, request: pytest.FixtureRequest, proj_app):  # type: ignore[no-untyped-def]
    with proj_workers(broker_url(kind, tmp_path, request), tmp_path, proj_app) as group:
        yield group


def test_a_task_whose_worker_is_sigkilled_completes_on_another(workers: Workers) -> None:
    import proj.tasks as t

    first = workers.start()
    marker = str(workers.tmp / "marker")
    result = t.slow.delay(1.5, marker)
    wait_until(lambda: lines(marker), T, "the task to start on the first worker")
    assert result.state == states.PENDING  # running: task_track_started is off, as in Celery
    first.kill()  # SIGKILL mid-task: nothing is acked, the lease lapses
    workers.start()
    assert result.get(timeout=T) == 1.5
    pids = [line.split()[1] for line in lines(marker)]
    assert len(pids) == 2 and pids[0] == str(first.proc.pid) != pids[1]


def test_beat_schedule_fires_each_slot_once_with_two_workers(workers: Workers, proj_app) -> None:  # type: ignore[no-untyped-def]
    ticks = str(workers.tmp / "ticks")
    env = {"PROJ_BEAT": ticks}
    a = workers.start(env=env)
    b = workers.start(env=env)
    wait_until(lambda: len(lines(ticks)) >= 3, T, "three ticks")
    a.stop()
    b.stop()  # no tick is in flight once both have stopped
    stamped = [x.split() for x in lines(ticks)]
    assert {name for _, name, _ in stamped} == {"tick-every-2s"}  # Celery beat's header
    ran = [run_id for _, _, run_id in stamped]
    assert len(ran) == len(set(ran)), ran  # each fired run ran once
    # Each run is one slot of the 2 s schedule (its idempotency key names the slot): no
    # slot fired twice although both workers fire schedules, and every fire is on the grid.
    keys = {run.run_id: run.idempotency_key or "" for run in stored_runs(workers.broker)}
    prefix = "schedule:tick-every-2s:"
    assert all(keys[run_id].startswith(prefix) for run_id in ran), (ran, keys)
    slots = sorted(float(keys[run_id][len(prefix) :]) for run_id in ran)
    gaps = [round(later - earlier, 3) for earlier, later in itertools.pairwise(slots)]
    assert gaps and all(gap > 0 and gap % 2.0 == 0 for gap in gaps), slots
    assert "beat schedule synced" in a.stderr + b.stderr


def stored_runs(url: str) -> list[RunRecord]:
    async def read() -> list[RunRecord]:
        store = open_store(url)
        try:
            return await store.list_runs(workflow="proj.tasks.beat_tick", limit=1000)
        finally:
            await store.close()

    return asyncio.run(read())
