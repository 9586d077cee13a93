-- pyrula SQLite schema. Every statement is idempotent: open() runs them all, in one
-- BEGIN IMMEDIATE transaction, on every start. Bump SCHEMA_VERSION in store.py when a
-- change here needs a migration.

CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS runs (
    seq              INTEGER PRIMARY KEY,          -- insertion order (rowid alias)
    run_id           TEXT    NOT NULL UNIQUE,
    workflow         TEXT    NOT NULL,
    params           TEXT    NOT NULL,             -- JSON text, kept byte for byte
    status           TEXT    NOT NULL,
    owner            TEXT    NOT NULL,
    idempotency_key  TEXT    UNIQUE,               -- NULLs never collide
    created_at       REAL    NOT NULL,
    available_at     REAL    NOT NULL,
    updated_at       REAL    NOT NULL,
    started_at       REAL,
    finished_at      REAL,
    result           TEXT,
    error            TEXT,
    worker_id        TEXT,
    lease_token      INTEGER NOT NULL DEFAULT 0,   -- +1 on every claim and terminate
    lease_expires_at REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    recoveries       INTEGER NOT NULL DEFAULT 0,
    claims           INTEGER NOT NULL DEFAULT 0
);

-- claim_runs: one range scan per workflow, already in (available_at, seq) order.
CREATE INDEX IF NOT EXISTS runs_claim ON runs (workflow, status, available_at, seq);

-- recover_expired: only running runs whose lease is past.
CREATE INDEX IF NOT EXISTS runs_leases ON runs (status, lease_expires_at);

CREATE TABLE IF NOT EXISTS journal (
    run_id      TEXT    NOT NULL,
    position    INTEGER NOT NULL,
    kind        TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    ok          INTEGER NOT NULL,
    value       TEXT    NOT NULL,                  -- JSON text, kept byte for byte
    attempts    INTEGER NOT NULL,
    token       INTEGER NOT NULL,
    recorded_at REAL    NOT NULL,
    PRIMARY KEY (run_id, position)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS workers (
    worker_id  TEXT PRIMARY KEY,
    workflows  TEXT    NOT NULL,                   -- JSON array of names
    hostname   TEXT    NOT NULL,
    pid        INTEGER NOT NULL,
    started_at REAL    NOT NULL,
    last_seen  REAL    NOT NULL,
    running    INTEGER NOT NULL
);
