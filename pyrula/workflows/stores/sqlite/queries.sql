-- Named statements of the SQLite store, loaded once by sql.py.
-- A block starts at a "-- name: <name>" line and runs to the next one.
-- Parameters are named (:name). Runs are read with SELECT * and mapped by column name.

-- name: meta_get
SELECT value FROM meta WHERE key = :key;

-- name: meta_init
INSERT OR IGNORE INTO meta (key, value) VALUES (:key, :value);

-- name: data_version
PRAGMA data_version;

-- name: journal_mode
PRAGMA journal_mode;

-- name: set_wal
PRAGMA journal_mode = WAL;

-- name: set_synchronous
PRAGMA synchronous = NORMAL;

-- name: begin_immediate
-- Every write is one of these: it takes the write lock first (waiting up to the busy
-- timeout), so a read-check-write inside it is atomic across processes.
BEGIN IMMEDIATE;

-- name: get_run
SELECT * FROM runs WHERE run_id = :run_id;

-- name: get_run_by_key
SELECT * FROM runs WHERE idempotency_key = :key;

-- name: insert_run
INSERT INTO runs (
    run_id, workflow, params, status, owner, idempotency_key,
    created_at, available_at, updated_at
) VALUES (
    :run_id, :workflow, :params, 'queued', :owner, :idempotency_key,
    :now, :available_at, :now
);

-- name: list_runs
SELECT * FROM runs
WHERE (:workflow IS NULL OR workflow = :workflow)
  AND (:status IS NULL OR status = :status)
  AND (:owner IS NULL OR owner = :owner)
ORDER BY seq DESC
LIMIT :limit;

-- name: claimable
-- One workflow at a time: a range scan of runs_claim, already in claim order.
SELECT * FROM runs
WHERE workflow = :workflow AND status = 'queued' AND available_at <= :now
ORDER BY available_at, seq
LIMIT :limit;

-- name: has_work
SELECT 1 FROM runs
WHERE workflow = :workflow AND status = 'queued' AND available_at <= :now
LIMIT 1;

-- name: next_due
SELECT MIN(available_at) FROM runs WHERE workflow = :workflow AND status = 'queued';

-- name: claim_run
UPDATE runs SET
    status = 'running',
    worker_id = :worker_id,
    lease_token = lease_token + 1,
    lease_expires_at = :expires_at,
    claims = claims + 1,
    updated_at = :now,
    started_at = COALESCE(started_at, :now)
WHERE seq = :seq;

-- name: get_run_by_seq
SELECT * FROM runs WHERE seq = :seq;

-- name: lease_state
SELECT status, lease_token, cancel_requested FROM runs WHERE run_id = :run_id;

-- name: renew_lease
UPDATE runs SET lease_expires_at = :expires_at WHERE run_id = :run_id;

-- name: cancel_queued
UPDATE runs SET
    status = 'cancelled', finished_at = :now, updated_at = :now, cancel_requested = 1
WHERE run_id = :run_id;

-- name: request_cancel
UPDATE runs SET cancel_requested = 1, updated_at = :now WHERE run_id = :run_id;

-- name: terminate_run
UPDATE runs SET
    status = 'terminated', finished_at = :now, updated_at = :now,
    lease_token = lease_token + 1, lease_expires_at = NULL
WHERE run_id = :run_id;

-- name: retry_run
UPDATE runs SET
    status = 'queued', available_at = :now, updated_at = :now, finished_at = NULL,
    error = NULL, result = NULL, cancel_requested = 0, recoveries = 0,
    lease_expires_at = NULL
WHERE run_id = :run_id;

-- name: finish_run
UPDATE runs SET
    status = :status, result = :result, error = :error,
    finished_at = :now, updated_at = :now, lease_expires_at = NULL
WHERE run_id = :run_id;

-- name: release_run
UPDATE runs SET
    status = 'queued', updated_at = :now, lease_expires_at = NULL,
    available_at = :available_at
WHERE run_id = :run_id;

-- name: expired_leases
SELECT * FROM runs
WHERE status = 'running' AND lease_expires_at <= :now
ORDER BY seq
LIMIT :limit;

-- name: requeue_expired
UPDATE runs SET
    status = 'queued', available_at = :now, updated_at = :now,
    lease_expires_at = NULL, recoveries = recoveries + 1
WHERE run_id = :run_id;

-- name: dead_letter
UPDATE runs SET
    status = 'dead', finished_at = :now, updated_at = :now,
    lease_expires_at = NULL, recoveries = recoveries + 1, error = :error
WHERE run_id = :run_id;

-- name: load_journal
SELECT * FROM journal WHERE run_id = :run_id ORDER BY position;

-- name: journal_entry
SELECT * FROM journal WHERE run_id = :run_id AND position = :position;

-- name: journal_next
SELECT COALESCE(MAX(position) + 1, 0) FROM journal WHERE run_id = :run_id;

-- name: journal_last
SELECT position, ok FROM journal WHERE run_id = :run_id ORDER BY position DESC LIMIT 1;

-- name: journal_delete
DELETE FROM journal WHERE run_id = :run_id AND position = :position;

-- name: insert_journal
INSERT INTO journal (run_id, position, kind, name, ok, value, attempts, token, recorded_at)
VALUES (:run_id, :position, :kind, :name, :ok, :value, :attempts, :token, :recorded_at);

-- name: upsert_worker
-- An upsert, not INSERT OR REPLACE, so a worker keeps its rowid (the tie-break order).
INSERT INTO workers (worker_id, workflows, hostname, pid, started_at, last_seen, running)
VALUES (:worker_id, :workflows, :hostname, :pid, :started_at, :last_seen, :running)
ON CONFLICT (worker_id) DO UPDATE SET
    workflows = excluded.workflows, hostname = excluded.hostname, pid = excluded.pid,
    started_at = excluded.started_at, last_seen = excluded.last_seen,
    running = excluded.running;

-- name: delete_worker
DELETE FROM workers WHERE worker_id = :worker_id;

-- name: list_workers
SELECT * FROM workers ORDER BY last_seen DESC, rowid;
