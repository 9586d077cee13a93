-- Named statements of the SQLite store, loaded once by sql.py.
-- A block starts at a "-- name: <name>" line and runs to the next one.
-- Parameters are named (:name). Runs are read with SELECT * and mapped by column name.
-- Every statement that makes a run queued also sets its fairness stamp: the claim
-- counter of its workflow at that moment (see stores/flow.py).

-- name: meta_get
SELECT value FROM meta WHERE key = :key;

-- name: meta_set
INSERT INTO meta (key, value) VALUES (:key, :value)
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: has_meta
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta';

-- name: data_version
PRAGMA data_version;

-- name: journal_mode
PRAGMA journal_mode;

-- name: set_wal
PRAGMA journal_mode = WAL;

-- name: set_synchronous
PRAGMA synchronous = NORMAL;

-- name: lease_news_set
INSERT INTO lease_news (worker_id, at) VALUES (:worker_id, :at)
ON CONFLICT (worker_id) DO UPDATE SET at = excluded.at;

-- name: lease_news_get
SELECT 1 FROM lease_news WHERE worker_id = :worker_id;

-- name: lease_news_take
DELETE FROM lease_news WHERE worker_id = :worker_id;

-- name: owners_of_runs
-- Migrating a version 1 file: record the owners of its runs, so claims find them.
INSERT OR IGNORE INTO owners (workflow, owner) SELECT workflow, owner FROM runs;

-- name: begin_immediate
-- Every write is one of these: it takes the write lock first (waiting up to the busy
-- timeout), so a read-check-write inside it is atomic across processes.
BEGIN IMMEDIATE;

-- name: get_run
SELECT * FROM runs WHERE run_id = :run_id;

-- name: get_run_by_key
SELECT * FROM runs WHERE idempotency_key = :key;

-- name: insert_run
-- The UNIQUE constraints on run_id and idempotency_key decide: no row back means taken.
INSERT INTO runs (
    run_id, workflow, params, status, owner, idempotency_key,
    created_at, available_at, updated_at, parent_run_id,
    rate_key, rate_per_second, rate_burst, owner_concurrency, stamp, expires_at
) VALUES (
    :run_id, :workflow, :params, 'queued', :owner, :idempotency_key,
    :now, :available_at, :now, :parent_run_id,
    :rate_key, :rate_per_second, :rate_burst, :owner_concurrency,
    COALESCE((SELECT counter FROM claim_counters WHERE workflow = :workflow), 0),
    :expires_at
)
ON CONFLICT DO NOTHING
RETURNING *;

-- name: drop_owner_if_idle
-- After a delete: an owner left with no run of the workflow leaves the claim probes.
-- Its last_served goes too, which changes no turn: its next run is stamped now, and a
-- stamp is never below a last_served.
DELETE FROM owners
WHERE workflow = :workflow AND owner = :owner
  AND NOT EXISTS (SELECT 1 FROM runs WHERE workflow = :workflow AND owner = :owner);

-- name: delete_run
DELETE FROM runs WHERE run_id = :run_id;

-- name: delete_journal
DELETE FROM journal WHERE run_id = :run_id;

-- name: delete_signals
DELETE FROM signals WHERE run_id = :run_id;

-- name: ended_before
-- Only an ended run has a finished_at (retry clears it), so the range is the runs_ended
-- index's; a child whose parent is still there is left for later.
SELECT * FROM runs AS r
WHERE r.finished_at < :before
  AND (r.parent_run_id IS NULL
       OR NOT EXISTS (SELECT 1 FROM runs AS p WHERE p.run_id = r.parent_run_id))
ORDER BY r.finished_at, r.seq
LIMIT :limit;

-- name: ended_after
-- ended_runs' page: the runs_ended index's range from :at on, in (finished_at, run_id)
-- order (only the runs that ended at :at itself are sorted; the row-value form,
-- (finished_at, run_id) > (:at, :run_id), would scan the table).
SELECT * FROM runs
WHERE finished_at >= :at AND (finished_at > :at OR run_id > :run_id)
ORDER BY finished_at, run_id
LIMIT :limit;

-- name: list_runs
SELECT * FROM runs
WHERE (:workflow IS NULL OR workflow = :workflow)
  AND (:status IS NULL OR status = :status)
  AND (:owner IS NULL OR owner = :owner)
ORDER BY seq DESC
LIMIT :limit;

-- name: children
SELECT * FROM runs WHERE parent_run_id = :run_id ORDER BY run_id;

