"""What only the SQLite store promises: its file, its pragmas, its indexes, its errors."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows.errors import PayloadError, StoreUnavailable
from pyrula.workflows.records import FlowControl, Lease, Outcome, RunStatus, Wait
from pyrula.workflows.stores import open_store
from pyrula.workflows.stores.sqlite import SqliteStore
from pyrula.workflows.stores.sqlite.sql import SCHEMA_VERSION, Q

from .conftest import FakeClock
from .helpers import COMPLETED, TTL, claim_one, create, entry, new_run, running


@pytest.fixture
async def sqlite_store(sqlite_path: Path, clock: FakeClock) -> AsyncIterator[SqliteStore]:
    store = SqliteStore(sqlite_path, clock=clock)
    await store.open()
    yield store
    await store.close()


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, timeout=5)


async def test_url_and_file(sqlite_path: Path) -> None:
    store = SqliteStore(sqlite_path)
    assert store.url == "sqlite:///" + str(sqlite_path)
    assert not sqlite_path.exists()  # lazily opened
    await store.open()
    await store.open()
    assert sqlite_path.exists()
    conn = raw(sqlite_path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert version == (SCHEMA_VERSION,)
    conn.close()
    await store.close()


async def test_connection_pragmas(sqlite_store: SqliteStore) -> None:
    def pragmas(conn: sqlite3.Connection) -> tuple[int, int]:
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        busy = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        return sync, busy

    assert await sqlite_store._db.call(pragmas) == (1, 30_000)  # NORMAL, 30 s


async def test_data_survives_reopening(sqlite_path: Path, clock: FakeClock) -> None:
    store = SqliteStore(sqlite_path, clock=clock)
    lease = await running(store)
    await store.append_journal(lease.token, entry(lease.run_id, 0, value='"\u00e9"'))
    await store.finish_run(lease.run_id, lease.token, COMPLETED)
    before = await store.get_run(lease.run_id)
    journal = await store.load_journal(lease.run_id)
    await store.close()

    again = SqliteStore(sqlite_path, clock=clock)
    await again.open()
    assert await again.get_run(lease.run_id) == before
    assert await again.load_journal(lease.run_id) == journal
    await again.close()


async def test_open_store_url(sqlite_path: Path) -> None:
    store = open_store("sqlite:///" + str(sqlite_path))
    assert isinstance(store, SqliteStore) and store.url == "sqlite:///" + str(sqlite_path)
    await store.close()


async def test_closed_store_refuses_work(sqlite_store: SqliteStore) -> None:
    await sqlite_store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await sqlite_store.get_run("x")
    with pytest.raises(StoreUnavailable, match="closed"):
        await create(sqlite_store)
    await sqlite_store.wait_for_work(["wf"], timeout=10)  # returns: nothing to wait for
    await sqlite_store.close()


async def test_unopenable_path(tmp_path: Path) -> None:
    path = tmp_path / "missing-dir" / "pyrula.db"
    store = SqliteStore(path)
    with pytest.raises(StoreUnavailable, match="missing-dir"):
        await store.open()
    await store.close()


async def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not an SQLite file at all" * 100)
    store = SqliteStore(path)
    with pytest.raises(StoreUnavailable, match=r"junk\.db"):
        await store.open()
    await store.close()


async def test_schema_version_mismatch(sqlite_path: Path) -> None:
    store = SqliteStore(sqlite_path)
    await store.open()
    await store.close()
    conn = raw(sqlite_path)
    conn.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    conn.close()
    store = SqliteStore(sqlite_path)
    with pytest.raises(StoreUnavailable, match="schema version 999"):
        await store.open()
    await store.close()


V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL UNIQUE, workflow TEXT NOT NULL,
    params TEXT NOT NULL, status TEXT NOT NULL, owner TEXT NOT NULL,
    idempotency_key TEXT UNIQUE, created_at REAL NOT NULL, available_at REAL NOT NULL,
    updated_at REAL NOT NULL, started_at REAL, finished_at REAL, result TEXT, error TEXT,
    worker_id TEXT, lease_token INTEGER NOT NULL DEFAULT 0, lease_expires_at REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0, recoveries INTEGER NOT NULL DEFAULT 0,
    claims INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX runs_claim ON runs (workflow, status, available_at, seq);
CREATE INDEX runs_leases ON runs (status, lease_expires_at);
CREATE TABLE journal (
    run_id TEXT NOT NULL, position INTEGER NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,
    ok INTEGER NOT NULL, value TEXT NOT NULL, attempts INTEGER NOT NULL,
    token INTEGER NOT NULL, recorded_at REAL NOT NULL, PRIMARY KEY (run_id, position)
) WITHOUT ROWID;
CREATE TABLE workers (
    worker_id TEXT PRIMARY KEY, workflows TEXT NOT NULL, hostname TEXT NOT NULL,
    pid INTEGER NOT NULL, started_at REAL NOT NULL, last_seen REAL NOT NULL,
    running INTEGER NOT NULL
);
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO workers VALUES ('old-worker', '["wf"]', 'web-1', 7, 1, 1, 0);
INSERT INTO runs (run_id, workflow, params, status, owner, created_at, available_at, updated_at)
VALUES ('old-a', 'wf', '{}', 'queued', 'acme', 1, 1, 1),
       ('old-b', 'wf', '{}', 'queued', 'acme', 2, 2, 2),
       ('old-c', 'wf', '{}', 'queued', 'zeta', 3, 3, 3);
"""


