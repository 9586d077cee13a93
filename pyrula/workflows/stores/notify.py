"""In-process wake-ups that work across threads and event loops.

A store calls :meth:`Notifier.notify` after a write; coroutines blocked in
:meth:`Notifier.wait` on the same key, in any thread's event loop, wake at once.
This is what lets ``wait_run`` and ``wait_for_work`` sleep instead of polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import defaultdict

from pyrula.workflows.records import RunRecord, RunStatus


class Notifier:
    """Keyed wake-ups for coroutines on any event loop. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = (
            defaultdict(set)
        )
        self._closed = False
        self._kept: set[str] = set()
        """News keys notified while nobody waited (``wait_news``)."""

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def register(self, key: str) -> asyncio.Future[None]:
        """A future, on the running loop, resolved at the next ``notify(key)``.

        Register before checking the condition, then await it, to never miss a wake-up.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._closed:
                fut.set_result(None)
            else:
                self._waiters[key].add((loop, fut))
        return fut

    def unregister(self, key: str, fut: asyncio.Future[None]) -> None:
        with self._lock:
            waiters = self._waiters.get(key)
            if waiters is None:
                return
            waiters.discard((asyncio.get_running_loop(), fut))
            if not waiters:
                del self._waiters[key]

    async def wait_news(self, key: str, timeout: float) -> bool:
        """Wait up to ``timeout`` for ``notify(key)`` of a news key (``lease_key``):
        whether it came. News notified while nobody waited is kept for the next wait (the
        worker was renewing meanwhile). A closed notifier sleeps the timeout out and says
        False, so a caller's loop does not spin."""
        if self._closed:
            await asyncio.sleep(max(0.0, timeout))
            return False
        if self.kept(key):
            return True
        return await self.wait(self.register(key), key, max(0.0, timeout))

    def kept(self, key: str) -> bool:
        """Take the news kept for ``key`` (notified while nobody waited): whether any."""
        with self._lock:
            if key in self._kept:
                self._kept.discard(key)
                return True
            return False

    async def wait(self, fut: asyncio.Future[None], key: str, timeout: float | None) -> bool:
        """Await a registered future; True if notified, False on timeout."""
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self.unregister(key, fut)

    def notify(self, *keys: str) -> None:
        """Wake every waiter on any of ``keys``; a news key nobody waits on is kept."""
        targets: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        with self._lock:
            for key in keys:
                waiters = self._waiters.pop(key, ())
                if waiters:
                    targets.extend(waiters)
                elif key.startswith(NEWS_PREFIX):
                    self._kept.add(key)
        for loop, fut in targets:
            _resolve(loop, fut)

    def close(self) -> None:
        """Wake everyone; later registrations resolve at once."""
        with self._lock:
            self._closed = True
            targets = [w for waiters in self._waiters.values() for w in waiters]
            self._waiters.clear()
        for loop, fut in targets:
            _resolve(loop, fut)


def _set(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _resolve(loop: asyncio.AbstractEventLoop, fut: asyncio.Future[None]) -> None:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        _set(fut)
        return
    with contextlib.suppress(RuntimeError):  # that loop is closed; nobody is waiting
        loop.call_soon_threadsafe(_set, fut)


def run_key(run_id: str) -> str:
    return f"run:{run_id}"


def work_key(workflow: str) -> str:
    return f"work:{workflow}"


NEWS_PREFIX = "lease:"


def lease_key(worker_id: str) -> str:
    """Notified when a run the worker holds is cancelled or terminated."""
    return NEWS_PREFIX + worker_id


def news_keys(run: RunRecord) -> tuple[str, ...]:
    """The lease-news key of ``run``'s holder, if it is running (``wait_lease_news``)."""
    if run.status is RunStatus.RUNNING and run.worker_id:
        return (lease_key(run.worker_id),)
    return ()


SCHEDULES_KEY = "schedules"
"""Notified when schedules change, so schedule loops recompute their next due time."""
