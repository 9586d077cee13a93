"""The SQLite store's plumbing: named statements, the connection, row mapping, errors.

Statements live in ``queries.sql`` and ``schema.sql`` next to this module and are
loaded once, at import. Everything here runs on the store's own thread.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from pyrula.workflows.errors import StoreError, StoreUnavailable
from pyrula.workflows.records import (
    JournalEntry,
    RunRecord,
    RunStatus,
    ScheduleRecord,
    WorkerInfo,
)
from pyrula.workflows.stores.sqlfiles import flow_of_row, parse_named, read_sql

SCHEMA_VERSION = "8"


def _read(filename: str) -> str:
    return read_sql(__package__ or __name__, filename)


def split_statements(text: str) -> list[str]:
    """Split a script into complete statements (what ``executescript`` would run)."""
    statements: list[str] = []
    buffer = ""
    for line in text.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    return [s for s in statements if s]


Q = parse_named(_read("queries.sql"))
SCHEMA = split_statements(_read("schema.sql"))


# -- statements --------------------------------------------------------------------------
def one(conn: sqlite3.Connection, name: str, /, **params: Any) -> sqlite3.Row | None:
    """The first row, or None. Reads every row, so a RETURNING statement runs to its end."""
    rows: list[sqlite3.Row] = conn.execute(Q[name], params).fetchall()
    return rows[0] if rows else None


def many(conn: sqlite3.Connection, name: str, /, **params: Any) -> list[sqlite3.Row]:
    return conn.execute(Q[name], params).fetchall()


def run(conn: sqlite3.Connection, name: str, /, **params: Any) -> int:
    """Execute; return how many rows it changed."""
    return conn.execute(Q[name], params).rowcount


def scalar(conn: sqlite3.Connection, name: str, /, **params: Any) -> Any:
    row = conn.execute(Q[name], params).fetchone()
    return None if row is None else row[0]


def data_version(conn: sqlite3.Connection) -> int:
    """Changes whenever another connection commits; cheap (no table is read)."""
    return int(scalar(conn, "data_version"))


# -- connection --------------------------------------------------------------------------
def connect(path: str, busy_timeout: float) -> sqlite3.Connection:
    """Open ``path`` in WAL mode with a busy timeout and create the schema if missing."""
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
    try:
        conn.row_factory = sqlite3.Row
        _enable_wal(conn, path, busy_timeout)
        run(conn, "set_synchronous")
        _ensure_schema(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


def _enable_wal(conn: sqlite3.Connection, path: str, busy_timeout: float) -> None:
    # WAL is persistent in the file, so usually this only reads. Switching needs a lock
    # that can report busy without waiting on the busy handler: retry until the timeout.
    deadline = time.monotonic() + busy_timeout
    mode = str(scalar(conn, "journal_mode")).lower()
    while mode != "wal":
        try:
            mode = str(scalar(conn, "set_wal")).lower()
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)
            continue
        if mode != "wal":
            raise StoreUnavailable(
                f"the SQLite database {path} cannot use WAL journal mode (it stays in "
                f"{mode!r} mode); put it on a local file system"
            )


def _ensure_schema(conn: sqlite3.Connection, path: str) -> None:
    run(conn, "begin_immediate")
    try:
        found = scalar(conn, "meta_get", key="schema_version") if one(conn, "has_meta") else None
        if found in _MIGRATIONS:
            _migrate(conn, found)
            found = None
        if found is None or found == SCHEMA_VERSION:  # an unknown version is left alone
            for statement in SCHEMA:
                conn.execute(statement)
            run(conn, "meta_set", key="schema_version", value=SCHEMA_VERSION)
            found = SCHEMA_VERSION
        conn.commit()
    except BaseException:
        if conn.in_transaction:
            conn.rollback()
        raise
    if found != SCHEMA_VERSION:
        raise StoreUnavailable(
            f"the SQLite database {path} has schema version {found}, but this pyrula "
            f"expects {SCHEMA_VERSION}; use a matching pyrula version or a new file"
        )


_V2_RUN_COLUMNS = (
    "parent_run_id TEXT",
    "wake_at REAL",
    "wait_signal TEXT",
    "wait_child TEXT",
    "rate_key TEXT",
    "rate_per_second REAL",
    "rate_burst REAL NOT NULL DEFAULT 1.0",
    "owner_concurrency INTEGER",
    "stamp INTEGER NOT NULL DEFAULT 0",
)
"""Version 2: durable time, child runs and flow control."""
_V3_RUN_COLUMNS = (
    "expires_at REAL",
    "progress_state TEXT",
    "progress_info TEXT",
)
"""Version 3: run expiry and progress reports."""
_V4_RUN_COLUMNS = ("failed_position INTEGER",)
"""Version 4: the step that failed a run, so a retry re-runs exactly it."""
_MIGRATIONS: dict[str, tuple[str, ...]] = {
    "1": _V2_RUN_COLUMNS + _V3_RUN_COLUMNS + _V4_RUN_COLUMNS,
    "2": _V3_RUN_COLUMNS + _V4_RUN_COLUMNS,
    "3": _V4_RUN_COLUMNS,
    "4": (),
    "5": (),
    "6": (),  # version 7 adds tables only (trigger buffers, cursors): SCHEMA creates them
    "7": (),  # version 8 adds schedule columns only (_V8_SCHEDULE_COLUMNS)
}
"""The run columns a file of each older version lacks."""
_V5_OWNER_COLUMN = "active INTEGER NOT NULL DEFAULT 1"
"""Version 5: owners with queued runs, so claims skip idle ones. Every existing owner
starts active; the first claim clears the idle ones."""
_V6_WORKER_COLUMN = "lock_ttl REAL NOT NULL DEFAULT 30.0"
"""Version 6: each worker's lock_ttl, by which its heartbeat's age is judged."""
_V8_SCHEDULE_COLUMNS = {
    "overlap": "overlap TEXT NOT NULL DEFAULT 'allow_all'",
    "last_run_id": "last_run_id TEXT",
}
"""Version 8: each schedule's overlap policy (existing ones keep firing every slot) and
the run its last fired slot started (unknown for slots fired before: NULL)."""


def _migrate(conn: sqlite3.Connection, found: str) -> None:
    """Bring a file of version ``found`` to SCHEMA_VERSION, inside the open transaction:
    add the run (and owner) columns it lacks, then SCHEMA adds the missing tables,
    indexes and triggers (a version 1 file also gets the owners of its existing runs)."""
    for column in _MIGRATIONS[found]:
        conn.execute(f"ALTER TABLE runs ADD COLUMN {column}")
    owner_columns = {row[1] for row in conn.execute("PRAGMA table_info(owners)")}
    if owner_columns and "active" not in owner_columns:  # no table: SCHEMA creates it
        conn.execute(f"ALTER TABLE owners ADD COLUMN {_V5_OWNER_COLUMN}")
    worker_columns = {row[1] for row in conn.execute("PRAGMA table_info(workers)")}
    if worker_columns and "lock_ttl" not in worker_columns:
        conn.execute(f"ALTER TABLE workers ADD COLUMN {_V6_WORKER_COLUMN}")
    schedule_columns = {row[1] for row in conn.execute("PRAGMA table_info(schedules)")}
    for name, column in _V8_SCHEDULE_COLUMNS.items():
        if schedule_columns and name not in schedule_columns:
            conn.execute(f"ALTER TABLE schedules ADD COLUMN {column}")
    for statement in SCHEMA:
        conn.execute(statement)
    if found == "1":
        run(conn, "owners_of_runs")


def is_busy(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", "")
    text = str(exc).lower()
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text or "busy" in text


def translate(exc: sqlite3.Error, path: str, busy_timeout: float) -> StoreError:
    """The pyrula error for a driver error, naming the database file."""
    text = str(exc)
    if "unable to open database file" in text:
        return StoreUnavailable(
            f"cannot open the SQLite database {path}: {text} (does the directory exist "
            "and is it writable?)"
        )
    if is_busy(exc):
        return StoreUnavailable(
            f"the SQLite database {path} stayed locked by another connection for longer "
            f"than busy_timeout={busy_timeout:g}s ({text}); is a process stuck holding a "
            "write transaction, or is the machine overloaded?"
        )
    if isinstance(exc, (sqlite3.OperationalError, sqlite3.DatabaseError)):
        return StoreUnavailable(f"the SQLite database {path} failed: {type(exc).__name__}: {text}")
    return StoreError(f"the SQLite database {path} refused a write: {type(exc).__name__}: {text}")


# -- rows to records ---------------------------------------------------------------------
def to_run(row: sqlite3.Row) -> RunRecord:
    return RunRecord(
        run_id=row["run_id"],
        workflow=row["workflow"],
        params=row["params"],
        status=RunStatus(row["status"]),
        owner=row["owner"],
        idempotency_key=row["idempotency_key"],
        created_at=row["created_at"],
        available_at=row["available_at"],
        updated_at=row["updated_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        result=row["result"],
        error=row["error"],
        worker_id=row["worker_id"],
        lease_token=row["lease_token"],
        lease_expires_at=row["lease_expires_at"],
        cancel_requested=bool(row["cancel_requested"]),
        recoveries=row["recoveries"],
        claims=row["claims"],
        parent_run_id=row["parent_run_id"],
        wake_at=row["wake_at"],
        wait_signal=row["wait_signal"],
        wait_child=row["wait_child"],
        flow=flow_of_row(row),
        expires_at=row["expires_at"],
        progress_state=row["progress_state"],
        progress_info=row["progress_info"],
        failed_position=row["failed_position"],
    )


def to_schedule(row: sqlite3.Row) -> ScheduleRecord:
    return ScheduleRecord(
        schedule_id=row["schedule_id"],
        workflow=row["workflow"],
        params=row["params"],
        cron=row["cron"],
        every=row["every"],
        timezone=row["timezone"],
        enabled=bool(row["enabled"]),
        next_fire_at=row["next_fire_at"],
        last_fire_at=row["last_fire_at"],
        owner=row["owner"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        overlap=row["overlap"],
        last_run_id=row["last_run_id"],
    )


def to_entry(row: sqlite3.Row) -> JournalEntry:
    return JournalEntry(
        run_id=row["run_id"],
        position=row["position"],
        kind=row["kind"],
        name=row["name"],
        ok=bool(row["ok"]),
        value=row["value"],
        attempts=row["attempts"],
        token=row["token"],
        recorded_at=row["recorded_at"],
    )


def to_worker(row: sqlite3.Row) -> WorkerInfo:
    return WorkerInfo(
        worker_id=row["worker_id"],
        workflows=tuple(json.loads(row["workflows"])),
        hostname=row["hostname"],
        pid=row["pid"],
        started_at=row["started_at"],
        last_seen=row["last_seen"],
        running=row["running"],
        lock_ttl=row["lock_ttl"],
    )
