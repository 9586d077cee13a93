"""Time limits on store calls, with one timer per event loop for all of them.

``asyncio.timeout`` schedules a timer for every call and cancels it after: about 4.6 µs of
CPU per call on a 2-core VM, half of the Python a store call costs around its round trip.
Here the calls in flight on a loop share one timer, armed for the earliest deadline among
them: a call enters the loop's table on entry and leaves it on exit (a dict insert and a
pop), and the timer, when it fires, expires the calls that are due and is armed again for
the next one. A steady stream of calls therefore costs about one timer per time limit.

The contract is ``asyncio.timeout``'s: when the time is up the call's task is cancelled,
and that cancellation leaves the ``async with`` block as ``TimeoutError``; a
cancellation from anywhere else passes through unchanged.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from types import TracebackType

SLACK = 0.001
"""A call due within this many seconds of a firing timer expires with it (the loop may
run a timer a hair before its time)."""


class _Table:
    """The calls in flight on one loop, and its timer."""

    __slots__ = ("armed_for", "calls", "loop", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls: dict[Deadline, None] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.armed_for = math.inf

    def add(self, call: Deadline) -> None:
        self.calls[call] = None
        if call.due < self.armed_for:
            self._arm(call.due)

    def _arm(self, when: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_at(when, self._fire)
        self.armed_for = when

    def _fire(self) -> None:
        self.timer, self.armed_for = None, math.inf
        limit = self.loop.time() + SLACK
        soonest = math.inf
        for call in list(self.calls):
            if call.due <= limit:
                del self.calls[call]
                call.expire()
            elif call.due < soonest:
                soonest = call.due
        if soonest < math.inf:
            self._arm(soonest)


_ATTRIBUTE = "_pyrula_deadlines"
_tables: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Table] = weakref.WeakKeyDictionary()
"""Tables of loops that take no attribute. Elsewhere a loop holds its own table: the table
holds the loop (its timer does too), so in a weak dictionary keyed by the loop neither
would ever be freed; as an attribute they are a plain cycle the collector frees."""


def _table_of(loop: asyncio.AbstractEventLoop) -> _Table:
    table: _Table | None = getattr(loop, _ATTRIBUTE, None)
    if table is None:
        table = _tables.get(loop)
        if table is None:
            table = _Table(loop)
            try:
                setattr(loop, _ATTRIBUTE, table)
            except AttributeError:  # a loop with no __dict__
                _tables[loop] = table
    return table


class Deadline:
    """``async with deadline(seconds):`` (see the module docstring)."""

    __slots__ = ("_cancelling", "_table", "_task", "delay", "due", "expired")

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.due = math.inf
        self.expired = False

    async def __aenter__(self) -> Deadline:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("deadline() must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling() if hasattr(task, "cancelling") else 0
        table = self._table = _table_of(loop)
        self.due = loop.time() + self.delay
        table.add(self)
        return self

    def expire(self) -> None:
        self.expired = True
        self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._table.calls.pop(self, None)
        if not self.expired:
            return
        uncancel = getattr(self._task, "uncancel", None)  # Python 3.11+
        outside = uncancel() > self._cancelling if uncancel is not None else False
        if exc_type is not None and issubclass(exc_type, asyncio.CancelledError) and not outside:
            raise TimeoutError from exc


def deadline(delay: float) -> Deadline:
    """A time limit of ``delay`` seconds on the block (``asyncio.timeout``'s contract)."""
    return Deadline(delay)
