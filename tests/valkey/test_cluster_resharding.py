"""Resharding a cluster under a running store: slots move between primaries the legacy
way (CLUSTER SETSLOT IMPORTING/MIGRATING, MIGRATE key by key, SETSLOT NODE), as
``valkey-cli --cluster reshard`` does, while a worker serves runs and a client submits.
The store follows MOVED and ASK, holds its functions while their slot moves, and keeps
working afterwards without being reopened. A cluster of the module's own: the moves
change which node owns what."""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from valkey.asyncio.cluster import ClusterNode

from pyrula.workflows import RunStatus, StoreUnavailable, WorkflowClient, WorkflowContext, workflow
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.stores.valkey.cluster_client import ClusterClient
from tests.conftest import StartWorker
from tests.valkey.servers import (
    ValkeyClusterProcesses,
    ValkeyProcess,
    free_port,
    fresh_namespace,
)

from .conftest import MakeStore


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[ValkeyClusterProcesses]:
    cluster = ValkeyClusterProcesses()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture
async def open_store(own_cluster: ValkeyClusterProcesses) -> AsyncIterator[MakeStore]:
    """``await open_store(shard_count=n)``: an opened store on ``own_cluster`` in a fresh
    namespace, closed at teardown (after the test's workers stopped)."""
    built: list[ValkeyStore] = []

    async def make(**kwargs: Any) -> ValkeyStore:
        store = ValkeyStore(own_cluster.url, cluster=True, namespace=fresh_namespace(), **kwargs)
        built.append(store)
        await store.open()
        return store

    try:
        yield make
    finally:
        for store in built:
            await store.close()


