"""MemoryStore's durable waits: suspending a run, timers, signals and child runs."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace

from pyrula.workflows.records import JournalEntry, NewRun, RunRecord, RunStatus, Wait
from pyrula.workflows.stores.memory.state import MemoryState
from pyrula.workflows.stores.notify import run_key, work_key
from pyrula.workflows.stores.rules import same_entry


class MemoryWaits:
    """Waits kept in :class:`MemoryState`; mixed into MemoryStore."""

    _s: MemoryState
    _clock: Callable[[], float]

    async def suspend_run(self, run_id: str, token: int, wait: Wait) -> bool:
        s = self._s
        with s.lock:
            run = s.fenced(run_id, token)
            now = self._clock()
            if wait.signal is not None and s.signals.get(run_id, {}).get(wait.signal):
                return False
            if wait.child is not None and s.require(wait.child).is_terminal:
                return False
            if wait.wake_at is not None and wait.wake_at <= now:
                return False
            status = (
                RunStatus.SLEEPING
                if wait.signal is None and wait.child is None
                else (RunStatus.WAITING)
            )
            s.save(
                replace(
                    run,
                    status=status,
                    wake_at=wait.wake_at,
                    wait_signal=wait.signal,
                    wait_child=wait.child,
                    lease_expires_at=None,
                    updated_at=now,
                )
            )
            s.note(run_key(run_id))
            if run.flow.owner_concurrency is not None:  # a slot of its owner is free again
                s.note(work_key(run.workflow))
        s.flush()
        return True

    async def fire_timers(self, limit: int) -> int:
        s = self._s
        with s.lock:
            now = self._clock()
            due = sorted(
                (
                    run
                    for run in s.runs.values()
                    if run.status in (RunStatus.SLEEPING, RunStatus.WAITING)
                    and run.wake_at is not None
                    and run.wake_at <= now
                ),
                key=lambda r: (r.wake_at, s.order[r.run_id]),
            )[:limit]
            for run in due:
                s.enqueue(run, now)
        s.flush()
        return len(due)

    # -- signals and children ----------------------------------------------------------
    async def send_signal(self, run_id: str, name: str, payload: str) -> None:
        s = self._s
        with s.lock:
            run = s.require_live(run_id)
            s.signals.setdefault(run_id, {}).setdefault(name, deque()).append(payload)
            if run.status is RunStatus.WAITING and run.wait_signal == name:
                s.enqueue(run, self._clock())
        s.flush()

    async def consume_signal(self, token: int, entry: JournalEntry) -> str | None:
        s = self._s
        with s.lock:
            s.fenced(entry.run_id, token)
            existing = s.journals[entry.run_id].get(entry.position)
            if existing is not None and existing.kind == entry.kind and existing.name == entry.name:
                return existing.value
            pending = s.signals.get(entry.run_id, {}).get(entry.name)
            if not pending:
                return None
            payload = pending[0]
            s.append(token, replace(entry, value=payload))
            pending.popleft()
            return payload

    async def start_child(self, token: int, entry: JournalEntry, child: NewRun) -> RunRecord:
        s = self._s
        with s.lock:
            s.fenced(entry.run_id, token)
            existing = s.journals[entry.run_id].get(entry.position)
            if existing is not None and not same_entry(existing, entry):
                s.append(token, entry)  # raises NondeterminismError
            record, _ = s.create(child)
            s.append(token, entry)
        s.flush()
        return record
