"""Single node: ``create_ready`` (lua/runs.lua), the short way in for the commonest run
(no key, parent, owner, flow control, delay or start_at), stores what ``create`` would,
and gives way to ``create`` in a workflow an owned run was submitted to."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from pyrula.workflows import InvalidRunState, WorkflowContext, workflow
from pyrula.workflows.records import RunStatus
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.stores.valkey.codec import new_run_args
from pyrula.workflows.sync import WorkflowClient as BlockingClient
from tests.stores.conftest import FakeClock
from tests.stores.helpers import TTL, create, new_run

from .conftest import MakeStore, function_calls
from .servers import ValkeyProcess, fresh_namespace

TIMES = ("ca", "aa", "ua")


async def stored(store: ValkeyStore, run_id: str) -> dict[str, str]:
    raw = await store._server.client().hgetall(store._keys.run(run_id))
    return {k.decode(): v.decode() for k, v in raw.items()}


def same_shard_ids(store: ValkeyStore, count: int) -> list[str]:
    ids: list[str] = []
    while len(ids) < count:
        run_id = uuid.uuid4().hex
        if not ids or store._keys.shard_of(run_id) == store._keys.shard_of(ids[0]):
            ids.append(run_id)
    return ids


@pytest.mark.parametrize("expires", [False, True])
async def test_it_stores_what_create_stores(
    make_store: MakeStore, clock: FakeClock, expires: bool
) -> None:
    store = await make_store("single", shard_count=4, clock=clock)
    expires_at = clock() + 60 if expires else None
    quick_id, slow_id = same_shard_ids(store, 2)
    quick = new_run("wf", expires_at=expires_at, run_id=quick_id)
    slow = new_run("wf", expires_at=expires_at, run_id=slow_id)
    names = function_calls(store, "create")
    await store.create_run(quick)
    assert names == ["create_ready"]
    await store._run_call("create", slow_id, *new_run_args(slow), "0")
    a, b = await stored(store, quick_id), await stored(store, slow_id)
    assert int(b.pop("sq")) == int(a.pop("sq")) + 1  # the shard's one counter
    if expires:
        assert a.pop("xe") == new_run_args(quick)[14] and b.pop("xe") == new_run_args(slow)[14]
    assert a == b
    raw = store._server.client()
    hint, shard = store._keys.hint("wf"), store._keys.shard_of(quick_id)
    ready = [e.decode() for e in await raw.lrange(hint + "r", 0, -1)]
    assert ready == [f"{shard}:{quick_id}", f"{shard}:{slow_id}"]
    listed = await raw.zrange(store._keys.shard(shard) + "a", 0, -1, withscores=True)
    assert [(m.decode()[13:], score) for m, score in listed] == [
        (quick_id, clock()),
        (slow_id, clock()),
    ]
    assert await raw.lrange(hint + "wake", 0, -1) == [b"r", b"r"]
    [lease] = await store.claim_runs("w", ["wf"], 1, TTL)
    assert lease.run_id == quick_id


async def test_the_record_it_returns_is_the_one_stored(make_store: MakeStore) -> None:
    store = await make_store("single", shard_count=4)
    created, fresh = await store.create_run(new_run("wf", expires_at=time.time() + 60))
    assert fresh and created == await store.get_run(created.run_id)
    assert created.status is RunStatus.QUEUED and created.expires_at is not None


async def test_a_workflow_with_an_owned_run_takes_create(make_store: MakeStore) -> None:
    store = await make_store("single", shard_count=4)
    names = function_calls(store, "create")
    await create(store)
    tenant = await create(store, owner="t1")  # the workflow's runs go to the shards
    plain = await create(store)
    again = await create(store)
    # create_ready said "owned" once; after that the store goes to create directly.
    assert names == ["create_ready", "create", "create_ready", "create", "create"]
    raw = store._server.client()
    assert await raw.llen(store._keys.hint("wf") + "r") == 0
    order = []
    for _ in range(4):
        order += [lease.run_id for lease in await store.claim_runs("w", ["wf"], 1, TTL)]
    assert {tenant, plain, again} <= set(order)


async def test_a_duplicate_id_is_refused_and_changes_nothing(make_store: MakeStore) -> None:
    store = await make_store("single", shard_count=4)
    run_id = await create(store, params='{"n": 1}')
    before = await stored(store, run_id)
    with pytest.raises(InvalidRunState, match="already exists"):
        await create(store, run_id=run_id, params='{"n": 2}')
    assert await stored(store, run_id) == before
    raw = store._server.client()
    assert await raw.llen(store._keys.hint("wf") + "r") == 1


async def test_the_blocking_client_takes_it_and_gives_way_to_create(
    make_store: MakeStore, registry: Registry
) -> None:
    store = await make_store("single", shard_count=4)

    @workflow(registry=registry, name="wf")
    async def wf(ctx: WorkflowContext) -> None:
        return None

    client = BlockingClient(store, registry=registry)
    names = function_calls(store, "create")

    def use() -> list[str]:
        first = client.submit("wf")  # notes the workflow through the loop thread
        ids = [client.submit("wf").run_id for _ in range(3)]
        client.submit("wf", owner="t1")
        ids.append(client.submit("wf").run_id)
        return [first.run_id, *ids]

    ids = await asyncio.to_thread(use)
    # The blocking path sends its FCALLs itself: only the loop thread's calls show here.
    assert names == ["create_ready"], names
    assert "wf" in store._owned_workflows  # the blocking path met "owned" and went on
    runs = [await store.get_run(run_id) for run_id in ids]
    assert all(run is not None and run.status is RunStatus.QUEUED for run in runs)
    raw = store._server.client()
    assert await raw.llen(store._keys.hint("wf") + "r") == 0  # all moved to the shards


async def test_a_cluster_never_takes_it(make_store: MakeStore) -> None:
    store = await make_store("cluster", shard_count=4)
    names = function_calls(store, "create")
    await create(store)
    assert names == ["create"]


async def test_the_blocking_client_after_the_library_vanished(
    own_server: ValkeyProcess, registry: Registry
) -> None:
    """A server that lost its functions (restarted without persistence, FLUSHed): the
    blocking create_ready gets "Function not found", hands the submit to the async path,
    which loads the library again, and the run is created once."""
    store = ValkeyStore(own_server.url, namespace=fresh_namespace(), shard_count=4)
    await store.open()
    try:

        @workflow(registry=registry, name="wf")
        async def wf(ctx: WorkflowContext) -> None:
            return None

        client = BlockingClient(store, registry=registry)
        await asyncio.to_thread(client.submit, "wf")  # notes the workflow
        own_server.client().function_flush()
        handle = await asyncio.to_thread(client.submit, "wf")
        run = await store.get_run(handle.run_id)
        assert run is not None and run.status is RunStatus.QUEUED
        raw = store._server.client()
        assert await raw.llen(store._keys.hint("wf") + "r") == 2
    finally:
        await store.close()
