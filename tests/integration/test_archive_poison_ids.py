"""NUL characters and ArchivingStore(Valkey, Postgres) (reliability plan, scenario 29,
and I12: completed runs = archive rows).

Valkey stores any bytes, Postgres ``text`` holds no NUL. The client refuses NUL in a run
id, idempotency key or owner at submit (nothing stored). A NUL that reaches the live
store anyway (a step name or progress state from code, a run written by an older client)
must still be archived, with a stand-in character, and never stop the archiving of every
other run (then Valkey would grow without bound).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pyrula.workflows import (
    ArchivingStore,
    InvalidParams,
    PostgresArchive,
    WorkflowClient,
    WorkflowContext,
    workflow,
)
from pyrula.workflows.records import NewRun
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.archive.postgres import archive_dsn, empty_dsn, postgres_dsn  # noqa: F401
from tests.conftest import Eventually, StartWorker
from tests.valkey.servers import ValkeyProcess, fresh_namespace, valkey_server  # noqa: F401


@pytest.fixture
async def archiving(
    valkey_server: ValkeyProcess,  # noqa: F811
    archive_dsn: str,  # noqa: F811
) -> AsyncIterator[ArchivingStore]:
    live = ValkeyStore(valkey_server.url, namespace=fresh_namespace(), shard_count=4)
    store = ArchivingStore(
        live,
        PostgresArchive(archive_dsn),
        live_ttl_after_archive=0.5,
        reconcile_interval=0.1,
        clock_skew=0.2,
    )
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def test_a_nul_in_an_id_is_refused_at_submit(archiving: ArchivingStore) -> None:
    client = WorkflowClient(archiving, require_registered=False)
    for options in ({"run_id": "a\x00b"}, {"idempotency_key": "k\x00"}, {"owner": "o\x00"}):
        with pytest.raises(InvalidParams, match="NUL"):
            await client.submit("nul.echo", {"n": 1}, **options)  # type: ignore[arg-type]
    assert await archiving.live.list_runs() == []


async def test_a_nul_that_reached_the_live_store_is_archived_and_blocks_nothing(
    archiving: ArchivingStore,
    registry: Registry,
    start_worker: StartWorker,
    eventually: Eventually,
) -> None:
    @workflow(registry=registry, name="nul.echo")
    async def echo(ctx: WorkflowContext, n: int) -> int:
        return int(await ctx.step("same\x00step", lambda: n))

    await start_worker(archiving, [echo])
    client = WorkflowClient(archiving, registry=registry)
    # Written past the client, as an older one could: a NUL in the id, key and owner.
    odd_id = "a\x00b"
    await archiving.live.create_run(
        NewRun(
            run_id=odd_id,
            workflow="nul.echo",
            params='{"n":7}',
            idempotency_key="k\x00",
            owner="o\x00",
        )
    )
    odd = client.handle("nul.echo", odd_id)
    good = [await client.submit("nul.echo", {"n": n}) for n in range(3)]
    assert await odd.result(timeout=10) == 7
    assert [await h.result(timeout=10) for h in good] == [0, 1, 2]

    async def archived() -> bool:
        for handle in [*good, odd]:
            if await archiving.archive.get_run(handle.run_id) is None:
                return False
        return True

    await eventually(archived, timeout=10, what="every run archived, the odd one too")
    record = await archiving.archive.get_run(odd_id)  # looked up as it was written
    assert record is not None and record.run_id == "a\ufffdb" and record.owner == "o\ufffd"
    names = [e.name for e in await archiving.archive.load_journal(good[0].run_id)]
    assert names == ["same\ufffdstep"]
