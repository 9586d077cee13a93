"""MemoryStore's schedule operations."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from pyrula.workflows.errors import ScheduleExists, ScheduleNotFound
from pyrula.workflows.records import NewRun, RunRecord, ScheduleRecord
from pyrula.workflows.stores.memory.state import MemoryState
from pyrula.workflows.stores.notify import SCHEDULES_KEY


class MemorySchedules:
    """Schedules kept in :class:`MemoryState`; mixed into MemoryStore."""

    _s: MemoryState
    _clock: Callable[[], float]

    async def create_schedule(
        self, schedule: ScheduleRecord, *, replace: bool = False
    ) -> ScheduleRecord:
        s = self._s
        with s.lock:
            now = self._clock()
            existing = s.schedules.get(schedule.schedule_id)
            if existing is not None and not replace:
                raise ScheduleExists(
                    f"schedule {schedule.schedule_id!r} exists already; delete it first or "
                    "create it with replace=True"
                )
            record = dataclasses.replace(
                schedule,
                created_at=existing.created_at if existing else now,
                updated_at=now,
                last_fire_at=existing.last_fire_at if existing else schedule.last_fire_at,
                last_run_id=existing.last_run_id if existing else schedule.last_run_id,
            )
            s.schedules[schedule.schedule_id] = record
            s.schedule_changes += 1
            s.note(SCHEDULES_KEY)
        s.flush()
        return record

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        with self._s.lock:
            return self._s.schedules.get(schedule_id)

    async def list_schedules(self, *, workflow: str | None = None) -> list[ScheduleRecord]:
        with self._s.lock:
            return [
                self._s.schedules[key]
                for key in sorted(self._s.schedules)
                if workflow is None or self._s.schedules[key].workflow == workflow
            ]

    async def update_schedule(
        self,
        schedule_id: str,
        *,
        enabled: bool | None = None,
        params: str | None = None,
        next_fire_at: float | None = None,
    ) -> ScheduleRecord:
        s = self._s
        with s.lock:
            record = s.schedules.get(schedule_id)
            if record is None:
                raise ScheduleNotFound(f"no schedule with id {schedule_id!r} in {s.url}")
            record = dataclasses.replace(
                record,
                enabled=record.enabled if enabled is None else enabled,
                params=record.params if params is None else params,
                next_fire_at=record.next_fire_at if next_fire_at is None else next_fire_at,
                updated_at=self._clock(),
            )
            s.schedules[schedule_id] = record
            s.schedule_changes += 1
            s.note(SCHEDULES_KEY)
        s.flush()
        return record

    async def delete_schedule(self, schedule_id: str) -> bool:
        s = self._s
        with s.lock:
            deleted = s.schedules.pop(schedule_id, None) is not None
            if deleted:
                s.schedule_changes += 1
                s.note(SCHEDULES_KEY)
        s.flush()
        return deleted

    async def due_schedules(self, limit: int) -> list[ScheduleRecord]:
        with self._s.lock:
            now = self._clock()
            due = [r for r in self._s.schedules.values() if r.enabled and r.next_fire_at <= now]
            due.sort(key=lambda r: (r.next_fire_at, r.schedule_id))
            return due[:limit]

    async def next_schedule_at(self) -> float | None:
        with self._s.lock:
            return min(
                (r.next_fire_at for r in self._s.schedules.values() if r.enabled), default=None
            )

    async def wait_schedule_change(self, seen: str | None, timeout: float) -> str:
        s = self._s
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            fut = s.notifier.register(SCHEDULES_KEY)  # before the read: no change is missed
            with s.lock:
                current = str(s.schedule_changes)
            remaining = deadline - asyncio.get_running_loop().time()
            if seen is None or current != seen or remaining <= 0 or s.notifier.closed:
                s.notifier.unregister(SCHEDULES_KEY, fut)
                return current
            await s.notifier.wait(fut, SCHEDULES_KEY, remaining)

    async def fire_schedule(
        self,
        schedule_id: str,
        expected_next: float,
        fired_slot: float,
        next_fire_at: float,
        run: NewRun | None,
    ) -> RunRecord | None:
        s = self._s
        with s.lock:
            record = s.schedules.get(schedule_id)
            if record is None or not record.enabled or record.next_fire_at != expected_next:
                return None
            if run is None:  # skip the slot: only next_fire_at moves
                s.schedules[schedule_id] = dataclasses.replace(
                    record, next_fire_at=next_fire_at, updated_at=self._clock()
                )
                created = None
            else:
                created, _ = s.create(run)
                s.schedules[schedule_id] = dataclasses.replace(
                    record,
                    last_fire_at=fired_slot,
                    next_fire_at=next_fire_at,
                    last_run_id=created.run_id,
                    updated_at=self._clock(),
                )
        s.flush()
        return created
