"""The blocking client's fast path on a real valkey-server: submit, read and wait run in
the calling thread (``pyrula/workflows/stores/valkey/blocking.py``), and everything it
does not handle goes through the client's loop thread as before."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import valkey

from pyrula.workflows import WorkflowContext, workflow
from pyrula.workflows.errors import ResultTimeout, RunNotFound, StoreError
from pyrula.workflows.records import RunStatus
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.stores.valkey.blocking import Connections, fields
from pyrula.workflows.stores.valkey.resp import pack_command
from pyrula.workflows.sync import WorkflowClient as BlockingClient
from tests.conftest import StartWorker

from .conftest import MakeStore
from .servers import ValkeyProcess, fresh_namespace


def count_loop_calls(client: BlockingClient) -> list[str]:
    """Record every call the client makes through its loop thread (the calls still run)."""
    calls: list[str] = []
    through_loop: Callable[..., Any] = client._call

    def counted(coro: Any, timeout: float | None = None) -> Any:
        calls.append(coro.__qualname__)
        return through_loop(coro, timeout)

    client._call = counted  # type: ignore[method-assign]
    return calls


async def adder(store: ValkeyStore, registry: Registry, start_worker: StartWorker) -> None:
    @workflow(registry=registry, name="add")
    async def add(ctx: WorkflowContext, a: int, b: int) -> int:
        return int(await ctx.step("sum", lambda: a + b))

    await start_worker(store, [add])


async def test_submit_and_wait_skip_the_loop_thread(
    make_store: MakeStore, registry: Registry, start_worker: StartWorker
) -> None:
    store = await make_store(shard_count=4)
    await adder(store, registry, start_worker)
    client = BlockingClient(store, registry=registry)
    assert client._fast is not None
    calls = count_loop_calls(client)

    def use() -> tuple[list[int], list[int]]:
        first = client.submit("add", {"a": 0, "b": 0}).result(timeout=20)  # notes "add"
        warm = list(calls)
        handles = [client.submit("add", {"a": i, "b": 1}) for i in range(30)]
        results = [first] + [handle.result(timeout=20) for handle in handles]
        record = handles[0].record()
        assert record.status is RunStatus.COMPLETED and record.result == "1"
        assert handles[0].status() is RunStatus.COMPLETED
        return warm, results

    warm, results = await asyncio.to_thread(use)
    assert results == [0, *range(1, 31)]
    assert warm == ["RunOps.create_run"]  # the first run of "add" notes the workflow
    assert calls == warm  # nothing after it went through the loop thread


async def test_unknown_runs_timeouts_and_keys(
    make_store: MakeStore, registry: Registry, start_worker: StartWorker
) -> None:
    store = await make_store(shard_count=4)
    await adder(store, registry, start_worker)

    @workflow(registry=registry, name="never_served")
    async def never_served(ctx: WorkflowContext) -> None:
        return None

    client = BlockingClient(store, registry=registry)

    def use() -> None:
        with pytest.raises(RunNotFound):
            client.handle("add", "no-such-run").record()
        with pytest.raises(RunNotFound):
            client.handle("add", "no-such-run").result(timeout=1)
        queued = client.submit("never_served")
        began = time.monotonic()
        with pytest.raises(ResultTimeout):
            queued.result(timeout=0.4)
        assert 0.35 <= time.monotonic() - began < 10
        assert queued.status() is RunStatus.QUEUED
        # An idempotency key goes through the loop thread; a repeat is the first run.
        calls = count_loop_calls(client)
        one = client.submit("add", {"a": 1, "b": 2}, idempotency_key="k1")
        again = client.submit("add", {"a": 1, "b": 2}, idempotency_key="k1")
        assert one.run_id == again.run_id and one.result(timeout=20) == 3
        assert calls.count("RunOps.create_run") == 2

    await asyncio.to_thread(use)


async def test_close_wakes_a_waiting_thread(
    make_store: MakeStore, registry: Registry, start_worker: StartWorker
) -> None:
    store = await make_store(shard_count=4, socket_timeout=30)
    assert store.block_slice == 5.0  # a wait blocks on the server 5 seconds at a time

    @workflow(registry=registry, name="never_served")
    async def never_served(ctx: WorkflowContext) -> None:
        return None

    client = BlockingClient(store, registry=registry)
    handle = await asyncio.to_thread(client.submit, "never_served")
    outcome: list[BaseException] = []
    began = time.monotonic()

    def wait() -> None:
        try:
            handle.result()
        except BaseException as exc:  # checked below
            outcome.append(exc)
        outcome.append(TimeoutError(time.monotonic() - began))

    waiter = threading.Thread(target=wait)
    waiter.start()
    await asyncio.sleep(0.5)
    assert waiter.is_alive()
    await asyncio.to_thread(client.close)
    await asyncio.to_thread(waiter.join, 10)
    assert not waiter.is_alive()
    assert isinstance(outcome[0], ResultTimeout)  # "still queued"
    assert outcome[1].args[0] < 4.0  # woken by close, not by the end of its 5 s slice


async def test_a_connection_the_server_closed_is_opened_again(
    make_store: MakeStore, registry: Registry, start_worker: StartWorker
) -> None:
    store = await make_store(shard_count=4)
    await adder(store, registry, start_worker)
    client = BlockingClient(store, registry=registry)
    fast = client._fast
    assert fast is not None

    def use() -> None:
        assert client.submit("add", {"a": 1, "b": 1}).result(timeout=20) == 2
        connection_id = fast._command(("CLIENT", "ID"))
        admin = valkey.Valkey.from_url(store._server.url)
        try:
            assert admin.execute_command("CLIENT", "KILL", "ID", connection_id) == 1
        finally:
            admin.close()
        calls = count_loop_calls(client)
        assert client.submit("add", {"a": 2, "b": 2}).result(timeout=20) == 4
        assert calls == []  # reconnected on the fast path, no error, no detour
        assert fast._command(("CLIENT", "ID")) != connection_id

    await asyncio.to_thread(use)


async def test_a_suspect_server_is_checked_through_the_loop_thread_first(
    make_store: MakeStore, registry: Registry, start_worker: StartWorker
) -> None:
    store = await make_store(shard_count=4)
    await adder(store, registry, start_worker)
    client = BlockingClient(store, registry=registry)

    def use() -> None:
        assert client.submit("add", {"a": 1, "b": 1}).result(timeout=20) == 2
        calls = count_loop_calls(client)
        store._server._suspect = True  # as after a connection error
        assert client.submit("add", {"a": 5, "b": 1}).result(timeout=20) == 6
        assert calls[:1] == ["RunOps.create_run"]  # it checks the server first
        assert not store._server._suspect
        calls.clear()
        assert client.submit("add", {"a": 7, "b": 1}).result(timeout=20) == 8
        assert calls == []

    await asyncio.to_thread(use)


async def test_no_fast_path_on_a_cluster(make_store: MakeStore) -> None:
    store = await make_store("cluster", shard_count=4)
    client = BlockingClient(store)
    assert client._fast is None


async def test_an_error_in_a_pipeline_leaves_the_connection_in_step(make_store: MakeStore) -> None:
    store = await make_store(shard_count=4)
    client = BlockingClient(store)
    fast = client._fast
    assert fast is not None
    key = f"{store.namespace}:not-a-number"

    def use() -> None:
        fast._command(("SET", key, "text"))
        connection_id = fast._command(("CLIENT", "ID"))
        with pytest.raises(StoreError, match="not an integer"):
            fast._command(("INCR", key), ("ECHO", "after the error"))
        # Both replies were read: the connection is still in step, and still the same.
        assert fast._command(("ECHO", "next")) == b"next"
        assert fast._command(("GET", key), ("CLIENT", "ID")) == [b"text", connection_id]
        fast._command(("DEL", key))

    await asyncio.to_thread(use)


def test_connections_speak_resp2_whatever_the_url_says(valkey_server: ValkeyProcess) -> None:
    pool = Connections(f"{valkey_server.url}/0?protocol=3&decode_responses=true")
    connection = pool.take()
    key = f"{fresh_namespace()}:h"
    try:
        assert connection.protocol == 2
        connection.send_packed_command([pack_command(("HSET", key, "a", "é"))])
        assert connection.read_response() == 1
        connection.send_packed_command(
            [pack_command(("HGETALL", key)) + pack_command(("DEL", key))]
        )
        assert connection.read_response() == ["a", "é"]  # decoded, as the URL asks
        assert connection.read_response() == 1
        assert fields([b"a", "é".encode()]) == {"a": "é"}
        assert fields(["a", "é"]) == {"a": "é"}
    finally:
        pool.give(connection)
        pool.close()