-- name: has_work
SELECT 1 FROM runs
WHERE workflow = :workflow AND status = 'queued' AND available_at <= :now
LIMIT 1;

-- name: due_heads
-- Claims: each active owner's first queued run due by :due (now, or a little later for a
-- claim that looks ahead), one index probe per owner. An
-- owner without one (seq NULL) is idle when it has no queued run at all (a second
-- probe, made only then): the claim then clears its active flag.
SELECT o.owner AS owner, o.last_served AS last_served, r.seq AS seq, r.stamp AS stamp,
       r.run_id AS run_id, r.expires_at AS expires_at,
       r.available_at AS available_at, r.rate_key AS rate_key,
       r.rate_per_second AS rate_per_second, r.rate_burst AS rate_burst,
       r.owner_concurrency AS owner_concurrency,
       CASE WHEN r.seq IS NULL THEN NOT EXISTS (
           SELECT 1 FROM runs AS q
           WHERE q.workflow = o.workflow AND q.owner = o.owner AND q.status = 'queued'
       ) ELSE 0 END AS idle
FROM owners AS o
LEFT JOIN runs AS r ON r.seq = (
    SELECT h.seq FROM runs AS h
    WHERE h.workflow = o.workflow AND h.owner = o.owner AND h.status = 'queued'
      AND h.available_at <= :due
    ORDER BY h.available_at, h.seq
    LIMIT 1
)
WHERE o.workflow = :workflow AND o.active = 1;

-- name: set_idle
-- Only inside the claim's transaction that found the owner with no queued run.
UPDATE owners SET active = 0 WHERE workflow = :workflow AND owner = :owner;

-- name: due_head
-- The next due queued run of one owner, after a claim took its head.
SELECT seq, stamp, run_id, expires_at, available_at, rate_key, rate_per_second,
       rate_burst, owner_concurrency
FROM runs
WHERE workflow = :workflow AND owner = :owner AND status = 'queued'
  AND available_at <= :due
ORDER BY available_at, seq
LIMIT 1;

-- name: due_head_skipping
-- The owner's first due run whose rate key is not out of tokens (:held, a JSON array),
-- looking no further than its first :window due runs: a rate-limited run keeps its
-- place while runs of other keys behind it go by.
SELECT seq, stamp, run_id, expires_at, available_at, rate_key, rate_per_second,
       rate_burst, owner_concurrency
FROM (
    SELECT seq, stamp, run_id, expires_at, available_at, rate_key, rate_per_second,
           rate_burst, owner_concurrency
    FROM runs
    WHERE workflow = :workflow AND owner = :owner AND status = 'queued'
      AND available_at <= :due
    ORDER BY available_at, seq
    LIMIT :window
)
WHERE rate_key IS NULL OR rate_key NOT IN (SELECT value FROM json_each(:held))
ORDER BY available_at, seq
LIMIT 1;

-- name: owner_queues
-- next_due_at: per active owner with queued runs, its first due run (only if rate-limited:
-- that one waits for a token) and its first run that is not due yet.
SELECT o.owner AS owner,
       d.available_at AS due_at, d.rate_key AS rate_key,
       d.rate_per_second AS rate_per_second, d.rate_burst AS rate_burst,
       d.owner_concurrency AS due_cap,
       l.available_at AS later_at, l.owner_concurrency AS later_cap
FROM owners AS o
LEFT JOIN runs AS d ON d.seq = (
    SELECT h.seq FROM runs AS h
    WHERE h.workflow = o.workflow AND h.owner = o.owner AND h.status = 'queued'
      AND h.available_at <= :now
    ORDER BY h.available_at, h.seq
    LIMIT 1
) AND d.rate_key IS NOT NULL
LEFT JOIN runs AS l ON l.seq = (
    SELECT h.seq FROM runs AS h
    WHERE h.workflow = o.workflow AND h.owner = o.owner AND h.status = 'queued'
      AND h.available_at > :now
    ORDER BY h.available_at, h.seq
    LIMIT 1
)
WHERE o.workflow = :workflow AND o.active = 1 AND (d.seq IS NOT NULL OR l.seq IS NOT NULL);

-- name: next_wake
SELECT MIN(wake_at) FROM runs
WHERE workflow = :workflow AND wake_at IS NOT NULL AND wake_at > :now;

-- name: running_count
-- Running runs of one workflow and owner, counted up to :cap only.
SELECT COUNT(*) FROM (
    SELECT 1 FROM runs
    WHERE workflow = :workflow AND owner = :owner AND status = 'running'
    LIMIT :cap
);

