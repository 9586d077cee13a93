"""PostgresArchive's query_timeout: a Postgres that stops answering (here: a table locked
by another session) fails the operation with StoreUnavailable instead of holding its
caller, and the archive carries on once the server answers again."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from pyrula.workflows import ConfigurationError, PostgresArchive, StoreUnavailable
from tests.archive.test_postgres_archive import ended


async def test_an_operation_the_server_does_not_answer_fails_after_query_timeout(
    archive_dsn: str,
) -> None:
    archive = PostgresArchive(archive_dsn, query_timeout=0.5, pool_size=1)
    await archive.open()
    try:
        assert await archive.write_runs([(ended("r1"), [])]) == 1
        with psycopg.connect(archive_dsn) as locker:  # a transaction, held open
            locker.execute("LOCK TABLE pyrula_runs IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match=r"did not answer within 0.5 s"):
                await asyncio.wait_for(archive.get_run("r1"), timeout=15)
            assert time.monotonic() - started < 10  # not held until the lock goes
            # The one pooled connection was dropped, not left busy: the next call waits
            # for its own time limit again, rather than for a slot forever.
            with pytest.raises(StoreUnavailable, match="query_timeout"):
                await asyncio.wait_for(archive.finished_times(["r1"]), timeout=15)
            locker.rollback()
        run = await archive.get_run("r1")
        assert run is not None and run.run_id == "r1"
    finally:
        await archive.close()


@pytest.mark.parametrize("value", [0, -1.0, "5", True, float("nan")])
def test_a_time_limit_that_is_not_a_positive_number_is_refused(value: object) -> None:
    with pytest.raises(ConfigurationError, match="query_timeout must be a number"):
        PostgresArchive("postgresql:///x", query_timeout=value)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="connect_timeout must be a number"):
        PostgresArchive("postgresql:///x", connect_timeout=value)  # type: ignore[arg-type]
