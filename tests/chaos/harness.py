"""Real worker processes for crash and fault tests: start, signal and reap them by PID.

A :class:`Cluster` owns one SQLite database file, one side-effect ledger and the worker
processes it started (``tests/fixtures/run_worker.py``, cwd = repo root). Teardown
SIGKILLs and reaps every process it started. A :class:`Supervisor` keeps a fixed number
of workers alive, restarting killed ones, and records each death as a fault window.

A cluster whose ``archive`` is set (an :class:`ArchiveSpec`) starts its workers on an
:class:`~pyrula.workflows.ArchivingStore` over its URL and that Postgres archive:
``python -m tests.chaos.harness``, which is ``run_worker.py`` with that store (the
archive's DSN and options ride in ``PYRULA_TEST_ARCHIVE``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyrula.workflows.stores.base import Store

from .check import FaultWindow, read_ledger

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "tests" / "fixtures" / "run_worker.py"
WORKFLOW_MODULE = "tests.fixtures.chaos_workflows"
LEDGER_ENV = "PYRULA_TEST_LEDGER"
ARCHIVE_ENV = "PYRULA_TEST_ARCHIVE"

LOCK_TTL = 2.0
ORPHAN_SCAN = 0.5
FAST_OPTIONS: dict[str, float | int] = {
    "lock_ttl": LOCK_TTL,
    "orphan_scan_interval": ORPHAN_SCAN,
    "claim_poll_interval": 0.1,
    "shutdown_grace": 0.5,
    "cancel_timeout": 1.0,
    "max_concurrent_runs": 4,
}


def generous(guarantee: float) -> float:
    """A timing guarantee's bound with room for a loaded machine (CI's two cores, a shared
    host): three times it and a second. Scheduling and a busy event loop only ever make
    a handover or a stop later; a bound this loose still tells one from never."""
    return guarantee * 3 + 1


@dataclass(frozen=True)
class ArchiveSpec:
    """Workers wrap their store in ``ArchivingStore(store, PostgresArchive(dsn),
    **options)`` (``live_ttl_after_archive``, ``reconcile_interval``, ...)."""

    dsn: str
    options: Mapping[str, float | int] = field(default_factory=dict)

    def to_env(self) -> str:
        return json.dumps({"dsn": self.dsn, "options": dict(self.options)})


@dataclass
class Worker:
    """One worker process, known by its PID."""

    name: str
    worker_id: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float = field(default_factory=time.time)
    ended: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, signum: int) -> None:
        if self.alive():
            os.kill(self.pid, signum)

    def wait(self, timeout: float) -> int | None:
        """The exit code (negative: killed by that signal), or None if still running."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        if self.ended is None:
            self.ended = time.time()
        return code

    def state(self) -> str:
        """The kernel's state letter for the process (``T`` = stopped), or ``"gone"``."""
        try:
            text = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return "gone"
        return text.rsplit(")", 1)[1].split()[0]

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


