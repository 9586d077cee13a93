"""A valkey-server that restarts: without persistence its data is gone, and the store
says so loudly (then carries on); with persistence nothing is lost or reported."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

from pyrula.workflows import (
    RunStatus,
    StoreUnavailable,
    WorkflowClient,
    WorkflowContext,
    workflow,
)
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.conftest import StartWorker
from tests.stores.helpers import create
from tests.valkey.servers import ValkeyProcess, fresh_namespace

pytestmark = pytest.mark.slow
T = TypeVar("T")


@pytest.fixture
def server() -> Iterator[ValkeyProcess]:
    process = ValkeyProcess()
    process.start()
    try:
        yield process
    finally:
        process.cleanup()


@pytest.fixture
def durable_server() -> Iterator[ValkeyProcess]:
    process = ValkeyProcess(persist=True)
    process.start()
    try:
        yield process
    finally:
        process.cleanup()


async def retrying(call: Callable[[], Awaitable[T]], seen: list[str], timeout: float = 15) -> T:
    """``call()`` until it stops raising StoreUnavailable; what it raised goes to ``seen``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except StoreUnavailable as exc:
            seen.append(str(exc))
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_a_restart_without_persistence_is_reported(
    server: ValkeyProcess, caplog: pytest.LogCaptureFixture
) -> None:
    store = ValkeyStore(server.url, namespace=fresh_namespace(), shard_count=4)
    try:
        old = await create(store)
        server.restart()  # SIGKILL, then a fresh process on the same port: empty
        seen: list[str] = []
        with caplog.at_level(logging.ERROR):
            assert await retrying(lambda: store.get_run(old), seen) is None
        assert any("LOST ITS DATA" in message for message in seen), seen
        assert len(store.data_loss) == 1 and "run_id changed" in store.data_loss[0]
        assert any("LOST ITS DATA" in r.getMessage() for r in caplog.records)
        # Reported once; the store then carries on with its library loaded again.
        new = await create(store)
        run = await store.get_run(new)
        assert run is not None and run.status is RunStatus.QUEUED
        assert len(store.data_loss) == 1
    finally:
        await store.close()


async def test_a_restart_with_persistence_loses_nothing(durable_server: ValkeyProcess) -> None:
    store = ValkeyStore(durable_server.url, namespace=fresh_namespace(), shard_count=4)
    try:
        run_id = await create(store)
        durable_server.stop()
        durable_server.start()
        seen: list[str] = []
        run = await retrying(lambda: store.get_run(run_id), seen)
        assert run is not None and run.status is RunStatus.QUEUED
        await create(store)
        assert store.data_loss == []
    finally:
        await store.close()


async def test_a_worker_carries_on_after_the_server_lost_its_data(
    server: ValkeyProcess, registry: Registry, start_worker: StartWorker
) -> None:
    store = ValkeyStore(server.url, namespace=fresh_namespace(), shard_count=4)

    @workflow(registry=registry, name="echo")
    async def echo(ctx: WorkflowContext, word: str) -> str:
        return str(await ctx.step("upper", lambda: word.upper()))

    try:
        await store.open()
        await start_worker(store, [echo])
        client = WorkflowClient(store, registry=registry)
        assert await (await client.submit("echo", {"word": "before"})).result(10) == "BEFORE"
        server.restart()
        seen: list[str] = []

        async def submit() -> Any:
            return await client.submit("echo", {"word": "after"})

        handle = await retrying(submit, seen)
        assert await handle.result(timeout=20) == "AFTER"
        assert len(store.data_loss) == 1
    finally:
        await store.close()
