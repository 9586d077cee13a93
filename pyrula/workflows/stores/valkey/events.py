"""ValkeyStore's batch-trigger buffers and named cursors.

Each trigger and each cursor has a hash tag of its own (:meth:`.keys.Keys.trigger`,
:meth:`.keys.Keys.cursor`), so every call is single-slot, on one node or a cluster.
Appending, consuming and swapping are functions of lua/events.lua (which describes the
buffer's layout); reading a buffer or a cursor is one plain command.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyrula.workflows.errors import StoreError
from pyrula.workflows.records import TriggerEvent
from pyrula.workflows.stores.valkey.codec import text
from pyrula.workflows.stores.valkey.core import ValkeyCore


class EventOps(ValkeyCore):
    """append_events, read_events, consume_events, get_cursor, swap_cursor."""

    async def append_events(self, trigger: str, payloads: Sequence[str]) -> list[int]:
        if not payloads:
            return []
        await self._ensure_open()
        first = int(
            await self._server.call("events_append", self._keys.trigger(trigger), *payloads)
        )
        return list(range(first, first + len(payloads)))

    async def read_events(self, trigger: str, limit: int) -> list[TriggerEvent]:
        if limit <= 0:
            return []
        await self._ensure_open()
        key = self._keys.trigger_events(trigger)
        entries = await self._server.command("LRANGE", key, 0, limit - 1)
        return [self._event(key, entry) for entry in entries]

    def _event(self, key: str, entry: Any) -> TriggerEvent:
        """An entry of a buffer, ``"seq|created_at|payload"`` (lua/events.lua)."""
        try:
            seq, created_at, payload = text(entry).split("|", 2)
            return TriggerEvent(seq=int(seq), payload=payload, created_at=float(created_at))
        except ValueError:
            raise StoreError(
                f"malformed event in {key!r} at {self._server.masked}: {text(entry)[:80]!r} "
                "(written by something other than pyrula?)"
            ) from None

    async def consume_events(self, trigger: str, first_seq: int, count: int) -> bool:
        if count <= 0:
            return False
        await self._ensure_open()
        reply = await self._server.call(
            "events_consume", self._keys.trigger(trigger), str(first_seq), str(count)
        )
        return bool(int(reply))

    async def get_cursor(self, name: str) -> str | None:
        await self._ensure_open()
        value = await self._server.command("GET", self._keys.cursor(name))
        return None if value is None else text(value)

    async def swap_cursor(self, name: str, expected: str | None, value: str) -> bool:
        await self._ensure_open()
        reply = await self._server.call(
            "cursor_swap",
            self._keys.cursor(name),
            "0" if expected is None else "1",
            expected or "",
            value,
        )
        return bool(int(reply))
