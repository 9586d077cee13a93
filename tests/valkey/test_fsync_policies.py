"""A valkey-server SIGKILLed under load, once per ``appendfsync`` policy (reliability
scenario 12): which acknowledged submits survive its restart from the same AOF, and
whether the store and a real worker process carry on without a data-loss alarm.

For each of ``always``, ``everysec`` and ``no``, a server with ``appendonly yes`` and
that policy runs in a directory of its own (started, killed and reaped by PID). The test
process submits runs through ``ValkeyStore.create_run`` from ``SUBMITTERS`` concurrent
tasks (runs of a workflow no worker serves, so they stay queued) and, beside them,
``WORKER_RUNS`` ``chaos.three_steps`` runs that one ``run_worker.py`` process serves,
each step appending to an ``O_APPEND`` side-effect ledger. Every acknowledged submit is
recorded with the time of its ack. ``LOAD_SECONDS`` in, the server is SIGKILLed, stays
down ``DOWN`` seconds and is started again from the same directory (the same AOF).

Asserted, per policy:

* ``always``: no acknowledged submit is lost. ``everysec``: whatever is lost was acked
  within ``EVERYSEC_BOUND`` seconds of the kill (a sanity bound: Valkey documents up to
  about 2 s when fsync lags). ``no``: measured and printed only.
* No false data-loss alarm: the server's run_id changed, but the marker keys came back
  from the AOF, so the test's store (which saw the outage and so checks its markers on
  its next call) and the worker report nothing; nobody found the library missing.
* The worker process that lived through the restart completes every surviving
  three-step run with the right result, each step started exactly once (the chaos
  checker of ``tests/chaos/check.py`` with no worker faults), and stops cleanly.

The measured numbers print (``pytest -s``). A SIGKILL of the server process keeps the
OS page cache: whatever Valkey had handed to ``write(2)`` reaches the disk anyway, and
Valkey writes the AOF before it replies, whatever the fsync policy (except that
``everysec`` postpones the write, up to 2 s, while a background fsync is still running:
a slow disk). So a process kill shows (almost) no loss for any policy; a power loss or
kernel crash would lose what was not yet fsynced (up to about a second with
``everysec``, up to the kernel's writeback delay with ``no``). These numbers understate
that.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import StoreUnavailable, WorkflowClient, open_store
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.chaos.check import quiesce
from tests.chaos.harness import Cluster
from tests.chaos.nemesis import judge, valkey_url
from tests.fixtures.chaos_workflows import WORKFLOW, expected_result
from tests.stores.helpers import new_run
from tests.valkey.servers import ValkeyProcess

pytestmark = pytest.mark.slow

POLICIES = ["always", "everysec", "no"]
LOAD_SECONDS = 1.2
"""Seconds of load before the kill."""
SUBMITTERS = 24
"""Concurrent ``create_run`` loops."""
LOAD_WORKFLOW = "fsync.load"
"""Served by no worker: these runs stay queued, only their presence is checked."""
WORKER_RUNS = 30
"""Three-step runs for the worker process, submitted over the first half of the load
window (faster than it runs them: some are still queued at the kill)."""
STEP_DELAYS = [0.1, 0.1, 0.1]
"""Long enough that the worker (4 runs at a time) has runs in flight and queued when
the server dies."""
DOWN = 0.5
"""Seconds the server stays down: the worker's calls fail meanwhile."""
EVERYSEC_BOUND = 2.0 * 3 + 1
"""Sanity bound for ``everysec``: a lost ack is at most this many seconds older than
the kill (Valkey's guarantee, about 2 s when fsync lags, with room for a loaded disk and
machine: x3 + 1 s)."""
CHUNK = 500
"""Presence checks in flight at once."""
LOCK_TTL = 30.0
"""The worker's run lease (the default): the outage is far shorter, so nothing is
requeued and a re-executed step would be a defect."""


@dataclass
class Load:
    """What the test process submitted: acked (run id -> monotonic ack time) and not."""

    acked: dict[str, float] = field(default_factory=dict)
    unacked: dict[str, tuple[float, float]] = field(default_factory=dict)
    """run id -> monotonic times the failed submit started and failed."""
    worker_runs: dict[str, int] = field(default_factory=dict)
    """Acked three-step runs: run id -> expected result."""
    errors: list[str] = field(default_factory=list)


@dataclass
class Measured:
    policy: str
    acked: int
    rate: float
    lost: int
    lost_window: float
    last_ack_gap: float
    in_flight: int
    in_flight_present: int
    worker_runs: int
    queued_at_kill: int
    drained: float


