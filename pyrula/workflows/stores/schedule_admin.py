"""The blocking schedule API every store offers: ``store.schedule_create(...)`` and friends.

Seed usage is synchronous (``store.schedule_create(Schedule.create(...))`` at deploy time or
in a script), while the store's core is async. This mixin runs the async operations to
completion: directly on a fresh event loop when the calling thread has none running,
else on a short-lived helper thread (so it also works inside async code, blocking it
briefly, as any admin call would).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from pyrula.workflows.records import ScheduleRecord

T = TypeVar("T")


def run_blocking(factory: Callable[[], Awaitable[T]]) -> T:
    """Run the coroutine ``factory()`` makes to completion and return its result."""

    async def main() -> T:
        return await factory()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:  # handed back to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="pyrula-admin")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


class _ScheduleCore(Protocol):
    async def now(self) -> float: ...

    async def create_schedule(
        self, schedule: ScheduleRecord, *, replace: bool = False
    ) -> ScheduleRecord: ...

    async def list_schedules(self, *, workflow: str | None = None) -> list[ScheduleRecord]: ...

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None: ...

    async def update_schedule(
        self,
        schedule_id: str,
        *,
        enabled: bool | None = None,
        params: str | None = None,
        next_fire_at: float | None = None,
    ) -> ScheduleRecord: ...

    async def delete_schedule(self, schedule_id: str) -> bool: ...


class ScheduleAdmin:
    """Blocking schedule management; mixed into every store."""

    def schedule_create(
        self: _ScheduleCore, schedule: Any, *, replace: bool = False
    ) -> ScheduleRecord:
        """Store a :class:`~pyrula.workflows.schedules.Schedule`; its first slot is the
        first one after the store's now. ``replace=True`` overwrites one with that id."""

        async def create() -> ScheduleRecord:
            return await self.create_schedule(schedule.to_record(await self.now()), replace=replace)

        return run_blocking(create)

    def schedule_list(self: _ScheduleCore, *, workflow: str | None = None) -> list[ScheduleRecord]:
        return run_blocking(lambda: self.list_schedules(workflow=workflow))

    def schedule_get(self: _ScheduleCore, schedule_id: str) -> ScheduleRecord | None:
        return run_blocking(lambda: self.get_schedule(schedule_id))

    def schedule_update(
        self: _ScheduleCore, schedule_id: str, *, enabled: bool | None = None, params: Any = None
    ) -> ScheduleRecord:
        """Pause (``enabled=False``), resume (``enabled=True``) or change params."""
        from pyrula.workflows.serialization import encode

        text = None if params is None else encode(dict(params), what="schedule params")

        async def update() -> ScheduleRecord:
            current = await self.get_schedule(schedule_id)
            next_fire_at = None
            if enabled and current is not None and not current.enabled:
                # Resuming: no backfill of the paused time; fire from the next slot.
                from pyrula.workflows.schedules import Schedule

                next_fire_at = Schedule.from_record(current).next_slot_after(await self.now())
            return await self.update_schedule(
                schedule_id, enabled=enabled, params=text, next_fire_at=next_fire_at
            )

        return run_blocking(update)

    def schedule_delete(self: _ScheduleCore, schedule_id: str) -> bool:
        return run_blocking(lambda: self.delete_schedule(schedule_id))
