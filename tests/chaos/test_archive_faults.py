"""Archiving under faults: worker processes on ArchivingStore(Valkey, Postgres) lose and
duplicate nothing when the archiving process dies between the Postgres commit and the
hot delete, or when Postgres dies in the middle of a batch (reliability plan, scenario 14;
invariant I12: archive rows = completed runs, no duplicates, the hot record deleted only
after the Postgres commit).

* ``kills``: ``RUNS`` runs complete while every worker archives; the first
  ``FIRST_KILLS`` worker processes are SIGKILLed at the first batch they commit
  (``archive_after_pg_commit_before_hot_delete``: the batch is in Postgres, the cursor
  has not moved, nothing has left Valkey), later ones with probability ``LATER_KILL``
  there or at ``archive_before_pg_write`` (the batch read, nothing written); the
  supervisor replaces them.
* ``outage``: runs keep coming while a test connection locks ``pyrula_journal``, so an
  archiver's batch transaction stops half-written (its run rows upserted, its journal
  waiting); then the postmaster gets SIGQUIT by PID (``pg_ctl stop -m immediate``), and
  Postgres starts again on its data directory ``OUTAGE`` seconds later. Runs must keep
  completing on Valkey meanwhile, stay there, and be archived once the archiver's
  backoff lets it in again.

Afterwards the checker of ``check.py`` (I1-I6, through the ArchivingStore, so archived
runs are read from Postgres), then the archive itself: one row per submitted run and no
other, each completed with its result and its whole journal; Valkey emptied of them
(``live_ttl_after_archive`` after archival); a fresh ArchivingStore reads every result.

Valkey: the session's valkey-server (``tests/valkey/servers.py``). Postgres:
``PYRULA_TEST_POSTGRES_DSN`` or the session's pgserver for ``kills``; ``outage`` always
starts a pgserver of its own, since it stops it. The seed prints;
``PYRULA_CHAOS_SEED=<seed>`` replays the dice (step delays, fault dice).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pyrula.workflows import ArchivingStore, PostgresArchive, RunStatus, WorkflowClient
from pyrula.workflows.serialization import decode
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.archive.postgres import (  # noqa: F401  (fixture)
    PostgresProcess,
    drop_schema,
    fresh_schema,
    migrate,
    postgres_dsn,
)
from tests.fixtures.chaos_workflows import STEPS, WORKFLOW, expected_result
from tests.valkey.servers import ValkeyProcess, valkey_server  # noqa: F401  (fixture)

from .check import quiesce
from .harness import ArchiveSpec, Cluster, Supervisor
from .nemesis import judge, log_has, valkey_url

pytestmark = pytest.mark.slow

POINT = "archive_after_pg_commit_before_hot_delete"
BEFORE = "archive_before_pg_write"
WORKERS = 2
TTL, INTERVAL, BATCH, SKEW = 1.0, 0.2, 20, 0.2
ARCHIVE_OPTIONS: dict[str, float | int] = {
    "live_ttl_after_archive": TTL,
    "reconcile_interval": INTERVAL,
    "reconcile_batch": BATCH,
    "clock_skew": SKEW,
}
"""The workers' ArchivingStore options: small batches (several per pass), a short stay
in Valkey after archival."""
RUNS = 300
FIRST_KILLS = 3
"""Worker processes killed at the first batch they commit."""
LATER_KILL = 0.04
"""The chance a later worker process is killed at each of the two points, per batch."""
OUTAGE_RUNS = 200
OUTAGE = 3.0
"""Seconds between the postmaster's death and the restart's start."""
SETTLE = 25.0
"""Seconds allowed, after the last run ended, to archive everything and empty Valkey."""


def seed_for(default: int, label: str) -> int:
    seed = int(os.environ.get("PYRULA_CHAOS_SEED") or default)
    print(f"\n[{label}] seed {seed} (replay: PYRULA_CHAOS_SEED={seed})")
    return seed


@contextlib.asynccontextmanager
async def archiving_cluster(
    cluster: Cluster, server: ValkeyProcess, dsn: str
) -> AsyncIterator[ArchivingStore]:
    """Point the cluster's workers at a fresh Valkey namespace and the archive at
    ``dsn``; yield this process's own ArchivingStore on both (it never archives)."""
    cluster.url = valkey_url(server)
    cluster.archive = ArchiveSpec(dsn, ARCHIVE_OPTIONS)
    async with opened_archiving(cluster) as store:
        yield store