-- name: claim_counter
SELECT counter FROM claim_counters WHERE workflow = :workflow;

-- name: set_claim_counter
INSERT INTO claim_counters (workflow, counter) VALUES (:workflow, :counter)
ON CONFLICT (workflow) DO UPDATE SET counter = excluded.counter;

-- name: set_last_served
UPDATE owners SET last_served = :last_served WHERE workflow = :workflow AND owner = :owner;

-- name: get_bucket
SELECT tokens, updated_at FROM buckets WHERE key = :key;

-- name: put_bucket
INSERT INTO buckets (key, tokens, updated_at) VALUES (:key, :tokens, :updated_at)
ON CONFLICT (key) DO UPDATE SET tokens = excluded.tokens, updated_at = excluded.updated_at;

-- name: claim_run
UPDATE runs SET
    status = 'running',
    worker_id = :worker_id,
    lease_token = lease_token + 1,
    lease_expires_at = :expires_at,
    claims = claims + 1,
    updated_at = :now,
    started_at = COALESCE(started_at, MAX(:now, available_at)),  -- claimed ahead: its time
    expires_at = NULL  -- expiry applies only to a run that never started
WHERE seq = :seq
RETURNING *;

-- name: expire_run
-- A queued run a claim found past its expires_at: cancelled, never started.
UPDATE runs SET
    status = 'cancelled', error = :error, finished_at = :now, updated_at = :now,
    lease_expires_at = NULL, wake_at = NULL, wait_signal = NULL, wait_child = NULL
WHERE run_id = :run_id AND status = 'queued'
RETURNING *;

-- name: lease_state
SELECT status, lease_token, cancel_requested FROM runs WHERE run_id = :run_id;

-- name: renew_lease
UPDATE runs SET lease_expires_at = :expires_at WHERE run_id = :run_id;

-- name: request_cancel
UPDATE runs SET cancel_requested = 1, updated_at = :now WHERE run_id = :run_id;

-- name: cancel_now
UPDATE runs SET
    status = 'cancelled', finished_at = :now, updated_at = :now, cancel_requested = 1,
    lease_expires_at = NULL, wake_at = NULL, wait_signal = NULL, wait_child = NULL
WHERE run_id = :run_id
RETURNING *;

-- name: terminate_run
UPDATE runs SET
    status = 'terminated', finished_at = :now, updated_at = :now,
    lease_token = lease_token + 1,
    lease_expires_at = NULL, wake_at = NULL, wait_signal = NULL, wait_child = NULL
WHERE run_id = :run_id
RETURNING *;

-- name: finish_run
-- Fenced in the WHERE clause: no row back means the lease is gone.
UPDATE runs SET
    status = :status, result = :result, error = :error, failed_position = :failed_position,
    finished_at = :now, updated_at = :now,
    lease_expires_at = NULL, wake_at = NULL, wait_signal = NULL, wait_child = NULL
WHERE run_id = :run_id AND status = 'running' AND lease_token = :token
RETURNING *;

-- name: dead_letter
UPDATE runs SET
    status = 'dead', finished_at = :now, updated_at = :now,
    recoveries = recoveries + 1, error = :error,
    lease_expires_at = NULL, wake_at = NULL, wait_signal = NULL, wait_child = NULL
WHERE run_id = :run_id
RETURNING *;

-- name: wake_parent
-- A parent waiting for this child becomes queued.
UPDATE runs SET
    status = 'queued', available_at = :now, updated_at = :now,
    lease_expires_at = NULL, wake_at = NULL, wait_signal = NULL, wait_child = NULL,
    stamp = COALESCE((SELECT c.counter FROM claim_counters AS c
                      WHERE c.workflow = runs.workflow), 0)
WHERE run_id = :parent AND status = 'waiting' AND wait_child = :child
RETURNING workflow;

-- name: enqueue_run
UPDATE runs SET
    status = 'queued', available_at = :available_at, updated_at = :now,
    lease_expires_at = NULL, wake_at = NULL, wait_signal = NULL, wait_child = NULL,
    stamp = COALESCE((SELECT c.counter FROM claim_counters AS c
                      WHERE c.workflow = runs.workflow), 0)
WHERE run_id = :run_id;

-- name: release_run
-- Fenced in the WHERE clause: no row back means the lease is gone.
UPDATE runs SET
    status = 'queued', available_at = :available_at, updated_at = :now,
    lease_expires_at = NULL, wake_at = NULL, wait_signal = NULL, wait_child = NULL,
    stamp = COALESCE((SELECT c.counter FROM claim_counters AS c
                      WHERE c.workflow = runs.workflow), 0)
