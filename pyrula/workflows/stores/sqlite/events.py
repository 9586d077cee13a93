"""SqliteStore's batch-trigger buffers and named cursors (a mixin; each write is one
transaction).

A trigger's events are rows of ``trigger_events`` keyed by (trigger, seq); its seqs come
from ``trigger_seqs``, whose counter outlives the events, so a seq is never given out
twice. Cursors are rows of ``cursors``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyrula.workflows.records import TriggerEvent
from pyrula.workflows.stores.sqlite.db import Database
from pyrula.workflows.stores.sqlite.sql import many, scalar
from pyrula.workflows.stores.sqlite.tx import Tx


class SqliteEvents:
    """Trigger buffers and cursors in their tables; mixed into SqliteStore."""

    _db: Database

    # -- batch triggers ----------------------------------------------------------------
    async def append_events(self, trigger: str, payloads: Sequence[str]) -> list[int]:
        if not payloads:
            return []
        texts = list(payloads)

        def tx(t: Tx) -> list[int]:
            last: int = t.scalar("take_trigger_seqs", trigger=trigger, count=len(texts))
            seqs = list(range(last - len(texts) + 1, last + 1))
            for seq, payload in zip(seqs, texts, strict=True):
                t.run(
                    "insert_trigger_event",
                    trigger=trigger,
                    seq=seq,
                    payload=payload,
                    created_at=t.now,
                )
            return seqs

        return await self._db.transact(tx)

    async def read_events(self, trigger: str, limit: int) -> list[TriggerEvent]:
        if limit <= 0:  # a negative LIMIT is none in SQLite
            return []
        rows = await self._db.call(
            lambda conn: many(conn, "read_trigger_events", trigger=trigger, limit=limit)
        )
        return [
            TriggerEvent(seq=row["seq"], payload=row["payload"], created_at=row["created_at"])
            for row in rows
        ]

    async def consume_events(self, trigger: str, first_seq: int, count: int) -> bool:
        if count <= 0:
            return False

        def tx(t: Tx) -> bool:
            batch = t.one("trigger_batch", trigger=trigger, count=count)
            if batch is None or batch["n"] < count or batch["first_seq"] != first_seq:
                return False
            t.run("delete_trigger_events", trigger=trigger, last_seq=batch["last_seq"])
            return True

        return await self._db.transact(tx)

    # -- cursors -----------------------------------------------------------------------
    async def get_cursor(self, name: str) -> str | None:
        value: str | None = await self._db.call(lambda conn: scalar(conn, "get_cursor", name=name))
        return value

    async def swap_cursor(self, name: str, expected: str | None, value: str) -> bool:
        def tx(t: Tx) -> bool:
            if expected is None:
                return t.run("create_cursor", name=name, value=value) == 1
            return t.run("swap_cursor", name=name, expected=expected, value=value) == 1

        return await self._db.transact(tx)
