"""``pyrula worker --postgres-dsn``: a real worker process on Valkey whose ended runs its
reconcile loop copies to a real Postgres archive."""

from __future__ import annotations

import asyncio
import time

import pytest

from pyrula.workflows import ArchivingStore, PostgresArchive, RunRecord, open_store
from pyrula.workflows.sync import WorkflowClient
from tests.integration.test_cli_worker import FAST, MODULE, Workers, workers  # noqa: F401  (a fixture)
from tests.valkey.servers import ValkeyProcess, fresh_namespace

pytestmark = pytest.mark.slow


def archived(dsn: str, run_id: str) -> RunRecord | None:
    async def main() -> RunRecord | None:
        archive = PostgresArchive(dsn)
        await archive.open()
        try:
            return await archive.get_run(run_id)
        finally:
            await archive.close()

    return asyncio.run(main())


def test_the_worker_archives_the_runs_it_ends(
    workers: Workers,  # noqa: F811
    valkey_server: ValkeyProcess,
    archive_dsn: str,
) -> None:
    url = f"{valkey_server.url}?namespace={fresh_namespace()}"
    worker = workers.start(
        "--workflow", MODULE, "--store", url, "--postgres-dsn", archive_dsn, *FAST
    )
    store = ArchivingStore(open_store(url), PostgresArchive(archive_dsn))
    with WorkflowClient(store) as client:
        handle = client.submit("cli_add", {"a": 2, "b": 3})
        assert handle.result(timeout=30) == {"sum": 5, "doubled": 10}
        deadline = time.monotonic() + 30  # the reconcile loop copies every 5 s
        while (copy := archived(archive_dsn, handle.run_id)) is None:
            assert time.monotonic() < deadline, f"not archived:\n{worker.stderr}"
            time.sleep(0.2)
        assert copy.result is not None and copy.finished_at is not None
        assert client.get_run(handle.run_id) is not None  # still live: its TTL is 300 s
    assert worker.stop() == 0
