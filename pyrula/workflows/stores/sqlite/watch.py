"""SqliteStore's waits for news: a run's end, claimable work and lease news.

In this process a shared :class:`~pyrula.workflows.stores.notify.Notifier` wakes them at
once; another process's commits are seen through ``PRAGMA data_version``, read while
asleep on the notifier (see SqliteStore).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from typing import TypeVar

from pyrula.workflows.errors import RunNotFound
from pyrula.workflows.records import RunRecord
from pyrula.workflows.stores.notify import lease_key, run_key, work_key
from pyrula.workflows.stores.sqlite.db import POLL_MAX, POLL_MIN, Database, remaining
from pyrula.workflows.stores.sqlite.sql import one, to_run
from pyrula.workflows.stores.sqlite.tx import Tx

T = TypeVar("T")

NEWS_POLL = 0.25
"""Seconds between two reads of ``data_version`` while waiting for lease news."""


class SqliteWatch:
    """Waits on a SqliteStore's database; mixed into SqliteStore."""

    url: str
    _db: Database
    _work_version: int | None
    """``data_version`` as of this store's last claim or wake-up (see wait_for_work)."""

    async def wait_run(self, run_id: str, timeout: float | None) -> RunRecord:
        deadline = None if timeout is None else time.monotonic() + timeout
        key = run_key(run_id)

        def read(conn: sqlite3.Connection) -> tuple[int, sqlite3.Row | None]:
            return self._db.data_version(conn), one(conn, "get_run", run_id=run_id)

        while True:
            fut = self._db.notifier.register(key)
            try:
                version, row = await self._db.call(read)
                if row is None:
                    raise RunNotFound(f"no run with id {run_id!r} in {self.url}")
                run = to_run(row)
                if run.is_terminal or self._db.closed or remaining(deadline) == 0.0:
                    return run
                interval = POLL_MIN
                while await self._db.nap([fut], deadline, interval):
                    if version != await self._db.poll_version():
                        break
                    interval = min(2 * interval, POLL_MAX)
                if self._db.closed:
                    return run
            finally:
                self._db.notifier.unregister(key, fut)

    async def wait_lease_news(self, worker_id: str, timeout: float) -> bool:
        """This process's news through the notifier, at once; another process's through
        the worker's ``lease_news`` row, looked for whenever ``data_version`` moved
        (read every ``NEWS_POLL``)."""
        notifier, key = self._db.notifier, lease_key(worker_id)
        deadline = time.monotonic() + max(0.0, timeout)
        if notifier.closed or self._db.closed:
            await asyncio.sleep(max(0.0, timeout))
            return False
        fut = notifier.register(key)
        try:
            seen = await self._db.poll_version()
            while seen is not None:
                if fut.done() or notifier.kept(key):
                    await self._take_news(worker_id)  # the row it set is answered too
                    return True
                if await self._take_news(worker_id):
                    return True
                while await self._db.nap([fut], deadline, NEWS_POLL):
                    version = await self._db.poll_version()
                    if version != seen:
                        seen = version
                        break
                else:
                    if not fut.done():
                        return False  # the deadline, or the store closed
            return False
        finally:
            notifier.unregister(key, fut)

    async def _take_news(self, worker_id: str) -> bool:
        """Whether the worker's ``lease_news`` row was there (it is deleted): a read,
        and a write only when there is news."""

        def read(conn: sqlite3.Connection) -> bool:
            return one(conn, "lease_news_get", worker_id=worker_id) is not None

        if not await self._db.call(read):
            return False

        def take(t: Tx) -> None:
            t.run("lease_news_take", worker_id=worker_id)

        await self._db.transact(take)
        return True

    async def wait_for_work(self, workflows: Sequence[str], timeout: float) -> None:
        names = list(dict.fromkeys(workflows))
        if not names:
            return
        deadline = time.monotonic() + timeout
        futs = [(key, self._db.notifier.register(key)) for key in map(work_key, names)]

        def has_work(conn: sqlite3.Connection) -> bool:
            now = self._db.clock()
            return any(one(conn, "has_work", workflow=n, now=now) for n in names)

        try:
            # Compare with the version our last claim (or wake-up) saw, so a run created
            # by another process since then is not missed.
            seen = self._work_version
            interval = POLL_MIN
            while True:
                current = await self._db.poll_version()
                if current is None:
                    return
                if seen is not None and current != seen:
                    self._work_version = current
                    if await self._db.call(has_work):
                        return
                    interval = POLL_MIN
                seen = current
                if not await self._db.nap([f for _, f in futs], deadline, interval):
                    return
                interval = min(2 * interval, POLL_MAX)
        finally:
            for key, fut in futs:
                self._db.notifier.unregister(key, fut)
