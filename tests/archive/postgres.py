"""A real Postgres for the tests.

``PYRULA_TEST_POSTGRES_DSN`` names one when set; otherwise the session starts one from
the ``pgserver`` package (a private data directory, a Unix socket in it, no TCP port),
shared by every fixture that asks and stopped by the last user. Each test gets a schema
of its own (:func:`fresh_schema`, dropped afterwards), so tests never see each other's
rows.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import PostgresArchive
from pyrula.workflows.stores.schedule_admin import run_blocking

ENV = "PYRULA_TEST_POSTGRES_DSN"
REQUIRE_ENV = "PYRULA_REQUIRE_POSTGRES"
"""Set (CI sets it) to fail, not skip, the tests that need Postgres when none is available."""


class PostgresProcess:
    """One pgserver-managed Postgres on its own data directory; ``stop()`` then
    ``start()`` restart it with its data (the DSN stays the same)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or Path(tempfile.mkdtemp(prefix="pyrula-pg-"))
        self.server: Any = None
        self.dsn = ""

    def start(self) -> str:
        with warnings.catch_warnings():  # platformdirs: XDG_RUNTIME_DIR is not set
            warnings.simplefilter("ignore")
            import pgserver

            self.server = pgserver.get_server(self.path, cleanup_mode="stop")
        self.dsn = str(self.server.get_uri())
        return self.dsn

    def stop(self) -> None:
        if self.server is not None:
            self.server.cleanup()  # pg_ctl stop on this data directory's postmaster
            self.server = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.path, ignore_errors=True)


class _Shared:
    """The session's server, started on first use and stopped by its last user."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._process: PostgresProcess | None = None

    def acquire(self) -> str:
        with self._lock:
            if self._process is None:
                process = PostgresProcess()
                try:
                    process.start()
                except Exception:
                    process.remove()
                    raise
                self._process = process
            self._users += 1
            return self._process.dsn

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._process is not None:
                self._process.remove()
                self._process = None


_SHARED = _Shared()


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A DSN of a Postgres the tests may create schemas in."""
    if os.environ.get(ENV):
        yield os.environ[ENV]
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver  # noqa: F401
    except ImportError:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"no Postgres, and {REQUIRE_ENV} is set: set {ENV} or install pgserver")
        pytest.skip(f"no Postgres: set {ENV} or install pgserver")
    dsn = _SHARED.acquire()
    try:
        yield dsn
    finally:
        _SHARED.release()


def fresh_schema(dsn: str) -> tuple[str, str]:
    """Create an empty schema; return its name and a DSN whose search_path is it."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    name = "t" + uuid.uuid4().hex[:12]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    return name, make_conninfo(dsn, options=f"-csearch_path={name}")


def drop_schema(dsn: str, name: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def migrate(dsn: str) -> None:
    """``pyrula db migrate`` on ``dsn``, from sync or async code."""

    async def go() -> None:
        archive = PostgresArchive(dsn)
        try:
            await archive.migrate()
        finally:
            await archive.close()

    run_blocking(go)


@pytest.fixture
def empty_dsn(postgres_dsn: str) -> Iterator[str]:
    """A DSN of a schema of this test's own, without pyrula's tables."""
    name, dsn = fresh_schema(postgres_dsn)
    try:
        yield dsn
    finally:
        drop_schema(postgres_dsn, name)


@pytest.fixture
def archive_dsn(empty_dsn: str) -> str:
    """A DSN of a schema of this test's own, migrated."""
    migrate(empty_dsn)
    return empty_dsn
