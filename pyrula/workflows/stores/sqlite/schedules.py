"""SqliteStore's schedule operations (a mixin; each write is one transaction).

Every create, update and delete also moves the change marker (``schedule_changes`` in
``meta``) and notifies this process's waiters; a waiter sees other processes' changes
through ``PRAGMA data_version`` (read every ``CHANGE_POLL``), as ``wait_for_work`` sees
their runs.
"""

from __future__ import annotations

import sqlite3
import time
from typing import TypeVar

from pyrula.workflows.errors import ScheduleExists, ScheduleNotFound
from pyrula.workflows.records import NewRun, RunRecord, ScheduleRecord
from pyrula.workflows.stores.notify import SCHEDULES_KEY
from pyrula.workflows.stores.sqlite.db import Database, remaining
from pyrula.workflows.stores.sqlite.sql import many, one, scalar, to_schedule
from pyrula.workflows.stores.sqlite.tx import Tx

T = TypeVar("T")

CHANGE_POLL = 0.25
"""Seconds between two ``PRAGMA data_version`` reads of a schedule wait: a schedule
another process changed is seen within this (a change in this process, at once). Not
``wait_for_work``'s 5 - 50 ms: that costs an idle worker ~6 ms of CPU a second more, and
a first slot is rarely that close to the change that made it."""


class SqliteSchedules:
    """Schedules in the ``schedules`` table; mixed into SqliteStore."""

    url: str
    _db: Database

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
                overlap=schedule.overlap,
                last_run_id=existing.last_run_id if existing else schedule.last_run_id,
            )
            assert stored is not None
            _changed(t)
            return to_schedule(stored)

        return await self._db.transact(tx)

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
            _changed(t)
            return to_schedule(row)

        return await self._db.transact(tx)

    async def delete_schedule(self, schedule_id: str) -> bool:
        def tx(t: Tx) -> bool:
            if t.run("delete_schedule", schedule_id=schedule_id) == 0:
                return False
            _changed(t)
            return True

        return await self._db.transact(tx)

    async def due_schedules(self, limit: int) -> list[ScheduleRecord]:
        rows = await self._db.call(
            lambda conn: many(conn, "due_schedules", now=self._db.clock(), limit=max(limit, 0))
        )
        return [to_schedule(row) for row in rows]

    async def next_schedule_at(self) -> float | None:
        when: float | None = await self._db.call(lambda conn: scalar(conn, "next_schedule_at"))
        return when

    async def wait_schedule_change(self, seen: str | None, timeout: float) -> str:
        deadline = time.monotonic() + max(0.0, timeout)

        def read(conn: sqlite3.Connection) -> tuple[int, str]:
            marker = scalar(conn, "meta_get", key="schedule_changes")
            return self._db.data_version(conn), "0" if marker is None else str(marker)

        while True:
            fut = self._db.notifier.register(SCHEDULES_KEY)  # before the read
            try:
                version, current = await self._db.call(read)
                if seen is None or current != seen or remaining(deadline) == 0.0:
                    return current
                while await self._db.nap([fut], deadline, CHANGE_POLL):
                    if version != await self._db.poll_version():
                        break  # another process committed: read the marker again
                if self._db.closed:
                    return current
            finally:
                self._db.notifier.unregister(SCHEDULES_KEY, fut)

    async def fire_schedule(
        self,
        schedule_id: str,
        expected_next: float,
        fired_slot: float,
        next_fire_at: float,
        run: NewRun | None,
    ) -> RunRecord | None:
        def tx(t: Tx) -> RunRecord | None:
            if run is None:  # skip the slot: the compare-and-set moves next_fire_at only
                t.one(
                    "skip_schedule_slot",
                    schedule_id=schedule_id,
                    expected_next=expected_next,
                    next_fire_at=next_fire_at,
                    now=t.now,
                )
                return None
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
            t.run("set_schedule_last_run", schedule_id=schedule_id, run_id=created.run_id)
            return created

        return await self._db.transact(tx)


def _changed(t: Tx) -> None:
    """Move the change marker and wake this process's schedule loops after the commit."""
    t.run("bump_schedule_changes")
    t.note(SCHEDULES_KEY)
