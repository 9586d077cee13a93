-- Named statements of the Postgres archive, loaded once by store.py.
-- A block starts at a "-- name: <name>" line and runs to the next one.
-- Parameters are psycopg's named placeholders: %(name)s.

-- name: schema_table
-- The version table, or NULL when the database has no pyrula schema.
SELECT to_regclass('pyrula_schema') IS NOT NULL;

-- name: schema_version
SELECT pyrula_version FROM pyrula_schema;

-- name: set_schema_version
INSERT INTO pyrula_schema (pyrula_version) VALUES (%(version)s)
ON CONFLICT (singleton) DO NOTHING;

-- name: migrate_lock
-- Concurrent migrations take turns (the key is arbitrary, fixed).
SELECT pg_advisory_xact_lock(7305711421);

-- name: upsert_run
-- Insert an ended run, or replace it when this copy is the same run (the same
-- created_at) and ended later (a retried run that ended again). Another run under the
-- same id never replaces it. Returns a row only when it wrote one.
INSERT INTO pyrula_runs (
    run_id, workflow, params, status, owner, idempotency_key, created_at, available_at,
    updated_at, started_at, finished_at, result, error, worker_id, lease_token,
    lease_expires_at, cancel_requested, recoveries, claims, parent_run_id, wake_at,
    wait_signal, wait_child, rate_key, rate_per_second, rate_burst, owner_concurrency,
    expires_at, progress_state, progress_info, failed_position
) VALUES (
    %(run_id)s, %(workflow)s, %(params)s, %(status)s, %(owner)s, %(idempotency_key)s,
    %(created_at)s, %(available_at)s, %(updated_at)s, %(started_at)s, %(finished_at)s,
    %(result)s, %(error)s, %(worker_id)s, %(lease_token)s, %(lease_expires_at)s,
    %(cancel_requested)s, %(recoveries)s, %(claims)s, %(parent_run_id)s, %(wake_at)s,
    %(wait_signal)s, %(wait_child)s, %(rate_key)s, %(rate_per_second)s, %(rate_burst)s,
    %(owner_concurrency)s, %(expires_at)s, %(progress_state)s, %(progress_info)s,
    %(failed_position)s
)
ON CONFLICT (run_id) DO UPDATE SET
    workflow = excluded.workflow, params = excluded.params, status = excluded.status,
    owner = excluded.owner, idempotency_key = excluded.idempotency_key,
    created_at = excluded.created_at, available_at = excluded.available_at,
    updated_at = excluded.updated_at, started_at = excluded.started_at,
    finished_at = excluded.finished_at, result = excluded.result, error = excluded.error,
    worker_id = excluded.worker_id, lease_token = excluded.lease_token,
    lease_expires_at = excluded.lease_expires_at,
    cancel_requested = excluded.cancel_requested, recoveries = excluded.recoveries,
    claims = excluded.claims, parent_run_id = excluded.parent_run_id,
    wake_at = excluded.wake_at, wait_signal = excluded.wait_signal,
    wait_child = excluded.wait_child, rate_key = excluded.rate_key,
    rate_per_second = excluded.rate_per_second, rate_burst = excluded.rate_burst,
    owner_concurrency = excluded.owner_concurrency, expires_at = excluded.expires_at,
    progress_state = excluded.progress_state, progress_info = excluded.progress_info,
    failed_position = excluded.failed_position, archived_at = now()
WHERE pyrula_runs.finished_at < excluded.finished_at
  AND pyrula_runs.created_at = excluded.created_at
RETURNING run_id;

-- name: delete_journal
DELETE FROM pyrula_journal WHERE run_id = %(run_id)s;

-- name: insert_entry
INSERT INTO pyrula_journal (run_id, position, kind, name, ok, value, attempts, token,
                            recorded_at)
VALUES (%(run_id)s, %(position)s, %(kind)s, %(name)s, %(ok)s, %(value)s, %(attempts)s,
        %(token)s, %(recorded_at)s);

-- name: finished_of
-- The finished_at of those of the given runs that are archived.
SELECT run_id, finished_at FROM pyrula_runs WHERE run_id = ANY(%(run_ids)s);

-- name: stamps_of
-- When those of the given runs that are archived were created and ended.
SELECT run_id, created_at, finished_at FROM pyrula_runs WHERE run_id = ANY(%(run_ids)s);

-- name: get_run
SELECT * FROM pyrula_runs WHERE run_id = %(run_id)s;

-- name: load_journal
SELECT * FROM pyrula_journal WHERE run_id = %(run_id)s ORDER BY position;

-- name: list_runs
-- Newest first, as Store.list_runs: by created_at, then run_id.
SELECT * FROM pyrula_runs
WHERE (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(owner)s::text IS NULL OR owner = %(owner)s::text)
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s;

-- name: delete_run
DELETE FROM pyrula_runs WHERE run_id = %(run_id)s RETURNING run_id;

-- name: purge_candidates
-- Runs that ended before a time, after a (finished_at, run_id) cursor, first ended
-- first, leaving out children whose parent is archived (a child stays while its
-- parent is there, as in every store).
SELECT r.run_id, r.finished_at, r.parent_run_id FROM pyrula_runs r
WHERE r.finished_at < %(ended_before)s
  AND (r.finished_at, r.run_id) > (%(after_at)s, %(after_id)s)
  AND (r.parent_run_id IS NULL
       OR NOT EXISTS (SELECT 1 FROM pyrula_runs p WHERE p.run_id = r.parent_run_id))
ORDER BY r.finished_at, r.run_id
LIMIT %(limit)s;

-- name: load_state
SELECT * FROM pyrula_archive_state WHERE name = %(name)s;

-- name: save_state
-- The cursor and the watermark only move forward, whichever worker writes last.
INSERT INTO pyrula_archive_state (name, cursor_finished_at, cursor_run_id, archived_before)
VALUES (%(name)s, %(cursor_at)s, %(cursor_id)s, %(archived_before)s)
ON CONFLICT (name) DO UPDATE SET
    cursor_finished_at = CASE
        WHEN (pyrula_archive_state.cursor_finished_at, pyrula_archive_state.cursor_run_id)
             < (excluded.cursor_finished_at, excluded.cursor_run_id)
        THEN excluded.cursor_finished_at ELSE pyrula_archive_state.cursor_finished_at END,
    cursor_run_id = CASE
        WHEN (pyrula_archive_state.cursor_finished_at, pyrula_archive_state.cursor_run_id)
             < (excluded.cursor_finished_at, excluded.cursor_run_id)
        THEN excluded.cursor_run_id ELSE pyrula_archive_state.cursor_run_id END,
    archived_before = GREATEST(pyrula_archive_state.archived_before,
                               excluded.archived_before),
    updated_at = now();
