"""MemoryStore: in-process, thread-safe, loses everything on restart.

It is the executable specification of :class:`~pyrula.workflows.stores.base.Store`:
when the conformance suite and this store disagree, the suite is fixed first, then
every backend. Every operation runs under one lock, so each is atomic.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from pyrula.workflows.errors import (
    InvalidRunState,
    LeaseLost,
    NondeterminismError,
    RunNotFound,
)
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
from pyrula.workflows.stores.notify import Notifier, run_key, work_key
from pyrula.workflows.stores.rules import (
    check_finish_outcome,
    dead_letter_error,
    idempotency_conflict,
    idempotency_matches,
    same_entry,
)


class MemoryStore:
    """A store in this process's memory. ``clock`` is the store's time source."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.url = "memory://"
        self._clock = clock
        self._lock = threading.RLock()
        self._runs: dict[str, RunRecord] = {}
        self._order: dict[str, int] = {}
        self._seq = 0
        self._keys: dict[str, str] = {}
        self._journals: dict[str, list[JournalEntry]] = {}
        self._workers: dict[str, WorkerInfo] = {}
        self._token = 0
        self._notifier = Notifier()

    # -- lifecycle -------------------------------------------------------------------
    async def open(self) -> None:
        return None

    async def close(self) -> None:
        self._notifier.close()

    async def now(self) -> float:
        return self._clock()

    # -- runs ------------------------------------------------------------------------
    async def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        with self._lock:
            if new.idempotency_key is not None and new.idempotency_key in self._keys:
                existing = self._runs[self._keys[new.idempotency_key]]
                if not idempotency_matches(existing, new):
                    raise idempotency_conflict(new.idempotency_key, existing, new)
                return existing, False
            now = self._clock()
            available = new.start_at if new.start_at is not None else now + new.delay
            record = RunRecord(
                run_id=new.run_id,
                workflow=new.workflow,
                params=new.params,
                status=RunStatus.QUEUED,
                owner=new.owner,
                idempotency_key=new.idempotency_key,
                created_at=now,
                available_at=available,
                updated_at=now,
            )
            if new.run_id in self._runs:
                raise InvalidRunState(f"a run with id {new.run_id!r} already exists")
            self._runs[new.run_id] = record
            self._seq += 1
            self._order[new.run_id] = self._seq
            self._journals[new.run_id] = []
            if new.idempotency_key is not None:
                self._keys[new.idempotency_key] = new.run_id
        self._notifier.notify(work_key(new.workflow))
        return record, True

    async def get_run(self, run_id: str) -> RunRecord | None:
        with self._lock:
            return self._runs.get(run_id)

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        with self._lock:
            ids = sorted(self._runs, key=self._order.__getitem__, reverse=True)
            out: list[RunRecord] = []
            for run_id in ids:
                run = self._runs[run_id]
                if workflow is not None and run.workflow != workflow:
                    continue
                if status is not None and run.status != status:
                    continue
                if owner is not None and run.owner != owner:
                    continue
                if len(out) >= limit:
                    break
                out.append(run)
            return out

    async def wait_run(self, run_id: str, timeout: float | None) -> RunRecord:
        deadline = None if timeout is None else time.monotonic() + timeout
        key = run_key(run_id)
        while True:
            fut = self._notifier.register(key)
            run = await self.get_run(run_id)
            if run is None:
                self._notifier.unregister(key, fut)
                raise RunNotFound(f"no run with id {run_id!r} in {self.url}")
            remaining = None if deadline is None else deadline - time.monotonic()
            closed = self._notifier.closed  # close() woke us: return the run as it is
            if run.is_terminal or closed or (remaining is not None and remaining <= 0):
                self._notifier.unregister(key, fut)
                return run
            await self._notifier.wait(fut, key, remaining)

    async def cancel_run(self, run_id: str) -> RunRecord:
        with self._lock:
            run = self._require(run_id)
            if run.is_terminal:
                raise InvalidRunState(f"run {run_id!r} already ended as {run.status.value}")
            now = self._clock()
            if run.status is RunStatus.QUEUED:
                run = replace(
                    run,
                    status=RunStatus.CANCELLED,
                    finished_at=now,
                    updated_at=now,
                    cancel_requested=True,
                )
            else:
                run = replace(run, cancel_requested=True, updated_at=now)
            self._runs[run_id] = run
        self._notifier.notify(run_key(run_id))
        return run

    async def terminate_run(self, run_id: str) -> RunRecord:
        with self._lock:
            run = self._require(run_id)
            if run.is_terminal:
                raise InvalidRunState(f"run {run_id!r} already ended as {run.status.value}")
            now = self._clock()
            self._token += 1
            run = replace(
                run,
                status=RunStatus.TERMINATED,
                finished_at=now,
                updated_at=now,
                lease_token=self._token,
                lease_expires_at=None,
            )
            self._runs[run_id] = run
        self._notifier.notify(run_key(run_id))
        return run

    async def retry_run(self, run_id: str) -> RunRecord:
        with self._lock:
            run = self._require(run_id)
            if run.status not in RETRYABLE_STATUSES:
                raise InvalidRunState(
                    f"run {run_id!r} is {run.status.value}; only failed, cancelled, "
                    "terminated or dead runs can be retried"
                )
            journal = self._journals[run_id]
            if journal and not journal[-1].ok:
                journal.pop()
            now = self._clock()
            run = replace(
                run,
                status=RunStatus.QUEUED,
                available_at=now,
                updated_at=now,
                finished_at=None,
                error=None,
                result=None,
                cancel_requested=False,
                recoveries=0,
                lease_expires_at=None,
            )
            self._runs[run_id] = run
        self._notifier.notify(work_key(run.workflow), run_key(run_id))
        return run

    # -- queue and leases ------------------------------------------------------------
    async def wait_for_work(self, workflows: Sequence[str], timeout: float) -> None:
        keys = [work_key(name) for name in workflows]
        loop_futs = [(key, self._notifier.register(key)) for key in keys]
        try:
            if not loop_futs:
                return
            done, _ = await asyncio.wait(
                [asyncio.shield(f) for _, f in loop_futs],
                timeout=timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
            del done
        finally:
            for key, fut in loop_futs:
                self._notifier.unregister(key, fut)

    async def claim_runs(
        self, worker_id: str, workflows: Sequence[str], limit: int, lease_ttl: float
    ) -> list[Lease]:
        if limit <= 0:
            return []
        names = set(workflows)
        with self._lock:
            now = self._clock()
            due = [
                run
                for run in self._runs.values()
                if run.status is RunStatus.QUEUED
                and run.workflow in names
                and run.available_at <= now
            ]
            due.sort(key=lambda r: (r.available_at, self._order[r.run_id]))
            leases: list[Lease] = []
            for run in due[:limit]:
                self._token += 1
                claimed = replace(
                    run,
                    status=RunStatus.RUNNING,
                    worker_id=worker_id,
                    lease_token=self._token,
                    lease_expires_at=now + lease_ttl,
                    claims=run.claims + 1,
                    updated_at=now,
                    started_at=run.started_at if run.started_at is not None else now,
                )
                self._runs[run.run_id] = claimed
                leases.append(Lease(run=claimed, token=self._token, expires_at=now + lease_ttl))
            return leases

    async def next_due_at(self, workflows: Sequence[str]) -> float | None:
        names = set(workflows)
        with self._lock:
            times = [
                run.available_at
                for run in self._runs.values()
                if run.status is RunStatus.QUEUED and run.workflow in names
            ]
        return min(times, default=None)

    async def renew_leases(
        self, worker_id: str, leases: Sequence[tuple[str, int]], lease_ttl: float
    ) -> RenewResult:
        lost: list[str] = []
        cancel: list[str] = []
        with self._lock:
            now = self._clock()
            for run_id, token in leases:
                run = self._runs.get(run_id)
                if run is None or run.status is not RunStatus.RUNNING or run.lease_token != token:
                    lost.append(run_id)
                    continue
                self._runs[run_id] = replace(run, lease_expires_at=now + lease_ttl)
                if run.cancel_requested:
                    cancel.append(run_id)
        return RenewResult(lost=tuple(lost), cancel_requested=tuple(cancel))

    async def load_journal(self, run_id: str) -> list[JournalEntry]:
        with self._lock:
            return list(self._journals.get(run_id, ()))

    async def append_journal(self, token: int, entry: JournalEntry) -> bool:
        with self._lock:
            run = self._fenced(entry.run_id, token)
            journal = self._journals[entry.run_id]
            if entry.position < len(journal):
                if same_entry(journal[entry.position], entry):
                    return run.cancel_requested
                raise NondeterminismError(
                    f"run {entry.run_id!r} already recorded {journal[entry.position].name!r} "
                    f"at position {entry.position}, not {entry.name!r}"
                )
            if entry.position != len(journal):
                raise NondeterminismError(
                    f"run {entry.run_id!r}: journal position {entry.position} skips "
                    f"positions (next free is {len(journal)})"
                )
            journal.append(replace(entry, token=token, recorded_at=self._clock()))
            return run.cancel_requested

    async def finish_run(self, run_id: str, token: int, outcome: Outcome) -> RunRecord:
        check_finish_outcome(outcome)
        with self._lock:
            run = self._fenced(run_id, token)
            now = self._clock()
            run = replace(
                run,
                status=outcome.status,
                result=outcome.result,
                error=outcome.error,
                finished_at=now,
                updated_at=now,
                lease_expires_at=None,
            )
            self._runs[run_id] = run
        self._notifier.notify(run_key(run_id))
        return run

    async def release_run(self, run_id: str, token: int, available_at: float | None = None) -> None:
        with self._lock:
            run = self._fenced(run_id, token)
            now = self._clock()
            run = replace(
                run,
                status=RunStatus.QUEUED,
                updated_at=now,
                lease_expires_at=None,
                available_at=now if available_at is None else available_at,
            )
            self._runs[run_id] = run
        self._notifier.notify(work_key(run.workflow))

    async def recover_expired(self, max_recoveries: int, limit: int) -> RecoveryReport:
        requeued: list[str] = []
        dead: list[str] = []
        touched: list[RunRecord] = []
        with self._lock:
            now = self._clock()
            expired = [
                run
                for run in self._runs.values()
                if run.status is RunStatus.RUNNING
                and run.lease_expires_at is not None
                and run.lease_expires_at <= now
            ]
            for run in expired[:limit]:
                if run.recoveries + 1 > max_recoveries:
                    run = replace(
                        run,
                        status=RunStatus.DEAD,
                        finished_at=now,
                        updated_at=now,
                        lease_expires_at=None,
                        recoveries=run.recoveries + 1,
                        error=dead_letter_error(run, max_recoveries),
                    )
                    dead.append(run.run_id)
                else:
                    run = replace(
                        run,
                        status=RunStatus.QUEUED,
                        available_at=now,
                        updated_at=now,
                        lease_expires_at=None,
                        recoveries=run.recoveries + 1,
                    )
                    requeued.append(run.run_id)
                self._runs[run.run_id] = run
                touched.append(run)
        for run in touched:
            self._notifier.notify(work_key(run.workflow), run_key(run.run_id))
        return RecoveryReport(requeued=tuple(requeued), dead=tuple(dead))

    # -- workers ---------------------------------------------------------------------
    async def heartbeat(self, info: WorkerInfo) -> None:
        with self._lock:
            self._workers[info.worker_id] = replace(info, last_seen=self._clock())

    async def remove_worker(self, worker_id: str) -> None:
        with self._lock:
            self._workers.pop(worker_id, None)

    async def list_workers(self) -> list[WorkerInfo]:
        with self._lock:
            return sorted(self._workers.values(), key=lambda w: w.last_seen, reverse=True)

    # -- internals -------------------------------------------------------------------
    def _require(self, run_id: str) -> RunRecord:
        run = self._runs.get(run_id)
        if run is None:
            raise RunNotFound(f"no run with id {run_id!r} in {self.url}")
        return run

    def _fenced(self, run_id: str, token: int) -> RunRecord:
        run = self._require(run_id)
        if run.status is not RunStatus.RUNNING or run.lease_token != token:
            raise LeaseLost(
                f"run {run_id!r} is no longer held with token {token} "
                f"(status {run.status.value}, token {run.lease_token})"
            )
        return run
