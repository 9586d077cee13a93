"""Schedules and rate limits across processes on one shared SQLite file: three workers fire each
slot of a 1-second interval exactly once, and a Rate(per_second=10) holds across two
workers. Every worker process is started, and killed, by its PID."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from pyrula.workflows import WorkflowClient
from pyrula.workflows.schedules import Schedule
from pyrula.workflows.stores.sqlite import SqliteStore
from tests.fixtures import schedule_rate_workflows as wf

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "tests" / "fixtures" / "run_worker.py"
WORKER_FLAGS = [
    "--module",
    "tests.fixtures.schedule_rate_workflows",
    "--claim-poll-interval",
    "0.05",
    "--timer-poll-interval-s",
    "0.05",
    "--schedule-poll-interval",
    "0.05",
    "--lock-ttl",
    "5",
    "--shutdown-grace",
    "1",
]
FIRED = re.compile(r"schedule (\S+) fired slot (\d+) as run (\w+)")


class Workers:
    """Worker processes on one SQLite file; each is stopped, then killed, by its PID."""

    def __init__(self, tmp_path: Path) -> None:
        self.db_path = tmp_path / "shared.db"
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self, count: int) -> None:
        for _ in range(count):
            index = len(self.procs)
            log = self.tmp_path / f"worker-{index}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        str(LAUNCHER),
                        "--store",
                        f"sqlite:///{self.db_path}",
                        "--worker-id",
                        f"w{index}",
                        *WORKER_FLAGS,
                    ],
                    cwd=ROOT,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            self.procs.append(proc)
            self.logs.append(log)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs if p.exists())


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    group = Workers(tmp_path)
    try:
        yield group
    finally:
        group.stop_all()


@pytest.fixture
async def store(workers: Workers) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(workers.db_path)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.05)


async def all_serving(store: SqliteStore, count: int) -> bool:
    return len(await store.list_workers()) >= count


async def test_three_workers_fire_each_slot_of_a_one_second_interval_exactly_once(
    workers: Workers, store: SqliteStore
) -> None:
    workers.start(3)
    await wait_for(lambda: all_serving(store, 3), 30, "three workers serving")
    schedule = Schedule.create(wf.tick, every=1, schedule_id="every-second")
    created = store.schedule_create(schedule)
    await asyncio.sleep(20.5)
    store.schedule_update(schedule.schedule_id, enabled=False)
    disabled_at = await store.now()  # no slot after it can have fired
    await asyncio.sleep(0.5)  # let a fire in flight land

    runs = await store.list_runs(workflow=wf.TICK, limit=1000)
    prefix = f"schedule:{schedule.schedule_id}:"
    slots = sorted(float(r.idempotency_key[len(prefix) :]) for r in runs if r.idempotency_key)
    assert len(slots) == len(runs)
    # About 20 slots passed; none fired before its time (the count is not bounded by the
    # test's sleep, which a loaded machine stretches).
    assert len(slots) >= 19 and slots[-1] <= disabled_at + 1e-3, (slots, disabled_at)
    assert slots[0] == pytest.approx(created.next_fire_at, abs=1e-3)
    gaps = {round(b - a, 3) for a, b in itertools.pairwise(slots)}
    assert gaps == {1.0}  # no slot skipped, none fired twice

    fires = Counter(m.group(2) for m in FIRED.finditer(workers.log_text()))
    assert len(fires) == len(slots)
    assert set(fires.values()) == {1}, fires  # each slot won by exactly one worker
    for run in runs:
        assert (await store.wait_run(run.run_id, 10)).status.value == "completed"


async def test_a_rate_of_ten_a_second_holds_across_two_worker_processes(
    workers: Workers, store: SqliteStore
) -> None:
    workers.start(2)
    await wait_for(lambda: all_serving(store, 2), 30, "two workers serving")
    client = WorkflowClient(store)
    handles = [await client.submit(wf.limited, {"i": i}) for i in range(30)]
    assert [await h.result(timeout=60) for h in handles] == list(range(30))

    runs = await store.list_runs(workflow=wf.LIMITED, limit=100)
    starts = sorted(r.started_at for r in runs if r.started_at is not None)
    assert len(starts) == 30
    assert starts[-1] - starts[0] >= 2.5  # 29 gaps of 0.1 s: about 2.9 s
    for i, start in enumerate(starts):  # the limit is shared, not per worker
        assert sum(1 for s in starts[i:] if s < start + 1.0 - 1e-6) <= 11
    print("runs per worker:", Counter(r.worker_id for r in runs))
