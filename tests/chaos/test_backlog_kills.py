"""A large backlog, then half the workers SIGKILLed mid-flight, with no restart.

Reliability plan scenario 7 (``test_faults.py`` and friends stop at 40 runs, spread
out): ``RUNS`` three-step runs of ``chaos.three_steps`` are all queued BEFORE any worker
starts; four worker processes then drain them. Once about a third have finished, two
workers holding runs are SIGKILLed and not replaced (``Supervisor(restart=False)``), so
the two survivors must recover the victims' runs once their leases lapse and finish the
rest of the backlog. The checker (``check.py``) then enforces: every run completed once
with its result, no journaled step started again, duplicates only by the victims, and
the victims' runs moved on (recoveries > 0); the whole backlog must be done within
``DRAIN_BOUND`` seconds, a deadline that catches a stalled recovery, not a benchmark.

On a real valkey-server and on SQLite. The seed prints; ``PYRULA_CHAOS_SEED=<seed>``
replays the dice (step delays, victims).
"""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest

from pyrula.workflows.stores.valkey import ValkeyStore
from tests.fixtures.chaos_workflows import STEPS
from tests.valkey.servers import valkey_server  # noqa: F401  (fixture)

from .check import quiesce
from .harness import Cluster, Supervisor
from .nemesis import judge, kill_holders, opened_store
from .test_faults import submit_runs

pytestmark = pytest.mark.slow

RUNS = {"valkey": 1500, "sqlite": 1500}
"""Backlog size per store."""
WORKERS = 4
KILLED = 2
DRAIN_BOUND = 120.0
"""Seconds from the workers' start to the last run's outcome; beyond it, recovery stalled."""


def finished(cluster: Cluster) -> int:
    """Runs whose last step has ended at least once, by the ledger."""
    return len(
        {
            line["run_id"]
            for line in cluster.ledger()
            if line.get("step") == STEPS[-1] and line.get("phase") == "end"
        }
    )


async def wait_finished(cluster: Cluster, count: int, deadline: float) -> int:
    """Wait until ``count`` runs have finished their last step (by ``deadline``, a
    monotonic time); return how many had."""
    while (done := finished(cluster)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(cluster.describe(f"only {done} of {count} runs finished"))
        await asyncio.sleep(0.1)
    return done


@pytest.mark.parametrize("kind", ["valkey", "sqlite"])
async def test_half_the_workers_killed_mid_backlog_lose_and_repeat_nothing(
    request: pytest.FixtureRequest, cluster: Cluster, kind: str
) -> None:
    runs = RUNS[kind]
    seed = int(os.environ.get("PYRULA_CHAOS_SEED") or 8808)
    label = f"{kind} backlog of {runs}, seed {seed}"
    print(f"\n[{label}] (replay: PYRULA_CHAOS_SEED={seed})")
    async with opened_store(request, cluster, kind) as store:
        submit_started = time.monotonic()
        expected = await submit_runs(store, random.Random(seed), runs=runs, spread=0)
        submit_took = time.monotonic() - submit_started

        supervisor = Supervisor(cluster, WORKERS, faultpoints="", seed=seed, restart=False)
        await supervisor.start(store)
        started = time.monotonic()
        deadline = started + DRAIN_BOUND
        done_at_kill = await wait_finished(cluster, runs // 3, deadline)
        kills = await kill_holders(
            store, supervisor, random.Random(seed + 9), count=KILLED, gap=0.1
        )
        killed = time.monotonic()
        pending = await quiesce(store, list(expected), max(deadline - killed, 0.0))
        drained = time.monotonic()
        report, summary = await judge(
            cluster,
            store,
            expected,
            supervisor.faults,
            label=label,
            quiesce_for=0,  # done above, against the deadline
            extra=rates(runs, submit_took, done_at_kill, started, killed, drained, kills),
        )
        await supervisor.halt()
        assert not pending, f"{len(pending)} runs unfinished {DRAIN_BOUND}s in\n{summary}"
        assert report.ok, summary
        assert report.figures["completed"] == runs, summary
        assert kills == KILLED and len(supervisor.faults) == KILLED, summary
        assert report.figures["recoveries"] > 0, summary  # the victims' runs moved on
        assert len(supervisor.slots) == WORKERS - KILLED, summary
        assert all(w.alive() for w in supervisor.slots), summary
        assert not supervisor.unexpected_exits, f"{supervisor.unexpected_exits}\n{summary}"
        if isinstance(store, ValkeyStore):
            assert store.data_loss == [], summary


def rates(
    runs: int,
    submit_took: float,
    done_at_kill: int,
    started: float,
    killed: float,
    drained: float,
    kills: int,
) -> str:
    """Timings for the summary: submit time, runs/s before and after the kills, drain."""
    before = done_at_kill / max(killed - started, 1e-9)
    after = (runs - done_at_kill) / max(drained - killed, 1e-9)
    return (
        f"submitted in {submit_took:.1f}s; kills {kills} after {done_at_kill} runs "
        f"({killed - started:.1f}s, {before:.0f} runs/s); the rest in "
        f"{drained - killed:.1f}s ({after:.0f} runs/s); drained in {drained - started:.1f}s"
    )
