"""SqliteStore's schedule operations (a mixin; each write is one transaction)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pyrula.workflows.errors import ScheduleExists, ScheduleNotFound
from pyrula.workflows.records import NewRun, RunRecord, ScheduleRecord
from pyrula.workflows.stores.notify import SCHEDULES_KEY
from pyrula.workflows.stores.sqlite.db import Database
from pyrula.workflows.stores.sqlite.sql import many, one, scalar, to_schedule
from pyrula.workflows.stores.sqlite.tx import Tx

T = TypeVar("T")


class SqliteSchedules:
    """Schedules in the ``schedules`` table; mixed into SqliteStore."""

    url: str
    _db: Database

    async def _write(self, fn: Callable[[Tx], T]) -> T:
        raise NotImplementedError  # provided by SqliteStore

    async def create_schedule(
        self, schedule: ScheduleRecord, *, replace: bool = False
    ) -> ScheduleRecord:
        def tx(t: Tx) -> ScheduleRecord:
            row = t.one("get_schedule", schedule_id=schedule.schedule_id)
            if row is not None and not replace:
                raise ScheduleExists(
                    f"schedule {schedule.schedule_id!r} exists already; delete it first or "
                    "create it with replace=True"
                )
            existing = None if row is None else to_schedule(row)
            stored = t.one(
                "put_schedule",
                schedule_id=schedule.schedule_id,
                workflow=schedule.workflow,
                params=schedule.params,
                cron=schedule.cron,
                every=schedule.every,
                timezone=schedule.timezone,
                enabled=schedule.enabled,
                next_fire_at=schedule.next_fire_at,
                last_fire_at=existing.last_fire_at if existing else schedule.last_fire_at,
                owner=schedule.owner,
                created_at=existing.created_at if existing else t.now,
                updated_at=t.now,
            )
            assert stored is not None
            t.note(SCHEDULES_KEY)
            return to_schedule(stored)

        return await self._write(tx)

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        row = await self._db.call(lambda conn: one(conn, "get_schedule", schedule_id=schedule_id))
        return None if row is None else to_schedule(row)

    async def list_schedules(self, *, workflow: str | None = None) -> list[ScheduleRecord]:
        rows = await self._db.call(lambda conn: many(conn, "list_schedules", workflow=workflow))
        return [to_schedule(row) for row in rows]

    async def update_schedule(
        self,
        schedule_id: str,
        *,
        enabled: bool | None = None,
        params: str | None = None,
        next_fire_at: float | None = None,
    ) -> ScheduleRecord:
        def tx(t: Tx) -> ScheduleRecord:
            row = t.one(
                "update_schedule",
                schedule_id=schedule_id,
                enabled=enabled,
                params=params,
                next_fire_at=next_fire_at,
                now=t.now,
            )
            if row is None:
                raise ScheduleNotFound(f"no schedule with id {schedule_id!r} in {self.url}")
            t.note(SCHEDULES_KEY)
            return to_schedule(row)

        return await self._write(tx)

    async def delete_schedule(self, schedule_id: str) -> bool:
        return await self._write(lambda t: t.run("delete_schedule", schedule_id=schedule_id) > 0)

    async def due_schedules(self, limit: int) -> list[ScheduleRecord]:
        rows = await self._db.call(
            lambda conn: many(conn, "due_schedules", now=self._db.clock(), limit=max(limit, 0))
        )
        return [to_schedule(row) for row in rows]

    async def next_schedule_at(self) -> float | None:
        when: float | None = await self._db.call(lambda conn: scalar(conn, "next_schedule_at"))
        return when

    async def fire_schedule(
        self,
        schedule_id: str,
        expected_next: float,
        fired_slot: float,
        next_fire_at: float,
        run: NewRun,
    ) -> RunRecord | None:
        def tx(t: Tx) -> RunRecord | None:
            won = t.one(
                "fire_schedule",
                schedule_id=schedule_id,
                expected_next=expected_next,
                fired_slot=fired_slot,
                next_fire_at=next_fire_at,
                now=t.now,
            )
            if won is None:
                return None
            created, _ = t.create(run)
            return created

        return await self._write(tx)