@pytest.fixture(scope="module")
def measured() -> Iterator[list[Measured]]:
    """Every policy's figures, printed together once the module is done."""
    rows: list[Measured] = []
    yield rows
    if rows:
        print(
            "\n[fsync] policy    acked  rate/s  lost  lost-window  kill-last-ack  in-flight"
            "  worker-runs queued-at-kill drained"
        )
        for m in rows:
            print(
                f"[fsync] {m.policy:<8} {m.acked:>6} {m.rate:>7.0f} {m.lost:>5} "
                f"{f'{m.lost_window:.3f}s' if m.lost else '-':>11} "
                f"{m.last_ack_gap * 1000:>10.1f}ms "
                f"{m.in_flight_present:>3}/{m.in_flight:<3} present "
                f"{m.worker_runs:>3} {m.queued_at_kill:>3} {m.drained:>6.2f}s"
            )


async def load_submitter(store: ValkeyStore, stop: asyncio.Event, load: Load) -> None:
    """``create_run`` in a loop until ``stop`` or the first failure."""
    while not stop.is_set():
        new = new_run(LOAD_WORKFLOW)
        started = time.monotonic()
        try:
            await store.create_run(new)
        except StoreUnavailable as exc:
            load.unacked[new.run_id] = (started, time.monotonic())
            load.errors.append(str(exc))
            return
        load.acked[new.run_id] = time.monotonic()


async def worker_run_submitter(client: WorkflowClient, stop: asyncio.Event, load: Load) -> None:
    """``WORKER_RUNS`` three-step runs spread over the load window."""
    for n in range(WORKER_RUNS):
        if stop.is_set():
            return
        run_id = uuid.uuid4().hex
        started = time.monotonic()
        try:
            await client.submit(
                WORKFLOW, {"n": n, "delays": STEP_DELAYS}, run_id=run_id, fresh_id=True
            )
        except StoreUnavailable as exc:
            load.unacked[run_id] = (started, time.monotonic())
            load.errors.append(str(exc))
            return
        load.acked[run_id] = time.monotonic()
        load.worker_runs[run_id] = expected_result(n)
        await asyncio.sleep(LOAD_SECONDS / 2 / WORKER_RUNS)


async def present(store: ValkeyStore, run_ids: list[str]) -> set[str]:
    """The ones of ``run_ids`` the store has."""
    found: set[str] = set()
    for i in range(0, len(run_ids), CHUNK):
        chunk = run_ids[i : i + CHUNK]
        runs = await asyncio.gather(*(store.get_run(run_id) for run_id in chunk))
        found.update(run_id for run_id, run in zip(chunk, runs, strict=True) if run is not None)
    return found


def started_server(policy: str) -> ValkeyProcess:
    """A server with the AOF on and ``appendfsync policy`` (the later flag wins)."""
    server = ValkeyProcess("--appendfsync", policy, persist=True)
    server.start()
    raw: Any = server.client()
    try:
        assert raw.config_get("appendfsync") == {"appendfsync": policy}
        assert raw.config_get("appendonly") == {"appendonly": "yes"}
    finally:
        raw.close()
    return server