async def test_a_version_1_file_is_migrated(sqlite_path: Path, clock: FakeClock) -> None:
    conn = raw(sqlite_path)
    conn.executescript(V1_SCHEMA)
    conn.close()
    store = SqliteStore(sqlite_path, clock=clock)
    await store.open()
    run = await store.get_run("old-a")
    assert run is not None and run.parent_run_id is None and run.wake_at is None
    assert run.flow.is_empty and run.owner == "acme"
    assert run.expires_at is None and run.progress_state is None and run.progress_info is None
    assert [(w.worker_id, w.lock_ttl) for w in await store.list_workers()] == [("old-worker", 30)]
    # The owners of existing runs were recorded, so claims find them, fairly.
    leases = await store.claim_runs("w", ["wf"], 10, 30)
    assert [lease.run_id for lease in leases] == ["old-a", "old-c", "old-b"]
    await create(store)
    await store.close()
    conn = raw(sqlite_path)
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert version == (SCHEMA_VERSION,)


async def test_a_version_2_file_is_migrated(sqlite_path: Path, clock: FakeClock) -> None:
    store = SqliteStore(sqlite_path, clock=clock)
    lease = await running(store, run_id="old-running")
    await create(store, run_id="old-queued")
    await store.close()
    # Back to version 2: the runs table without the columns of versions 3 and 4.
    conn = raw(sqlite_path)
    for column in ("expires_at", "progress_state", "progress_info", "failed_position"):
        conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
    conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    conn.close()
    store = SqliteStore(sqlite_path, clock=clock)
    await store.open()
    old = await store.get_run("old-running")
    assert old is not None and old.status is RunStatus.RUNNING and old.expires_at is None
    assert (old.progress_state, old.progress_info) == (None, None)
    await store.set_progress("old-running", lease.token, "resumed", "1")
    assert await store.finish_run("old-running", lease.token, COMPLETED)
    assert await store.delete_run("old-running") is True
    await create(store, run_id="new", expires_at=clock() + 1)
    clock.advance(1)
    assert [lease.run_id for lease in await store.claim_runs("w", ["wf"], 10, 30)] == ["old-queued"]
    expired = await store.get_run("new")
    assert expired is not None and expired.status is RunStatus.CANCELLED
    await store.close()
    conn = raw(sqlite_path)
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert version == (SCHEMA_VERSION,) == ("8",)


