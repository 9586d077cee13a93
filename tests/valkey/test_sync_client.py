"""The blocking client (its own loop thread) and a worker (another loop) on one
ValkeyStore, as a web process and a worker process share a store object in tests."""

from __future__ import annotations

import asyncio

from pyrula.workflows import WorkflowContext, workflow
from pyrula.workflows.registry import Registry
from pyrula.workflows.sync import WorkflowClient as BlockingClient
from tests.conftest import StartWorker

from .conftest import MakeStore


async def test_the_blocking_client_beside_a_worker(
    make_store: MakeStore, topology: str, registry: Registry, start_worker: StartWorker
) -> None:
    store = await make_store(topology, shard_count=4)

    @workflow(registry=registry, name="add")
    async def add(ctx: WorkflowContext, a: int, b: int) -> int:
        return int(await ctx.step("sum", lambda: a + b))

    await start_worker(store, [add])

    def use_blocking_client() -> list[int]:
        with BlockingClient(store, registry=registry) as client:
            handles = [client.submit("add", {"a": i, "b": 1}) for i in range(5)]
            return [handle.result(timeout=20) for handle in handles]

    assert await asyncio.to_thread(use_blocking_client) == [1, 2, 3, 4, 5]
