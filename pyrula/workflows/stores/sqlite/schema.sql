-- pyrula SQLite schema. Every statement is idempotent: open() runs them all, in one
-- BEGIN IMMEDIATE transaction, on every start. Bump SCHEMA_VERSION in sql.py when a
-- change here needs a migration.

CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS runs (
    seq               INTEGER PRIMARY KEY,         -- insertion order (rowid alias)
    run_id            TEXT    NOT NULL UNIQUE,
    workflow          TEXT    NOT NULL,
    params            TEXT    NOT NULL,            -- JSON text, kept byte for byte
    status            TEXT    NOT NULL,
    owner             TEXT    NOT NULL,
    idempotency_key   TEXT    UNIQUE,              -- NULLs never collide
    created_at        REAL    NOT NULL,
    available_at      REAL    NOT NULL,
    updated_at        REAL    NOT NULL,
    started_at        REAL,
    finished_at       REAL,
    result            TEXT,
    error             TEXT,
    worker_id         TEXT,
    lease_token       INTEGER NOT NULL DEFAULT 0,  -- +1 on every claim and terminate
    lease_expires_at  REAL,
    cancel_requested  INTEGER NOT NULL DEFAULT 0,
    recoveries        INTEGER NOT NULL DEFAULT 0,
    claims            INTEGER NOT NULL DEFAULT 0,
    parent_run_id     TEXT,                        -- set on child runs
    wake_at           REAL,                        -- set only while sleeping or waiting
    wait_signal       TEXT,
    wait_child        TEXT,
    rate_key          TEXT,                        -- FlowControl, kept from submission
    rate_per_second   REAL,
    rate_burst        REAL    NOT NULL DEFAULT 1.0,
    owner_concurrency INTEGER,
    stamp             INTEGER NOT NULL DEFAULT 0,  -- claim counter when last queued (fairness)
    expires_at        REAL,                        -- still queued then: cancelled, never run
    progress_state    TEXT,                        -- set_progress, kept after the run ends
    progress_info     TEXT,                        -- JSON text, kept byte for byte
    failed_position   INTEGER                      -- the step that failed it (retry clears it)
);

-- has_work: one range scan per workflow, already in (available_at, seq) order.
CREATE INDEX IF NOT EXISTS runs_claim ON runs (workflow, status, available_at, seq);

-- Fair claims: one probe finds an owner's head run; also counts its running runs.
CREATE INDEX IF NOT EXISTS runs_owner_queue
    ON runs (workflow, owner, status, available_at, seq);

-- recover_expired: only running runs whose lease is past.
CREATE INDEX IF NOT EXISTS runs_leases ON runs (status, lease_expires_at);

-- fire_timers and next_due_at: only sleeping and waiting runs have a wake_at.
CREATE INDEX IF NOT EXISTS runs_timers ON runs (wake_at) WHERE wake_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_workflow_timers
    ON runs (workflow, wake_at) WHERE wake_at IS NOT NULL;

