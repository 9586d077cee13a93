"""ValkeyStore's schedules (one namespace-wide slot) and worker heartbeats.

Every create, update and delete adds an entry to the stream ``...{ns:sched}:chg`` (kept
to one entry): its last id is the schedules' change marker. A schedule loop blocks on it
with ``XREAD BLOCK`` (every blocked reader wakes on one entry), so a schedule created or
resumed by another process is seen at once, at the cost of one command per
``block_slice`` while idle.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pyrula.workflows.records import (
    DEFAULT_LOCK_TTL,
    NewRun,
    RunRecord,
    ScheduleRecord,
    WorkerInfo,
)
from pyrula.workflows.stores.valkey.clients import drop_reply
from pyrula.workflows.stores.valkey.codec import num, schedule_fields, text, to_schedule
from pyrula.workflows.stores.valkey.core import ValkeyCore, monotonic

NO_CHANGE = "0-0"
"""The marker while the change stream is empty (below every entry id)."""


class ScheduleOps(ValkeyCore):
    """Schedules, fired with a compare-and-set on their next slot; heartbeats."""

    block_slice: float

    async def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        raise NotImplementedError  # RunOps

    async def create_schedule(
        self, schedule: ScheduleRecord, *, replace: bool = False
    ) -> ScheduleRecord:
        await self._ensure_open()
        reply = await self._server.call(
            "sched_create",
            self._keys.sched,
            schedule.schedule_id,
            "1" if replace else "0",
            "1" if schedule.enabled else "0",
            num(schedule.next_fire_at),
            "0" if schedule.last_fire_at is None else "1",
            "" if schedule.last_fire_at is None else num(schedule.last_fire_at),
            schedule.last_run_id or "",
            *schedule_fields(schedule),
        )
        return to_schedule(reply)

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        await self._ensure_open()
        flat = await self._server.command("HGETALL", self._keys.schedule(schedule_id))
        if not flat:
            return None
        if isinstance(flat, dict):
            flat = [x for pair in flat.items() for x in pair]
        return to_schedule(flat)

    async def list_schedules(self, *, workflow: str | None = None) -> list[ScheduleRecord]:
        await self._ensure_open()
        records = [to_schedule(f) for f in await self._server.call("sched_list", self._keys.sched)]
        return [r for r in records if workflow is None or r.workflow == workflow]

    async def update_schedule(
        self,
        schedule_id: str,
        *,
        enabled: bool | None = None,
        params: str | None = None,
        next_fire_at: float | None = None,
    ) -> ScheduleRecord:
        await self._ensure_open()
        reply = await self._server.call(
            "sched_update",
            self._keys.sched,
            schedule_id,
            "" if enabled is None else ("1" if enabled else "0"),
            "0" if params is None else "1",
            params or "",
            "" if next_fire_at is None else num(next_fire_at),
        )
        return to_schedule(reply)

    async def delete_schedule(self, schedule_id: str) -> bool:
        await self._ensure_open()
        return bool(await self._server.call("sched_delete", self._keys.sched, schedule_id))

    async def due_schedules(self, limit: int) -> list[ScheduleRecord]:
        if limit <= 0:
            return []
        await self._ensure_open()
        flat = await self._server.call("sched_due", self._keys.sched, str(limit))
        return [to_schedule(f) for f in flat]

    async def next_schedule_at(self) -> float | None:
        await self._ensure_open()
        first = await self._server.command(
            "ZRANGE", self._keys.schedules_by_time, 0, 0, "WITHSCORES"
        )
        if not first:
            return None
        item = first[0]
        return float(item[1]) if isinstance(item, (list, tuple)) else float(text(first[1]))

    async def wait_schedule_change(self, seen: str | None, timeout: float) -> str:
        if self._notifier.closed and seen is not None:
            return seen
        await self._ensure_open()
        key = self._keys.sched + "chg"
        if seen is None or timeout <= 0:
            last = await self._server.command("XREVRANGE", key, "+", "-", "COUNT", 1)
            return text(last[0][0]) if last else NO_CHANGE
        closed = self._notifier.register("close")
        deadline = monotonic() + timeout
        try:
            while not closed.done():
                block = min(deadline - monotonic(), self.block_slice)
                if block <= 0:
                    break
                command = ("XREAD", "COUNT", 1, "BLOCK", max(1, round(block * 1000)))
                read = asyncio.ensure_future(
                    self._server.command(*command, "STREAMS", key, seen, block=block)
                )
                try:
                    await asyncio.wait([read, closed], return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:
                    # The reader stays blocked until its own timeout: cancelling it would
                    # close its connection. Its reply is dropped.
                    read.add_done_callback(drop_reply)
                    raise
                if not read.done():
                    read.add_done_callback(drop_reply)  # closing: the connection goes with it
                    break
                marker = _last_id(read.result())
                if marker is not None:
                    return marker
        finally:
            self._notifier.unregister("close", closed)
        return seen

    async def fire_schedule(
        self,
        schedule_id: str,
        expected_next: float,
        fired_slot: float,
        next_fire_at: float,
        run: NewRun | None,
    ) -> RunRecord | None:
        """Create the slot's run, then compare-and-set the schedule's next slot, recording
        the run as ``last_run_id``. The two live in different slots, so they are two calls,
        in this order: a process dying between them leaves the run created and the
        schedule due, and the next look fires the same slot again, which finds the same
        run by its idempotency key (schedule and slot) and moves the schedule. (Moving
        first lost the slot's run to such a death.) A racing worker firing the same slot
        finds the same run. The schedule is read first, so a fire that is already stale
        (another worker fired the slot, the schedule was paused, changed or deleted)
        creates nothing; one that goes stale between that read and the compare-and-set
        leaves the run of a slot that was due when it was read. ``run=None`` skips the
        slot: ``next_fire_at`` only."""
        await self._ensure_open()
        if run is None:
            await self._sched_fire(schedule_id, expected_next, fired_slot, next_fire_at, "")
            return None
        current = await self.get_schedule(schedule_id)
        if current is None or not current.enabled or current.next_fire_at != expected_next:
            return None
        record, _ = await self.create_run(run)
        moved = await self._sched_fire(
            schedule_id, expected_next, fired_slot, next_fire_at, record.run_id
        )
        return record if moved else None

    async def _sched_fire(
        self, schedule_id: str, expected: float, slot: float, following: float, run_id: str
    ) -> bool:
        moved = await self._server.call(
            "sched_fire", self._keys.sched, schedule_id, num(expected), num(slot), num(following),
            run_id,
        )  # fmt: skip
        return bool(int(moved))

    # -- workers -----------------------------------------------------------------------
    async def heartbeat(self, info: WorkerInfo) -> None:
        await self._ensure_open()
        body = json.dumps(
            {
                "workflows": list(info.workflows),
                "hostname": info.hostname,
                "pid": info.pid,
                "started_at": info.started_at,
                "running": info.running,
                "lock_ttl": info.lock_ttl,
            },
            ensure_ascii=False,
        )
        await self._server.call(
            "heartbeat", self._keys.workers, self._keys.workers_seq, info.worker_id, body
        )

    async def remove_worker(self, worker_id: str) -> None:
        await self._ensure_open()
        await self._server.command("HDEL", self._keys.workers, worker_id)

    async def list_workers(self) -> list[WorkerInfo]:
        await self._ensure_open()
        flat = await self._server.command("HGETALL", self._keys.workers)
        items = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=False)
        found: list[tuple[float, int, WorkerInfo]] = []
        for worker_id, stored in items:
            last_seen, seq, body = text(stored).split("|", 2)
            data = json.loads(body)
            info = WorkerInfo(
                worker_id=text(worker_id),
                workflows=tuple(data["workflows"]),
                hostname=data["hostname"],
                pid=data["pid"],
                started_at=data["started_at"],
                last_seen=float(last_seen),
                running=data["running"],
                lock_ttl=float(data.get("lock_ttl", DEFAULT_LOCK_TTL)),  # older builds': none
            )
            found.append((-info.last_seen, int(seq), info))
        found.sort(key=lambda item: (item[0], item[1]))
        return [info for _, _, info in found]


def _last_id(reply: Any) -> str | None:
    """The id of the last entry in an ``XREAD`` reply of one stream, or None (timed out):
    ``[[key, [[id, fields], ...]]]``, or ``{key: [...]}`` from a RESP3 client."""
    if not reply:
        return None
    entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
    return text(entries[-1][0]) if entries else None
