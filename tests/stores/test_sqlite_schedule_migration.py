"""SQLite schema version 8: a file of version 7 gets the schedules' overlap policy and last
run, and its schedules keep firing every slot (overlap 'allow_all')."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from pyrula.workflows.records import NewRun
from pyrula.workflows.stores.sqlite import SqliteStore
from pyrula.workflows.stores.sqlite.sql import SCHEMA_VERSION

from .conftest import START, FakeClock

V7_SCHEDULES = """
DROP TABLE schedules;
CREATE TABLE schedules (
    schedule_id  TEXT PRIMARY KEY,
    workflow     TEXT    NOT NULL,
    params       TEXT    NOT NULL,
    cron         TEXT,
    every        REAL,
    timezone     TEXT    NOT NULL,
    enabled      INTEGER NOT NULL,
    next_fire_at REAL    NOT NULL,
    last_fire_at REAL,
    owner        TEXT    NOT NULL,
    created_at   REAL    NOT NULL,
    updated_at   REAL    NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_fire_at, schedule_id) WHERE enabled = 1;
INSERT INTO schedules VALUES
    ('old', 'wf', '{"a":1}', NULL, 60.0, 'UTC', 1, 1700000060.0, 1700000000.0, 'acme', 1, 2);
UPDATE meta SET value = '7' WHERE key = 'schema_version';
"""
"""The schedules table as schema version 7 wrote it, with one schedule in it."""


async def test_a_version_7_file_is_migrated(sqlite_path: Path, clock: FakeClock) -> None:
    store = SqliteStore(sqlite_path, clock=clock)
    await store.open()  # every other table as it is, then schedules as version 7 had it
    await store.close()
    conn = sqlite3.connect(sqlite_path, isolation_level=None, timeout=5)
    conn.executescript(V7_SCHEDULES)
    conn.close()

    store = SqliteStore(sqlite_path, clock=clock)
    await store.open()
    old = await store.get_schedule("old")
    assert old is not None
    assert (old.overlap, old.last_run_id) == ("allow_all", None)
    assert (old.every, old.last_fire_at, old.owner) == (60.0, START, "acme")
    clock.advance(60)
    assert [s.schedule_id for s in await store.due_schedules(10)] == ["old"]
    run = NewRun(run_id="r1", workflow="wf", params='{"a":1}', idempotency_key="schedule:old:1")
    fired = await store.fire_schedule("old", START + 60, START + 60, START + 120, run)
    assert fired is not None
    after = await store.get_schedule("old")
    assert after is not None and after.last_run_id == "r1" and after.overlap == "allow_all"
    await store.close()

    conn = sqlite3.connect(sqlite_path, isolation_level=None, timeout=5)
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    row = conn.execute("SELECT overlap, last_run_id FROM schedules").fetchone()
    conn.close()
    assert version == (SCHEMA_VERSION,) == ("8",)
    assert row == ("allow_all", "r1")
