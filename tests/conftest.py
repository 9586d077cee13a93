"""Fixtures shared by the engine's unit and integration tests.

``engine_store`` runs a test once per store kind (memory, SQLite file), on the real clock.
``start_worker`` runs an in-process worker on the test's event loop with fast timings and
stops it at teardown. (``tests/stores/`` has its own fixtures for the conformance suite.)

``--stores memory,sqlite`` (or ``PYRULA_TEST_STORES``) keeps only the tests parametrized
over those store kinds (the conformance suite's ``store_kind`` and ``engine_store_kind``);
tests that name no store kind run as usual.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import (
    MemoryStore,
    SqliteStore,
    Store,
    WorkerOptions,
    WorkflowDefinition,
    WorkflowWorker,
)
from pyrula.workflows.registry import Registry

STORE_KINDS = ("memory", "sqlite")

STORE_PARAMS = ("store_kind", "engine_store_kind")
"""The fixtures whose parameter is a store kind, filtered by ``--stores``."""
ALL_STORE_KINDS = ("memory", "sqlite", "valkey", "valkey-cluster", "archiving")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stores",
        default=os.environ.get("PYRULA_TEST_STORES", ""),
        help=f"comma-separated store kinds to test ({', '.join(ALL_STORE_KINDS)}); default all",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = {kind.strip() for kind in str(config.getoption("--stores")).split(",") if kind}
    if not wanted:
        return
    unknown = wanted - set(ALL_STORE_KINDS)
    if unknown:
        raise pytest.UsageError(
            f"--stores: unknown store kind {', '.join(sorted(unknown))}; "
            f"expected some of {', '.join(ALL_STORE_KINDS)}"
        )
    kept, dropped = [], []
    for item in items:
        params = getattr(item, "callspec", None)
        kinds = (
            {params.params[name] for name in STORE_PARAMS if name in params.params}
            if params
            else set()
        )
        (dropped if kinds - wanted else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


FAST = {
    "claim_poll_interval": 0.02,
    "timer_poll_interval_s": 0.05,
    "lock_ttl": 2.0,
    "orphan_scan_interval": 0.2,
    "shutdown_grace": 2.0,
}
"""Worker timings for tests: every loop ticks well under a second."""


class StoreFactory:
    """Builds stores of one kind; SQLite ones share one file. Closes them all at teardown."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self.built: list[Store] = []

    async def __call__(self, clock: Callable[[], float] = time.time) -> Store:
        store: Store
        if self.kind == "memory":
            store = MemoryStore(clock=clock)
        else:
            store = SqliteStore(self.path, clock=clock)
        await store.open()
        self.built.append(store)
        return store

    async def close_all(self) -> None:
        for store in reversed(self.built):
            await store.close()


@pytest.fixture(params=STORE_KINDS)
def engine_store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
async def store_factory(engine_store_kind: str, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    factory = StoreFactory(engine_store_kind, tmp_path / "engine.db")
    try:
        yield factory
    finally:
        await factory.close_all()


@pytest.fixture
async def engine_store(store_factory: StoreFactory) -> Store:
    """An opened store of each kind on the real clock (a MemoryStore or a SqliteStore file)."""
    return await store_factory()


@pytest.fixture
def registry() -> Registry:
    """A registry of this test's own, so workflow names never collide between tests."""
    return Registry()


StartWorker = Callable[..., Awaitable[WorkflowWorker]]


@pytest.fixture
async def start_worker(registry: Registry) -> AsyncIterator[StartWorker]:
    """``await start_worker(store, [wf], **option_overrides)``: a running worker.

    Every worker started is stopped (and awaited) at teardown.
    """
    running: list[tuple[WorkflowWorker, asyncio.Task[None]]] = []

    async def start(
        store: Store, workflows: Iterable[WorkflowDefinition], **overrides: Any
    ) -> WorkflowWorker:
        options = WorkerOptions(**{**FAST, **overrides})
        worker = WorkflowWorker(
            store=store, workflows=list(workflows), options=options, registry=registry
        )
        task = asyncio.create_task(worker.run())
        running.append((worker, task))
        await asyncio.sleep(0)
        return worker

    try:
        yield start
    finally:
        for worker, _ in running:
            worker.stop()
        for _, task in running:
            await asyncio.wait_for(task, timeout=15)


Eventually = Callable[..., Awaitable[None]]


@pytest.fixture
def eventually() -> Eventually:
    """``await eventually(predicate, timeout=5, what=...)``: poll until true, or fail."""

    async def wait(
        predicate: Callable[[], Any], timeout: float = 5.0, what: str = "condition"
    ) -> None:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"{what} not reached within {timeout}s")
            await asyncio.sleep(0.01)

    return wait
