"""A schedule due during downtime fires exactly once, across real worker processes on a
real Valkey server (reliability scenario 23).

A schedule with ``every=1`` has its ``next_fire_at`` set an hour in the past (the
downtime; the server's clock rules, so no faketime), then worker processes start on its
namespace. Each runs the schedule loop every ``WorkflowWorker`` runs; none serves the
schedule's workflow (they serve ``tests.fixtures.chaos_workflows``: a worker serving
nothing has no claim loop to exercise), so every fired run stays queued and is
counted by its idempotency key ``schedule:<id>:<slot>``. Measured and printed: runs per
slot (the histogram), the catch-up runs, and how late each fire was (the run's
``created_at`` minus its slot, both on the server's clock).

* Three workers started at once fire one catch-up run, for the latest slot that passed
  (not 3600), then one run per slot; one of them is SIGKILLed mid-way and the other two
  keep every slot firing once.
* The fault between the fire's two calls (on Valkey the slot's run and the schedule
  live in different cluster slots: ``fire_schedule`` creates the run, then moves the
  schedule): pyrula has no named fault point for it, so the worker here is launched by
  this module (``python -m tests.valkey.test_schedule_processes``, ``run_worker.py``
  with a hook) and SIGKILLs itself after creating the run, before ``sched_fire``. Two
  workers started afterwards fire every slot once, and the victim's slot keeps its run.
  (Moving the schedule first lost that run.)

Every process is started, signalled and reaped by its PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import open_store
from pyrula.workflows.records import RunRecord
from pyrula.workflows.schedules import Schedule
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.valkey.servers import ValkeyProcess, fresh_namespace

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = "sched_probe"
"""Served by no worker: the runs the schedule fires stay queued, to be counted."""
SERVED_MODULE = "tests.fixtures.chaos_workflows"
"""What the workers serve (not the schedule's workflow): a worker serving nothing cannot
stop cleanly, see :func:`test_a_worker_serving_no_workflow_stops_cleanly`."""
SCHEDULE_ID = "downtime"
EVERY = 1.0
DOWNTIME = 3600.0
KILL_AFTER_FIRE_ENV = "PYRULA_TEST_KILL_AFTER_FIRE"
"""Set in a worker's environment: it SIGKILLs itself between the two calls of a fire,
after the slot's run is created and before ``sched_fire`` moves the schedule."""
WORKER_OPTIONS = {
    "lock_ttl": "2",
    "orphan_scan_interval": "0.5",
    "claim_poll_interval": "0.1",
    "shutdown_grace": "0.5",
    "cancel_timeout": "1",
}
FIRED = re.compile(rf"schedule {SCHEDULE_ID} fired slot \d+ as run (\w+)")


# -- worker processes --------------------------------------------------------------------
@dataclass
class Worker:
    """One worker process, known by its PID."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    killed_at: float | None = field(default=None)
    """Store time of the SIGKILL this test sent it."""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def text(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def fired_runs(self) -> list[str]:
        """The run ids this worker logged firing."""
        return FIRED.findall(self.text())


class Workers:
    """Starts worker processes (this module as ``__main__``) on ``url``; SIGKILLs and
    reaps, by PID, every one still alive at teardown."""

    def __init__(self, directory: Path, url: str) -> None:
        self.dir = directory
        self.url = url
        self.started: list[Worker] = []

    def start(self, name: str, *, kill_after_fire: bool = False) -> Worker:
        argv = [sys.executable, "-m", "tests.valkey.test_schedule_processes"]
        argv += ["--store", self.url, "--worker-id", name, "--module", SERVED_MODULE]
        for key, value in WORKER_OPTIONS.items():
            argv += ["--" + key.replace("_", "-"), value]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYRULA_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        if kill_after_fire:
            env[KILL_AFTER_FIRE_ENV] = "1"
        log_path = self.dir / f"{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        worker = Worker(name, proc, log_path)
        self.started.append(worker)
        return worker

    def stop(self, *workers: Worker) -> None:
        """SIGTERM each (a clean stop), then wait for each to exit 0."""
        for worker in workers:
            os.kill(worker.pid, signal.SIGTERM)
        for worker in workers:
            code = worker.wait(15)
            assert code == 0, self.describe(f"{worker.name} stopped with {code}")

    def kill_all(self) -> None:
        for worker in self.started:
            if worker.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGKILL)
        for worker in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(10)

    def firer(self, run_id: str) -> str:
        names = [w.name for w in self.started if run_id in w.fired_runs()]
        return ",".join(names) or "?"

    def describe(self, headline: str, tail: int = 20) -> str:
        parts = [headline, f"(logs in {self.dir})"]
        for worker in self.started:
            parts.append(f"--- {worker.name} pid {worker.pid} rc {worker.proc.poll()}")
            parts.extend(worker.text().splitlines()[-tail:])
        return "\n".join(parts)


@contextlib.contextmanager
def worker_processes(directory: Path, server: ValkeyProcess) -> Iterator[Workers]:
    workers = Workers(directory, f"{server.url}/0?namespace={fresh_namespace()}")
    try:
        yield workers
    finally:
        workers.kill_all()


# -- reading the runs ----------------------------------------------------------------------
def slot_of(run: RunRecord) -> float:
    key = run.idempotency_key or ""
    prefix = f"schedule:{SCHEDULE_ID}:"
    assert key.startswith(prefix), key
    return float(key[len(prefix) :])


def on_grid(slot: float, origin: float) -> bool:
    """Whether ``slot`` is a whole number of periods from ``origin`` (keys keep ms)."""
    periods = (slot - origin) / EVERY
    return abs(periods - round(periods)) < 2e-3


async def fired_runs(store: ValkeyStore) -> list[RunRecord]:
    return sorted(await store.list_runs(workflow=WORKFLOW, limit=10_000), key=slot_of)


async def wait_for_slot(store: ValkeyStore, workers: Workers, at_least: float) -> None:
    """Until a run for a slot >= ``at_least`` exists (a run fires within 10 s)."""
    deadline = time.monotonic() + 10 + max(0.0, at_least - await store.now())
    while not any(slot_of(run) >= at_least - 1e-3 for run in await fired_runs(store)):
        if time.monotonic() > deadline:
            raise AssertionError(workers.describe(f"no run for a slot >= {at_least:.3f}"))
        await asyncio.sleep(0.05)


async def schedule_an_hour_overdue(store: ValkeyStore) -> float:
    """Store the schedule, then move its next slot an hour back (the downtime); that slot."""
    schedule = Schedule.create(WORKFLOW, every=EVERY, schedule_id=SCHEDULE_ID)
    record = await store.create_schedule(schedule.to_record(await store.now()))
    overdue = await store.update_schedule(SCHEDULE_ID, next_fire_at=record.next_fire_at - DOWNTIME)
    assert overdue.next_fire_at < await store.now() - DOWNTIME + 2 * EVERY
    return overdue.next_fire_at


def summary(runs: list[RunRecord], workers: Workers) -> list[dict[str, Any]]:
    return [
        {
            "slot": round(slot_of(run), 3),
            "late": round(run.created_at - slot_of(run), 4),
            "by": workers.firer(run.run_id),
        }
        for run in runs
    ]


# -- three workers, one SIGKILLed mid-way ------------------------------------------------
async def test_downtime_fires_once_then_every_slot_once_while_a_worker_dies(
    tmp_path: Path, valkey_server: ValkeyProcess
) -> None:
    with worker_processes(tmp_path, valkey_server) as workers:
        store = open_store(workers.url)
        assert isinstance(store, ValkeyStore)
        try:
            await _three_workers_one_killed(store, workers)
        finally:
            await store.close()


async def _three_workers_one_killed(store: ValkeyStore, workers: Workers) -> None:
    origin = await schedule_an_hour_overdue(store)
    launched = await store.now()
    trio = [workers.start(f"w{i}") for i in range(3)]
    await wait_for_slot(store, workers, origin)
    catch_up = (await fired_runs(store))[0]
    first = slot_of(catch_up)
    # The latest slot that had passed when it fired: one run, not the hour's 3600.
    assert on_grid(first, origin)
    # How late it fired measures only the machine's load; that it was not early, and not
    # a slot from before the launch, is the guarantee.
    assert first <= catch_up.created_at
    assert first > launched - EVERY
    # Three slots with the three workers, then one of them is killed mid-period (between
    # two slots, when no fire is in flight) and the other two go on for three slots.
    await wait_for_slot(store, workers, first + 3 * EVERY)
    firers = {workers.firer(run.run_id) for run in await fired_runs(store)}
    victim = next((w for w in trio if w.name in firers), trio[0])  # one that won races
    now = await store.now()
    offset = now - time.time()
    kill_slot = first + math.floor((now - first) / EVERY) * EVERY  # the latest due
    if kill_slot + 0.5 * EVERY - now < 0.1 * EVERY:  # too close to the next fire
        kill_slot += EVERY
    await asyncio.sleep(max(0.0, kill_slot + 0.5 * EVERY - (time.time() + offset)))
    os.kill(victim.pid, signal.SIGKILL)
    victim.killed_at = await store.now()
    assert victim.wait(5) == -signal.SIGKILL
    await wait_for_slot(store, workers, kill_slot + 3 * EVERY)
    await asyncio.sleep(0.3 * EVERY)  # a second run for that slot, if any, lands
    stopped = await store.now()
    workers.stop(*(w for w in trio if w is not victim))
    runs = await fired_runs(store)
    report = summary(runs, workers)
    counts = Counter(round(slot_of(run), 3) for run in runs)
    histogram = Counter(counts.values())
    print(
        f"\nscenario 23, 3 workers: launched at {launched:.3f}, overdue since "
        f"{origin:.3f}, catch-up slot {first:.3f} fired {catch_up.created_at - first:.3f}s "
        f"after it; {victim.name} killed at {victim.killed_at:.3f}; runs per slot "
        f"{dict(sorted(histogram.items()))}; fires: {report}"
    )
    assert histogram == Counter({1: len(counts)}), report  # no slot fired twice
    assert [n for n in counts if n <= first] == [round(first, 3)], report  # one catch-up
    # Every slot from the catch-up to the stop fired, and only those.
    last = max(counts)
    assert last >= kill_slot + 3 * EVERY - 1e-3 and last <= stopped, report
    expected = {round(first + n * EVERY, 3) for n in range(round((last - first) / EVERY) + 1)}
    assert set(counts) == expected, report
    assert all(fire["late"] >= 0 for fire in report[1:]), report  # never before its slot
    # The dead worker fired nothing after its kill; the survivors shared the slots.
    after_kill = {r.run_id for r in runs if slot_of(r) > victim.killed_at}
    assert not after_kill & set(victim.fired_runs()), report
    schedule = await store.get_schedule(SCHEDULE_ID)
    assert schedule is not None
    assert schedule.last_fire_at == pytest.approx(last, abs=1e-3)
    assert schedule.next_fire_at == pytest.approx(last + EVERY, abs=1e-3)


# -- a worker killed between the fire's two calls -----------------------------------------
@dataclass
class KillAfterFire:
    """What happened when a worker died between creating a slot's run and moving the
    schedule (ValkeyStore.fire_schedule's two calls)."""

    victim_slot: float
    """The slot whose run the killed worker created (the catch-up slot)."""
    runs: list[RunRecord]
    report: list[dict[str, Any]]
    describe: str


@pytest.fixture(scope="module")
def kill_after_fire(
    tmp_path_factory: pytest.TempPathFactory, valkey_server: ValkeyProcess
) -> KillAfterFire:
    """Run once for the tests below: the schedule an hour overdue, one worker alone that
    SIGKILLs itself after creating the catch-up slot's run, before moving the schedule;
    then two healthy workers for three slots."""
    with worker_processes(tmp_path_factory.mktemp("kill-after-fire"), valkey_server) as workers:
        return asyncio.run(_kill_after_fire(workers))


async def _kill_after_fire(workers: Workers) -> KillAfterFire:
    store = open_store(workers.url)
    assert isinstance(store, ValkeyStore)
    try:
        origin = await schedule_an_hour_overdue(store)
        victim = workers.start("victim", kill_after_fire=True)
        code = await asyncio.to_thread(victim.wait, 20)
        assert code == -signal.SIGKILL, workers.describe(f"the victim ended with {code}")
        (created,) = await fired_runs(store)  # the run is there; the schedule did not move
        victim_slot = slot_of(created)
        schedule = await store.get_schedule(SCHEDULE_ID)
        assert schedule is not None and schedule.last_fire_at is None
        assert on_grid(victim_slot, origin) and victim_slot > origin + DOWNTIME - 60
        healthy = [workers.start(f"h{i}") for i in range(2)]
        await wait_for_slot(store, workers, victim_slot + EVERY)
        resumed = min(slot_of(run) for run in await fired_runs(store) if slot_of(run) > victim_slot)
        await wait_for_slot(store, workers, resumed + 3 * EVERY)
        await asyncio.sleep(0.3 * EVERY)
        workers.stop(*healthy)
        runs = await fired_runs(store)
        report = summary(runs, workers)
        print(
            f"\nscenario 23, kill between the fire's calls: the victim created the run of "
            f"slot {victim_slot:.3f} and died before moving the schedule; runs: {report}"
        )
        return KillAfterFire(victim_slot, runs, report, workers.describe("kill after fire"))
    finally:
        await store.close()


def test_a_kill_between_the_fires_calls_loses_no_slot_and_fires_none_twice(
    kill_after_fire: KillAfterFire,
) -> None:
    outcome = kill_after_fire
    counts = Counter(round(slot_of(run), 3) for run in outcome.runs)
    assert set(counts.values()) <= {1}, outcome.report  # no slot twice, the killed one neither
    assert round(outcome.victim_slot, 3) in counts, outcome.report  # its run was kept
    later = sorted(n for n in counts if n > outcome.victim_slot)
    # The healthy workers came up after the next slots had passed: one catch-up for the
    # latest of them, then every slot once.
    assert len(later) >= 4, outcome.describe
    assert later == [round(later[0] + n * EVERY, 3) for n in range(len(later))], outcome.report
    assert all(fire["late"] >= 0 for fire in outcome.report[-3:]), outcome.report  # not early


# -- the worker launcher -------------------------------------------------------------------
def _die_between_the_fires_calls() -> None:
    """Make this process SIGKILL itself when it is about to send a ``sched_fire`` that
    fires a slot (a run id given): after the slot's run was created, before the schedule
    moves."""
    from pyrula.workflows.stores.valkey.connection import Server

    call = Server.call

    async def die_before_moving(self: Server, name: str, key: str, *args: Any) -> Any:
        if name == "sched_fire" and args[-1]:
            logging.getLogger(__name__).warning("the slot's run is created: SIGKILL now")
            os.kill(os.getpid(), signal.SIGKILL)
        return await call(self, name, key, *args)

    Server.call = die_before_moving  # type: ignore[method-assign]


if __name__ == "__main__":
    from tests.fixtures import run_worker

    if os.environ.get(KILL_AFTER_FIRE_ENV):
        _die_between_the_fires_calls()
    sys.exit(run_worker.main())