@contextlib.asynccontextmanager
async def opened_archiving(cluster: Cluster) -> AsyncIterator[ArchivingStore]:
    """A new ArchivingStore on the cluster's namespace and archive, opened."""
    store = open_archiving(cluster)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def open_archiving(cluster: Cluster) -> ArchivingStore:
    assert cluster.archive is not None
    live = ValkeyStore.from_url(cluster.url)
    return ArchivingStore(
        live,
        PostgresArchive(cluster.archive.dsn),
        TTL,
        reconcile_interval=INTERVAL,
        reconcile_batch=BATCH,
        clock_skew=SKEW,
    )


async def submit(
    store: ArchivingStore, rng: random.Random, runs: int, spread: float, into: dict[str, int]
) -> None:
    """Submit ``runs`` three-step runs over ``spread`` seconds, recording each in
    ``into`` (run id -> expected result) as soon as it is created."""
    client = WorkflowClient(store)
    for n in range(runs):
        delays = [round(rng.uniform(0.01, 0.05), 3) for _ in range(3)]
        handle = await client.submit(WORKFLOW, {"n": n, "delays": delays})
        into[handle.run_id] = expected_result(n)
        await asyncio.sleep(spread / runs)


async def archive_rows(dsn: str) -> tuple[list[tuple[str, str, str | None]], dict[str, list[int]]]:
    """The archive's run rows (run id, status, result) and each run's journal positions."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT run_id, status, result FROM pyrula_runs")
        runs = [(str(a), str(b), None if c is None else str(c)) for a, b, c in await cur.fetchall()]
        cur = await conn.execute(
            "SELECT run_id, position FROM pyrula_journal ORDER BY run_id, position"
        )
        journals: dict[str, list[int]] = {}
        for run_id, position in await cur.fetchall():
            journals.setdefault(str(run_id), []).append(int(position))
    return runs, journals


async def wait_settled(
    store: ArchivingStore, dsn: str, expected: dict[str, int], timeout: float
) -> float:
    """Wait until the archive holds every submitted run and Valkey none; the seconds it
    took. Raises AssertionError with what is missing on timeout."""
    started = time.monotonic()
    while True:
        try:
            rows, _ = await archive_rows(dsn)
        except psycopg.OperationalError:
            rows = []
        archived = {row[0] for row in rows}
        live = [run.run_id for run in await store.live.list_runs(limit=len(expected) + 100)]
        if archived >= expected.keys() and not live:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(
                f"after {timeout}s: {len(expected.keys() - archived)} runs not archived, "
                f"{len(live)} still in Valkey"
            )
        await asyncio.sleep(0.3)


async def check_archive(
    cluster: Cluster, store: ArchivingStore, dsn: str, expected: dict[str, int]
) -> str:
    """I12 on the archive itself, and reads through a fresh ArchivingStore; returns
    the figures for the summary."""
    rows, journals = await archive_rows(dsn)
    ids = Counter(row[0] for row in rows)
    duplicated = sorted(run_id for run_id, n in ids.items() if n > 1)
    assert not duplicated, f"archived more than once: {duplicated[:10]}"
    missing = sorted(expected.keys() - ids.keys())
    assert not missing, f"{len(missing)} completed runs not archived: {missing[:10]}"
    strays = sorted(ids.keys() - expected.keys())
    assert not strays, f"archive rows of runs nobody submitted: {strays[:10]}"
    assert len(rows) == len(expected), (len(rows), len(expected))
    for run_id, status, result in rows:
        assert status == RunStatus.COMPLETED.value, (run_id, status)
        assert decode(result or "null") == expected[run_id], (run_id, result)
        assert journals.get(run_id) == list(range(len(STEPS))), (run_id, journals.get(run_id))
    assert set(journals) == set(expected), "journal rows of runs not archived"
    assert await store.live.list_runs(limit=10) == [], "runs left in Valkey"

    async with opened_archiving(cluster) as fresh:  # as a new process would read them
        client = WorkflowClient(fresh)
        for run_id, want in expected.items():
            assert await client.handle(WORKFLOW, run_id).result(timeout=1) == want, run_id
            entries = await fresh.load_journal(run_id)
            assert [e.name for e in entries] == list(STEPS), (run_id, entries)
        assert await fresh.live.get_run(next(iter(expected))) is None  # read from Postgres
    return f"archive rows {len(rows)}, journal rows {sum(len(j) for j in journals.values())}"


def faultpoints(spawn: int) -> str:
    """The first FIRST_KILLS worker processes die at their first commit; later ones now
    and then, after a commit or before a write."""
    if spawn < FIRST_KILLS:
        return f"{POINT}=kill"
    return f"{POINT}=kill@{LATER_KILL};{BEFORE}=kill@{LATER_KILL}"


def fired(cluster: Cluster, point: str) -> int:
    """How many kills the fault point ``point`` made (each logs first)."""
    return sum(w.log_text().count(f"fault point {point}: kill") for w in cluster.workers)


async def test_kills_between_the_postgres_commit_and_the_hot_delete_lose_nothing(
    cluster: Cluster,
    valkey_server: ValkeyProcess,  # noqa: F811
    postgres_dsn: str,  # noqa: F811
) -> None:
    seed = seed_for(1414, f"archive kills at {POINT}")
    schema, dsn = fresh_schema(postgres_dsn)
    try:
        migrate(dsn)
        async with archiving_cluster(cluster, valkey_server, dsn) as store:
            supervisor = Supervisor(cluster, WORKERS, faultpoints=faultpoints, seed=seed)
            await supervisor.start(store)
            started = time.monotonic()
            expected: dict[str, int] = {}
            await submit(store, random.Random(seed), RUNS, 6.0, expected)
            pending = await quiesce(store, list(expected), 30.0)
            assert not pending, cluster.describe(f"{len(pending)} runs never ended")
            settled = await wait_settled(store, dsn, expected, SETTLE)
            kills = [f for f in supervisor.faults if f.kind == "kill"]
            report, summary = await judge(
                cluster,
                store,
                expected,
                supervisor.faults,
                label=f"archive kills, seed {seed}",
                quiesce_for=0,
                extra=f"kills {len(kills)} (after the commit {fired(cluster, POINT)}, "
                f"before the write {fired(cluster, BEFORE)}), "
                f"settled {settled:.1f}s after the last run, {time.monotonic() - started:.1f}s",
            )
            await supervisor.halt()
            assert report.ok, summary
            assert report.figures["completed"] == RUNS, summary
            figures = await check_archive(cluster, store, dsn, expected)
            print(figures)
            # Every death was a fault point's, and the first FIRST_KILLS were after a commit.
            assert fired(cluster, POINT) >= FIRST_KILLS, summary
            points = fired(cluster, POINT) + fired(cluster, BEFORE)
            assert points == len(kills) == len(supervisor.faults), summary
            assert not supervisor.unexpected_exits, f"{supervisor.unexpected_exits}\n{summary}"
    finally:
        drop_schema(postgres_dsn, schema)


# -- Postgres stopped in the middle of a batch --------------------------------------------


def stop_immediately(postgres: PostgresProcess, timeout: float = 10.0) -> int:
    """SIGQUIT the postmaster by PID (what ``pg_ctl stop -m immediate`` sends): every
    backend dies at once, open transactions with it. Returns the PID once it is gone (a
    zombie counts: the postmaster is nobody's child here)."""
    pid = int(postgres.server.get_pid())
    os.kill(pid, signal.SIGQUIT)
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return pid
        if state == "Z":
            return pid
        if time.monotonic() > deadline:
            raise AssertionError(f"postmaster {pid} still {state} {timeout}s after SIGQUIT")
        time.sleep(0.01)


async def blocked_batch(monitor: psycopg.AsyncConnection[Any], timeout: float) -> list[int]:
    """Backends whose archive batch waits on the journal lock: their transaction has
    upserted a run row and cannot write its journal. Waits up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        cur = await monitor.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'DELETE FROM pyrula_journal%' AND pid <> pg_backend_pid()"
        )
        pids = [int(row[0]) for row in await cur.fetchall()]
        if pids or time.monotonic() > deadline:
            return pids
        await asyncio.sleep(0.02)


async def test_postgres_stopped_mid_batch_then_restarted_loses_and_duplicates_nothing(
    cluster: Cluster,
    valkey_server: ValkeyProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    pytest.importorskip("pgserver", reason="needs pgserver to start and stop a Postgres")
    seed = seed_for(1515, "postgres stopped mid-batch")
    postgres = PostgresProcess(tmp_path / "pg")
    try:
        _, dsn = fresh_schema(postgres.start())
        migrate(dsn)
        async with archiving_cluster(cluster, valkey_server, dsn) as store:
            supervisor = Supervisor(cluster, WORKERS, faultpoints="", seed=seed)
            await supervisor.start(store)
            expected: dict[str, int] = {}
            submitter = asyncio.create_task(
                submit(store, random.Random(seed), OUTAGE_RUNS, 12.0, expected)
            )
            try:
                await outage(cluster, store, postgres, dsn, expected)
            finally:
                await submitter  # submits never need Postgres (generated run ids)
        # Read on through a store opened after the restart (a reader that never saw the
        # outage; the pool's dead connections are test_archiving_worker.py's subject).
        async with opened_archiving(cluster) as store:
            pending = await quiesce(store, list(expected), 30.0)
            assert not pending, cluster.describe(f"{len(pending)} runs never ended")
            settled = await wait_settled(store, dsn, expected, SETTLE)
            report, summary = await judge(
                cluster,
                store,
                expected,
                [],
                label=f"postgres stopped mid-batch, seed {seed}",
                quiesce_for=0,
                extra=f"archived and out of Valkey {settled:.1f}s after the last run ended",
            )
            await supervisor.halt()
            assert report.ok, summary
            assert report.figures["completed"] == OUTAGE_RUNS, summary
            print(await check_archive(cluster, store, dsn, expected))
            assert log_has(cluster.workers, "archival failed"), summary  # it did back off
            assert all(w.alive() for w in cluster.workers), summary  # and nobody died of it
    finally:
        postgres.remove()


async def outage(
    cluster: Cluster,
    store: ArchivingStore,
    postgres: PostgresProcess,
    dsn: str,
    expected: dict[str, int],
) -> None:
    """Stop Postgres with a batch half-written, check Valkey keeps every run while it is
    down and that runs keep ending, then start it again."""
    monitor = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    locker = await psycopg.AsyncConnection.connect(dsn)
    try:
        deadline = time.monotonic() + 15
        while len((await archive_rows(dsn))[0]) < 20:  # archiving is under way
            assert time.monotonic() < deadline, cluster.describe("nothing archived in 15 s")
            await asyncio.sleep(0.1)
        await locker.execute("LOCK TABLE pyrula_journal IN SHARE MODE")  # until it dies
        blocked = await blocked_batch(monitor, 10.0)
        assert blocked, cluster.describe("no archive batch came to write its journal")
        cur = await monitor.execute("SELECT run_id FROM pyrula_runs")
        archived_before = {str(row[0]) for row in await cur.fetchall()}  # committed only
        stopped_pid = stop_immediately(postgres)
        stopped = time.time()
    finally:
        for conn in (monitor, locker):
            with contextlib.suppress(Exception):
                await conn.close()
    print(
        f"postmaster {stopped_pid} stopped with {len(blocked)} batch(es) half-written, "
        f"{len(archived_before)} runs archived"
    )
    await asyncio.sleep(OUTAGE)
    # Down: every run submitted so far is in Valkey, unless archived before the stop.
    submitted = list(expected)
    gone = [
        run_id
        for run_id in submitted
        if run_id not in archived_before and await store.live.get_run(run_id) is None
    ]
    assert not gone, f"{len(gone)} runs in neither store while Postgres is down: {gone[:5]}"
    ended_down = [
        run
        for run in await store.live.list_runs(status=RunStatus.COMPLETED, limit=1000)
        if (run.finished_at or 0.0) > stopped
    ]
    in_valkey = len(await store.live.list_runs(limit=1000))
    print(
        f"down {time.time() - stopped:.1f}s: {len(submitted)} submitted, {in_valkey} in "
        f"Valkey, {len(ended_down)} completed since the stop"
    )
    assert ended_down, cluster.describe("no run completed while Postgres was down")
    await asyncio.to_thread(postgres.stop)  # forget the dead server's handle
    await asyncio.to_thread(postgres.start)  # the same data directory and DSN
    restarted = time.time()
    print(f"restarted after {restarted - stopped:.1f}s down")
    while len((await archive_rows(dsn))[0]) <= len(archived_before):
        assert time.time() - restarted < SETTLE, cluster.describe("archival never resumed")
        await asyncio.sleep(0.1)
    print(f"archival resumed {time.time() - restarted:.1f}s after the restart")