WHERE run_id = :run_id AND status = 'running' AND lease_token = :token
RETURNING workflow;

-- name: retry_run
UPDATE runs SET
    status = 'queued', available_at = :now, updated_at = :now, finished_at = NULL,
    error = NULL, result = NULL, cancel_requested = 0, recoveries = 0, failed_position = NULL,
    lease_expires_at = NULL, wake_at = NULL, wait_signal = NULL, wait_child = NULL,
    stamp = COALESCE((SELECT c.counter FROM claim_counters AS c
                      WHERE c.workflow = runs.workflow), 0)
WHERE run_id = :run_id
RETURNING *;

-- name: requeue_expired
UPDATE runs SET
    status = 'queued', available_at = :now, updated_at = :now,
    recoveries = recoveries + 1,
    lease_expires_at = NULL, wake_at = NULL, wait_signal = NULL, wait_child = NULL,
    stamp = COALESCE((SELECT c.counter FROM claim_counters AS c
                      WHERE c.workflow = runs.workflow), 0)
WHERE run_id = :run_id;

-- name: expired_leases
SELECT * FROM runs
WHERE status = 'running' AND lease_expires_at <= :now
ORDER BY seq
LIMIT :limit;

-- name: set_progress
-- Fenced in the WHERE clause: no change means the lease is gone.
UPDATE runs SET progress_state = :state, progress_info = :info, updated_at = :now
WHERE run_id = :run_id AND status = 'running' AND lease_token = :token;

-- name: suspend_run
UPDATE runs SET
    status = :status, wake_at = :wake_at, wait_signal = :wait_signal,
    wait_child = :wait_child, lease_expires_at = NULL, updated_at = :now
WHERE run_id = :run_id
RETURNING workflow, owner_concurrency;

-- name: due_timers
SELECT run_id, workflow FROM runs
WHERE wake_at IS NOT NULL AND wake_at <= :now
ORDER BY wake_at, seq
LIMIT :limit;

-- name: load_journal
SELECT * FROM journal WHERE run_id = :run_id ORDER BY position;

-- name: journal_entry
SELECT * FROM journal WHERE run_id = :run_id AND position = :position;

-- name: journal_delete
DELETE FROM journal WHERE run_id = :run_id AND position = :position;

-- name: insert_journal
-- The primary key decides: no change means the position is taken.
INSERT INTO journal (run_id, position, kind, name, ok, value, attempts, token, recorded_at)
VALUES (:run_id, :position, :kind, :name, :ok, :value, :attempts, :token, :recorded_at)
ON CONFLICT DO NOTHING;

-- name: insert_signal
INSERT INTO signals (run_id, name, payload) VALUES (:run_id, :name, :payload);

-- name: first_signal
SELECT seq, payload FROM signals
WHERE run_id = :run_id AND name = :name
ORDER BY seq
LIMIT 1;

-- name: delete_signal
DELETE FROM signals WHERE seq = :seq;

-- name: signal_waiter
-- A run waiting for this signal becomes queued.
UPDATE runs SET
    status = 'queued', available_at = :now, updated_at = :now,
    lease_expires_at = NULL, wake_at = NULL, wait_signal = NULL, wait_child = NULL,
    stamp = COALESCE((SELECT c.counter FROM claim_counters AS c
                      WHERE c.workflow = runs.workflow), 0)
WHERE run_id = :run_id AND status = 'waiting' AND wait_signal = :name;

-- name: get_schedule
SELECT * FROM schedules WHERE schedule_id = :schedule_id;

-- name: put_schedule
INSERT INTO schedules (
    schedule_id, workflow, params, cron, every, timezone, enabled,
    next_fire_at, last_fire_at, owner, created_at, updated_at, overlap, last_run_id
) VALUES (
    :schedule_id, :workflow, :params, :cron, :every, :timezone, :enabled,
    :next_fire_at, :last_fire_at, :owner, :created_at, :updated_at, :overlap, :last_run_id
)
ON CONFLICT (schedule_id) DO UPDATE SET
    workflow = excluded.workflow, params = excluded.params, cron = excluded.cron,
    every = excluded.every, timezone = excluded.timezone, enabled = excluded.enabled,
    next_fire_at = excluded.next_fire_at, last_fire_at = excluded.last_fire_at,
    owner = excluded.owner, created_at = excluded.created_at,
    updated_at = excluded.updated_at, overlap = excluded.overlap,
    last_run_id = excluded.last_run_id
