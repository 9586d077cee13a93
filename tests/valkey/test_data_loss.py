"""Data loss on a server that keeps running (FLUSHALL, FLUSHDB) and on a cluster (flushed,
or one node restarted without persistence): reported loudly within a bounded number of
calls, once, and the store carries on. (A single node restarted without persistence:
test_restart.py.)"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import pytest

from pyrula.workflows import (
    RunStatus,
    StoreUnavailable,
    WorkflowClient,
    WorkflowContext,
    workflow,
)
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores.valkey import ValkeyStore, dataloss
from tests.conftest import StartWorker
from tests.stores.helpers import COMPLETED, TTL, claim_one, create
from tests.valkey.servers import ValkeyClusterProcesses, ValkeyProcess, fresh_namespace

pytestmark = pytest.mark.slow
BOUND = dataloss.CHECK_EVERY_CALLS + 1
"""Calls within which a loss nothing else shows must be reported."""


@pytest.fixture
def server() -> Iterator[ValkeyProcess]:
    """A server of this test's own: it gets flushed."""
    process = ValkeyProcess()
    process.start()
    try:
        yield process
    finally:
        process.cleanup()


@pytest.fixture(scope="module")
def cluster() -> Iterator[ValkeyClusterProcesses]:
    """A three-node cluster of this module's own: it gets flushed and a node restarted."""
    for attempt in (1, 2):  # a fresh set of ports if the first never formed a cluster
        processes = ValkeyClusterProcesses()
        try:
            processes.start()
            break
        except RuntimeError:
            print(f"cluster start, attempt {attempt}:", *map(cluster_info, processes.nodes))
            processes.cleanup()
            if attempt == 2:
                raise
    try:
        yield processes
    finally:
        processes.cleanup()


def cluster_info(node: ValkeyProcess) -> str:
    raw = node.client()
    try:
        info = raw.execute_command("CLUSTER", "INFO")
        nodes = raw.execute_command("CLUSTER", "NODES")
    except Exception as exc:  # diagnostics only
        return f"{node.port}: {exc!r}"
    finally:
        raw.close()
    return f"\n{node.port}:\n{info!r}\n{nodes!r}"


async def reported_within(store: ValkeyStore, calls: int, *, run_id: str) -> tuple[int, str]:
    """Make ordinary calls (none of which fails on its own after a flush) until one
    raises StoreUnavailable: (how many calls it took, the message)."""
    for made in range(1, calls + 1):
        try:
            if made % 2:
                assert await store.get_run(run_id) is None
            else:
                await store.claim_runs("w", ["other"], 1, TTL)
        except StoreUnavailable as exc:
            return made, str(exc)
    pytest.fail(f"no data loss reported within {calls} calls")


def assert_flush_message(message: str, url: str) -> None:
    assert message.startswith(f"Valkey at {url} LOST ITS DATA"), message
    assert "FLUSHALL or FLUSHDB" in message and "kept running" in message, message