async def test_a_held_back_claim_writes_nothing(sqlite_store: SqliteStore) -> None:
    """Refused claims must not change the file: every write wakes other processes'
    waiters, which would look for work, find the same held-back runs, and claim again."""
    rate = FlowControl(rate_key="api", rate_per_second=0.001)
    await create(sqlite_store, flow=rate)
    await create(sqlite_store, flow=rate)
    await create(sqlite_store, owner="b", flow=FlowControl(owner_concurrency=1))
    await create(sqlite_store, owner="b", flow=FlowControl(owner_concurrency=1))
    assert len(await sqlite_store.claim_runs("w", ["wf"], 10, 30)) == 2
    conn = raw(Path(sqlite_store.path))
    before = conn.execute("PRAGMA data_version").fetchone()
    assert await sqlite_store.claim_runs("w", ["wf"], 10, 30) == []
    assert conn.execute("PRAGMA data_version").fetchone() == before
    await create(sqlite_store, "other")  # while a real write does change it
    assert conn.execute("PRAGMA data_version").fetchone() != before
    conn.close()


async def test_busy_database_is_store_unavailable(sqlite_path: Path) -> None:
    store = SqliteStore(sqlite_path, busy_timeout=0.2)
    run_id = await create(store)
    conn = raw(sqlite_path)
    conn.execute("BEGIN IMMEDIATE")  # another process holding the write lock
    try:
        with pytest.raises(StoreUnavailable, match=r"busy_timeout=0\.2s"):
            await create(store)
        run = await store.get_run(run_id)  # WAL: readers are not blocked
        assert run is not None and run.status is RunStatus.QUEUED
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    await create(store)  # the store is still usable afterwards
    await store.close()


async def test_opening_one_new_file_from_many_stores_at_once(sqlite_path: Path) -> None:
    stores = [SqliteStore(sqlite_path) for _ in range(6)]
    await asyncio.gather(*(s.open() for s in stores))
    await asyncio.gather(*(create(s) for s in stores))
    assert len(await stores[0].list_runs()) == 6
    await asyncio.gather(*(s.close() for s in stores))


QUERY_INDEXES = {
    "has_work": "runs_claim",
    "due_heads": "runs_owner_queue",
    "due_head": "runs_owner_queue",
    "owner_queues": "runs_owner_queue",
    "running_count": "runs_owner_queue",
    "next_wake": "runs_workflow_timers",
    "due_timers": "runs_timers",
    "first_signal": "signals_pending",
    "children": "runs_children",
    "delete_signals": "signals_pending",
    "drop_owner_if_idle": "runs_owner_queue",
    "ended_before": "runs_ended",  # purge_runs: the ended range, not every ended run
    "due_schedules": "schedules_due",
    "next_schedule_at": "schedules_due",
    "read_trigger_events": "PRIMARY KEY (trigger_name=?)",  # a trigger's events, by seq
    "trigger_batch": "PRIMARY KEY (trigger_name=?)",
    "delete_trigger_events": "PRIMARY KEY (trigger_name=? AND seq<?)",
}


@pytest.mark.parametrize("query", list(QUERY_INDEXES))
async def test_hot_queries_use_an_index_without_sorting(
    sqlite_store: SqliteStore, sqlite_path: Path, query: str
) -> None:
    conn = raw(sqlite_path)
    conn.execute("ANALYZE")
    params = {"workflow": "wf", "owner": "o", "now": 0.0, "due": 0.0, "limit": 5, "cap": 2}
    params |= {"run_id": "r", "name": "n", "before": 0.0}
    params |= {"trigger": "t", "count": 3, "last_seq": 3}
    plan = " | ".join(
        str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + Q[query], params)
    )
    conn.close()
    assert QUERY_INDEXES[query] in plan, plan
    assert "TEMP B-TREE" not in plan.upper(), plan
    # The only scans allowed are running_count's and trigger_batch's over their own
    # LIMIT-ed subqueries.
    assert "SCAN" not in plan.upper().replace("SCAN (SUBQUERY-1)", ""), plan
    if query in ("due_heads", "owner_queues"):  # only active owners, one index range
        assert "COVERING INDEX owners_active (workflow=? AND active=?)" in plan, plan


