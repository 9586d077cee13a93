"""PostgresArchive: ended runs and their journals in Postgres, through psycopg 3 (async).

psycopg is an optional dependency (``pip install 'pyrula[postgres]'``), imported when
an archive is built, so pyrula without it still imports. Statements are in
``queries.sql``, the schema in ``schema.sql`` (:mod:`.sql` reads both).

Driver errors are translated here and never leak: a connection that fails is
:class:`~pyrula.workflows.errors.StoreUnavailable` (naming the archive, password
masked), and so is an operation that takes longer than ``query_timeout`` (a server that
stopped answering: the connection is dropped), a missing table
:class:`~pyrula.workflows.errors.ArchiveSchemaMismatch`, any other database error
:class:`~pyrula.workflows.errors.StoreError`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import select
import threading
import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from pyrula.workflows.errors import (
    ArchiveSchemaMismatch,
    ConfigurationError,
    StoreError,
    StoreUnavailable,
)
from pyrula.workflows.records import JournalEntry, RunRecord, RunStatus
from pyrula.workflows.stores.archive.base import ArchiveCursor, ArchivedStamp, PurgeCandidate
from pyrula.workflows.stores.archive.postgres import sql
from pyrula.workflows.stores.archive.postgres.sql import Q
from pyrula.workflows.stores.deadlines import deadline

if TYPE_CHECKING:
    from psycopg import AsyncConnection

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'pyrula[postgres]'"
CURSOR_NAME = "reconcile"
"""The ``pyrula_archive_state`` row of the reconcile loop's cursor."""


def _require_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            f"PostgresArchive needs psycopg 3, which is not installed: {INSTALL_HINT}"
        ) from exc


