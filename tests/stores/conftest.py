"""The conformance suite's fixtures: one ``store`` fixture over every backend.

A new backend slots in by adding a builder to ``BUILDERS`` (it gets the pytest request,
to reach other fixtures such as a server, and the shared clock).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.memory import MemoryStore
from pyrula.workflows.stores.sqlite import SqliteStore
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.archive.postgres import archive_dsn, empty_dsn, postgres_dsn  # noqa: F401
from tests.valkey.servers import fresh_namespace, valkey_cluster, valkey_server  # noqa: F401

START = 1_700_000_000.0


class FakeClock:
    """A store clock that only moves when told to. Thread-safe."""

    def __init__(self, start: float = START) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        with self._lock:
            self._now += seconds
            return self._now

    def set(self, now: float) -> None:
        with self._lock:
            self._now = now


def _memory(request: pytest.FixtureRequest, clock: Callable[[], float]) -> Store:
    return MemoryStore(clock=clock)


def _sqlite(request: pytest.FixtureRequest, clock: Callable[[], float]) -> Store:
    tmp_path: Path = request.getfixturevalue("tmp_path")
    return SqliteStore(tmp_path / "pyrula.db", clock=clock)


def _valkey(request: pytest.FixtureRequest, clock: Callable[[], float]) -> Store:
    # One shard, so the queue orders are exact (sharding is tested in tests/valkey).
    url = request.getfixturevalue("valkey_server").url
    return ValkeyStore(url, namespace=fresh_namespace(), shard_count=1, clock=clock)


def _valkey_cluster(request: pytest.FixtureRequest, clock: Callable[[], float]) -> Store:
    url = request.getfixturevalue("valkey_cluster").url
    return ValkeyStore(url, namespace=fresh_namespace(), shard_count=1, cluster=True, clock=clock)


def _archiving(request: pytest.FixtureRequest, clock: Callable[[], float]) -> Store:
    # Valkey plus a Postgres archive (a schema of the test's own, migrated).
    from pyrula.workflows import ArchivingStore, PostgresArchive

    dsn = request.getfixturevalue("archive_dsn")
    return ArchivingStore(_valkey(request, clock), PostgresArchive(dsn))


BUILDERS: dict[str, Callable[[pytest.FixtureRequest, Callable[[], float]], Store]] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "valkey": _valkey,
    "valkey-cluster": _valkey_cluster,
    "archiving": _archiving,
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=list(BUILDERS), ids=list(BUILDERS))
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
async def store(
    request: pytest.FixtureRequest, store_kind: str, clock: FakeClock
) -> AsyncIterator[Store]:
    """An opened store of each kind on the fake clock, closed afterwards."""
    built = BUILDERS[store_kind](request, clock)
    await built.open()
    try:
        yield built
    finally:
        await built.close()


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "pyrula.db"
