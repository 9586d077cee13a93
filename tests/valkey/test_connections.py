"""Idle waits that get cancelled keep their connections: counted by the server itself
(``INFO stats`` total_connections_received), on a single node and a cluster."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator

import pytest

from pyrula.workflows import WorkflowClient, WorkflowContext, workflow
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.stores.valkey.clients import PARK_LIMIT, droppable
from tests.conftest import StartWorker
from tests.stores.helpers import COMPLETED, TTL, create
from tests.valkey.servers import ValkeyClusterProcesses, ValkeyProcess, fresh_namespace

from .conftest import MakeStore

ROUNDS = 20


@pytest.fixture
def received(request: pytest.FixtureRequest, topology: str) -> Iterator[Callable[[], int]]:
    """``received()``: connections the server (every node of the cluster) accepted so
    far, read on connections opened once, beforehand."""
    if topology == "cluster":
        cluster: ValkeyClusterProcesses = request.getfixturevalue("valkey_cluster")
        clients = [node.client() for node in cluster.nodes]
    else:
        clients = [request.getfixturevalue("valkey_server").client()]

    def count() -> int:
        return sum(int(c.info("stats")["total_connections_received"]) for c in clients)

    count()  # each client connects now
    try:
        yield count
    finally:
        for client in clients:
            client.close()


async def cancel_after(waiting: Awaitable[object], seconds: float) -> None:
    task = asyncio.ensure_future(waiting)
    await asyncio.sleep(seconds)
    assert not task.done()  # still blocked on the server when cancelled
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def new_connections(
    received: Callable[[], int], wait: Callable[[], Awaitable[object]]
) -> int:
    """Connections opened over ROUNDS waits each cancelled while blocked (the wait blocks
    0.15 s on the server; the next one starts after that, as a worker's next idle wait
    comes after some work)."""
    before = received()
    for _ in range(ROUNDS):
        await cancel_after(wait(), 0.05)
        await asyncio.sleep(0.12)
    got = received() - before
    print(f"{got} new connections over {ROUNDS} cancelled waits")
    return got


def test_only_waits_that_consume_no_data_are_parked() -> None:
    assert droppable(("BLPOP", "ns:{ns:w:wf}:wake", "0.100"))
    assert droppable(("BLPOP", "ns:{ns:w:a}:wake", "ns:{ns:w:b}:wake", "1"))
    assert droppable(("BLMOVE", "ns:{ns:3}:z:r1", "ns:{ns:3}:z:r1", "RIGHT", "LEFT", "1"))
    # Anything that would pop or move real data is dropped with its connection instead.
    assert not droppable(("BLPOP", "ns:{ns:3}:g:2:r1:go", "1"))
    assert not droppable(("BLPOP", "ns:{ns:w:wf}:wake", "ns:{ns:3}:q", "1"))
    assert not droppable(("BLMOVE", "ns:{ns:3}:z:r1", "ns:{ns:3}:z:r2", "RIGHT", "LEFT", "1"))
    assert not droppable(("BRPOPLPUSH", "a", "a", "1"))
    assert not droppable(("BZPOPMIN", "ns:{ns:w:wf}:wake", "1"))


async def test_cancelled_idle_waits_reuse_their_connections(
    make_store: MakeStore, topology: str, received: Callable[[], int]
) -> None:
    store = await make_store(topology, shard_count=4)
    await store.claim_runs("w", ["idle"], 1, TTL)  # the workflow is noted: no first-use calls

    async def wait() -> None:
        await store.wait_for_work(["idle"], 0.15)

    await wait()  # the connection pool is warm
    # The old way (nothing parked: a cancelled read closes its connection), for scale.
    store._server.parking.limit = 0
    assert await new_connections(received, wait) >= ROUNDS * 2 // 3
    store._server.parking.limit = PARK_LIMIT
    assert await new_connections(received, wait) <= 4
    # Waking still works: a new run ends the wait long before its timeout.
    waiting = asyncio.ensure_future(store.wait_for_work(["idle"], 30))
    await asyncio.sleep(0.05)
    await create(store, workflow="idle")
    await asyncio.wait_for(waiting, 5)


async def test_cancelled_result_waits_reuse_their_connections(
    make_store: MakeStore, topology: str, received: Callable[[], int]
) -> None:
    store = await make_store(topology, shard_count=4)
    run_id = await create(store)

    def wait() -> Awaitable[object]:
        return store.wait_run(run_id, 0.15)

    await wait()
    assert await new_connections(received, wait) <= 4
    # The parked BLMOVEs rotated the completion list in place: ending the run still
    # wakes a waiter at once.
    waiting = asyncio.ensure_future(store.wait_run(run_id, 30))
    await asyncio.sleep(0.05)
    [lease] = await store.claim_runs("w", ["wf"], 1, TTL)
    await store.finish_run(lease.run_id, lease.token, COMPLETED)
    run = await asyncio.wait_for(waiting, 5)
    assert run.result == '"done"'


async def test_an_idle_worker_does_not_reconnect(
    make_store: MakeStore,
    topology: str,
    received: Callable[[], int],
    registry: Registry,
    start_worker: StartWorker,
) -> None:
    """The timer loop wakes the claimers every timer_poll_interval_s (here 0.05 s), which
    cancels their BLPOP: that used to cost a reconnect each time."""
    store = await make_store(topology, shard_count=4)

    @workflow(registry=registry, name="quiet")
    async def quiet(ctx: WorkflowContext) -> str:
        return str(await ctx.step("s", lambda: "ok"))

    await start_worker(store, [quiet])
    client = WorkflowClient(store, registry=registry)
    assert await (await client.submit("quiet", {})).result(10) == "ok"
    await asyncio.sleep(0.5)  # every loop of the worker is running and idle
    before = received()
    await asyncio.sleep(2.0)  # about 40 wake-ups of the claim loop
    got = received() - before
    print(f"an idle worker opened {got} connections in 2 s")
    assert got <= 3
    assert await (await client.submit("quiet", {})).result(10) == "ok"


async def test_a_server_that_never_answers_leaks_no_connection(
    own_server: ValkeyProcess,
) -> None:
    store = ValkeyStore(
        own_server.url, namespace=fresh_namespace(), shard_count=4, socket_timeout=1
    )
    raw = own_server.client()
    try:
        await store.claim_runs("w", ["idle"], 1, TTL)
        raw.execute_command("CLIENT", "PAUSE", 30000, "ALL")  # nothing is answered
        started = time.monotonic()
        await cancel_after(store.wait_for_work(["idle"], 0.3), 0.1)
        assert len(store._server.parking) == 1
        # The parked wait gives up at its own limit (0.3 s + socket_timeout), closing its
        # connection, long before the server answers (30 s; generous: x3 + 1 s).
        while len(store._server.parking):
            assert time.monotonic() - started < (0.3 + 1) * 3 + 1, "the parked wait never gave up"
            await asyncio.sleep(0.05)
        raw.execute_command("CLIENT", "UNPAUSE")
        assert await store.claim_runs("w", ["idle"], 1, TTL) == []  # and the store works on
    finally:
        raw.close()
        await store.close()


async def test_close_ends_parked_waits(own_server: ValkeyProcess) -> None:
    store = ValkeyStore(own_server.url, namespace=fresh_namespace(), shard_count=4)
    raw = own_server.client()
    try:
        await store.claim_runs("w", ["idle"], 1, TTL)
        for _ in range(3):  # each blocks up to 3 s on the server
            await cancel_after(store.wait_for_work(["idle"], 3), 0.05)
        assert len(store._server.parking) == 3
        assert int(raw.info("clients")["connected_clients"]) >= 4  # 3 parked + raw
        await store.close()
        assert len(store._server.parking) == 0
        deadline = time.monotonic() + 5
        while int(raw.info("clients")["connected_clients"]) > 1:  # only raw is left
            assert time.monotonic() < deadline, "close() left connections open"
            await asyncio.sleep(0.05)
    finally:
        raw.close()
        await store.close()


def connected(raw: object) -> int:
    return int(raw.info("clients")["connected_clients"])  # type: ignore[attr-defined]


@pytest.mark.parametrize("other_loop_stops", [False, True])
def test_close_closes_other_loops_clients(
    own_server: ValkeyProcess, other_loop_stops: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A store used from two loops, closed from one: the other loop's connections close
    too, on that loop while it runs, or directly when it stops just then; either way no
    coroutine is left never awaited, no task pending and no connection unclosed."""
    gc.collect()  # what earlier tests left to collect warns before the block below
    store = ValkeyStore(own_server.url, namespace=fresh_namespace(), shard_count=4)
    raw = own_server.client()
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(store.get_run("x"), other).result(10)

        async def close_here() -> None:
            await store.get_run("y")
            assert connected(raw) >= 3  # raw, this loop's, the other loop's
            if other_loop_stops:
                other.call_soon_threadsafe(other.stop)
            await store.close()

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            asyncio.run(close_here())
            if not other_loop_stops:
                other.call_soon_threadsafe(other.stop)
            thread.join(10)
            other.close()
            gc.collect()
        mine = (f":{own_server.port}", f"port={own_server.port}", "close_quietly", "StreamWriter")
        assert [str(w.message) for w in caught if any(m in str(w.message) for m in mine)] == []
        assert "destroyed but it is pending" not in caplog.text
        deadline = time.monotonic() + 5
        while connected(raw) > 1:  # only raw is left
            assert time.monotonic() < deadline, "close() left connections open"
            time.sleep(0.05)
    finally:
        raw.close()
        if not other.is_closed():
            other.call_soon_threadsafe(other.stop)
            thread.join(10)
            other.close()