def mask_dsn(dsn: str) -> str:
    """A DSN (URI or ``key=value`` form) as ``postgresql://user@host:port/dbname``, no
    password, for messages and logs."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        info = conninfo_to_dict(dsn)
    except Exception:  # not parseable: say nothing of its content
        return "postgresql://(unparseable DSN)"
    user = f"{info['user']}@" if info.get("user") else ""
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql://{user}{info.get('host') or ''}{port}/{info.get('dbname') or ''}"


def missing_schema(url: str) -> ArchiveSchemaMismatch:
    return ArchiveSchemaMismatch(
        f"the Postgres archive at {url} has no pyrula schema: run "
        "`pyrula db migrate --postgres-dsn DSN` before starting workers"
    )


def other_version(url: str, found: str, ours: str) -> ArchiveSchemaMismatch:
    return ArchiveSchemaMismatch(
        f"the Postgres archive at {url} was migrated by pyrula {found}, this is pyrula "
        f"{ours}. There is no upgrade path between versions: recreate the database and "
        "run `pyrula db migrate --postgres-dsn DSN` again"
    )


class PostgresArchive:
    """Ended runs and their journals in Postgres.

    * ``dsn``: a libpq connection string or ``postgresql://`` URI. Tables go in the
      connection's ``search_path``: add ``options=-csearch_path=NAME`` to keep several
      archives in one database. One archive serves one live store (namespace).
    * ``pool_size``: connections kept open at most per event loop (opened on demand;
      a worker's loop and a blocking client's loop thread sharing the archive each have
      their own, so neither closes or borrows the other's connections).
    * ``connect_timeout``: seconds a connection attempt may take.
    * ``query_timeout``: seconds one operation (waiting for a pooled connection, then its
      statements) may take before it fails with ``StoreUnavailable`` and its connection
      is dropped, so a Postgres that stopped answering holds up no caller for longer.

    :meth:`migrate` creates the schema (``pyrula db migrate``); :meth:`open` and
    :meth:`check` refuse a missing schema, or one another pyrula version migrated, with
    :class:`~pyrula.workflows.errors.ArchiveSchemaMismatch`.
    """

    def __init__(
        self,
        dsn: str,
        *,
        pool_size: int = 4,
        connect_timeout: float = 5.0,
        query_timeout: float = 30.0,
    ) -> None:
        _require_psycopg()
        if pool_size < 1:
            raise ConfigurationError(f"pool_size must be >= 1, got {pool_size!r}")
        for name, value in (("connect_timeout", connect_timeout), ("query_timeout", query_timeout)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigurationError(f"{name} must be a number of seconds > 0, got {value!r}")
        self._dsn = dsn
        self.url = mask_dsn(dsn)
        self.pool_size = pool_size
        self.connect_timeout = connect_timeout
        self.query_timeout = query_timeout
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = (
            weakref.WeakKeyDictionary()
        )
        self._pools_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PostgresArchive({self.url!r})"

    # -- connections -------------------------------------------------------------------
    async def _connect(self) -> AsyncConnection[Any]:
        from psycopg import AsyncConnection
        from psycopg.rows import dict_row

        conn = await AsyncConnection.connect(
            self._dsn,
            autocommit=True,
            row_factory=dict_row,
            connect_timeout=max(1, round(self.connect_timeout)),
        )
        conn.adapters.register_dumper(str, _nul_free_text())
        return conn

    def _pool(self) -> _Pool:
        """This event loop's pool: a connection is awaited only on the loop that opened
        it, and several loops (threads) may use the archive at once. A loop's pool goes
        with the loop; a new loop's first use closes the connections of loops closed
        since (a blocking helper's ``asyncio.run``)."""
        loop = asyncio.get_running_loop()
        with self._pools_lock:
            pool = self._pools.get(loop)
            if pool is None:
                for old in [old for old in self._pools if old.is_closed()]:
                    for conn in self._pools.pop(old).idle:
                        conn.pgconn.finish()
                pool = self._pools[loop] = _Pool(self.pool_size)
            return pool

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection for one operation, within ``query_timeout``, errors
        translated; a connection that saw an error (or the time limit) is closed rather
        than reused."""
        import psycopg
        from psycopg import errors as pgerrors

        conn: AsyncConnection[Any] | None = None
        pool = self._pool()
        try:
            async with deadline(self.query_timeout), pool.slots:
                try:
                    conn = await pool.take_idle() or await self._connect()
                    yield conn
                except BaseException:
                    await _discard(conn)
                    raise
                if not conn.closed:
                    pool.idle.append(conn)
        except TimeoutError as exc:
            raise StoreUnavailable(
                f"the Postgres archive at {self.url} did not answer within "
                f"{self.query_timeout:g} s (query_timeout)"
            ) from exc
        except pgerrors.UndefinedTable as exc:
            raise missing_schema(self.url) from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise StoreUnavailable(
                f"the Postgres archive at {self.url} is unavailable: {_first_line(exc)}"
            ) from exc
        except psycopg.Error as exc:
            raise StoreError(f"the Postgres archive at {self.url}: {_first_line(exc)}") from exc

    # -- lifecycle -----------------------------------------------------------------------
    async def open(self) -> None:
        await self.check()

    async def close(self) -> None:
        here = asyncio.get_running_loop()
        with self._pools_lock:
            pools = list(self._pools.items())
        for loop, pool in pools:
            idle, pool.idle = pool.idle, []
            for conn in idle:
                if loop is here:
                    await _discard(conn)
                else:  # another loop's: it cannot be awaited here
                    conn.pgconn.finish()

    async def migrate(self) -> None:
        """Create the tables (every statement is idempotent) and record this pyrula's
        version, under an advisory lock so concurrent migrations take turns. A schema
        another version migrated is refused and left alone."""
        ours = sql.pyrula_version()
        async with self._conn() as conn, conn.transaction():
            await conn.execute(Q["migrate_lock"])
            found = await self._version(conn)
            if found is not None and found != ours:
                raise other_version(self.url, found, ours)
            await conn.execute(sql.SCHEMA)
            await conn.execute(Q["set_schema_version"], {"version": ours})
        log.info("migrated the Postgres archive at %s (pyrula %s)", self.url, ours)

    async def check(self) -> None:
        async with self._conn() as conn:
            found = await self._version(conn)
        if found is None:
            raise missing_schema(self.url)
        ours = sql.pyrula_version()
        if found != ours:
            raise other_version(self.url, found, ours)

    async def _version(self, conn: AsyncConnection[Any]) -> str | None:
        """The version that migrated the schema, None when there is none."""
        row = await (await conn.execute(Q["schema_table"])).fetchone()
        if row is None or not next(iter(row.values())):
            return None
        row = await (await conn.execute(Q["schema_version"])).fetchone()
        return None if row is None else str(row["pyrula_version"])

    # -- writes ----------------------------------------------------------------------------
    async def write_runs(self, runs: Sequence[tuple[RunRecord, list[JournalEntry]]]) -> int:
        ended = [(run, journal) for run, journal in runs if run.finished_at is not None]
        if not ended:
            return 0
        written = 0
        async with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
            for run, journal in ended:
                await cur.execute(Q["upsert_run"], sql.run_params(run))
                if await cur.fetchone() is None:
                    continue  # archived already (this end or a later one), or another run
                written += 1
                await cur.execute(Q["delete_journal"], {"run_id": run.run_id})
                if journal:
                    await cur.executemany(Q["insert_entry"], [sql.entry_params(e) for e in journal])
        return written

    async def finished_times(self, run_ids: Sequence[str]) -> dict[str, float]:
        if not run_ids:
            return {}
        async with self._conn() as conn:
            cur = await conn.execute(Q["finished_of"], {"run_ids": list(run_ids)})
            return {row["run_id"]: row["finished_at"] for row in await cur.fetchall()}

    async def archived_stamps(self, run_ids: Sequence[str]) -> dict[str, ArchivedStamp]:
        if not run_ids:
            return {}
        async with self._conn() as conn:
            cur = await conn.execute(Q["stamps_of"], {"run_ids": list(run_ids)})
            rows = await cur.fetchall()
        return {row["run_id"]: ArchivedStamp(row["created_at"], row["finished_at"]) for row in rows}

    async def delete_run(self, run_id: str) -> bool:
        async with self._conn() as conn:
            cur = await conn.execute(Q["delete_run"], {"run_id": run_id})
            return await cur.fetchone() is not None

    async def save_cursor(self, cursor: ArchiveCursor) -> None:
        params = {
            "name": CURSOR_NAME,
            "cursor_at": cursor.finished_at,
            "cursor_id": cursor.run_id,
            "archived_before": cursor.archived_before,
        }
        async with self._conn() as conn:
            await conn.execute(Q["save_state"], params)

    # -- reads -----------------------------------------------------------------------------
    async def get_run(self, run_id: str) -> RunRecord | None:
        async with self._conn() as conn:
            row = await (await conn.execute(Q["get_run"], {"run_id": run_id})).fetchone()
        return None if row is None else sql.to_run(row)

    async def load_journal(self, run_id: str) -> list[JournalEntry]:
        async with self._conn() as conn:
            rows = await (await conn.execute(Q["load_journal"], {"run_id": run_id})).fetchall()
        return [sql.to_entry(row) for row in rows]

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        if limit <= 0:
            return []
        params = {
            "workflow": workflow,
            "status": None if status is None else status.value,
            "owner": owner,
            "limit": limit,
        }
        async with self._conn() as conn:
            rows = await (await conn.execute(Q["list_runs"], params)).fetchall()
        return [sql.to_run(row) for row in rows]

    async def purge_candidates(
        self, ended_before: float, after: tuple[float, str] | None, limit: int
    ) -> list[PurgeCandidate]:
        if limit <= 0:
            return []
        after_at, after_id = after if after is not None else (float("-inf"), "")
        params = {
            "ended_before": ended_before,
            "after_at": after_at,
            "after_id": after_id,
            "limit": limit,
        }
        async with self._conn() as conn:
            rows = await (await conn.execute(Q["purge_candidates"], params)).fetchall()
        return [PurgeCandidate(r["run_id"], r["finished_at"], r["parent_run_id"]) for r in rows]

    async def load_cursor(self) -> ArchiveCursor | None:
        async with self._conn() as conn:
            row = await (await conn.execute(Q["load_state"], {"name": CURSOR_NAME})).fetchone()
        if row is None:
            return None
        return ArchiveCursor(
            row["cursor_finished_at"], row["cursor_run_id"], row["archived_before"]
        )


class _Pool:
    """One event loop's connections: at most ``size`` in use at once, the idle ones kept."""

    def __init__(self, size: int) -> None:
        self.slots = asyncio.Semaphore(size)
        self.idle: list[AsyncConnection[Any]] = []

    async def take_idle(self) -> AsyncConnection[Any] | None:
        """An idle connection the server has not closed, or None. A server that shut
        down or restarted since (``terminating connection due to administrator
        command``, or a killed one's end of file) left something to read on the socket
        of every connection it had: those are discarded here, so the first operations
        after a restart do not each fail once on a dead connection."""
        while self.idle:
            conn = self.idle.pop()
            if not _closed_by_server(conn):
                return conn
            await _discard(conn)
        return None


def _closed_by_server(conn: AsyncConnection[Any]) -> bool:
    """Whether an idle connection has something to read: it is asked nothing, and
    pyrula does not LISTEN, so only the server's goodbye (or end of file) can be there."""
    if conn.closed:
        return True
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError):  # no socket any more
        return True
    return bool(readable)


NUL_STAND_IN = "\ufffd"
"""What a NUL character in a text sent to Postgres becomes (in every statement, so a
lookup finds what a write stored): Postgres text cannot hold NUL, and one such run must
not stop every later one from being archived. The client refuses NUL in ids, keys,
owners and names; code may still put one in a step name or a progress state."""


@functools.cache
def _nul_free_text() -> type:
    """psycopg's text dumper for ``str``, with NUL replaced by :data:`NUL_STAND_IN`."""
    from psycopg.types.string import StrDumperUnknown

    class NulFreeText(StrDumperUnknown):
        def dump(self, obj: str) -> Any:
            return super().dump(obj.replace("\x00", NUL_STAND_IN))

    return NulFreeText


async def _discard(conn: AsyncConnection[Any] | None) -> None:
    if conn is None or conn.closed:
        return
    try:
        await conn.close()
    except Exception:  # closing a broken connection: nothing more to do
        conn.pgconn.finish()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