class Cluster:
    """A database file, a ledger and the worker processes started against them."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.db_path = directory / "chaos.db"
        self.ledger_path = directory / "ledger.jsonl"
        self.url = "sqlite:///" + str(self.db_path)
        self.archive: ArchiveSpec | None = None
        """Set: workers run on an ArchivingStore over ``url`` and this archive."""
        self.workers: list[Worker] = []
        self._spawned = 0

    # -- processes ---------------------------------------------------------------------
    def start_worker(
        self, name: str, *, env: Mapping[str, str] | None = None, **options: float | int
    ) -> Worker:
        self._spawned += 1
        worker_id = f"{name}-{self._spawned}"
        settings = {**FAST_OPTIONS, "max_recoveries": 1000, **options}
        launcher = [str(LAUNCHER)] if self.archive is None else ["-m", "tests.chaos.harness"]
        argv = [
            sys.executable,
            *launcher,
            "--store",
            self.url,
            "--module",
            WORKFLOW_MODULE,
            "--worker-id",
            worker_id,
        ]
        for key, value in settings.items():
            argv += ["--" + key.replace("_", "-"), str(value)]
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), full_env.get("PYTHONPATH", "")) if p
        )
        full_env[LEDGER_ENV] = str(self.ledger_path)
        for key in ("PYRULA_FAULTPOINTS", "PYRULA_FAULT_SEED", "PYRULA_STORE_URL", ARCHIVE_ENV):
            full_env.pop(key, None)
        if self.archive is not None:
            full_env[ARCHIVE_ENV] = self.archive.to_env()
        full_env.update(env or {})
        log_path = self.dir / f"{worker_id}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=full_env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        worker = Worker(name, worker_id, proc, log_path)
        self.workers.append(worker)
        return worker

    def kill_all(self) -> None:
        """SIGKILL and reap every process this cluster started (stopped ones included)."""
        for worker in self.workers:
            if worker.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGKILL)
        for worker in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(10)

    def by_pid(self, pid: int) -> Worker:
        return next(w for w in self.workers if w.pid == pid)

    async def wait_ready(self, store: Store, *workers: Worker, timeout: float = 20.0) -> None:
        """Wait until each worker has registered its heartbeat in the store."""
        deadline = time.monotonic() + timeout
        pending = {w.worker_id: w for w in workers}
        while pending:
            seen = {info.worker_id for info in await store.list_workers()}
            for worker_id in list(pending):
                if worker_id in seen:
                    del pending[worker_id]
                elif not pending[worker_id].alive():
                    raise AssertionError(self.describe(f"worker {worker_id} exited early"))
            if pending and time.monotonic() > deadline:
                raise AssertionError(self.describe(f"workers never became ready: {pending}"))
            await asyncio.sleep(0.05)

    # -- the ledger --------------------------------------------------------------------
    def ledger(self) -> list[dict[str, Any]]:
        return read_ledger(self.ledger_path)

    async def wait_ledger(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float
    ) -> dict[str, Any]:
        """The first ledger line matching ``predicate``, waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.ledger():
                if predicate(line):
                    return line
            if time.monotonic() > deadline:
                raise AssertionError(self.describe("the expected ledger line never came"))
            await asyncio.sleep(0.02)

    # -- pausing -----------------------------------------------------------------------
    def write_lock_free(self, wait: float = 0.3) -> bool:
        """Whether a write transaction on the database can start within ``wait`` seconds."""
        conn = sqlite3.connect(self.db_path, timeout=wait, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            conn.close()

    def pause(self, worker: Worker, attempts: int = 40) -> float:
        """SIGSTOP ``worker`` at a moment it holds no SQLite write lock; return the time.

        A process stopped inside a write transaction keeps the file lock, which stalls
        every process on the database (up to ``busy_timeout``): that models a hung store,
        not a paused lease holder, so the pause is retried until the lock is free.
        """
        for _ in range(attempts):
            worker.send(signal.SIGSTOP)
            deadline = time.monotonic() + 2.0
            while worker.state() not in ("T", "t", "gone") and time.monotonic() < deadline:
                time.sleep(0.002)
            if self.write_lock_free():
                return time.time()
            worker.send(signal.SIGCONT)
            time.sleep(0.02)
        raise AssertionError(self.describe(f"could not pause {worker.worker_id} outside a write"))

    # -- diagnostics -------------------------------------------------------------------
    def describe(self, headline: str, tail: int = 25) -> str:
        parts = [headline, f"(artifacts in {self.dir})"]
        for worker in self.workers:
            lines = worker.log_text().splitlines()[-tail:]
            parts.append(f"--- {worker.worker_id} pid {worker.pid} rc {worker.proc.poll()}")
            parts.extend(lines)
        return "\n".join(parts)

    def save(self, name: str, data: Any) -> Path:
        path = self.dir / name
        path.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
        return path


class Supervisor:
    """Keeps ``count`` workers alive; a dead one is recorded as a fault and replaced.

    Each spawn gets ``PYRULA_FAULT_SEED = seed * 1000 + spawn number`` so a restarted
    worker does not replay its predecessor's dice. ``faultpoints`` may also be a function
    of the spawn number (0 for the first worker started), e.g. to kill only the first
    few. With ``restart=False`` a dead worker is still recorded, but leaves ``slots``
    instead of being replaced (the survivors must cope).
    """

    def __init__(
        self,
        cluster: Cluster,
        count: int,
        *,
        faultpoints: str | Callable[[int], str],
        seed: int,
        restart: bool = True,
        **options: float,
    ) -> None:
        self.cluster = cluster
        self.count = count
        self.restart = restart
        self.faultpoints = faultpoints
        self.seed = seed
        self.options = options
        self.slots: list[Worker] = []
        self.faults: list[FaultWindow] = []
        self.unexpected_exits: list[str] = []
        self._spawns = 0
        self._task: asyncio.Task[None] | None = None

    def _spawn(self, slot: int) -> Worker:
        env: dict[str, str] = {}
        spec = (
            self.faultpoints
            if isinstance(self.faultpoints, str)
            else self.faultpoints(self._spawns)
        )
        if spec:
            env["PYRULA_FAULTPOINTS"] = spec
            env["PYRULA_FAULT_SEED"] = str(self.seed * 1000 + self._spawns)
        self._spawns += 1
        return self.cluster.start_worker(f"w{slot}", env=env, **self.options)

    async def start(self, store: Store) -> None:
        self.slots = [self._spawn(i) for i in range(self.count)]
        await self.cluster.wait_ready(store, *self.slots)
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            for index, worker in enumerate(list(self.slots)):
                code = worker.proc.poll()
                if code is None:
                    continue
                worker.wait(0)
                ended = worker.ended or time.time()
                if code == -signal.SIGKILL:
                    self.faults.append(FaultWindow("kill", worker.pid, worker.started, ended))
                else:
                    self.unexpected_exits.append(f"{worker.worker_id} exited with {code}")
                if self.restart:
                    self.slots[index] = self._spawn(index)
                else:
                    self.slots.remove(worker)
            await asyncio.sleep(0.05)

    async def halt(self) -> None:
        """Stop restarting workers (the processes keep running until the cluster's kill)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def archiving_worker_main() -> int:
    """``python -m tests.chaos.harness ARGS``: ``run_worker.py ARGS`` on an ArchivingStore
    over ``--store`` and the archive ``PYRULA_TEST_ARCHIVE`` names (see ``ArchiveSpec``)."""
    from pyrula.workflows import ArchivingStore, PostgresArchive, open_store
    from tests.fixtures import run_worker

    spec = json.loads(os.environ[ARCHIVE_ENV])

    def archiving(url: str | None = None, *, default: str | None = None) -> Store:
        live = open_store(url, default=default)
        return ArchivingStore(live, PostgresArchive(spec["dsn"]), **spec["options"])

    run_worker.open_store = archiving  # type: ignore[attr-defined]  # its one store factory
    return run_worker.main()


if __name__ == "__main__":
    sys.exit(archiving_worker_main())
