"""SqliteStore: one database file shared by the processes of one machine."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Sequence

from pyrula.workflows.errors import InvalidRunState, LeaseLost, NondeterminismError, RunNotFound
from pyrula.workflows.records import (
    RETRYABLE_STATUSES,
    JournalEntry,
    Lease,
    NewRun,
    Outcome,
    RecoveryReport,
    RunRecord,
    RunStatus,
    WorkerInfo,
)
from pyrula.workflows.stores.base import RenewResult
from pyrula.workflows.stores.notify import run_key, work_key
from pyrula.workflows.stores.rules import (
    check_finish_outcome,
    dead_letter_error,
    idempotency_conflict,
    idempotency_matches,
    same_entry,
)
from pyrula.workflows.stores.sqlite import sql
from pyrula.workflows.stores.sqlite.db import POLL_MAX, POLL_MIN, Database, Keys, remaining
from pyrula.workflows.stores.sqlite.sql import many, one, scalar, to_entry, to_run


class SqliteStore:
    """A store in one SQLite file (WAL mode), safe for many processes on one machine.

    * **One thread.** Every sqlite3 call runs on this store's own single-thread executor,
      awaited with ``run_in_executor``, so one instance can serve several event loops
      and threads at once. The connection is opened lazily on that thread, in WAL mode
      with ``synchronous=NORMAL``; the schema is created (idempotently) on connect.
    * **Atomic writes.** Each write operation is one ``BEGIN IMMEDIATE`` transaction: the
      write lock is taken before anything is read, so read-check-write sequences (claims,
      idempotent creation, fenced journal writes) are atomic across processes. A lock
      held by another connection is waited for up to ``busy_timeout`` seconds, then
      :class:`~pyrula.workflows.errors.StoreUnavailable` is raised.
    * **Time** is the injected ``clock``; every process of one machine shares it.
    * **Wake-ups.** In this process, every SqliteStore on the same file (by real path)
      shares one :class:`~pyrula.workflows.stores.notify.Notifier`, notified after each
      commit, so ``wait_run`` and ``wait_for_work`` wake at once. No notification
      crosses processes: while waiting, they also read ``PRAGMA data_version`` (a counter
      that moves when another connection commits; it reads no table) every 5 ms, backing
      off to 50 ms, and only re-read the run (or look for claimable work) when it moved.
      The interval is spent asleep awaiting the notifier, never spinning. So a change
      made by another process is seen within about 50 ms.
    * **Claims** read one index range per workflow (``runs_claim``), already in
      ``(available_at, insertion)`` order, so their cost does not grow with the queue.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 30.0,
    ) -> None:
        self.path = os.fspath(path)
        self.url = "sqlite:///" + self.path
        self._db = Database(self.path, clock, busy_timeout)
        self._work_version: int | None = None
        """``data_version`` as of this store's last claim or wake-up (see wait_for_work)."""

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    # -- lifecycle -------------------------------------------------------------------
    async def open(self) -> None:
        await self._db.call(lambda conn: None)

    async def close(self) -> None:
        await self._db.close()

    async def now(self) -> float:
        return self._db.clock()

    # -- runs ------------------------------------------------------------------------
    async def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        def tx(conn: sqlite3.Connection, now: float) -> tuple[tuple[RunRecord, bool], Keys]:
            if new.idempotency_key is not None:
                row = one(conn, "get_run_by_key", key=new.idempotency_key)
                if row is not None:
                    existing = to_run(row)
                    if not idempotency_matches(existing, new):
                        raise idempotency_conflict(new.idempotency_key, existing, new)
                    return (existing, False), ()
            if one(conn, "get_run", run_id=new.run_id) is not None:
                raise InvalidRunState(f"a run with id {new.run_id!r} already exists")
            sql.run(
                conn, "insert_run", run_id=new.run_id, workflow=new.workflow,
                params=new.params, owner=new.owner, idempotency_key=new.idempotency_key,
                now=now,
                available_at=new.start_at if new.start_at is not None else now + new.delay,
            )
            return (self._require(conn, new.run_id), True), (work_key(new.workflow),)

        return await self._db.write(tx)

    async def get_run(self, run_id: str) -> RunRecord | None:
        row = await self._db.call(lambda conn: one(conn, "get_run", run_id=run_id))
        return None if row is None else to_run(row)

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        if limit <= 0:
            return []
        rows = await self._db.call(
            lambda conn: many(
                conn, "list_runs", workflow=workflow, owner=owner, limit=limit,
                status=None if status is None else RunStatus(status).value,
            )
        )
        return [to_run(row) for row in rows]

    async def wait_run(self, run_id: str, timeout: float | None) -> RunRecord:
        deadline = None if timeout is None else time.monotonic() + timeout
        key = run_key(run_id)

        def read(conn: sqlite3.Connection) -> tuple[int, sqlite3.Row | None]:
            return self._db.data_version(conn), one(conn, "get_run", run_id=run_id)

        while True:
            fut = self._db.notifier.register(key)
            try:
                version, row = await self._db.call(read)
                if row is None:
                    raise RunNotFound(f"no run with id {run_id!r} in {self.url}")
                run = to_run(row)
                if run.is_terminal or self._db.closed or remaining(deadline) == 0.0:
                    return run
                interval = POLL_MIN
                while await self._db.nap([fut], deadline, interval):
                    if version != await self._db.poll_version():
                        break
                    interval = min(2 * interval, POLL_MAX)
                if self._db.closed:
                    return run
            finally:
                self._db.notifier.unregister(key, fut)

    async def cancel_run(self, run_id: str) -> RunRecord:
        def tx(conn: sqlite3.Connection, now: float) -> tuple[RunRecord, Keys]:
            run = self._require(conn, run_id)
            if run.is_terminal:
                raise InvalidRunState(f"run {run_id!r} already ended as {run.status.value}")
            name = "cancel_queued" if run.status is RunStatus.QUEUED else "request_cancel"
            sql.run(conn, name, run_id=run_id, now=now)
            return self._require(conn, run_id), (run_key(run_id),)

        return await self._db.write(tx)

    async def terminate_run(self, run_id: str) -> RunRecord:
        def tx(conn: sqlite3.Connection, now: float) -> tuple[RunRecord, Keys]:
            run = self._require(conn, run_id)
            if run.is_terminal:
                raise InvalidRunState(f"run {run_id!r} already ended as {run.status.value}")
            sql.run(conn, "terminate_run", run_id=run_id, now=now)
            return self._require(conn, run_id), (run_key(run_id),)

        return await self._db.write(tx)

    async def retry_run(self, run_id: str) -> RunRecord:
        def tx(conn: sqlite3.Connection, now: float) -> tuple[RunRecord, Keys]:
            run = self._require(conn, run_id)
            if run.status not in RETRYABLE_STATUSES:
                raise InvalidRunState(
                    f"run {run_id!r} is {run.status.value}; only failed, cancelled, "
                    "terminated or dead runs can be retried"
                )
            last = one(conn, "journal_last", run_id=run_id)
            if last is not None and not last["ok"]:
                sql.run(conn, "journal_delete", run_id=run_id, position=last["position"])
            sql.run(conn, "retry_run", run_id=run_id, now=now)
            return self._require(conn, run_id), (work_key(run.workflow), run_key(run_id))

        return await self._db.write(tx)

    # -- queue and leases ------------------------------------------------------------
    async def wait_for_work(self, workflows: Sequence[str], timeout: float) -> None:
        names = list(dict.fromkeys(workflows))
        if not names:
            return
        deadline = time.monotonic() + timeout
        futs = [(key, self._db.notifier.register(key)) for key in map(work_key, names)]

        def has_work(conn: sqlite3.Connection) -> bool:
            now = self._db.clock()
            return any(one(conn, "has_work", workflow=n, now=now) for n in names)

        try:
            # Compare with the version our last claim (or wake-up) saw, so a run created
            # by another process since then is not missed.
            seen = self._work_version
            interval = POLL_MIN
            while True:
                current = await self._db.poll_version()
                if current is None:
                    return
                if seen is not None and current != seen:
                    self._work_version = current
                    if await self._db.call(has_work):
                        return
                    interval = POLL_MIN
                seen = current
                if not await self._db.nap([f for _, f in futs], deadline, interval):
                    return
                interval = min(2 * interval, POLL_MAX)
        finally:
            for key, fut in futs:
                self._db.notifier.unregister(key, fut)

    async def claim_runs(
        self, worker_id: str, workflows: Sequence[str], limit: int, lease_ttl: float
    ) -> list[Lease]:
        names = list(dict.fromkeys(workflows))
        if limit <= 0 or not names:
            return []

        def tx(conn: sqlite3.Connection, now: float) -> tuple[list[Lease], Keys]:
            self._work_version = self._db.data_version(conn)
            rows = [
                row for name in names
                for row in many(conn, "claimable", workflow=name, now=now, limit=limit)
            ]
            rows.sort(key=lambda row: (row["available_at"], row["seq"]))
            leases: list[Lease] = []
            for row in rows[:limit]:
                sql.run(
                    conn, "claim_run", seq=row["seq"], worker_id=worker_id, now=now,
                    expires_at=now + lease_ttl,
                )
                claimed = to_run(_must(one(conn, "get_run_by_seq", seq=row["seq"])))
                leases.append(Lease(claimed, claimed.lease_token, now + lease_ttl))
            return leases, ()

        return await self._db.write(tx)

    async def next_due_at(self, workflows: Sequence[str]) -> float | None:
        def read(conn: sqlite3.Connection) -> float | None:
            times = [scalar(conn, "next_due", workflow=name) for name in set(workflows)]
            return min((t for t in times if t is not None), default=None)

        return await self._db.call(read)

    async def renew_leases(
        self, worker_id: str, leases: Sequence[tuple[str, int]], lease_ttl: float
    ) -> RenewResult:
        def tx(conn: sqlite3.Connection, now: float) -> tuple[RenewResult, Keys]:
            lost: list[str] = []
            cancel: list[str] = []
            for run_id, token in leases:
                row = one(conn, "lease_state", run_id=run_id)
                if row is None or row["status"] != "running" or row["lease_token"] != token:
                    lost.append(run_id)
                    continue
                sql.run(conn, "renew_lease", run_id=run_id, expires_at=now + lease_ttl)
                if row["cancel_requested"]:
                    cancel.append(run_id)
            return RenewResult(lost=tuple(lost), cancel_requested=tuple(cancel)), ()

        if not leases:
            return RenewResult()
        return await self._db.write(tx)

    async def load_journal(self, run_id: str) -> list[JournalEntry]:
        rows = await self._db.call(lambda conn: many(conn, "load_journal", run_id=run_id))
        return [to_entry(row) for row in rows]

    async def append_journal(self, token: int, entry: JournalEntry) -> bool:
        def tx(conn: sqlite3.Connection, now: float) -> tuple[bool, Keys]:
            run = self._fenced(conn, entry.run_id, token)
            row = one(conn, "journal_entry", run_id=entry.run_id, position=entry.position)
            if row is not None:
                existing = to_entry(row)
                if same_entry(existing, entry):
                    return run.cancel_requested, ()
                raise NondeterminismError(
                    f"run {entry.run_id!r} already recorded {existing.name!r} "
                    f"at position {entry.position}, not {entry.name!r}"
                )
            free = scalar(conn, "journal_next", run_id=entry.run_id)
            if entry.position != free:
                raise NondeterminismError(
                    f"run {entry.run_id!r}: journal position {entry.position} skips "
                    f"positions (next free is {free})"
                )
            sql.run(
                conn, "insert_journal", run_id=entry.run_id, position=entry.position,
                kind=entry.kind, name=entry.name, ok=entry.ok, value=entry.value,
                attempts=entry.attempts, token=token, recorded_at=now,
            )
            return run.cancel_requested, ()

        return await self._db.write(tx)

    async def finish_run(self, run_id: str, token: int, outcome: Outcome) -> RunRecord:
        check_finish_outcome(outcome)

        def tx(conn: sqlite3.Connection, now: float) -> tuple[RunRecord, Keys]:
            self._fenced(conn, run_id, token)
            sql.run(
                conn, "finish_run", run_id=run_id, now=now, status=outcome.status.value,
                result=outcome.result, error=outcome.error,
            )
            return self._require(conn, run_id), (run_key(run_id),)

        return await self._db.write(tx)

    async def release_run(
        self, run_id: str, token: int, available_at: float | None = None
    ) -> None:
        def tx(conn: sqlite3.Connection, now: float) -> tuple[None, Keys]:
            run = self._fenced(conn, run_id, token)
            sql.run(
                conn, "release_run", run_id=run_id, now=now,
                available_at=now if available_at is None else available_at,
            )
            return None, (work_key(run.workflow),)

        await self._db.write(tx)

    async def recover_expired(self, max_recoveries: int, limit: int) -> RecoveryReport:
        def tx(conn: sqlite3.Connection, now: float) -> tuple[RecoveryReport, Keys]:
            requeued: list[str] = []
            dead: list[str] = []
            keys: list[str] = []
            for row in many(conn, "expired_leases", now=now, limit=max(limit, 0)):
                run = to_run(row)
                if run.recoveries + 1 > max_recoveries:
                    error = dead_letter_error(run, max_recoveries)
                    sql.run(conn, "dead_letter", run_id=run.run_id, now=now, error=error)
                    dead.append(run.run_id)
                else:
                    sql.run(conn, "requeue_expired", run_id=run.run_id, now=now)
                    requeued.append(run.run_id)
                keys += [work_key(run.workflow), run_key(run.run_id)]
            return RecoveryReport(requeued=tuple(requeued), dead=tuple(dead)), tuple(keys)

        return await self._db.write(tx)

    # -- workers ---------------------------------------------------------------------
    async def heartbeat(self, info: WorkerInfo) -> None:
        def tx(conn: sqlite3.Connection, now: float) -> tuple[None, Keys]:
            sql.run(
                conn, "upsert_worker", worker_id=info.worker_id,
                workflows=json.dumps(list(info.workflows)), hostname=info.hostname,
                pid=info.pid, started_at=info.started_at, last_seen=now, running=info.running,
            )
            return None, ()

        await self._db.write(tx)

    async def remove_worker(self, worker_id: str) -> None:
        def tx(conn: sqlite3.Connection, now: float) -> tuple[None, Keys]:
            sql.run(conn, "delete_worker", worker_id=worker_id)
            return None, ()

        await self._db.write(tx)

    async def list_workers(self) -> list[WorkerInfo]:
        rows = await self._db.call(lambda conn: many(conn, "list_workers"))
        return [sql.to_worker(row) for row in rows]

    # -- internals: inside a transaction ---------------------------------------------
    def _require(self, conn: sqlite3.Connection, run_id: str) -> RunRecord:
        row = one(conn, "get_run", run_id=run_id)
        if row is None:
            raise RunNotFound(f"no run with id {run_id!r} in {self.url}")
        return to_run(row)

    def _fenced(self, conn: sqlite3.Connection, run_id: str, token: int) -> RunRecord:
        run = self._require(conn, run_id)
        if run.status is not RunStatus.RUNNING or run.lease_token != token:
            raise LeaseLost(
                f"run {run_id!r} is no longer held with token {token} "
                f"(status {run.status.value}, token {run.lease_token})"
            )
        return run


def _must(row: sqlite3.Row | None) -> sqlite3.Row:
    assert row is not None
    return row