def _fill(path: Path, count: int, owners: int) -> None:
    """``count`` due runs of "wf" (and as many of "other"), round robin over ``owners``."""
    conn = raw(path)
    conn.execute("BEGIN")
    rows = [
        (f"r{i}", "wf" if i % 2 else "other", f"o{i % (2 * owners) // 2}", 1.0 + i)
        for i in range(2 * count)
    ]
    conn.executemany(
        "INSERT INTO runs (run_id, workflow, params, status, owner, created_at, available_at,"
        " updated_at) VALUES (?, ?, '{}', 'queued', ?, 0, ?, 0)",
        rows,
    )
    conn.execute("INSERT OR IGNORE INTO owners (workflow, owner) SELECT workflow, owner FROM runs")
    conn.execute("COMMIT")
    conn.close()


async def _claim_steps(store: SqliteStore, limit: int) -> tuple[int, list[str]]:
    """Virtual-machine steps (in hundreds) one claim of ``limit`` takes, and what it got.

    SQLITE_STMTSTATUS_VM_STEP is not exposed; a progress handler counts instead."""
    count = 0

    def tick() -> int:
        nonlocal count
        count += 1
        return 0

    await store._db.call(lambda c: c.set_progress_handler(tick, 100))
    leases = await store.claim_runs("w", ["wf"], limit, 30)
    await store._db.call(lambda c: c.set_progress_handler(None, 0))
    return count, [lease.run_id for lease in leases]


async def test_claim_stays_cheap_with_a_deep_queue(sqlite_path: Path, clock: FakeClock) -> None:
    """A claim reads the head of each owner's queue, not the whole queue: the same
    claim costs about the same against 20,000 queued runs as against 20."""
    costs = []
    for depth in (20, 20_000):
        path = sqlite_path.with_name(f"depth-{depth}.db")
        store = SqliteStore(path, clock=clock)
        await store.open()
        _fill(path, depth, owners=1)
        steps, claimed = await _claim_steps(store, 5)
        assert claimed == ["r1", "r3", "r5", "r7", "r9"]
        costs.append(steps)
        await store.close()
    shallow, deep = costs
    assert deep <= 2 * shallow + 5, costs


async def test_claim_cost_follows_owners_not_runs(sqlite_store: SqliteStore) -> None:
    _fill(Path(sqlite_store.path), 20_000, owners=4)
    steps, claimed = await _claim_steps(sqlite_store, 4)
    # Fair: one run from each owner, each owner's oldest first.
    assert claimed == ["r1", "r3", "r5", "r7"]
    assert steps < 50, steps  # a scan of 40,000 rows would take thousands


async def test_text_that_is_not_unicode_is_a_payload_error(sqlite_store: SqliteStore) -> None:
    # A lone surrogate (e.g. a filename decoded with surrogateescape) has no UTF-8 form.
    with pytest.raises(PayloadError, match="not valid Unicode"):
        await create(sqlite_store, params='{"name":"\udcff"}')
    assert await sqlite_store.list_runs() == []
    await create(sqlite_store)  # nothing was left half written


async def test_waiting_does_not_busy_poll(sqlite_store: SqliteStore) -> None:
    """Waiters look at data_version at most every 50 ms once backed off."""
    lease = await running(sqlite_store)
    calls = 0
    call = sqlite_store._db.call

    async def counting(fn: Any) -> Any:
        nonlocal calls
        calls += 1
        return await call(fn)

    sqlite_store._db.call = counting  # type: ignore[method-assign]
    await sqlite_store.wait_run(lease.run_id, timeout=0.5)
    await sqlite_store.wait_for_work(["wf"], timeout=0.5)
    assert calls < 2 * (0.5 / 0.05 + 6), calls  # ~16 per wait: 5, 10, 20, 40, 50, 50 ms...