class Resharder:
    """Moves one slot at a time from its primary to another, with blocking clients (run
    it in a thread): keys go over in small MIGRATE batches with a pause between them,
    so the store's calls meet every stage of the move. MIGRATE without REPLACE: a key
    already on the importing node (something written there mid-move that the source
    still held) fails the move, as it fails valkey-cli."""

    def __init__(self, cluster: ValkeyClusterProcesses, batch: int = 2, pause: float = 0.03):
        self.nodes = cluster.nodes
        self.batch = batch
        self.pause = pause
        self.ids = {node.port: self._ask(node, "CLUSTER", "MYID").decode() for node in self.nodes}

    @staticmethod
    def _ask(node: ValkeyProcess, *command: Any) -> Any:
        client = node.client()
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def slot(self, tag: str) -> int:
        return int(self._ask(self.nodes[0], "CLUSTER", "KEYSLOT", "{" + tag + "}"))

    def owner(self, slot: int) -> ValkeyProcess:
        for start, end, primary, *_ in self._ask(self.nodes[0], "CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return next(node for node in self.nodes if node.port == int(primary[1]))
        raise AssertionError(f"slot {slot} has no owner")

    def begin(self, slot: int) -> tuple[ValkeyProcess, ValkeyProcess]:
        source = self.owner(slot)
        target = next(node for node in self.nodes if node is not source)
        self._ask(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.ids[source.port])
        self._ask(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.ids[target.port])
        return source, target

    def migrate(self, slot: int, source: ValkeyProcess, target: ValkeyProcess) -> int:
        """Every key of ``slot`` to ``target``; how many."""
        moved = 0
        while keys := self._ask(source, "CLUSTER", "GETKEYSINSLOT", slot, self.batch):
            self.migrate_keys(source, target, keys)
            moved += len(keys)
            time.sleep(self.pause)
        return moved

    def migrate_keys(self, source: ValkeyProcess, target: ValkeyProcess, keys: Any) -> None:
        self._ask(source, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)

    def finish(self, slot: int, target: ValkeyProcess) -> None:
        for node in (target, *(n for n in self.nodes if n is not target)):
            self._ask(node, "CLUSTER", "SETSLOT", slot, "NODE", self.ids[target.port])

    def move(self, tag: str) -> tuple[int, int, int]:
        """Move the slot of hash tag ``tag``: (source port, target port, keys moved)."""
        slot = self.slot(tag)
        source, target = self.begin(slot)
        moved = self.migrate(slot, source, target)
        self.finish(slot, target)
        return source.port, target.port, moved


@pytest.mark.slow
async def test_cluster_reshard_while_a_worker_serves_runs(
    own_cluster: ValkeyClusterProcesses,
    open_store: MakeStore,
    registry: Registry,
    start_worker: StartWorker,
) -> None:
    """A shard's slot, the workflow's hint slot and the namespace's meta slot move while
    runs are submitted and served: every run completes once, no finished step runs
    again, and the same store works afterwards."""
    store = await open_store(shard_count=2)
    namespace = store.namespace
    executed: collections.Counter[tuple[str, str]] = collections.Counter()

    @workflow(registry=registry, name="hop")
    async def hop(ctx: WorkflowContext, n: int) -> int:
        def first() -> int:
            executed[ctx.run_id, "a"] += 1
            return n + 1

        def second() -> int:
            executed[ctx.run_id, "b"] += 1
            return a * 2

        a = int(await ctx.step("a", first))
        await asyncio.sleep(0.02)
        return int(await ctx.step("b", second))

    resharder = Resharder(own_cluster)
    tags = [f"{namespace}:0", f"{namespace}:w:hop", f"{namespace}:meta"]
    owners = {tag: resharder.owner(resharder.slot(tag)).port for tag in tags}
    await start_worker(store, [hop], max_concurrent_runs=10, lock_ttl=6.0)
    client = WorkflowClient(store, registry=registry)
    handles = {n: await client.submit("hop", {"n": n}) for n in range(20)}
    numbers = itertools.count(len(handles))
    moving = asyncio.ensure_future(asyncio.to_thread(lambda: [resharder.move(tag) for tag in tags]))

    async def submit() -> None:  # through every stage of the moves
        while not moving.done():
            n = next(numbers)
            handles[n] = await client.submit("hop", {"n": n})
            await asyncio.sleep(0.01)

    await asyncio.gather(*(submit() for _ in range(4)))
    for tag, (source, target, keys) in zip(tags, await moving, strict=True):
        assert source == owners[tag] and keys > 0
        assert resharder.owner(resharder.slot(tag)).port == target != source
    assert len(handles) > 30  # the moves took a while: submits met them

    results = await asyncio.gather(*(h.result(timeout=60) for h in handles.values()))
    assert results == [(n + 1) * 2 for n in handles]
    assert set(executed.values()) == {1}  # no step ran twice
    assert len(executed) == 2 * len(handles)
    for handle in handles.values():
        journal = await store.load_journal(handle.run_id)
        assert [(e.name, e.attempts) for e in journal if e.kind == "step"] == [
            ("a", 1),
            ("b", 1),
        ]

    # The same store, never reopened, on the new owners.
    late = await client.submit("hop", {"n": 1000})
    assert await late.result(timeout=20) == 2002
    runs = await store.list_runs(workflow="hop", limit=1000)
    assert len(runs) == len(handles) + 1
    assert {run.status for run in runs} == {RunStatus.COMPLETED}
    assert store.data_loss == []


@pytest.mark.slow
async def test_cluster_calls_during_one_slot_migration(
    own_cluster: ValkeyClusterProcesses, open_store: MakeStore, registry: Registry
) -> None:
    """Mid-move: a run's record already on the importing node is read there (ASKING on
    the connection that sends the read, even with many pooled connections); a function
    on the moving slot waits until the move ends (it would see only part of the slot on
    either node), then runs on the new owner."""
    store = await open_store(shard_count=1)
    resharder = Resharder(own_cluster)
    slot = resharder.slot(f"{store.namespace}:0")
    client = WorkflowClient(store, registry=registry)

    @workflow(registry=registry, name="idle")
    async def idle(ctx: WorkflowContext) -> None:
        return None

    handles = [await client.submit("idle", {}) for _ in range(3)]
    source, target = await asyncio.to_thread(resharder.begin, slot)
    # Several idle connections to the importing node, as a busy worker has.
    near = next(f"k{i}" for i in range(100_000) if _owner(store, f"k{i}") == target.port)
    await asyncio.gather(*(store._server.command("GET", near) for _ in range(8)))
    record = store._keys.run(handles[0].run_id)
    await asyncio.to_thread(resharder.migrate_keys, source, target, [record])

    run = await store.get_run(handles[0].run_id)  # ASK: read on the importing node
    assert run is not None and run.status is RunStatus.QUEUED
    cancelling = asyncio.ensure_future(store.cancel_run(handles[0].run_id))
    await asyncio.sleep(0.5)
    assert not cancelling.done()  # held while the slot moves, not run on half of it

    await asyncio.to_thread(resharder.migrate, slot, source, target)
    await asyncio.to_thread(resharder.finish, slot, target)
    cancelled = await asyncio.wait_for(cancelling, 15)
    assert cancelled.status is RunStatus.CANCELLED
    assert _owner(store, record) == target.port  # the slot table was read again
    for handle in handles[1:]:
        run = await store.get_run(handle.run_id)
        assert run is not None and run.status is RunStatus.QUEUED
    assert store.data_loss == []


def _owner(store: ValkeyStore, key: str) -> int:
    return int(store._server.client().get_node_from_key(key).port)


async def test_cluster_client_reads_its_nodes_again_from_the_url(make_store: MakeStore) -> None:
    """A client whose every known node is gone (here: replaced by a dead address) is
    rebuilt from the store's URL on the first failure, instead of failing for ever."""
    store = await make_store("cluster", shard_count=2)
    await store.list_runs()
    client = store._server.client()
    manager = client.nodes_manager
    dead = ClusterNode("127.0.0.1", free_port(), "primary", **manager.connection_kwargs)
    known = [*manager.nodes_cache.values(), *manager.startup_nodes.values()]
    manager.nodes_cache.clear()
    manager.startup_nodes.clear()
    manager.nodes_cache[dead.name] = manager.startup_nodes[dead.name] = dead
    manager.slots_cache = {slot: [dead] for slot in manager.slots_cache}
    manager.default_node = dead
    try:
        with pytest.raises(StoreUnavailable):  # sent to the dead node: never resent
            await store.list_runs()
        assert await store.list_runs() == []
        assert dead.name not in manager.nodes_cache and len(client.get_primaries()) == 3
    finally:
        for node in known:
            await node.disconnect()


SPLIT_LIBRARY = """#!lua name=pyrula_test_split
redis.register_function('both', function(keys, args)
  return {redis.call('GET', keys[1]), redis.call('GET', args[1])}
end)
"""


@pytest.mark.slow
async def test_cluster_client_waits_out_keys_split_by_a_move(
    own_cluster: ValkeyClusterProcesses,
) -> None:
    """Keys of one slot on both sides of a move: a multi-key command (TRYAGAIN) and a
    function reading a key it does not declare ("non local key") wait until the move
    ends, then get both values; a single-key read of the moved key follows ASK."""
    tag = "{" + fresh_namespace() + "}"
    resharder = Resharder(own_cluster)
    slot = resharder.slot(tag[1:-1])
    client = ClusterClient.from_url(own_cluster.url)
    try:
        await client.initialize()
        await client.execute_command(
            "FUNCTION", "LOAD", "REPLACE", SPLIT_LIBRARY, target_nodes=client.get_primaries()
        )
        await client.set(tag + "a", "A")
        await client.set(tag + "b", "B")
        source, target = await asyncio.to_thread(resharder.begin, slot)
        await asyncio.to_thread(resharder.migrate_keys, source, target, [tag + "b"])

        source_node = client.get_node_from_key(tag)
        assert await client.get(tag + "b") == b"B"  # ASK
        several = asyncio.ensure_future(client.execute_command("MGET", tag + "a", tag + "b"))
        script = asyncio.ensure_future(  # routed by its key, as the store routes FCALLs
            client.execute_command(
                "FCALL", "both", 1, tag + "a", tag + "b", target_nodes=source_node
            )
        )
        await asyncio.sleep(0.3)
        assert not several.done() and not script.done()

        await asyncio.to_thread(resharder.migrate, slot, source, target)
        await asyncio.to_thread(resharder.finish, slot, target)
        assert await asyncio.wait_for(several, 10) == [b"A", b"B"]
        assert await asyncio.wait_for(script, 10) == [b"A", b"B"]
        owner = client.get_node_from_key(tag)
        assert owner is not None and owner.port == target.port
    finally:
        await client.aclose()
