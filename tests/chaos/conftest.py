"""Fixtures for the chaos suite: a Cluster of worker processes and a store on its file."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # worker processes import tests.fixtures.*; so do the tests
    sys.path.insert(0, str(ROOT))

from pyrula.workflows.stores.sqlite import SqliteStore  # noqa: E402

from .harness import Cluster  # noqa: E402


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_failed] = report.failed
    return report


_failed = pytest.StashKey[bool]()


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Worker processes on one SQLite file; all SIGKILLed and reaped at teardown."""
    cluster = Cluster(tmp_path)
    try:
        yield cluster
    finally:
        cluster.kill_all()
        if request.node.stash.get(_failed, False):
            print(cluster.describe("worker logs of the failed test:", tail=60))


@pytest.fixture
async def store(cluster: Cluster) -> AsyncIterator[SqliteStore]:
    """This process's own SqliteStore on the cluster's database file."""
    store = SqliteStore(cluster.db_path)
    await store.open()
    try:
        yield store
    finally:
        await store.close()