# -- idle owners --------------------------------------------------------------------------
def _active(path: Path) -> dict[str, int]:
    conn = raw(path)
    rows = dict(conn.execute("SELECT owner, active FROM owners WHERE workflow = 'wf'"))
    conn.close()
    return rows


async def _go_idle(store: SqliteStore, how: str) -> Lease:
    """A run of owner "idle", claimed (then suspended for the waits); then a claim that
    finds nothing queued of "idle" clears its flag."""
    await create(store, owner="idle", run_id="r")
    lease = await claim_one(store)
    if how == "timer":
        assert await store.suspend_run("r", lease.token, Wait(wake_at=store._db.clock() + 5))
    elif how == "signal":
        assert await store.suspend_run("r", lease.token, Wait(signal="go"))
    elif how == "child":
        child = new_run("child", run_id="c1", parent_run_id="r")
        await store.start_child(lease.token, entry("r", 0, "child", kind="child"), child)
        assert await store.suspend_run("r", lease.token, Wait(child="c1"))
    assert _active(Path(store.path)) == {"idle": 1}
    assert await store.claim_runs("w", ["wf"], 10, TTL) == []
    assert _active(Path(store.path)) == {"idle": 0}
    return lease


async def _requeue(store: SqliteStore, clock: FakeClock, lease: Lease, how: str) -> None:
    failed = Outcome(RunStatus.FAILED, error="{}")
    if how == "create":
        await store.finish_run("r", lease.token, COMPLETED)
        await create(store, owner="idle", run_id="r2")
    elif how == "release":
        await store.release_run("r", lease.token)
    elif how == "retry":
        await store.finish_run("r", lease.token, failed)
        await store.retry_run("r")
    elif how == "recover":
        clock.advance(TTL + 1)
        assert (await store.recover_expired(5, 10)).requeued == ("r",)
    elif how == "timer":
        clock.advance(5)
        assert await store.fire_timers(10) == 1
    elif how == "signal":
        await store.send_signal("r", "go", "1")
    else:
        child = await claim_one(store, "child")
        await store.finish_run("c1", child.token, COMPLETED)


HOWS = ["create", "release", "retry", "recover", "timer", "signal", "child"]


@pytest.mark.parametrize("how", HOWS)
async def test_an_idle_owner_comes_back_when_a_run_is_queued(
    sqlite_store: SqliteStore, clock: FakeClock, how: str
) -> None:
    """Claims skip owners with nothing queued; every path that queues a run (the
    triggers on runs) makes its owner claimable again."""
    lease = await _go_idle(sqlite_store, how)
    await create(sqlite_store, owner="busy", delay=60)  # queued, not due: stays active
    assert await sqlite_store.claim_runs("w", ["wf"], 10, TTL) == []
    assert _active(Path(sqlite_store.path)) == {"idle": 0, "busy": 1}
    assert await sqlite_store.next_due_at(["wf"]) == clock() + (5 if how == "timer" else 60)
    await _requeue(sqlite_store, clock, lease, how)
    assert _active(Path(sqlite_store.path))["idle"] == 1
    [again] = await sqlite_store.claim_runs("w", ["wf"], 10, TTL)
    assert again.run.owner == "idle"


