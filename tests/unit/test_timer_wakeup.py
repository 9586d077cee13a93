"""The timer loop's wait: it returns at the due time, never before it, and not a rounded
millisecond after it (the last stretch yields to the event loop instead of sleeping)."""

from __future__ import annotations

import asyncio
from typing import Any

from pyrula.workflows import loops


class Waits:
    """What ``_until_due_or_changed`` uses of a worker: its two events and its wait."""

    def __init__(self) -> None:
        self.timers_changed = asyncio.Event()
        self.timers_hint = asyncio.Event()

    async def wait_stop_or(self, timeout: float, *events: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()


async def test_the_wait_ends_at_the_due_time_and_not_before() -> None:
    loop = asyncio.get_running_loop()
    worker: Any = Waits()
    for delay in (0.0004, 0.003, 0.02):
        deadline = loop.time() + delay
        why = await loops._until_due_or_changed(worker, deadline, loop.time(), 1.0)
        assert why is loops._Why.DUE
        assert loop.time() >= deadline


async def test_a_local_change_ends_the_wait_at_once() -> None:
    loop = asyncio.get_running_loop()
    worker: Any = Waits()
    loop.call_later(0.01, worker.timers_changed.set)
    why = await loops._until_due_or_changed(worker, loop.time() + 5, loop.time(), 1.0)
    assert why is loops._Why.CHANGED and not worker.timers_changed.is_set()