RETURNING *;

-- name: list_schedules
SELECT * FROM schedules
WHERE (:workflow IS NULL OR workflow = :workflow)
ORDER BY schedule_id;

-- name: update_schedule
UPDATE schedules SET
    enabled = COALESCE(:enabled, enabled),
    params = COALESCE(:params, params),
    next_fire_at = COALESCE(:next_fire_at, next_fire_at),
    updated_at = :now
WHERE schedule_id = :schedule_id
RETURNING *;

-- name: delete_schedule
DELETE FROM schedules WHERE schedule_id = :schedule_id;

-- name: bump_schedule_changes
-- The schedules' change marker (wait_schedule_change): +1 on every create, update, delete.
INSERT INTO meta (key, value) VALUES ('schedule_changes', '1')
ON CONFLICT (key) DO UPDATE SET value = CAST(value AS INTEGER) + 1;

-- name: due_schedules
SELECT * FROM schedules
WHERE enabled = 1 AND next_fire_at <= :now
ORDER BY next_fire_at, schedule_id
LIMIT :limit;

-- name: next_schedule_at
SELECT MIN(next_fire_at) FROM schedules WHERE enabled = 1;

-- name: fire_schedule
-- Compare-and-set on next_fire_at: no row back means another fire won.
UPDATE schedules SET
    last_fire_at = :fired_slot, next_fire_at = :next_fire_at, updated_at = :now
WHERE schedule_id = :schedule_id AND enabled = 1 AND next_fire_at = :expected_next
RETURNING schedule_id;

-- name: skip_schedule_slot
-- fire_schedule without a run (overlap 'skip'): the same compare-and-set, next_fire_at only.
UPDATE schedules SET next_fire_at = :next_fire_at, updated_at = :now
WHERE schedule_id = :schedule_id AND enabled = 1 AND next_fire_at = :expected_next
RETURNING schedule_id;

-- name: set_schedule_last_run
-- In fire_schedule's transaction, once the slot's run exists.
UPDATE schedules SET last_run_id = :run_id WHERE schedule_id = :schedule_id;

-- name: upsert_worker
-- An upsert, not INSERT OR REPLACE, so a worker keeps its rowid (the tie-break order).
INSERT INTO workers (worker_id, workflows, hostname, pid, started_at, last_seen, running,
                     lock_ttl)
VALUES (:worker_id, :workflows, :hostname, :pid, :started_at, :last_seen, :running,
        :lock_ttl)
ON CONFLICT (worker_id) DO UPDATE SET
    workflows = excluded.workflows, hostname = excluded.hostname, pid = excluded.pid,
    started_at = excluded.started_at, last_seen = excluded.last_seen,
    running = excluded.running, lock_ttl = excluded.lock_ttl;

-- name: delete_worker
DELETE FROM workers WHERE worker_id = :worker_id;

-- name: list_workers
SELECT * FROM workers ORDER BY last_seen DESC, rowid;

-- name: take_trigger_seqs
-- Give out :count seqs of a trigger; returns the last (the first is last - count + 1).
INSERT INTO trigger_seqs (trigger_name, last_seq) VALUES (:trigger, :count)
ON CONFLICT (trigger_name) DO UPDATE SET last_seq = trigger_seqs.last_seq + excluded.last_seq
RETURNING last_seq;

-- name: insert_trigger_event
INSERT INTO trigger_events (trigger_name, seq, payload, created_at)
VALUES (:trigger, :seq, :payload, :created_at);

-- name: read_trigger_events
SELECT seq, payload, created_at FROM trigger_events
WHERE trigger_name = :trigger ORDER BY seq LIMIT :limit;

-- name: trigger_batch
-- The first and last seq of the :count oldest events of a trigger, and how many there are.
SELECT min(seq) AS first_seq, max(seq) AS last_seq, count(*) AS n FROM (
    SELECT seq FROM trigger_events WHERE trigger_name = :trigger ORDER BY seq LIMIT :count
);

-- name: delete_trigger_events
DELETE FROM trigger_events WHERE trigger_name = :trigger AND seq <= :last_seq;

-- name: get_cursor
SELECT value FROM cursors WHERE name = :name;

-- name: create_cursor
-- No row changed: the cursor exists already.
INSERT INTO cursors (name, value) VALUES (:name, :value) ON CONFLICT (name) DO NOTHING;

-- name: swap_cursor
UPDATE cursors SET value = :value WHERE name = :name AND value = :expected;
