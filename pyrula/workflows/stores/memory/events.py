"""MemoryStore's batch-trigger buffers and named cursors."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence

from pyrula.workflows.records import TriggerEvent
from pyrula.workflows.stores.memory.state import MemoryState


class MemoryEvents:
    """Trigger buffers and cursors kept in :class:`MemoryState`; mixed into MemoryStore."""

    _s: MemoryState
    _clock: Callable[[], float]

    # -- batch triggers ----------------------------------------------------------------
    async def append_events(self, trigger: str, payloads: Sequence[str]) -> list[int]:
        s = self._s
        with s.lock:
            if not payloads:
                return []
            now = self._clock()
            first = s.trigger_seqs.get(trigger, 0) + 1
            seqs = list(range(first, first + len(payloads)))
            s.trigger_seqs[trigger] = seqs[-1]  # kept when the events are consumed
            buffer = s.trigger_events.setdefault(trigger, deque())
            buffer.extend(
                TriggerEvent(seq=seq, payload=payload, created_at=now)
                for seq, payload in zip(seqs, payloads, strict=True)
            )
            return seqs

    async def read_events(self, trigger: str, limit: int) -> list[TriggerEvent]:
        with self._s.lock:
            buffer = self._s.trigger_events.get(trigger, ())
            return list(itertools.islice(buffer, max(0, limit)))

    async def consume_events(self, trigger: str, first_seq: int, count: int) -> bool:
        s = self._s
        with s.lock:
            buffer = s.trigger_events.get(trigger)
            if count <= 0 or not buffer or buffer[0].seq != first_seq or len(buffer) < count:
                return False
            for _ in range(count):
                buffer.popleft()
            if not buffer:
                del s.trigger_events[trigger]
            return True

    # -- cursors -----------------------------------------------------------------------
    async def get_cursor(self, name: str) -> str | None:
        with self._s.lock:
            return self._s.cursors.get(name)

    async def swap_cursor(self, name: str, expected: str | None, value: str) -> bool:
        s = self._s
        with s.lock:
            if s.cursors.get(name) != expected:
                return False
            s.cursors[name] = value
            return True