-- purge_runs and ended_runs: the runs by end (a retried run's finished_at is cleared).
CREATE INDEX IF NOT EXISTS runs_ended ON runs (finished_at) WHERE finished_at IS NOT NULL;

-- cancel and terminate cascade to child runs.
CREATE INDEX IF NOT EXISTS runs_children
    ON runs (parent_run_id, run_id) WHERE parent_run_id IS NOT NULL;

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

-- Pending signals, oldest first per (run, name).
CREATE TABLE IF NOT EXISTS signals (
    seq     INTEGER PRIMARY KEY,
    run_id  TEXT NOT NULL,
    name    TEXT NOT NULL,
    payload TEXT NOT NULL                          -- JSON text, kept byte for byte
);
CREATE INDEX IF NOT EXISTS signals_pending ON signals (run_id, name, seq);

-- Fairness state: every owner that ever had a run of the workflow, and when it was
-- last served (the workflow's claim counter at its last claim; NULL: never).
-- active: 1 whenever the owner has a queued run (the triggers below set it); a claim
-- clears it once it finds none, so claims probe only owners with queued runs.
CREATE TABLE IF NOT EXISTS owners (
    workflow    TEXT NOT NULL,
    owner       TEXT NOT NULL,
    last_served INTEGER,
    active      INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (workflow, owner)
) WITHOUT ROWID;
-- Claims and next_due_at read only active owners: a covering index.
CREATE INDEX IF NOT EXISTS owners_active
    ON owners (workflow, active, owner, last_served);

-- Every path that makes a run queued (create, release, retry, recovery, a timer, a
-- signal, a child ending...) goes through one of these two triggers.
CREATE TRIGGER IF NOT EXISTS runs_queued_insert AFTER INSERT ON runs
WHEN NEW.status = 'queued'
BEGIN
    INSERT INTO owners (workflow, owner) VALUES (NEW.workflow, NEW.owner)
    ON CONFLICT (workflow, owner) DO UPDATE SET active = 1 WHERE active = 0;
END;
CREATE TRIGGER IF NOT EXISTS runs_queued_update AFTER UPDATE OF status ON runs
WHEN NEW.status = 'queued'
BEGIN
    INSERT INTO owners (workflow, owner) VALUES (NEW.workflow, NEW.owner)
    ON CONFLICT (workflow, owner) DO UPDATE SET active = 1 WHERE active = 0;
END;

-- Per workflow: goes up by one on every claim.
CREATE TABLE IF NOT EXISTS claim_counters (
    workflow TEXT PRIMARY KEY,
    counter  INTEGER NOT NULL
) WITHOUT ROWID;

-- Rate-limit token buckets, shared by every worker.
CREATE TABLE IF NOT EXISTS buckets (
    key        TEXT PRIMARY KEY,
    tokens     REAL NOT NULL,
    updated_at REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS schedules (
    schedule_id  TEXT PRIMARY KEY,
    workflow     TEXT    NOT NULL,
    params       TEXT    NOT NULL,                 -- JSON text, kept byte for byte
    cron         TEXT,
    every        REAL,
    timezone     TEXT    NOT NULL,
    enabled      INTEGER NOT NULL,
    next_fire_at REAL    NOT NULL,
    last_fire_at REAL,
    owner        TEXT    NOT NULL,
    created_at   REAL    NOT NULL,
    updated_at   REAL    NOT NULL,
    overlap      TEXT    NOT NULL DEFAULT 'allow_all',  -- the overlap policy (version 8)
    last_run_id  TEXT                              -- the run the last fired slot started
);
CREATE INDEX IF NOT EXISTS schedules_due
    ON schedules (next_fire_at, schedule_id) WHERE enabled = 1;

CREATE TABLE IF NOT EXISTS workers (
    worker_id  TEXT PRIMARY KEY,
    workflows  TEXT    NOT NULL,                   -- JSON array of names
    hostname   TEXT    NOT NULL,
    pid        INTEGER NOT NULL,
    started_at REAL    NOT NULL,
    last_seen  REAL    NOT NULL,
    running    INTEGER NOT NULL,
    lock_ttl   REAL    NOT NULL DEFAULT 30.0       -- the worker's; it heartbeats every third
);

-- Lease news for workers in other processes: a cancel or terminate of a running run
-- sets its holder's row, which the holder's wait_lease_news (polling data_version) takes.
CREATE TABLE IF NOT EXISTS lease_news (
    worker_id TEXT PRIMARY KEY,
    at        REAL NOT NULL
);

-- Batch triggers: each trigger's buffered events (those not consumed yet), by seq.
CREATE TABLE IF NOT EXISTS trigger_events (
    trigger_name TEXT    NOT NULL,
    seq          INTEGER NOT NULL,
    payload      TEXT    NOT NULL,                 -- JSON text, kept byte for byte
    created_at   REAL    NOT NULL,
    PRIMARY KEY (trigger_name, seq)
) WITHOUT ROWID;

-- The last seq each trigger gave out. It outlives the events, so a consumed event's
-- seq is never given out again.
CREATE TABLE IF NOT EXISTS trigger_seqs (
    trigger_name TEXT    PRIMARY KEY,
    last_seq     INTEGER NOT NULL
) WITHOUT ROWID;

-- Named cursors (swap_cursor: compare-and-set), opaque strings.
CREATE TABLE IF NOT EXISTS cursors (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
