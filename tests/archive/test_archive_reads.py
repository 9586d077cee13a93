"""ArchivingStore reads and deletes found wrong by an audit (real Valkey and Postgres):
``list_runs`` filled its ``limit`` even when the archive's newest matches were still live
with another status (retried); ``delete_run`` with Postgres down deleted the live copy and
then raised; and the CLI, with ``PYRULA_POSTGRES_DSN`` set, read Valkey alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyrula.workflows import ArchivingStore, PostgresArchive, RunStatus, StoreUnavailable
from pyrula.workflows.records import Outcome
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.archive.archiving_helpers import SKEW, TTL, ended_and_archived
from tests.archive.postgres import PostgresProcess, fresh_schema, migrate
from tests.stores.conftest import FakeClock
from tests.stores.helpers import new_run
from tests.valkey.servers import ValkeyProcess, fresh_namespace

FAILED = Outcome(
    RunStatus.FAILED,
    error='{"module":"builtins","type":"ValueError","message":"x","traceback":""}',
)
REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_list_runs_fills_its_limit_past_archived_runs_retried_since(
    store: ArchivingStore,
    clock: FakeClock,
) -> None:
    for run_id in ("fA", "fB"):  # failed, archived, gone from Valkey
        await ended_and_archived(store, clock, new_run(run_id=run_id), FAILED)
        clock.advance(1)
    for run_id in ("fC", "fD"):  # failed, archived, retried while still live: queued
        await store.create_run(new_run(run_id=run_id))
        (lease,) = await store.claim_runs("w1", ["wf"], 1, 30.0)
        await store.finish_run(run_id, lease.token, FAILED)
        clock.advance(1)
    clock.advance(SKEW + 1)
    assert await store.archive_ended() == 2
    for run_id in ("fC", "fD"):
        await store.retry_run(run_id)
    for limit in (1, 2, 3, 100):
        failed = await store.list_runs(status=RunStatus.FAILED, limit=limit)
        assert [run.run_id for run in failed] == ["fB", "fA"][:limit], limit
    queued = await store.list_runs(status=RunStatus.QUEUED)
    assert sorted(run.run_id for run in queued) == ["fC", "fD"]


async def test_delete_run_with_the_archive_down_changes_nothing(
    valkey_server: ValkeyProcess, tmp_path: Path
) -> None:
    postgres = PostgresProcess(tmp_path / "pg")
    base = postgres.start()
    try:
        _, dsn = fresh_schema(base)
        migrate(dsn)
        live = ValkeyStore(valkey_server.url, namespace=fresh_namespace(), shard_count=2)
        store = ArchivingStore(live, PostgresArchive(dsn, query_timeout=5.0), TTL)
        await store.open()
        try:
            await store.create_run(new_run(run_id="kept"))
            (lease,) = await store.claim_runs("w1", ["wf"], 1, 30.0)
            await store.finish_run("kept", lease.token, FAILED)  # ended, not archived yet
            postgres.stop()
            with pytest.raises(StoreUnavailable):
                await store.delete_run("kept")
            assert await store.live.get_run("kept") is not None  # nothing changed
            postgres.start()
            assert await store.delete_run("kept") is True
            assert await store.get_run("kept") is None
        finally:
            await store.close()
    finally:
        postgres.remove()


async def test_the_cli_reads_through_the_archive_named_by_the_environment(
    store: ArchivingStore,
    clock: FakeClock,
    archive_dsn: str,
) -> None:
    await ended_and_archived(store, clock, new_run(run_id="gone-from-valkey"))
    live = store.live
    assert isinstance(live, ValkeyStore)
    url = f"{live.url}?namespace={live.namespace}&shard_count={live.shard_count}"
    env = {**os.environ, "PYRULA_POSTGRES_DSN": archive_dsn, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("PYRULA_STORE_URL", None)

    def pyrula(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "pyrula.cli.main", "runs", *args, "--store", url]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    listed = pyrula("list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [run["run_id"] for run in json.loads(listed.stdout)["runs"]] == ["gone-from-valkey"]
    shown = pyrula("show", "gone-from-valkey")
    assert shown.returncode == 0 and "completed" in shown.stdout, shown.stderr
    retried = pyrula("retry", "gone-from-valkey")
    assert retried.returncode == 1 and "read-only" in retried.stderr
