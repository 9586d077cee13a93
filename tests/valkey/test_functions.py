"""The Lua function library: content-addressed builds side by side, pruning with the
tombstone, and loading it again on a node that lost it."""

from __future__ import annotations

import pytest
import valkey

from pyrula.workflows import StoreUnavailable
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.stores.valkey.functions import (
    build_library,
    library,
    prune_stale_function_libraries,
    upgrade_scripts,
)
from pyrula.workflows.stores.valkey.keys import TOMBSTONE
from tests.stores.helpers import TTL, create
from tests.valkey.servers import ValkeyClusterProcesses, ValkeyProcess, fresh_namespace

from .conftest import MakeStore

OLD_BUILD = build_library("-- an older pyrula build\n")


def libraries(client: valkey.Valkey) -> set[str]:
    listing = client.execute_command("FUNCTION", "LIST", "LIBRARYNAME", "pyrula_*")
    return {dict(zip(e[::2], e[1::2], strict=False))[b"library_name"].decode() for e in listing}


async def old_build_store(url: str, namespace: str, **kwargs: object) -> ValkeyStore:
    store = ValkeyStore(url, namespace=namespace, **kwargs)  # type: ignore[arg-type]
    store._server.lib = OLD_BUILD
    await store.open()
    return store


def test_the_library_is_content_addressed() -> None:
    lib = library()
    assert lib.name.startswith("pyrula_") and len(lib.name) == len("pyrula_") + 16
    assert build_library() == lib
    assert OLD_BUILD.name != lib.name and OLD_BUILD.name.startswith("pyrula_")
    assert f"#!lua name={lib.name}\n" in lib.source
    assert lib.function("claim") == f"{lib.name}_claim"


async def test_two_builds_share_one_server_then_the_old_one_is_pruned(
    own_server: ValkeyProcess,
) -> None:
    namespace = fresh_namespace()
    new = ValkeyStore(own_server.url, namespace=namespace, shard_count=4)
    await new.open()
    old = await old_build_store(own_server.url, namespace, shard_count=4)
    raw = own_server.client()
    try:
        assert {library().name, OLD_BUILD.name} <= libraries(raw)
        # A rolling deploy: each build calls its own functions on the same data.
        from_old = await create(old)
        from_new = await create(new)
        claimed = {lease.run_id for lease in await old.claim_runs("w-old", ["wf"], 1, TTL)}
        claimed |= {lease.run_id for lease in await new.claim_runs("w-new", ["wf"], 1, TTL)}
        assert claimed == {from_old, from_new}

        assert upgrade_scripts(own_server.url, prune_stale=True) == [OLD_BUILD.name]
        assert libraries(raw) == {library().name}
        assert raw.sismember(TOMBSTONE, OLD_BUILD.name)
        # The old build fails loudly instead of loading its library back...
        with pytest.raises(StoreUnavailable, match="pruned"):
            await create(old)
        with pytest.raises(StoreUnavailable, match="pruned"):
            await old_build_store(own_server.url, fresh_namespace())
        assert libraries(raw) == {library().name}
        # ...while the current one carries on; pruning again finds nothing.
        run = await new.get_run(from_old)
        assert run is not None and run.status is RunStatus.RUNNING
        await create(new)
        assert upgrade_scripts(own_server.url) == []
    finally:
        raw.close()
        await old.close()
        await new.close()


async def test_upgrade_scripts_loads_without_pruning(own_server: ValkeyProcess) -> None:
    old = await old_build_store(own_server.url, fresh_namespace())
    raw = own_server.client()
    try:
        assert upgrade_scripts(own_server.url, prune_stale=False) == []
        assert libraries(raw) == {library().name, OLD_BUILD.name}
        await create(old)  # nothing was pruned
    finally:
        raw.close()
        await old.close()


async def test_prune_stale_function_libraries_is_the_pruning_upgrade(
    own_server: ValkeyProcess,
) -> None:
    old = await old_build_store(own_server.url, fresh_namespace())
    raw = own_server.client()
    try:
        assert prune_stale_function_libraries(own_server.url) == [OLD_BUILD.name]
        assert libraries(raw) == {library().name}
        assert raw.sismember(TOMBSTONE, OLD_BUILD.name)
        with pytest.raises(StoreUnavailable, match="pruned"):
            await create(old)
    finally:
        raw.close()
        await old.close()


async def test_a_node_that_lost_the_library_gets_it_again(make_store: MakeStore) -> None:
    store = await make_store("single", shard_count=4)
    raw = store._server.client()
    await raw.execute_command("FUNCTION", "DELETE", library().name)
    run_id = await create(store)  # "Function not found": loaded again, call retried
    assert (await store.get_run(run_id)) is not None
    assert store.data_loss == []  # the data is all there: no alarm


async def test_a_cluster_node_that_lost_the_library(make_store: MakeStore) -> None:
    store = await make_store("cluster", shard_count=4)
    cluster: ValkeyClusterProcesses = store_cluster(store)
    run_id = "r-lost-lib"
    slot_node = store._server.client().get_node_from_key(store._keys.run(run_id))
    node = next(n for n in cluster.nodes if n.port == slot_node.port)
    raw = node.client()
    try:
        raw.execute_command("FUNCTION", "DELETE", library().name)
        assert library().name not in libraries(raw)
        await create(store, run_id=run_id)
        assert library().name in libraries(raw)
        assert store.data_loss == []
    finally:
        raw.close()


async def test_upgrade_scripts_on_a_cluster(make_store: MakeStore) -> None:
    store = await make_store("cluster", shard_count=4)
    cluster = store_cluster(store)
    assert upgrade_scripts(cluster.url, prune_stale=False, cluster=True) == []
    for node in cluster.nodes:
        raw = node.client()
        try:
            assert library().name in libraries(raw)
        finally:
            raw.close()


def store_cluster(store: ValkeyStore) -> ValkeyClusterProcesses:
    from tests.valkey import servers

    instance = servers._cluster._instance
    assert isinstance(instance, ValkeyClusterProcesses)
    assert store.url == instance.url
    return instance
