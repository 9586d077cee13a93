"""SIGKILLs from outside of SQLite worker processes, at random moments (mid-step,
mid-claim, mid-transaction), then ``PRAGMA integrity_check`` and the checker.

``test_faults.py`` kills workers only at fault points, between store calls; here the
kills land wherever the victim is, so some hit a process inside a write transaction.
docs/stores.md: "An application crash or SIGKILL loses nothing that was committed", and
a lock held by a dead process must not wedge the others (SQLite drops it with the
process). Expect: the file stays intact, no run lost or re-run, and no worker surfaces
a store error as an engine failure.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import time

import pytest

from pyrula.workflows.stores.sqlite import SqliteStore

from .harness import Cluster, Supervisor
from .nemesis import judge, kill_holders, log_has
from .test_faults import RUNS, submit_runs

pytestmark = pytest.mark.slow

KILLS = 6


async def test_random_sigkills_keep_the_database_intact_and_lose_nothing(
    cluster: Cluster, store: SqliteStore
) -> None:
    seed = int(os.environ.get("PYRULA_CHAOS_SEED") or 7707)
    print(f"\n[sqlite kills] seed {seed} (replay: PYRULA_CHAOS_SEED={seed})")
    supervisor = Supervisor(cluster, 3, faultpoints="", seed=seed)
    await supervisor.start(store)
    started = time.monotonic()
    killer = asyncio.create_task(
        kill_holders(store, supervisor, random.Random(seed + 3), count=KILLS, gap=0.9)
    )
    expected = await submit_runs(store, random.Random(seed))
    kills = await killer
    report, summary = await judge(
        cluster,
        store,
        expected,
        supervisor.faults,
        label="sqlite kills",
        extra=f"kills {kills}, {time.monotonic() - started:.1f}s",
    )
    await supervisor.halt()
    assert report.ok, summary
    assert report.figures["completed"] == RUNS, summary
    assert kills >= 3 and len(supervisor.faults) == kills, summary
    assert report.figures["recoveries"] > 0, summary
    assert not supervisor.unexpected_exits, supervisor.unexpected_exits
    survivors = [w for w in cluster.workers if w.alive()]
    assert not log_has(survivors, "engine error"), cluster.describe("a store error leaked")

    cluster.kill_all()  # no writer left: check the file as a fresh process would
    conn = sqlite3.connect(cluster.db_path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        conn.close()
