"""SqliteStore: one database file shared by the processes of one machine."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from pyrula.workflows.errors import InvalidRunState
from pyrula.workflows.records import (
    RETRYABLE_STATUSES,
    JournalEntry,
    NewRun,
    Outcome,
    RecoveryReport,
    RunRecord,
    RunStatus,
    Wait,
    WorkerInfo,
)
from pyrula.workflows.stores.base import Claimed, RenewResult
from pyrula.workflows.stores.notify import news_keys, run_key, work_key
from pyrula.workflows.stores.rules import check_finish_outcome, dead_letter_error
from pyrula.workflows.stores.schedule_admin import ScheduleAdmin
from pyrula.workflows.stores.sqlite import claims, sql, waits
from pyrula.workflows.stores.sqlite.db import Database
from pyrula.workflows.stores.sqlite.events import SqliteEvents
from pyrula.workflows.stores.sqlite.schedules import SqliteSchedules
from pyrula.workflows.stores.sqlite.sql import many, one, to_entry, to_run
from pyrula.workflows.stores.sqlite.tx import Tx
from pyrula.workflows.stores.sqlite.watch import SqliteWatch

T = TypeVar("T")


def tell(t: Tx, run: RunRecord) -> None:
    """Lease news for ``run``'s holder, if it is running: at once through the notifier
    (this process), and in its ``lease_news`` row (every process)."""
    keys = news_keys(run)
    if keys:
        t.note(*keys)
        t.run("lease_news_set", worker_id=run.worker_id, at=t.now)


class SqliteStore(SqliteWatch, SqliteSchedules, SqliteEvents, ScheduleAdmin):
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
    * **Claims** are fair across owners and cost one index probe per owner of the
      workflow, never a scan of the queue (see ``claims.py``).
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
        return await self._db.transact(lambda tx: tx.create(new))

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
                conn,
                "list_runs",
                workflow=workflow,
                owner=owner,
                limit=limit,
                status=None if status is None else RunStatus(status).value,
            )
        )
        return [to_run(row) for row in rows]

    async def delete_run(self, run_id: str) -> bool:
        def tx(t: Tx) -> bool:
            row = t.one("get_run", run_id=run_id)
            if row is None:
                return False
            run = to_run(row)
            if not run.is_terminal:
                raise InvalidRunState(
                    f"run {run_id!r} is {run.status.value}; only a run that ended can be deleted"
                )
            _forget(t, run)
            return True

        return await self._db.transact(tx)

    async def purge_runs(self, ended_before: float, limit: int) -> int:
        if limit <= 0:
            return 0

        def tx(t: Tx) -> int:
            rows = t.many("ended_before", before=ended_before, limit=limit)
            for row in rows:
                _forget(t, to_run(row))
            return len(rows)

        return await self._db.transact(tx)

    async def ended_runs(self, after: tuple[float, str] | None, limit: int) -> list[RunRecord]:
        at, run_id = after if after is not None else (-math.inf, "")
        n = max(0, limit)  # a negative LIMIT is none in SQLite
        rows = await self._db.call(lambda c: many(c, "ended_after", at=at, run_id=run_id, limit=n))
        return [to_run(row) for row in rows]

    async def cancel_run(self, run_id: str) -> RunRecord:
        def tx(t: Tx) -> RunRecord:
            run = t.require_live(run_id)
            for target in [run, *t.live_descendants(run_id)]:
                if target.status is RunStatus.RUNNING:
                    t.run("request_cancel", run_id=target.run_id, now=t.now)
                    t.note(run_key(target.run_id))
                    tell(t, target)
                else:
                    t.end("cancel_now", target)
            return t.require(run_id)

        return await self._db.transact(tx)

    async def terminate_run(self, run_id: str) -> RunRecord:
        def tx(t: Tx) -> RunRecord:
            run = t.require_live(run_id)
            for target in [run, *t.live_descendants(run_id)]:
                tell(t, target)
                t.end("terminate_run", target)
            return t.require(run_id)

        return await self._db.transact(tx)

    async def retry_run(
        self, run_id: str, remove: Sequence[int] = (), *, seen_claims: int | None = None
    ) -> RunRecord:
        def tx(t: Tx) -> RunRecord:
            run = t.require(run_id)
            if run.status not in RETRYABLE_STATUSES:
                raise InvalidRunState(
                    f"run {run_id!r} is {run.status.value}; only failed, cancelled, "
                    "terminated or dead runs can be retried"
                )
            if seen_claims is not None and run.claims != seen_claims:
                raise InvalidRunState(
                    f"run {run_id!r} was claimed again since its journal was read "
                    f"({run.claims} claims, not {seen_claims}): read it again to retry it"
                )
            for position in remove:
                t.run("journal_delete", run_id=run_id, position=int(position))
            row = t.one("retry_run", run_id=run_id, now=t.now)
            assert row is not None
            t.note(work_key(run.workflow), run_key(run_id))
            return to_run(row)

        return await self._db.transact(tx)

    # -- queue and leases ------------------------------------------------------------
    async def claim_runs(
        self,
        worker_id: str,
        workflows: Sequence[str],
        limit: int,
        lease_ttl: float,
        ahead: float = 0.0,
    ) -> Claimed:
        if limit <= 0 or not workflows:
            return Claimed()

        def tx(t: Tx) -> Claimed:
            self._work_version = self._db.data_version(t.conn)
            return claims.claim(t, worker_id, workflows, limit, lease_ttl, ahead)

        return await self._db.transact(tx)

    async def next_due_at(self, workflows: Sequence[str]) -> float | None:
        return await self._db.call(
            lambda conn: claims.next_due(Tx(conn, self._db.clock(), self.url), workflows)
        )

    async def renew_leases(
        self, worker_id: str, leases: Sequence[tuple[str, int]], lease_ttl: float
    ) -> RenewResult:
        def tx(t: Tx) -> RenewResult:
            lost: list[str] = []
            cancel: list[str] = []
            for run_id, token in leases:
                row = t.one("lease_state", run_id=run_id)
                if (
                    row is not None
                    and row["lease_token"] == token
                    and RunStatus(row["status"]).is_terminal
                ):
                    continue  # it ended under this lease: the renewal crossed its finish
                if row is None or row["status"] != "running" or row["lease_token"] != token:
                    lost.append(run_id)
                    continue
                t.run("renew_lease", run_id=run_id, expires_at=t.now + lease_ttl)
                if row["cancel_requested"]:
                    cancel.append(run_id)
            return RenewResult(lost=tuple(lost), cancel_requested=tuple(cancel))

        if not leases:
            return RenewResult()
        return await self._db.transact(tx)

    async def load_journal(self, run_id: str) -> list[JournalEntry]:
        rows = await self._db.call(lambda conn: many(conn, "load_journal", run_id=run_id))
        return [to_entry(row) for row in rows]

    async def append_journal(self, token: int, entry: JournalEntry) -> bool:
        def tx(t: Tx) -> bool:
            cancel_requested = t.fence(entry.run_id, token)
            t.append(token, entry)
            return cancel_requested

        return await self._db.transact(tx)

    async def finish_run(
        self, run_id: str, token: int, outcome: Outcome, entry: JournalEntry | None = None
    ) -> RunRecord:
        check_finish_outcome(outcome, run_id, entry)

        def tx(t: Tx) -> RunRecord:
            if entry is not None:
                t.fence(run_id, token)
                t.append(token, entry)
            row = t.one(
                "finish_run",
                run_id=run_id,
                token=token,
                now=t.now,
                status=outcome.status.value,
                result=outcome.result,
                error=outcome.error,
                failed_position=outcome.failed_position,
            )
            if row is None:
                raise t.lease_lost(run_id, token)
            return t.ended(to_run(row), RunStatus.RUNNING)

        return await self._db.transact(tx)

    async def release_run(self, run_id: str, token: int, available_at: float | None = None) -> None:
        def tx(t: Tx) -> None:
            row = t.one(
                "release_run",
                run_id=run_id,
                token=token,
                now=t.now,
                available_at=t.now if available_at is None else available_at,
            )
            if row is None:
                raise t.lease_lost(run_id, token)
            t.note(work_key(row["workflow"]))

        await self._db.transact(tx)

    async def set_progress(self, run_id: str, token: int, state: str, info: str) -> None:
        def tx(t: Tx) -> None:
            params = {"state": state, "info": info, "now": t.now}
            if not t.run("set_progress", run_id=run_id, token=token, **params):
                raise t.lease_lost(run_id, token)

        await self._db.transact(tx)

    async def suspend_run(self, run_id: str, token: int, wait: Wait) -> bool:
        return await self._db.transact(lambda t: waits.suspend(t, run_id, token, wait))

    async def fire_timers(self, limit: int) -> int:
        return await self._db.transact(lambda t: waits.fire_timers(t, limit))

    # -- signals and children ----------------------------------------------------------
    async def send_signal(self, run_id: str, name: str, payload: str) -> None:
        await self._db.transact(lambda t: waits.send_signal(t, run_id, name, payload))

    async def consume_signal(self, token: int, entry: JournalEntry) -> str | None:
        return await self._db.transact(lambda t: waits.consume_signal(t, token, entry))

    async def start_child(self, token: int, entry: JournalEntry, child: NewRun) -> RunRecord:
        return await self._db.transact(lambda t: waits.start_child(t, token, entry, child))

    # -- housekeeping ------------------------------------------------------------------
    async def recover_expired(self, max_recoveries: int, limit: int) -> RecoveryReport:
        def tx(t: Tx) -> RecoveryReport:
            requeued: list[str] = []
            dead: list[str] = []
            for row in t.many("expired_leases", now=t.now, limit=max(limit, 0)):
                run = to_run(row)
                if run.recoveries + 1 > max_recoveries:
                    t.end("dead_letter", run, error=dead_letter_error(run, max_recoveries))
                    dead.append(run.run_id)
                else:
                    t.run("requeue_expired", run_id=run.run_id, now=t.now)
                    t.note(work_key(run.workflow), run_key(run.run_id))
                    requeued.append(run.run_id)
            return RecoveryReport(requeued=tuple(requeued), dead=tuple(dead))

        return await self._db.transact(tx)

    # -- workers ---------------------------------------------------------------------
    async def heartbeat(self, info: WorkerInfo) -> None:
        def tx(t: Tx) -> None:
            t.run(
                "upsert_worker",
                worker_id=info.worker_id,
                workflows=json.dumps(list(info.workflows)),
                hostname=info.hostname,
                pid=info.pid,
                started_at=info.started_at,
                last_seen=t.now,
                running=info.running,
                lock_ttl=info.lock_ttl,
            )

        await self._db.transact(tx)

    async def remove_worker(self, worker_id: str) -> None:
        def tx(t: Tx) -> None:
            t.run("delete_worker", worker_id=worker_id)
            t.run("lease_news_take", worker_id=worker_id)  # news nobody will read

        await self._db.transact(tx)

    async def list_workers(self) -> list[WorkerInfo]:
        rows = await self._db.call(lambda conn: many(conn, "list_workers"))
        return [sql.to_worker(row) for row in rows]


def _forget(t: Tx, run: RunRecord) -> None:
    """Delete an ended run with its journal and signals (its idempotency key is a column)."""
    for statement in ("delete_journal", "delete_signals", "delete_run"):
        t.run(statement, run_id=run.run_id)
    t.run("drop_owner_if_idle", workflow=run.workflow, owner=run.owner)
