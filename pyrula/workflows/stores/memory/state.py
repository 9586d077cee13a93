"""MemoryStore's state and the transitions every operation shares. One lock guards all."""

from __future__ import annotations

import heapq
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pyrula.workflows.errors import InvalidRunState, LeaseLost, NondeterminismError, RunNotFound
from pyrula.workflows.records import (
    JournalEntry,
    NewRun,
    RunRecord,
    RunStatus,
    ScheduleRecord,
    TriggerEvent,
    WorkerInfo,
)
from pyrula.workflows.stores.flow import Bucket
from pyrula.workflows.stores.notify import Notifier, run_key, work_key
from pyrula.workflows.stores.rules import idempotency_conflict, idempotency_matches, same_entry


@dataclass
class MemoryState:
    """Everything a MemoryStore holds. Every method expects ``lock`` to be held."""

    clock: Callable[[], float]
    url: str = "memory://"
    lock: threading.RLock = field(default_factory=threading.RLock)
    notifier: Notifier = field(default_factory=Notifier)
    runs: dict[str, RunRecord] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)
    """Submission sequence of each run (FIFO tie-break, newest-first listing)."""
    stamps: dict[str, int] = field(default_factory=dict)
    """The workflow's claim counter when the run last became queued (fairness)."""
    seq: int = 0
    keys: dict[str, str] = field(default_factory=dict)
    journals: dict[str, dict[int, JournalEntry]] = field(default_factory=dict)
    signals: dict[str, dict[str, deque[str]]] = field(default_factory=dict)
    children: dict[str, set[str]] = field(default_factory=dict)
    served: dict[tuple[str, str], int] = field(default_factory=dict)
    """(workflow, owner) -> the claim counter value of the owner's last claim."""
    claim_counter: dict[str, int] = field(default_factory=dict)
    buckets: dict[str, Bucket] = field(default_factory=dict)
    schedules: dict[str, ScheduleRecord] = field(default_factory=dict)
    schedule_changes: int = 0
    """Moved by every schedule create, update and delete: the change marker."""
    workers: dict[str, WorkerInfo] = field(default_factory=dict)
    trigger_events: dict[str, deque[TriggerEvent]] = field(default_factory=dict)
    """Each batch trigger's buffer (events not consumed yet), oldest first."""
    trigger_seqs: dict[str, int] = field(default_factory=dict)
    """The last seq each trigger gave out; kept after its events are consumed."""
    cursors: dict[str, str] = field(default_factory=dict)
    """Named cursors (swap_cursor), by name."""
    token: int = 0
    pending_notes: list[str] = field(default_factory=list)

    # -- lookups -----------------------------------------------------------------------
    def require(self, run_id: str) -> RunRecord:
        run = self.runs.get(run_id)
        if run is None:
            raise RunNotFound(f"no run with id {run_id!r} in {self.url}")
        return run

    def fenced(self, run_id: str, token: int) -> RunRecord:
        run = self.require(run_id)
        if run.status is not RunStatus.RUNNING or run.lease_token != token:
            raise LeaseLost(
                f"run {run_id!r} is no longer held with token {token} "
                f"(status {run.status.value}, token {run.lease_token})"
            )
        return run

    def require_live(self, run_id: str) -> RunRecord:
        run = self.require(run_id)
        if run.is_terminal:
            raise InvalidRunState(f"run {run_id!r} already ended as {run.status.value}")
        return run

    def ended_after(self, after: tuple[float, str] | None, limit: int) -> list[RunRecord]:
        """Store.ended_runs: terminal runs past ``after`` by ``(finished_at, run_id)``."""
        ended = (
            (run.finished_at, run.run_id, run)
            for run in self.runs.values()
            if run.is_terminal
            and run.finished_at is not None
            and (after is None or (run.finished_at, run.run_id) > after)
        )
        return [run for *_, run in heapq.nsmallest(max(0, limit), ended, key=lambda e: e[:2])]

    def next_token(self) -> int:
        self.token += 1
        return self.token

    # -- transitions -------------------------------------------------------------------
    def create(self, new: NewRun) -> tuple[RunRecord, bool]:
        """Create the run, or return the one its idempotency key (or, for a child, its id)
        already names; True if created."""
        if new.idempotency_key is not None and new.idempotency_key in self.keys:
            existing = self.runs[self.keys[new.idempotency_key]]
            if not idempotency_matches(existing, new):
                raise idempotency_conflict(new.idempotency_key, existing, new)
            return existing, False
        if new.run_id in self.runs:
            existing = self.runs[new.run_id]
            if new.parent_run_id is not None and existing.parent_run_id == new.parent_run_id:
                return existing, False
            raise InvalidRunState(f"a run with id {new.run_id!r} already exists")
        now = self.clock()
        record = RunRecord(
            run_id=new.run_id,
            workflow=new.workflow,
            params=new.params,
            status=RunStatus.QUEUED,
            owner=new.owner,
            idempotency_key=new.idempotency_key,
            created_at=now,
            available_at=new.start_at if new.start_at is not None else now + new.delay,
            updated_at=now,
            parent_run_id=new.parent_run_id,
            flow=new.flow,
            expires_at=new.expires_at,
        )
        self.seq += 1
        self.order[new.run_id] = self.seq
        self.journals[new.run_id] = {}
        if new.idempotency_key is not None:
            self.keys[new.idempotency_key] = new.run_id
        if new.parent_run_id is not None:
            self.children.setdefault(new.parent_run_id, set()).add(new.run_id)
        self.enqueue(record, record.available_at)
        return self.runs[new.run_id], True

    def append(self, token: int, entry: JournalEntry) -> bool:
        """Write ``entry`` unless an identical one is there; True if it was written."""
        journal = self.journals[entry.run_id]
        existing = journal.get(entry.position)
        if existing is not None:
            if same_entry(existing, entry):
                return False
            raise NondeterminismError(
                f"run {entry.run_id!r} already recorded {existing.kind} {existing.name!r} "
                f"at position {entry.position}, not {entry.kind} {entry.name!r}"
            )
        journal[entry.position] = replace(entry, token=token, recorded_at=self.clock())
        return True

    def save(self, run: RunRecord) -> RunRecord:
        self.runs[run.run_id] = run
        return run

    def enqueue(self, run: RunRecord, available_at: float, **changes: object) -> RunRecord:
        """Make the run queued (claimable from ``available_at``) and stamp its turn."""
        now = self.clock()
        run = replace(
            run,
            status=RunStatus.QUEUED,
            available_at=available_at,
            updated_at=now,
            lease_expires_at=None,
            wake_at=None,
            wait_signal=None,
            wait_child=None,
            **changes,  # type: ignore[arg-type]
        )
        self.stamps[run.run_id] = self.claim_counter.get(run.workflow, 0)
        self.note(work_key(run.workflow))
        return self.save(run)

    def end(self, run: RunRecord, status: RunStatus, **changes: object) -> RunRecord:
        """Make the run terminal; wake its waiters, a parent waiting for it, and
        claimers when it frees a slot of its owner's concurrency cap."""
        now = self.clock()
        if run.status is RunStatus.RUNNING and run.flow.owner_concurrency is not None:
            self.note(work_key(run.workflow))
        run = replace(
            run,
            status=status,
            finished_at=now,
            updated_at=now,
            lease_expires_at=None,
            wake_at=None,
            wait_signal=None,
            wait_child=None,
            **changes,  # type: ignore[arg-type]
        )
        self.save(run)
        self.note(run_key(run.run_id))
        parent = self.runs.get(run.parent_run_id) if run.parent_run_id else None
        waiting = parent is not None and parent.status is RunStatus.WAITING
        if waiting and parent is not None and parent.wait_child == run.run_id:
            self.enqueue(parent, now)
        return run

    def live_children(self, run_id: str) -> list[RunRecord]:
        """Non-terminal descendants, depth first."""
        out: list[RunRecord] = []
        for child_id in sorted(self.children.get(run_id, ())):
            child = self.runs[child_id]
            if not child.is_terminal:
                out.append(child)
            out.extend(self.live_children(child_id))
        return out

    def note(self, *keys: str) -> None:
        """Queue wake-ups, sent by :meth:`flush` once the lock is released."""
        self.pending_notes.extend(keys)

    def flush(self) -> None:
        with self.lock:
            keys, self.pending_notes = self.pending_notes, []
        if keys:
            self.notifier.notify(*keys)
