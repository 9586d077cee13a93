"""The SQLite store's engine room: one connection on one thread, transactions, wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from pyrula.workflows.errors import PayloadError, StoreUnavailable
from pyrula.workflows.stores.notify import Notifier
from pyrula.workflows.stores.sqlite import sql
from pyrula.workflows.stores.sqlite.tx import Tx

T = TypeVar("T")
Keys = tuple[str, ...]
"""Notifier keys to wake once a transaction has committed."""
POLL_MIN = 0.005
"""First interval between two ``PRAGMA data_version`` checks while waiting."""
POLL_MAX = 0.05
"""The interval backs off to this; it bounds the cross-process wake-up latency."""
_CLOSE = "close"

_registry_lock = threading.Lock()
_notifiers: dict[str, Notifier] = {}


def shared_notifier(path: str) -> Notifier:
    """The one Notifier of this process for the database file at ``path`` (by real path)."""
    key = os.path.realpath(path)
    with _registry_lock:
        return _notifiers.setdefault(key, Notifier())


def remaining(deadline: float | None) -> float | None:
    """Seconds left before a ``time.monotonic`` deadline (never negative); None: no deadline."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class Database:
    """One lazily opened connection, used only from one dedicated thread."""

    def __init__(self, path: str, clock: Callable[[], float], busy_timeout: float) -> None:
        self.path = path
        self.url = "sqlite:///" + path
        self.clock = clock
        self.busy_timeout = busy_timeout
        self.notifier = shared_notifier(path)
        self.closed = False
        self._closing = Notifier()  # wakes this instance's waiters on close
        self._executor = _executor()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._inherited: list[sqlite3.Connection] = []
        self._version: tuple[float, int] = (float("-inf"), 0)

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the store thread."""
        if self.closed:
            raise self._closed_error()
        if self._pid != os.getpid():
            self._after_fork()
        try:
            fut = asyncio.get_running_loop().run_in_executor(self._executor, self._invoke, fn)
        except RuntimeError as exc:  # the executor was shut down meanwhile
            raise self._closed_error() from exc
        return await fut

    async def write(self, fn: Callable[[sqlite3.Connection, float], tuple[T, Keys]]) -> T:
        """Run ``fn(connection, now)`` in one BEGIN IMMEDIATE transaction; after the
        commit, notify the keys it returned. An exception rolls everything back."""

        def tx(conn: sqlite3.Connection) -> T:
            sql.run(conn, "begin_immediate")
            try:
                result, keys = fn(conn, self.clock())
                conn.commit()
            except BaseException:
                if conn.in_transaction:
                    conn.rollback()
                raise
            if keys:
                self.notifier.notify(*keys)
            return result

        return await self.call(tx)

    async def transact(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in one write transaction (:meth:`write`); notify the keys it noted
        after the commit."""

        def body(conn: sqlite3.Connection, now: float) -> tuple[T, Keys]:
            tx = Tx(conn, now, self.url)
            return fn(tx), tuple(tx.keys)

        return await self.write(body)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._closing.close()
        with contextlib.suppress(RuntimeError):  # the executor is already shut down
            await asyncio.get_running_loop().run_in_executor(self._executor, self._disconnect)
        self._executor.shutdown(wait=False)

    # -- waiting ---------------------------------------------------------------------
    async def poll_version(self) -> int | None:
        """``PRAGMA data_version``, or None once the store is closed.

        Waiters share one reading for ``POLL_MIN`` seconds, so a thousand of them cost
        what one does."""
        read_at, version = self._version
        if time.monotonic() - read_at < POLL_MIN:
            return version
        try:
            return await self.call(self.data_version)
        except StoreUnavailable:
            if self.closed:
                return None
            raise

    def data_version(self, conn: sqlite3.Connection) -> int:
        """Read ``PRAGMA data_version`` (on the store thread) and remember it."""
        version = sql.data_version(conn)
        self._version = (time.monotonic(), version)
        return version

    async def nap(
        self, futs: Iterable[asyncio.Future[None]], deadline: float | None, interval: float
    ) -> bool:
        """Sleep for ``interval`` at most. True when it elapsed quietly (time to look at
        ``data_version``); False when a future fired, the store closed or the deadline
        passed."""
        step = remaining(deadline)
        if step == 0.0 or self.closed:
            return False
        closing = self._closing.register(_CLOSE)
        try:
            done, _ = await asyncio.wait(
                {closing, *futs},
                timeout=interval if step is None else min(interval, step),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            self._closing.unregister(_CLOSE, closing)
        return not done and remaining(deadline) != 0.0

    # -- on the store thread ---------------------------------------------------------
    def _invoke(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            if self._conn is None:
                if self.closed:
                    raise self._closed_error()
                self._conn = sql.connect(self.path, self.busy_timeout)
            return fn(self._conn)
        except sqlite3.Error as exc:
            raise sql.translate(exc, self.path, self.busy_timeout) from exc
        except UnicodeEncodeError as exc:
            raise PayloadError(
                f"a payload cannot be stored in {self.url}: it is not valid Unicode ({exc})"
            ) from exc

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _after_fork(self) -> None:
        # Threads do not survive fork and a connection must not cross it: start afresh in
        # the child, keeping (never closing) the parent's connection object.
        self._pid = os.getpid()
        self._executor = _executor()
        self._version = (float("-inf"), 0)  # data_version belongs to a connection
        if self._conn is not None:
            self._inherited.append(self._conn)
            self._conn = None

    def _closed_error(self) -> StoreUnavailable:
        return StoreUnavailable(f"the SQLite store {self.url} is closed")


def _executor() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="pyrula-sqlite")
