"""The blocking client over an ArchivingStore(Valkey, Postgres) keeps its fast path
(calls made in the calling thread, on the live Valkey store) where the archive cannot
matter, and takes the async path where it can: a run Valkey does not hold is read from
the archive, and a run id the caller chose is checked against it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula.workflows import ArchivingStore, InvalidRunState, RunStatus
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.stores.valkey.blocking import BlockingValkey
from pyrula.workflows.sync import WorkflowClient
from tests.archive.archiving_helpers import TTL, CountingArchive, ended_and_archived
from tests.stores.conftest import FakeClock
from tests.stores.helpers import new_run
from tests.valkey.servers import ValkeyProcess, fresh_namespace


def test_the_fast_path_serves_the_live_store_and_the_archive_is_read_through(
    valkey_server: ValkeyProcess, archive_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace, clock = fresh_namespace(), FakeClock()

    def archiving() -> ArchivingStore:
        live = ValkeyStore(valkey_server.url, namespace=namespace, shard_count=2, clock=clock)
        return ArchivingStore(live, CountingArchive(archive_dsn), TTL, clock_skew=1.0)

    async def archive_one() -> None:
        store = archiving()
        await store.open()
        try:
            await ended_and_archived(store, clock, new_run(run_id="gone"))
        finally:
            await store.close()

    asyncio.run(archive_one())
    fast_creates: list[str] = []
    original = BlockingValkey.create

    def spy(self: BlockingValkey, new: Any) -> bool:
        done = original(self, new)
        if done:
            fast_creates.append(new.run_id)
        return done

    monkeypatch.setattr(BlockingValkey, "create", spy)
    store = archiving()
    archive = store.archive
    assert isinstance(archive, CountingArchive)
    client = WorkflowClient(store, require_registered=False)
    try:
        assert client._fast is not None and client._fast.store is store.live
        # Valkey no longer holds it: both reads fall through to the archive.
        record = client.get_run("gone")
        assert record is not None and record.status is RunStatus.COMPLETED
        assert client.wait_run("gone", 1.0).status is RunStatus.COMPLETED
        assert client.get_run("never-sent") is None
        # A chosen id is looked up (and refused: the archived run holds it) ...
        with pytest.raises(InvalidRunState, match="archived run"):
            client.submit("wf", {}, run_id="gone")
        # ... a generated one is not, and is created in the calling thread.
        lookups = archive.lookups
        first = client.submit("wf", {})  # notes the workflow on the async path
        fresh = client.submit("wf", {}, run_id="made-up-1", fresh_id=True)
        assert archive.lookups == lookups
        assert fast_creates == ["made-up-1"]
        assert client.get_run(first.run_id) is not None
        assert client.get_run("made-up-1") is not None and fresh.run_id == "made-up-1"
        chosen = client.submit("wf", {}, run_id="chosen-1")  # looked up: the async path
        assert archive.lookups == lookups + 1 and "chosen-1" not in fast_creates
        assert chosen.status() is RunStatus.QUEUED
    finally:
        client.close()