@pytest.mark.parametrize("flush", ["FLUSHALL", "FLUSHDB"])
async def test_a_flush_is_reported_within_a_bounded_number_of_calls(
    server: ValkeyProcess, flush: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = ValkeyStore(server.url, namespace=fresh_namespace(), shard_count=4)
    raw = server.client()
    try:
        run_id = await create(store)
        await store.claim_runs("w", ["other"], 1, TTL)
        raw.execute_command(flush)
        with caplog.at_level(logging.ERROR):
            made, message = await reported_within(store, BOUND, run_id=run_id)
        assert made <= BOUND
        assert_flush_message(message, server.url)
        assert store.data_loss == [message]
        assert any("LOST ITS DATA" in r.getMessage() for r in caplog.records)
        # Once: the store opens again (shard count, markers) and carries on.
        new = await create(store)
        assert (await store.get_run(new)).status is RunStatus.QUEUED  # type: ignore[union-attr]
        for _ in range(BOUND):
            await store.get_run(new)
        assert len(store.data_loss) == 1
        assert raw.hget(f"{store.namespace}:{{{store.namespace}:meta}}:m", "shards") == b"4"
    finally:
        raw.close()
        await store.close()


async def test_a_call_that_finds_its_run_gone_reports_the_flush_itself(
    server: ValkeyProcess,
) -> None:
    """A worker's write for a run it holds is the first call to notice: it raises the
    data loss, not a bare RunNotFound or LeaseLost."""
    store = ValkeyStore(server.url, namespace=fresh_namespace(), shard_count=4)
    raw = server.client()
    try:
        await create(store)
        lease = await claim_one(store)
        raw.flushall()
        with pytest.raises(StoreUnavailable, match="LOST ITS DATA") as caught:
            await store.finish_run(lease.run_id, lease.token, COMPLETED)
        assert_flush_message(str(caught.value), server.url)
        assert len(store.data_loss) == 1
    finally:
        raw.close()
        await store.close()


async def test_a_flush_is_reported_after_a_while_however_few_the_calls(
    server: ValkeyProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dataloss, "CHECK_EVERY_SECONDS", 0.3)
    store = ValkeyStore(server.url, namespace=fresh_namespace(), shard_count=4)
    raw = server.client()
    try:
        run_id = await create(store)
        raw.flushall()
        await asyncio.sleep(0.4)
        with pytest.raises(StoreUnavailable, match="LOST ITS DATA"):
            await store.get_run(run_id)  # the first call after the interval
    finally:
        raw.close()
        await store.close()


async def test_markers_written_again_by_a_newer_process_still_show_the_loss(
    server: ValkeyProcess,
) -> None:
    """A process that opened after the flush wrote the markers anew (it saw no loss: it
    was not there). One that lived through it still sees values it never knew."""
    namespace = fresh_namespace()
    old = ValkeyStore(server.url, namespace=namespace, shard_count=4)
    raw = server.client()
    try:
        run_id = await create(old)
        raw.flushall()
        new = ValkeyStore(server.url, namespace=namespace, shard_count=4)
        try:
            await new.open()
            await create(new)
            _, message = await reported_within(old, BOUND, run_id=run_id)
            assert_flush_message(message, server.url)
            assert new.data_loss == []
        finally:
            await new.close()
    finally:
        raw.close()
        await old.close()


async def test_a_worker_reports_a_flush_and_carries_on(
    server: ValkeyProcess, registry: Registry, start_worker: StartWorker
) -> None:
    store = ValkeyStore(server.url, namespace=fresh_namespace(), shard_count=4)
    in_step, release = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        in_step.set()
        await release.wait()
        return "late"

    @workflow(registry=registry, name="held")
    async def held(ctx: WorkflowContext) -> str:
        return str(await ctx.step("slow", slow))

    @workflow(registry=registry, name="echo")
    async def echo(ctx: WorkflowContext, word: str) -> str:
        return str(await ctx.step("upper", lambda: word.upper()))

    raw = server.client()
    try:
        await store.open()
        await start_worker(store, [held, echo])
        client = WorkflowClient(store, registry=registry)
        await client.submit("held", {})
        await asyncio.wait_for(in_step.wait(), 10)
        raw.flushall()  # the run in flight is gone with the rest
        release.set()  # its step's result is written next: that call finds the loss
        deadline = time.monotonic() + 10
        while not store.data_loss:
            assert time.monotonic() < deadline, "the worker never reported the flush"
            await asyncio.sleep(0.05)
        assert_flush_message(store.data_loss[0], server.url)
        handle = await client.submit("echo", {"word": "after"})
        assert await handle.result(timeout=20) == "AFTER"
        assert len(store.data_loss) == 1
    finally:
        raw.close()
        await store.close()


# -- cluster ---------------------------------------------------------------------------
def node_of(cluster: ValkeyClusterProcesses, key: str) -> ValkeyProcess:
    """The node serving ``key``'s slot (the fixture gives each node a third, in order)."""
    raw = cluster.nodes[0].client()
    try:
        slot = int(raw.execute_command("CLUSTER", "KEYSLOT", key))
    finally:
        raw.close()
    per = 16384 // len(cluster.nodes)
    return cluster.nodes[min(slot // per, len(cluster.nodes) - 1)]


def cluster_ok(cluster: ValkeyClusterProcesses) -> bool:
    for node in cluster.nodes:
        raw = node.client()
        try:
            if not cluster._ok(raw):
                return False
        finally:
            raw.close()
    return True


async def runs_on(
    store: ValkeyStore, node: ValkeyProcess, other: ValkeyProcess, cluster: ValkeyClusterProcesses
) -> tuple[str, str]:
    """A run on ``node`` and one on ``other``."""
    found: dict[int, str] = {}
    while len(found) < 2:
        run_id = await create(store)
        owner = node_of(cluster, store._keys.run(run_id))
        if owner is node:
            found.setdefault(0, run_id)
        elif owner is other:
            found.setdefault(1, run_id)
    return found[0], found[1]


async def test_one_flushed_cluster_node_is_reported(cluster: ValkeyClusterProcesses) -> None:
    store = ValkeyStore(cluster.url, cluster=True, namespace=fresh_namespace(), shard_count=8)
    flushed, kept = cluster.nodes[2], cluster.nodes[1]
    try:
        lost_run, kept_run = await runs_on(store, flushed, kept, cluster)
        raw = flushed.client()
        try:
            raw.flushall()  # that node only: the other two keep their data
        finally:
            raw.close()
        _, message = await reported_within(store, BOUND, run_id=lost_run)
        assert_flush_message(message, cluster.url)
        marker = message.split("marker key ")[1].split("'")[1]
        assert node_of(cluster, marker) is flushed  # it names a marker of that node
        assert await store.get_run(lost_run) is None
        assert (await store.get_run(kept_run)).status is RunStatus.QUEUED  # type: ignore[union-attr]
        new = await create(store)
        assert await store.get_run(new) is not None
        assert len(store.data_loss) == 1
    finally:
        await store.close()


async def test_a_flushed_cluster_is_reported_to_a_worker_holding_a_run(
    cluster: ValkeyClusterProcesses,
) -> None:
    store = ValkeyStore(cluster.url, cluster=True, namespace=fresh_namespace(), shard_count=8)
    try:
        await create(store)
        lease = await claim_one(store)
        for node in cluster.nodes:  # FLUSHALL reaches one node: a cluster needs each
            raw = node.client()
            try:
                raw.flushall()
            finally:
                raw.close()
        with pytest.raises(StoreUnavailable, match="LOST ITS DATA"):
            await store.finish_run(lease.run_id, lease.token, COMPLETED)
        assert len(store.data_loss) == 1
        await create(store)
    finally:
        await store.close()


async def test_a_cluster_node_restarted_without_persistence_is_reported(
    cluster: ValkeyClusterProcesses,
) -> None:
    """The node keeps its identity and slots (nodes.conf survives in its directory) but
    not its data or its function library: the store says so, loads the library there
    again and carries on."""
    store = ValkeyStore(cluster.url, cluster=True, namespace=fresh_namespace(), shard_count=8)
    restarted, kept = cluster.nodes[1], cluster.nodes[2]
    try:
        lost_run, kept_run = await runs_on(store, restarted, kept, cluster)
        restarted.restart()  # SIGKILL, then a fresh process on the same port and directory
        deadline = time.monotonic() + 30
        while not cluster_ok(cluster):
            assert time.monotonic() < deadline, "the cluster did not recover"
            await asyncio.sleep(0.1)
        seen: list[str] = []
        while not any("LOST ITS DATA" in message for message in seen):
            assert time.monotonic() < deadline, f"no data loss reported: {seen}"
            try:
                await store.get_run(lost_run)
                await create(store)
            except StoreUnavailable as exc:
                seen.append(str(exc))
                await asyncio.sleep(0.1)
        assert "run_id changed" in store.data_loss[0]
        assert len(store.data_loss) == 1
        assert await store.get_run(lost_run) is None
        assert (await store.get_run(kept_run)).status is RunStatus.QUEUED  # type: ignore[union-attr]
        # The library is back on the restarted node: calls on its shards work.
        for _ in range(8):
            run_id = await create(store)
            assert await store.get_run(run_id) is not None
        assert len(store.data_loss) == 1
    finally:
        await store.close()
