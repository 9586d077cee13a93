"""The Celery drop-in's client over the Postgres archive.

With ``PYRULA_POSTGRES_DSN`` set in the client's process, as in its workers',
``client_for`` wraps the store as ``pyrula worker`` does: a task already moved to the
archive (and expired from Valkey) reads back as SUCCESS or FAILURE with its result, and
a repeat ``apply_async(task_id=...)`` returns it without running it again.

A real ``pyrula worker -A proj`` process on a real valkey-server with a real Postgres
archive (``tests/compat/proj``); the test forces archival and the live store's expiry
(as ``test_run_id_taken.py`` does) instead of waiting for the worker's reconcile loop.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import ArchivingStore, PostgresArchive, RunRecord, RunStatus, open_store
from pyrula.workflows.stores.archive.wrapping import POSTGRES_DSN_ENV, with_archive
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula_compat import states
from pyrula_compat.store import client_for, close_clients
from tests.compat.conftest import Workers, lines, proj_workers
from tests.valkey.servers import ValkeyProcess, fresh_namespace

pytestmark = pytest.mark.slow
T = 30  # generous result timeout (seconds)


def project() -> Any:
    """The sample project's tasks module, imported as its worker imports it."""
    # tests/compat is on sys.path (tests.compat.conftest puts it there)
    import proj.tasks  # type: ignore[import-not-found]

    return proj.tasks


class Served:
    def __init__(self, workers: Workers, url: str, dsn: str) -> None:
        self.workers = workers
        self.url = url
        self.dsn = dsn
        self.app = project().app

    def archive_and_expire(self, task_id: str) -> RunRecord:
        """Copy the ended runs to the archive and expire them from Valkey now (the
        reconcile loop's two steps, with no TTL); the archived record of ``task_id``."""

        async def go() -> tuple[RunRecord | None, RunRecord | None]:
            store = ArchivingStore(
                open_store(self.url), PostgresArchive(self.dsn), 0.0, clock_skew=0.0
            )
            try:
                await store.archive_ended()
                await store.expire_archived()
                return await store.live.get_run(task_id), await store.archive.get_run(task_id)
            finally:
                await store.close()

        live, archived = asyncio.run(go())
        assert live is None, f"{task_id} is still in Valkey"
        assert archived is not None, f"{task_id} is not archived"
        return archived

    def in_valkey(self, task_id: str) -> bool:
        async def go() -> bool:
            store = open_store(self.url)
            try:
                return await store.get_run(task_id) is not None
            finally:
                await store.close()

        return asyncio.run(go())


@pytest.fixture
def served(
    valkey_server: ValkeyProcess,
    archive_dsn: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Served]:
    """A worker of the sample project on Valkey with the archive, and this process (the
    "web app") with ``PYRULA_POSTGRES_DSN`` set as the worker's is."""
    monkeypatch.setenv(POSTGRES_DSN_ENV, archive_dsn)
    url = f"{valkey_server.url}/0?namespace=compat{uuid.uuid4().hex[:10]}"
    try:
        with proj_workers(url, tmp_path, project().app) as workers:
            workers.start(env={POSTGRES_DSN_ENV: archive_dsn})
            yield Served(workers, url, archive_dsn)
    finally:
        close_clients()


def test_an_archived_tasks_result_reads_back(served: Served) -> None:
    t = project()
    task_id = f"order-{uuid.uuid4().hex[:8]}"
    assert t.add.apply_async((2, 5), task_id=task_id).get(timeout=T) == 7
    assert served.archive_and_expire(task_id).status is RunStatus.COMPLETED

    result = served.app.AsyncResult(task_id)  # a new process's view: no cached state
    assert result.state == states.SUCCESS  # not PENDING (Celery's "unknown id")
    assert result.successful() and result.ready()
    assert result.get(timeout=T) == 7
    assert served.app.AsyncResult(f"never-sent-{task_id}").state == states.PENDING


def test_a_repeat_of_an_archived_task_id_returns_it_without_running_again(
    served: Served,
) -> None:
    t = project()
    runs = str(served.workers.tmp / "runs")
    task_id = f"order-{uuid.uuid4().hex[:8]}"
    assert t.record.apply_async(({"n": 7}, runs), task_id=task_id).get(timeout=T) == {"n": 7}
    served.archive_and_expire(task_id)

    # The same task_id is the first task: nothing new is queued or run.
    again = t.record.apply_async(({"n": 7}, runs), task_id=task_id)
    assert again.id == task_id and again.get(timeout=T) == {"n": 7}
    assert lines(runs) == ['{"n": 7}']
    assert again.state == states.SUCCESS and not served.in_valkey(task_id)
    # The worker still serves: a task sent afterwards runs, and it is the second run.
    assert t.record.delay({"n": 8}, runs).get(timeout=T) == {"n": 8}
    assert lines(runs) == ['{"n": 7}', '{"n": 8}']


def test_an_archived_failure_reads_back_with_its_exception(served: Served) -> None:
    t = project()
    task_id = f"fail-{uuid.uuid4().hex[:8]}"
    with pytest.raises(t.ProjError, match="out of stock"):
        t.fail.apply_async(("out of stock",), task_id=task_id).get(timeout=T)
    assert served.archive_and_expire(task_id).status is RunStatus.FAILED

    result = served.app.AsyncResult(task_id)
    assert result.state == states.FAILURE and result.failed()
    assert isinstance(result.result, t.ProjError) and str(result.result) == "out of stock"
    assert "raise ProjError(message)" in (result.traceback or "")
    with pytest.raises(t.ProjError, match="out of stock"):
        result.get(timeout=T)
    # Its task_id stays taken too: the repeat is the archived failure, not a new run.
    again = t.fail.apply_async(("out of stock",), task_id=task_id)
    with pytest.raises(t.ProjError, match="out of stock"):
        again.get(timeout=T)
    assert not served.in_valkey(task_id)


def test_the_client_store_follows_the_env_var_and_closes(
    valkey_server: ValkeyProcess, archive_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{valkey_server.url}/0?namespace={fresh_namespace()}"
    monkeypatch.delenv(POSTGRES_DSN_ENV, raising=False)
    try:
        plain = client_for(url)
        assert isinstance(plain.store, ValkeyStore)
        monkeypatch.setenv(POSTGRES_DSN_ENV, f"  {archive_dsn}  ")
        client = client_for(url)
        assert client is not plain and client_for(url) is client  # one per URL and DSN
        store = client.store
        assert isinstance(store, ArchivingStore) and isinstance(store.live, ValkeyStore)
        assert client.get_run("unknown") is None  # Valkey, then Postgres: connected
        assert any(pool.idle for pool in store.archive._pools.values())  # type: ignore[attr-defined]
        monkeypatch.setenv(POSTGRES_DSN_ENV, " ")  # blank: unset, as for the worker
        assert client_for(url) is plain
    finally:
        close_clients()
    assert not any(pool.idle for pool in store.archive._pools.values())  # type: ignore[attr-defined]
    assert client_for(url) is not client  # closed and forgotten
    close_clients()


def test_with_archive_wraps_only_for_a_dsn(archive_dsn: str) -> None:
    live = open_store("memory://")
    assert with_archive(live, None) is live and with_archive(live, "  ") is live
    wrapped = with_archive(live, archive_dsn)
    assert isinstance(wrapped, ArchivingStore) and wrapped.live is live
    assert wrapped.live_ttl_after_archive == 300.0  # the worker's defaults
