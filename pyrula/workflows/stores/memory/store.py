"""MemoryStore: in-process, thread-safe, loses everything on restart.

It is the executable specification of :class:`~pyrula.workflows.stores.base.Store`:
when the conformance suite and this store disagree, the suite is fixed first, then
every backend. Every operation runs under one lock, so each is atomic; wake-ups are
sent after the lock is released.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from pyrula.workflows.errors import InvalidRunState, RunNotFound
from pyrula.workflows.records import (
    RETRYABLE_STATUSES,
    JournalEntry,
    NewRun,
    Outcome,
    RecoveryReport,
    RunRecord,
    RunStatus,
    WorkerInfo,
)
from pyrula.workflows.stores.base import Claimed, RenewResult
from pyrula.workflows.stores.memory import claims
from pyrula.workflows.stores.memory.events import MemoryEvents
from pyrula.workflows.stores.memory.schedules import MemorySchedules
from pyrula.workflows.stores.memory.state import MemoryState
from pyrula.workflows.stores.memory.waits import MemoryWaits
from pyrula.workflows.stores.notify import lease_key, news_keys, run_key, work_key
from pyrula.workflows.stores.rules import (
    check_finish_outcome,
    dead_letter_error,
)
from pyrula.workflows.stores.schedule_admin import ScheduleAdmin


class MemoryStore(MemoryWaits, MemorySchedules, MemoryEvents, ScheduleAdmin):
    """A store in this process's memory. ``clock`` is the store's time source."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.url = "memory://"
        self._clock = clock
        self._s = MemoryState(clock=clock)

    # -- lifecycle -------------------------------------------------------------------
    async def open(self) -> None:
        return None

    async def close(self) -> None:
        self._s.notifier.close()

    async def now(self) -> float:
        return self._clock()

    # -- runs ------------------------------------------------------------------------
    async def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        s = self._s
        with s.lock:
            record, created = self._s.create(new)
        s.flush()
        return record, created

    async def get_run(self, run_id: str) -> RunRecord | None:
        with self._s.lock:
            return self._s.runs.get(run_id)

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        s = self._s
        with s.lock:
            out: list[RunRecord] = []
            for run_id in sorted(s.runs, key=s.order.__getitem__, reverse=True):
                run = s.runs[run_id]
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
        notifier = self._s.notifier
        deadline = None if timeout is None else time.monotonic() + timeout
        key = run_key(run_id)
        while True:
            fut = notifier.register(key)
            run = await self.get_run(run_id)
            if run is None:
                notifier.unregister(key, fut)
                raise RunNotFound(f"no run with id {run_id!r} in {self.url}")
            remaining = None if deadline is None else deadline - time.monotonic()
            closed = notifier.closed  # close() woke us: return the run as it is
            if run.is_terminal or closed or (remaining is not None and remaining <= 0):
                notifier.unregister(key, fut)
                return run
            await notifier.wait(fut, key, remaining)

    async def delete_run(self, run_id: str) -> bool:
        s = self._s
        with s.lock:
            run = s.runs.get(run_id)
            if run is None:
                return False
            if not run.is_terminal:
                raise InvalidRunState(
                    f"run {run_id!r} is {run.status.value}; only a run that ended can be deleted"
                )
            self._forget(run)
            return True

    async def purge_runs(self, ended_before: float, limit: int) -> int:
        s = self._s
        with s.lock:
            ended = heapq.nsmallest(
                max(0, limit),
                (
                    run
                    for run in s.runs.values()
                    if run.is_terminal
                    and run.finished_at is not None
                    and run.finished_at < ended_before
                    and (run.parent_run_id is None or run.parent_run_id not in s.runs)
                ),
                key=lambda run: (run.finished_at or 0.0, s.order.get(run.run_id, 0)),
            )
            for run in ended:
                self._forget(run)
            return len(ended)

    async def ended_runs(self, after: tuple[float, str] | None, limit: int) -> list[RunRecord]:
        with self._s.lock:
            return self._s.ended_after(after, limit)

    def _forget(self, run: RunRecord) -> None:
        """Drop an ended run and everything of it (the caller holds the lock)."""
        s = self._s
        run_id = run.run_id
        del s.runs[run_id]
        for table in (s.order, s.stamps, s.journals, s.signals):
            table.pop(run_id, None)
        if run.idempotency_key is not None:
            s.keys.pop(run.idempotency_key, None)
        if run.parent_run_id is not None:
            s.children.get(run.parent_run_id, set()).discard(run_id)

    async def cancel_run(self, run_id: str) -> RunRecord:
        s = self._s
        with s.lock:
            run = s.require_live(run_id)
            for target in [run, *s.live_children(run_id)]:
                if target.status is RunStatus.RUNNING:
                    s.save(replace(target, cancel_requested=True, updated_at=self._clock()))
                    s.note(run_key(target.run_id), *news_keys(target))
                else:
                    s.end(target, RunStatus.CANCELLED, cancel_requested=True)
            result = s.runs[run_id]
        s.flush()
        return result

    async def terminate_run(self, run_id: str) -> RunRecord:
        s = self._s
        with s.lock:
            run = s.require_live(run_id)
            for target in [run, *s.live_children(run_id)]:
                s.note(*news_keys(target))
                s.end(target, RunStatus.TERMINATED, lease_token=s.next_token())
            result = s.runs[run_id]
        s.flush()
        return result

    async def retry_run(
        self, run_id: str, remove: Sequence[int] = (), *, seen_claims: int | None = None
    ) -> RunRecord:
        s = self._s
        with s.lock:
            run = s.require(run_id)
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
            journal = s.journals[run_id]
            for position in remove:
                journal.pop(position, None)
            run = s.enqueue(
                run,
                self._clock(),
                finished_at=None,
                error=None,
                result=None,
                cancel_requested=False,
                recoveries=0,
                failed_position=None,
            )
            s.note(run_key(run_id))
        s.flush()
        return run

    # -- queue and leases ------------------------------------------------------------
    async def wait_for_work(self, workflows: Sequence[str], timeout: float) -> None:
        notifier = self._s.notifier
        registered = [(key, notifier.register(key)) for key in map(work_key, workflows)]
        try:
            if registered:
                await asyncio.wait(
                    [asyncio.shield(f) for _, f in registered],
                    timeout=timeout,
                    return_when=asyncio.FIRST_COMPLETED,
                )
        finally:
            for key, fut in registered:
                notifier.unregister(key, fut)

    async def wait_lease_news(self, worker_id: str, timeout: float) -> bool:
        return await self._s.notifier.wait_news(lease_key(worker_id), timeout)

    async def claim_runs(
        self,
        worker_id: str,
        workflows: Sequence[str],
        limit: int,
        lease_ttl: float,
        ahead: float = 0.0,
    ) -> Claimed:
        if limit <= 0:
            return Claimed()
        with self._s.lock:
            leases = claims.claim(self._s, worker_id, workflows, limit, lease_ttl, ahead)
        self._s.flush()  # expired runs it ended wake their waiters
        return leases

    async def next_due_at(self, workflows: Sequence[str]) -> float | None:
        with self._s.lock:
            return claims.next_due(self._s, workflows)

    async def renew_leases(
        self, worker_id: str, leases: Sequence[tuple[str, int]], lease_ttl: float
    ) -> RenewResult:
        s = self._s
        lost: list[str] = []
        cancel: list[str] = []
        with s.lock:
            now = self._clock()
            for run_id, token in leases:
                run = s.runs.get(run_id)
                if run is not None and run.is_terminal and run.lease_token == token:
                    continue  # it ended under this lease: the renewal crossed its finish
                if run is None or run.status is not RunStatus.RUNNING or run.lease_token != token:
                    lost.append(run_id)
                    continue
                s.save(replace(run, lease_expires_at=now + lease_ttl))
                if run.cancel_requested:
                    cancel.append(run_id)
        return RenewResult(lost=tuple(lost), cancel_requested=tuple(cancel))

    async def load_journal(self, run_id: str) -> list[JournalEntry]:
        with self._s.lock:
            journal = self._s.journals.get(run_id, {})
            return [journal[position] for position in sorted(journal)]

    async def append_journal(self, token: int, entry: JournalEntry) -> bool:
        with self._s.lock:
            run = self._s.fenced(entry.run_id, token)
            self._s.append(token, entry)
            return run.cancel_requested

    async def finish_run(
        self, run_id: str, token: int, outcome: Outcome, entry: JournalEntry | None = None
    ) -> RunRecord:
        check_finish_outcome(outcome, run_id, entry)
        s = self._s
        with s.lock:
            run = s.fenced(run_id, token)
            if entry is not None:
                self._s.append(token, entry)
            run = s.end(
                run,
                outcome.status,
                result=outcome.result,
                error=outcome.error,
                failed_position=outcome.failed_position,
            )
        s.flush()
        return run

    async def release_run(self, run_id: str, token: int, available_at: float | None = None) -> None:
        s = self._s
        with s.lock:
            run = s.fenced(run_id, token)
            s.enqueue(run, self._clock() if available_at is None else available_at)
        s.flush()

    async def set_progress(self, run_id: str, token: int, state: str, info: str) -> None:
        s = self._s
        with s.lock:
            run = s.fenced(run_id, token)
            s.save(replace(run, progress_state=state, progress_info=info, updated_at=self._clock()))

    # -- housekeeping ------------------------------------------------------------------
    async def recover_expired(self, max_recoveries: int, limit: int) -> RecoveryReport:
        s = self._s
        requeued: list[str] = []
        dead: list[str] = []
        with s.lock:
            now = self._clock()
            expired = [
                run
                for run in s.runs.values()
                if run.status is RunStatus.RUNNING
                and run.lease_expires_at is not None
                and run.lease_expires_at <= now
            ]
            for run in expired[:limit]:
                if run.recoveries + 1 > max_recoveries:
                    s.end(
                        run,
                        RunStatus.DEAD,
                        recoveries=run.recoveries + 1,
                        error=dead_letter_error(run, max_recoveries),
                    )
                    dead.append(run.run_id)
                else:
                    s.enqueue(run, now, recoveries=run.recoveries + 1)
                    s.note(run_key(run.run_id))
                    requeued.append(run.run_id)
        s.flush()
        return RecoveryReport(requeued=tuple(requeued), dead=tuple(dead))

    async def heartbeat(self, info: WorkerInfo) -> None:
        with self._s.lock:
            self._s.workers[info.worker_id] = replace(info, last_seen=self._clock())

    async def remove_worker(self, worker_id: str) -> None:
        with self._s.lock:
            self._s.workers.pop(worker_id, None)

    async def list_workers(self) -> list[WorkerInfo]:
        with self._s.lock:
            return sorted(self._s.workers.values(), key=lambda w: w.last_seen, reverse=True)