@pytest.mark.parametrize("policy", POLICIES)
async def test_a_killed_server_keeps_acked_submits_per_fsync_policy(
    policy: str, tmp_path: Path, measured: list[Measured]
) -> None:
    began = time.monotonic()
    server = started_server(policy)
    cluster = Cluster(tmp_path)
    cluster.url = valkey_url(server)
    store = open_store(cluster.url)
    assert isinstance(store, ValkeyStore)
    try:
        await store.open()
        worker = cluster.start_worker("w", lock_ttl=LOCK_TTL, max_concurrent_runs=4)
        await cluster.wait_ready(store, worker)
        raw: Any = server.client()
        try:
            old_run_id = str(raw.info("server")["run_id"])
        finally:
            raw.close()

        load, stop = Load(), asyncio.Event()
        loaded_at = time.monotonic()
        tasks = [asyncio.create_task(load_submitter(store, stop, load)) for _ in range(SUBMITTERS)]
        tasks.append(asyncio.create_task(worker_run_submitter(WorkflowClient(store), stop, load)))
        await asyncio.sleep(LOAD_SECONDS)
        assert not load.errors, load.errors
        killed_at, killed_wall = time.monotonic(), time.time()
        server.kill()  # SIGKILL by PID, reaped: mid-load
        stop.set()
        await asyncio.gather(*tasks)
        await asyncio.sleep(DOWN)
        await asyncio.to_thread(server.start)  # the same port, directory and AOF
        restarted_at, restarted_wall = time.monotonic(), time.time()
        raw = server.client()
        try:
            new_run_id = str(raw.info("server")["run_id"])
            keys = int(raw.dbsize())
        finally:
            raw.close()
        assert new_run_id != old_run_id  # a new process: what detection sees first

        # The test's store saw the outage: its next call checks the markers first.
        verified: list[float] = []
        verify = store._server.verify

        async def counting_verify() -> None:
            verified.append(time.monotonic())
            await verify()

        store._server.verify = counting_verify  # type: ignore[method-assign]
        acked = sorted(load.acked, key=load.acked.__getitem__)
        survived = await present(store, acked)
        assert verified, "the store never checked its markers after the restart"
        assert store.data_loss == [], store.data_loss
        in_flight = [r for r, (started, _) in load.unacked.items() if started < killed_at]
        in_flight_present = len(await present(store, in_flight))
        assert all(failed >= killed_at for _, failed in load.unacked.values()), load.errors

        lost = [run_id for run_id in acked if run_id not in survived]
        before_kill = [load.acked[r] for r in acked if r in survived and load.acked[r] <= killed_at]
        lost_window = killed_at - min(load.acked[r] for r in lost) if lost else 0.0
        last_ack_gap = killed_at - max(before_kill) if before_kill else float("nan")
        loaded = killed_at - loaded_at
        print(
            f"\n[fsync {policy}] acked {len(acked)} submits in {loaded:.2f}s "
            f"({len(acked) / loaded:.0f}/s, {SUBMITTERS} tasks); lost {len(lost)} acked "
            f"(acked {lost_window:.3f}s before the kill at the earliest); last surviving "
            f"ack {last_ack_gap * 1000:.1f} ms before the kill; {len(in_flight)} submits "
            f"in flight at the kill, {in_flight_present} of them present; {keys} keys "
            f"after the restart; run_id {old_run_id[:8]} -> {new_run_id[:8]}"
        )

        if policy == "always":
            assert lost == [], f"appendfsync always lost {len(lost)} acknowledged submits"
        elif policy == "everysec":
            assert lost_window <= EVERYSEC_BOUND, f"{len(lost)} lost over {lost_window:.3f}s"

        # The worker process lived through it: it completes the surviving runs, each
        # step once.
        surviving = {r: want for r, want in load.worker_runs.items() if r in survived}
        unfinished = await quiesce(store, list(surviving), 20.0)
        drained = time.monotonic() - restarted_at
        assert not unfinished, cluster.describe(f"{len(unfinished)} runs never finished")
        report, summary = await judge(cluster, store, surviving, [], label=f"fsync {policy}")
        ledger = cluster.ledger()
        first_start: dict[str, float] = {}
        for line in ledger:
            if line["phase"] == "start" and line["run_id"] in surviving:
                first_start.setdefault(line["run_id"], float(line["t"]))
        queued_at_kill = sum(first_start[r] > killed_wall for r in surviving)
        started_after = sum(
            line["phase"] == "start" and float(line["t"]) > restarted_wall for line in ledger
        )
        measured.append(
            Measured(
                policy,
                len(acked),
                len(acked) / loaded,
                len(lost),
                lost_window,
                last_ack_gap,
                len(in_flight),
                in_flight_present,
                len(load.worker_runs),
                queued_at_kill,
                drained,
            )
        )
        assert worker.alive(), cluster.describe("the worker exited")
        assert report.ok, summary
        assert report.figures["completed"] == len(surviving), summary
        assert report.figures["step_starts"] == 3 * len(surviving), summary
        assert report.figures["dup_step_execs"] == 0, summary
        assert queued_at_kill > 0 and started_after > 0, cluster.describe("none queued")
        log = worker.log_text()
        assert "is unavailable" in log, cluster.describe("the worker never saw the outage")
        assert "LOST ITS DATA" not in log, cluster.describe("a false data-loss alarm")
        assert "lost the pyrula function library" not in log, cluster.describe("library")
        assert store.data_loss == [], store.data_loss
        worker.send(signal.SIGTERM)
        assert worker.wait(15) == 0, cluster.describe("the worker did not stop cleanly")
        print(
            f"[fsync {policy}] worker: {len(surviving)} of {len(load.worker_runs)} "
            f"three-step runs survived ({queued_at_kill} still queued at the kill), all "
            f"completed, each step once, {drained:.2f}s after the restart ({started_after} "
            f"steps started after it); no data-loss alarm; {time.monotonic() - began:.1f}s "
            "in all"
        )
    finally:
        cluster.kill_all()
        await store.close()
        server.cleanup()
