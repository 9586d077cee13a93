-- The Postgres archive's schema (the source of truth), applied by `pyrula db migrate`.
-- Every statement is idempotent. Tables live in the connection's search_path (put
-- options=-csearch_path=NAME in the DSN to keep them in a schema of their own).
-- Times are epoch seconds (double precision, the store's clock), as in RunRecord.

-- One row: the pyrula version that migrated this database. A different version refuses
-- the schema (ArchiveSchemaMismatch): there is no upgrade path between versions.
CREATE TABLE IF NOT EXISTS pyrula_schema (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    pyrula_version text NOT NULL,
    migrated_at timestamptz NOT NULL DEFAULT now()
);

-- Archived runs: every RunRecord field, FlowControl flattened. Only terminal runs.
CREATE TABLE IF NOT EXISTS pyrula_runs (
    run_id text PRIMARY KEY,
    workflow text NOT NULL,
    params text NOT NULL,
    status text NOT NULL,
    owner text NOT NULL,
    idempotency_key text,
    created_at double precision NOT NULL,
    available_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    started_at double precision,
    finished_at double precision NOT NULL,
    result text,
    error text,
    worker_id text,
    lease_token bigint NOT NULL,
    lease_expires_at double precision,
    cancel_requested boolean NOT NULL,
    recoveries integer NOT NULL,
    claims integer NOT NULL,
    parent_run_id text,
    wake_at double precision,
    wait_signal text,
    wait_child text,
    rate_key text,
    rate_per_second double precision,
    rate_burst double precision NOT NULL,
    owner_concurrency integer,
    expires_at double precision,
    progress_state text,
    progress_info text,
    failed_position integer,
    archived_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS pyrula_runs_finished ON pyrula_runs (finished_at, run_id);
CREATE INDEX IF NOT EXISTS pyrula_runs_newest ON pyrula_runs (created_at DESC, run_id DESC);
CREATE INDEX IF NOT EXISTS pyrula_runs_workflow ON pyrula_runs (workflow, created_at DESC);
CREATE INDEX IF NOT EXISTS pyrula_runs_owner ON pyrula_runs (owner, created_at DESC);
CREATE INDEX IF NOT EXISTS pyrula_runs_parent ON pyrula_runs (parent_run_id)
    WHERE parent_run_id IS NOT NULL;

-- Each archived run's journal, replaced whole when the run is archived again.
CREATE TABLE IF NOT EXISTS pyrula_journal (
    run_id text NOT NULL REFERENCES pyrula_runs (run_id) ON DELETE CASCADE,
    position integer NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    ok boolean NOT NULL,
    value text NOT NULL,
    attempts integer NOT NULL,
    token bigint NOT NULL,
    recorded_at double precision NOT NULL,
    PRIMARY KEY (run_id, position)
);

-- The archival cursor, shared by every worker that reconciles: the last ended run copied,
-- by (finished_at, run_id), and the time before which every ended run is archived.
CREATE TABLE IF NOT EXISTS pyrula_archive_state (
    name text PRIMARY KEY,
    cursor_finished_at double precision NOT NULL,
    cursor_run_id text NOT NULL,
    archived_before double precision NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