async def test_claim_cost_ignores_idle_owners(sqlite_store: SqliteStore) -> None:
    """2,000 owners with a running run and nothing queued: the first claim finds them
    idle (and clears them, once); after that a claim probes only the busy owner."""
    conn = raw(Path(sqlite_store.path))
    conn.executemany(
        "INSERT INTO runs (run_id, workflow, params, status, owner, created_at, available_at,"
        " updated_at) VALUES (?, 'wf', '{}', 'running', ?, 0, 0, 0)",
        [(f"x{i}", f"idle{i}") for i in range(2000)],
    )
    conn.execute("INSERT INTO owners (workflow, owner) SELECT workflow, owner FROM runs")
    conn.close()
    for i in range(3):
        await create(sqlite_store, owner="busy", run_id=f"b{i}")
    first, [claimed] = await _claim_steps(sqlite_store, 1)
    steps, [again] = await _claim_steps(sqlite_store, 1)
    assert (claimed, again) == ("b0", "b1")
    assert first > 500 and steps < 50, (first, steps)
    assert sum(_active(Path(sqlite_store.path)).values()) == 1


async def test_a_version_4_file_is_migrated(sqlite_path: Path, clock: FakeClock) -> None:
    store = SqliteStore(sqlite_path, clock=clock)
    await create(store, owner="a", run_id="queued")
    await running(store, run_id="busy")
    await store.close()
    # Back to version 4: owners without active, no index, no triggers.
    conn = raw(sqlite_path)
    for kind, name in [("INDEX", "owners_active"), ("TRIGGER", "runs_queued_insert")]:
        conn.execute(f"DROP {kind} {name}")
    conn.execute("DROP TRIGGER runs_queued_update")
    conn.execute("ALTER TABLE owners DROP COLUMN active")
    conn.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    conn.close()
    store = SqliteStore(sqlite_path, clock=clock)
    await store.open()
    assert _active(sqlite_path) == {"a": 1, "": 1}  # all active until a claim
    assert [lease.run_id for lease in await store.claim_runs("w", ["wf"], 10, TTL)] == ["queued"]
    assert _active(sqlite_path) == {"a": 1, "": 0}  # "a" is found idle by the next claim
    assert await store.claim_runs("w", ["wf"], 10, TTL) == []
    assert _active(sqlite_path) == {"a": 0, "": 0}
    await create(store, owner="a", run_id="new")  # the trigger is there
    assert _active(sqlite_path) == {"a": 1, "": 0}
    await store.close()
    conn = raw(sqlite_path)
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    query = "EXPLAIN QUERY PLAN " + Q["due_heads"]
    plan = conn.execute(query, {"workflow": "wf", "due": 0}).fetchall()
    conn.close()
    assert version == (SCHEMA_VERSION,)
    assert any("owners_active" in str(row[-1]) for row in plan)


async def test_a_version_6_file_is_migrated(sqlite_path: Path, clock: FakeClock) -> None:
    store = SqliteStore(sqlite_path, clock=clock)
    lease = await running(store, run_id="old-running")
    await create(store, run_id="old-queued")
    await store.close()
    # Back to version 6: no trigger buffers, no cursors.
    conn = raw(sqlite_path)
    for table in ("trigger_events", "trigger_seqs", "cursors"):
        conn.execute(f"DROP TABLE {table}")
    conn.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    conn.close()
    store = SqliteStore(sqlite_path, clock=clock)
    await store.open()
    old = await store.get_run("old-running")
    assert old is not None and old.status is RunStatus.RUNNING
    assert await store.finish_run("old-running", lease.token, COMPLETED)
    [claimed] = await store.claim_runs("w", ["wf"], 10, TTL)
    assert claimed.run_id == "old-queued"
    seqs = await store.append_events("orders", ['{"n": 1}'])
    assert [event.payload for event in await store.read_events("orders", 10)] == ['{"n": 1}']
    assert await store.consume_events("orders", seqs[0], 1)
    assert await store.swap_cursor("p", None, "1") and await store.get_cursor("p") == "1"
    await store.close()
    conn = raw(sqlite_path)
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    assert version == (SCHEMA_VERSION,)
    assert {"trigger_events", "trigger_seqs", "cursors", "runs", "journal"} <= tables
