"""Shard leases: spread over the live workers, handed over at once on a clean stop and
after the TTL on a crash; claims prefer the worker's own shards. Then real worker
processes: kill -9 mid-run, and a clean stop, on one Valkey."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.workflows import WorkflowClient
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.chaos.harness import Cluster
from tests.fixtures.chaos_workflows import WORKFLOW, expected_result
from tests.stores.helpers import TTL, create

from .conftest import MakeStore

SHARDS = 8


async def eventually_holds(store: ValkeyStore, worker: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        held = [s for s, w in (await store.shard_holders()).items() if w == worker]
        if len(held) == count:
            return
        assert time.monotonic() < deadline, (worker, held, await store.shard_holders())
        await asyncio.sleep(0.05)


async def test_leases_spread_rebalance_and_hand_over(make_store: MakeStore, topology: str) -> None:
    a = await make_store(
        topology, shard_count=SHARDS, shard_lease_ttl=1.0, shard_lease_interval=0.3
    )
    b = await make_store(
        topology,
        namespace=a.namespace,
        shard_count=SHARDS,
        shard_lease_ttl=1.0,
        shard_lease_interval=0.3,
    )
    assert len(await a.lease_shards("a")) == SHARDS  # alone: it takes every shard
    assert await b.lease_shards("b") == frozenset()  # nothing free yet
    mine = await a.lease_shards("a")  # two live workers: a gives half back
    assert len(mine) == SHARDS // 2
    theirs = await b.lease_shards("b")
    assert len(theirs) == SHARDS // 2 and not mine & theirs
    assert a.owned_shards("a") == mine

    # A clean stop hands its shards over at once.
    await a.release_shards("a")
    assert len(await b.lease_shards("b")) == SHARDS

    # A crash: the leases stay until their TTL, then the survivor takes them.
    mine = await a.lease_shards("a")
    await b.lease_shards("b")
    mine = await a.lease_shards("a")
    assert len(mine) == SHARDS // 2  # a holds half again... and now "crashes"
    assert len(await b.lease_shards("b")) == SHARDS // 2
    await asyncio.sleep(1.1)
    assert len(await b.lease_shards("b")) == SHARDS


@pytest.mark.parametrize("topology", ["single", "cluster"])
async def test_claims_take_from_the_workers_own_shards_first(
    make_store: MakeStore, topology: str
) -> None:
    store = await make_store(topology, shard_count=SHARDS)
    other = await make_store(topology, namespace=store.namespace, shard_count=SHARDS)
    for _ in range(60):
        # Due before they were submitted: on a single node, runs due at submission wait
        # in the workflow's ready list (lua/common.lua list_entry), outside the shards.
        await create(store, start_at=time.time() - 1)
    await store.lease_shards("a")
    await other.lease_shards("b")
    own = await store.lease_shards("a")
    assert len(own) == SHARDS // 2
    queued_on_own = sum(
        1 for run in await store.list_runs(limit=100) if store._keys.shard_of(run.run_id) in own
    )
    first = []
    for _ in range(queued_on_own):
        first += await store.claim_runs("a", ["wf"], 1, TTL)
    assert {store._keys.shard_of(lease.run_id) for lease in first} <= own
    rest = await store.claim_runs("a", ["wf"], 100, TTL)  # then from any shard
    assert len(first) + len(rest) == 60


# -- real worker processes -----------------------------------------------------------
@pytest.fixture
def processes(tmp_path: Path, valkey_server: object) -> Iterator[Cluster]:
    """Worker processes (tests/fixtures/run_worker.py) on the session's Valkey server, in
    a fresh namespace with fast shard leases; all SIGKILLed and reaped at teardown."""
    from tests.valkey.servers import ValkeyProcess, fresh_namespace

    assert isinstance(valkey_server, ValkeyProcess)
    cluster = Cluster(tmp_path)
    cluster.url = (
        f"{valkey_server.url}/0?namespace={fresh_namespace()}&shard_count={SHARDS}"
        "&shard_lease_ttl=2&shard_lease_interval=0.5"
    )
    try:
        yield cluster
    finally:
        cluster.kill_all()


@pytest.mark.slow
async def test_kill_minus_nine_mid_run_recovers_without_rerunning_steps(
    processes: Cluster,
) -> None:
    from pyrula.workflows import open_store

    store = open_store(processes.url)
    assert isinstance(store, ValkeyStore)
    try:
        a, b = processes.start_worker("a"), processes.start_worker("b")
        await processes.wait_ready(store, a, b)
        client = WorkflowClient(store)
        handle = await client.submit(WORKFLOW, {"n": 5, "delays": [0.05, 3.0, 0.05]})
        line = await processes.wait_ledger(
            lambda x: x["run_id"] == handle.run_id and x["step"] == "double", timeout=15
        )
        victim = processes.by_pid(line["pid"])
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        assert victim.wait(5) == -signal.SIGKILL
        assert await handle.result(timeout=30) == expected_result(5)
        # The guarantee: the run is taken over within lock_ttl (2 s) + one orphan scan
        # (0.5 s) and its 3 s step run again; generous for a loaded machine (x3 + 1 s).
        assert time.monotonic() - killed_at < (2.0 + 0.5 + 3.0) * 3 + 1
        starts = [x for x in processes.ledger() if x["phase"] == "start"]
        by_step = {s: [x["pid"] for x in starts if x["step"] == s] for s in
                   ("add_seven", "double", "minus_three")}  # fmt: skip
        assert by_step["add_seven"] == [victim.pid]  # journaled: never ran again
        assert len(by_step["double"]) == 2 and by_step["double"][0] == victim.pid
        assert len(by_step["minus_three"]) == 1
        survivor = a if victim is b else b
        # The dead worker's shards go to the survivor once their TTL (2 s) lapses.
        await eventually_holds(store, survivor.worker_id, SHARDS, timeout=10)
    finally:
        await store.close()


@pytest.mark.slow
async def test_a_clean_stop_hands_the_shards_over_at_once(processes: Cluster) -> None:
    from pyrula.workflows import open_store

    store = open_store(processes.url)
    assert isinstance(store, ValkeyStore)
    try:
        a, b = processes.start_worker("a"), processes.start_worker("b")
        await processes.wait_ready(store, a, b)
        await eventually_holds(store, a.worker_id, SHARDS // 2, timeout=10)
        await eventually_holds(store, b.worker_id, SHARDS // 2, timeout=10)
        os.kill(a.pid, signal.SIGTERM)
        assert a.wait(15) == 0
        holders = await store.shard_holders()
        assert a.worker_id not in holders.values(), holders  # released, not left to lapse
        # Taken by the survivor (how soon measures only the machine's load: that the
        # stopped worker released them, above, is what a clean stop guarantees).
        await eventually_holds(store, b.worker_id, SHARDS, timeout=15)
    finally:
        await store.close()
