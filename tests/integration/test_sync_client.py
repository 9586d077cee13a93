"""The blocking client: shared between threads, and usable in a forked child."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import (
    DurableInvocationError,
    Fatal,
    MemoryStore,
    PyrulaError,
    RunStatus,
    SqliteStore,
    Store,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.registry import Registry
from pyrula.workflows.sync import WorkflowClient
from tests.conftest import FAST

REGISTRY = Registry()


@workflow(registry=REGISTRY)
async def square(ctx: WorkflowContext, n: int) -> int:
    result: int = await ctx.step("square", lambda: n * n)
    return result


@workflow(registry=REGISTRY)
async def refuse(ctx: WorkflowContext) -> None:
    await ctx.step("refuse", _refuse)


def _refuse() -> None:
    raise Fatal("refused")


def _build(kind: str, tmp_path: Path) -> Store:
    return MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "sync.db")


@pytest.fixture(params=["memory", "sqlite"])
def worker_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A store served by a worker running on its own thread (as in a web app's process)."""
    store = _build(request.param, tmp_path)
    worker = WorkflowWorker(
        store=store,
        workflows=[square, refuse],
        options=WorkerOptions(**FAST),  # type: ignore[arg-type]
        registry=REGISTRY,
    )
    thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
    thread.start()
    try:
        yield store
    finally:
        worker.stop()
        thread.join(timeout=15)
        assert not thread.is_alive()


def test_one_client_shared_by_sixteen_threads(worker_store: Store) -> None:
    client = WorkflowClient(worker_store, registry=REGISTRY)
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(16)

    def use(index: int) -> None:
        try:
            barrier.wait(timeout=10)
            handles = [client.submit("square", {"n": index * 10 + i}) for i in range(3)]
            results[index] = [h.result(timeout=20) for h in handles]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=use, args=(i,)) for i in range(16)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        assert results == {i: [(i * 10 + k) ** 2 for k in range(3)] for i in range(16)}
    finally:
        client.close()


def test_blocking_handle_methods(worker_store: Store) -> None:
    with WorkflowClient(worker_store, registry=REGISTRY) as client:
        handle = client.submit("refuse")
        with pytest.raises(DurableInvocationError) as failed:
            handle.result(timeout=10)
        assert failed.value.error_type == "pyrula.workflows.errors.Fatal"
        assert handle.status() is RunStatus.FAILED
        assert client.handle("refuse", handle.run_id).record().run_id == handle.run_id
        assert handle.retry().status is RunStatus.QUEUED
        with pytest.raises(DurableInvocationError):
            handle.result(timeout=10)
    with pytest.raises(PyrulaError, match="closed"):
        client.submit("square", {"n": 1})
    client.close()  # idempotent


def _wait_child(pid: int, timeout: float) -> int:
    """The child's wait status; SIGKILLs it (and fails) if it outlives ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return status
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"forked child {pid} did not finish within {timeout}s")


def _serve_square(path: str, stop: Any) -> None:
    """A worker process serving ``square`` on ``path`` until ``stop`` is set."""
    worker = WorkflowWorker(
        store=SqliteStore(path),
        workflows=[square],
        options=WorkerOptions(**FAST),  # type: ignore[arg-type]
        registry=REGISTRY,
    )

    async def main() -> None:
        running = asyncio.create_task(worker.run())
        await asyncio.to_thread(stop.wait, 60)
        worker.stop()
        await running

    asyncio.run(main())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_the_client_works_in_a_forked_child(tmp_path: Path) -> None:
    # The worker is another process, as under a forking server. (SQLite's locks belong to
    # a process: a child forked while a thread of its parent was inside a transaction on
    # the same file would wait on that lock; see docs/worker.md.)
    path = tmp_path / "fork.db"
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    server = spawn.Process(target=_serve_square, args=(str(path), stop), daemon=True)
    server.start()
    client = WorkflowClient(SqliteStore(path), registry=REGISTRY)
    try:
        assert client.submit("square", {"n": 3}).result(timeout=30) == 9  # used before fork
        pid = os.fork()
        if pid == 0:  # the child: submit through the inherited client, wait, report
            code = 1
            try:
                signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not pytest-timeout's handler
                signal.alarm(25)  # a hung child dies on its own
                if client.submit("square", {"n": 12}).result(timeout=20) == 144:
                    code = 0
            except BaseException:
                code = 2
            finally:
                os._exit(code)
        status = _wait_child(pid, 40)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert client.submit("square", {"n": 4}).result(timeout=20) == 16  # parent still fine
    finally:
        client.close()
        stop.set()
        server.join(30)
        if server.is_alive():
            server.kill()
            server.join(10)
