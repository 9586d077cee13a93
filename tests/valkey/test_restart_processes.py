"""A valkey-server that loses its data under real ``pyrula worker`` processes with runs
in flight (reliability scenario 10).

Two ``pyrula worker`` processes (started, signalled and reaped by PID) serve
``tests.fixtures.cli_workflows``. Each holds ``CONCURRENCY`` ``cli_gate`` runs, whose
step waits for a file, and more wait in the queue. Then the server loses its data:

* restarted without persistence: SIGKILLed and started again, empty, on the same port
  (:meth:`ValkeyProcess.restart`: no AOF, no RDB), so its function library is gone too;
* flushed (``FLUSHALL``) while it keeps running: the library stays, the markers go.

Each worker logs the loss once at ERROR naming the URL, stays up, and serves the runs
submitted afterwards; the runs that were lost stay lost (never written back by a
worker that held one); ``FUNCTION LOAD`` runs a bounded number of times, and not at all
once the loss has been dealt with.

The bound on ``FUNCTION LOAD`` (counted with ``INFO commandstats`` on the server, which
counts failed calls, "already exists", too), per process and per loss, from the code
(dataloss.py, connection.py, ``ValkeyStore.open``): each store operation in flight when
the loss is found loads the library at most twice, once in ``DataLoss.verify`` (before
the loss is reported) or in ``recover_library`` (a call answered "Function not found",
after a restart only), and once in ``ValkeyStore.open``, which runs again when the
reported loss bumped the store's generation; the next operations find it open. So never
fewer than two a process (verify's, then open's), and at most twice the operations a
worker has in flight at once, ``CONCURRENCY`` runs and ``LOOPS`` housekeeping loops
(claims, run leases, shard leases, timers, orphan scan, schedules, heartbeat, finish
batches), plus one. What it catches is a reload loop, which the steady count afterwards
(no load while new runs run, none in the idle seconds after) catches too. The numbers
measured print (on the dev machine: 4 to 10 for the two workers after a restart, 4 or 5
after a flush; 2 for the test's own client; none once the loss was reported).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import (
    RunNotFound,
    RunStatus,
    StoreUnavailable,
    WorkflowClient,
)
from pyrula.workflows.stores.valkey import ValkeyStore, dataloss
from tests.chaos.harness import generous
from tests.fixtures import cli_workflows
from tests.integration.test_cli_worker import REPO_ROOT, pyrula_command
from tests.valkey.servers import ValkeyProcess, fresh_namespace

pytestmark = pytest.mark.slow

assert cli_workflows.cli_gate.name == "cli_gate"  # registers the workflows for submit()
MODULE = "tests.fixtures.cli_workflows"
WORKERS = 2
CONCURRENCY = 3
QUEUED = 2
"""Runs beyond every worker's slots: lost while they wait in the queue."""
NEW_RUNS = 6
LOOPS = 8
"""Store-calling loops of one worker besides its runs (see the module docstring)."""
LOAD_BOUND = 2 * (CONCURRENCY + LOOPS) + 1
"""FUNCTION LOAD calls one process may make for one loss (see the module docstring)."""
CLIENT_LOAD_BOUND = 3
"""FUNCTION LOAD calls of the test's own client for one loss, its calls one at a time:
verify's or a "Function not found" recovery's, one ``open()``, and one to spare."""
GAP = 2.0
"""Seconds a worker may go without a store call (timer poll 0.5 s, shard lease renewal
0.5 s) plus the log line's way to the file: added to CHECK_EVERY_SECONDS."""
SETTLE = 1.0
"""Seconds for store calls already on their way to land before loads are counted."""
DATALOSS_LOGGER = dataloss.__name__
FLAGS = [
    "--claim-poll-interval", "0.05",
    "--timer-poll-interval", "0.5",
    "--orphan-scan-interval", "1",
    "--lock-ttl", "30",
    "--shutdown-grace", "1",
    "--cancel-timeout", "1",
    "--concurrency", str(CONCURRENCY),
]  # fmt: skip
"""A run lease of 30 s (the default): no renewal in these tests' windows notices a loss,
so the flush is found by the timed marker check, the bound under test."""


class WorkerProcess:
    """One ``pyrula worker`` process, known by its PID, logging to a file."""

    def __init__(self, worker_id: str, proc: subprocess.Popen[bytes], log: Path, out: Path):
        self.worker_id = worker_id
        self.proc = proc
        self.log = log
        self.out = out

    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        parts = []
        for path in (self.log, self.out):
            with contextlib.suppress(OSError):
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    def loss_errors(self) -> list[str]:
        """The ERROR lines of the data-loss detector."""
        return [
            line
            for line in self.text().splitlines()
            if " ERROR " in line and DATALOSS_LOGGER in line and "LOST ITS DATA" in line
        ]


class Workers:
    """Starts ``pyrula worker`` processes on ``url``; SIGKILLs and reaps, by PID, those
    still alive at teardown."""

    def __init__(self, directory: Path, url: str) -> None:
        self.dir = directory
        self.url = url
        self.started: list[WorkerProcess] = []

    def start(self, worker_id: str) -> WorkerProcess:
        log, out = self.dir / f"{worker_id}.log", self.dir / f"{worker_id}.out"
        env = {k: v for k, v in os.environ.items() if k != "PYRULA_STORE_URL"}
        with out.open("wb") as sink:
            proc = subprocess.Popen(
                [*pyrula_command(), "worker", "--workflow", MODULE, "--store", self.url,
                 "--worker-id", worker_id, "--logfile", str(log), *FLAGS],
                cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
            )  # fmt: skip
        worker = WorkerProcess(worker_id, proc, log, out)
        self.started.append(worker)
        return worker

    def describe(self, headline: str) -> str:
        parts = [headline]
        for worker in self.started:
            lines = worker.text().splitlines()[-40:]
            parts.append(f"--- {worker.worker_id} pid {worker.proc.pid} rc {worker.proc.poll()}")
            parts.extend(lines)
        return "\n".join(parts)

    def kill_all(self) -> None:
        for worker in self.started:
            if worker.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.proc.pid, signal.SIGKILL)
        for worker in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(10)


@pytest.fixture
def workers(tmp_path: Path, own_server: ValkeyProcess) -> Iterator[Workers]:
    """Worker processes on a server of the test's own (without persistence: it loses
    its data)."""
    url = f"{own_server.url}/0?namespace={fresh_namespace()}&shard_count=4" + (
        "&shard_lease_ttl=2&shard_lease_interval=0.5"
    )
    started = Workers(tmp_path, url)
    try:
        yield started
    finally:
        started.kill_all()
        print(started.describe("worker logs:"))


def function_loads(server: ValkeyProcess) -> int:
    """``FUNCTION LOAD`` calls the server has run since it started, failed ones too."""
    raw: Any = server.client()
    try:
        stats = raw.info("commandstats")
    finally:
        raw.close()
    entry = stats.get("cmdstat_function|load") or {}
    return int(entry.get("calls", 0))


async def wait_for(
    what: str, workers: Workers, timeout: float, check: Callable[[], Awaitable[bool]]
) -> float:
    """Wait until ``check()``; the seconds it took."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout:
            raise AssertionError(workers.describe(f"{what}: not within {timeout}s"))
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def start_serving(
    workers: Workers, store: ValkeyStore, client: WorkflowClient, gate: Path
) -> tuple[list[WorkerProcess], list[str]]:
    """Start the workers, check they serve, then fill every slot with a ``cli_gate`` run
    waiting for ``gate`` (and queue QUEUED more). The ids of the runs before the loss."""
    procs = [workers.start(f"w{i}-{fresh_namespace()}") for i in range(WORKERS)]
    ids = {p.worker_id for p in procs}

    async def registered() -> bool:
        assert all(p.alive() for p in procs), workers.describe("a worker exited")
        return ids <= {info.worker_id for info in await store.list_workers()}

    await wait_for("both workers registered", workers, 30, registered)
    done = [await client.submit("cli_add", {"a": i, "b": 1}) for i in range(WORKERS)]
    for i, handle in enumerate(done):
        assert (await handle.result(timeout=20))["sum"] == i + 1
    gated = [
        (await client.submit("cli_gate", {"path": str(gate)})).run_id
        for _ in range(WORKERS * CONCURRENCY + QUEUED)
    ]

    async def every_slot_held() -> bool:
        running = await store.list_runs(status=RunStatus.RUNNING, limit=100)
        held = [run.worker_id for run in running if run.run_id in gated]
        return all(held.count(worker_id) == CONCURRENCY for worker_id in ids)

    await wait_for("every slot held by a gated run", workers, 20, every_slot_held)
    await asyncio.sleep(0.3)  # past the runs' first step, into the gate
    return procs, [h.run_id for h in done] + gated


async def client_reports_once(store: ValkeyStore, run_id: str, timeout: float) -> float:
    """The test's own store lived through the loss too: plain calls until it reports
    it (StoreUnavailable, the server unreachable then LOST ITS DATA); the seconds it
    took."""
    started = time.monotonic()
    seen: list[str] = []
    while not store.data_loss:
        assert time.monotonic() - started < timeout, f"the client never reported: {seen}"
        try:
            assert await store.get_run(run_id) is None
        except StoreUnavailable as exc:
            seen.append(str(exc))
        await asyncio.sleep(0.05)
    assert any("LOST ITS DATA" in message for message in seen), seen
    return time.monotonic() - started


async def carries_on(
    workers: Workers, procs: list[WorkerProcess], client: WorkflowClient
) -> list[str]:
    """New runs complete on the same worker processes; their ids."""
    handles = [await client.submit("cli_add", {"a": i, "b": 2}) for i in range(NEW_RUNS)]
    for i, handle in enumerate(handles):
        try:
            assert await handle.result(timeout=20) == {"sum": i + 2, "doubled": 2 * (i + 2)}
        except Exception as exc:
            raise AssertionError(workers.describe(f"new run {i}: {exc!r}")) from exc
    ids = {p.worker_id for p in procs}
    served = {(await handle.record()).worker_id for handle in handles}
    assert served <= ids, (served, ids)
    assert all(p.alive() for p in procs), workers.describe("a worker exited")
    return [handle.run_id for handle in handles]


READS: dict[str, tuple[object, ...]] = {
    "string": ("GET",),
    "hash": ("HGETALL",),
    "list": ("LRANGE", 0, -1),
    "set": ("SMEMBERS",),
    "zset": ("ZRANGE", 0, -1),
    "stream": ("XRANGE", "-", "+"),
}
"""The command that reads a whole key of each type (the key goes after the first word)."""


def traces(server: ValkeyProcess, namespace: str, run_ids: list[str]) -> list[str]:
    """The keys of ``namespace`` whose name or content names one of ``run_ids`` (a run
    hash, a journal, a queue or index entry written back after the loss)."""
    raw: Any = server.client()
    found = []
    try:
        for key in raw.scan_iter(match=f"{namespace}:*", count=1000):
            kind = raw.type(key).decode()
            command, *rest = READS.get(kind, ("TYPE",))
            text = f"{key!r} {raw.execute_command(command, key, *rest)!r}"
            found += [f"{key.decode()} ({kind}): {i}" for i in run_ids if i in text]
    finally:
        raw.close()
    return found


async def stay_lost(
    server: ValkeyProcess,
    url: str,
    client: WorkflowClient,
    lost: list[str],
    new: list[str],
    gate: Path,
) -> None:
    """The runs of before the loss are gone for good: none was written back by a worker
    that held it (their steps returned once ``gate`` appeared; no key of the namespace
    names one), a handle raises RunNotFound, and a client that opened after the loss
    sees only the new runs and reports nothing."""
    assert gate.exists()
    assert isinstance(client.store, ValkeyStore)
    assert traces(server, client.store.namespace, lost) == []
    for run_id in lost:
        assert await client.store.get_run(run_id) is None, run_id
        with pytest.raises(RunNotFound):
            await client.handle("cli_gate", run_id).status()
    fresh = ValkeyStore.from_url(url)
    try:
        listed = {run.run_id for run in await fresh.list_runs(limit=1000)}
        assert listed == set(new), (sorted(listed - set(new)), sorted(set(new) - listed))
        for run_id in lost:
            assert await fresh.get_run(run_id) is None, run_id
        assert fresh.data_loss == []
    finally:
        await fresh.close()


async def measured_loads(
    server: ValkeyProcess,
    base: int,
    workers: Workers,
    procs: list[WorkerProcess],
    client: WorkflowClient,
    lost: list[str],
    gate: Path,
) -> str:
    """After the workers reported (``base``: the server's FUNCTION LOAD count then, less
    any before the loss) and the test's client reported too: the client opens again
    (CLIENT_LOAD_BOUND), new runs complete on the workers and load nothing, a store
    opened afterwards loads once, and nothing loads in the idle seconds after. Checks
    the lost runs stay lost meanwhile; returns the counts, for the summary line."""
    assert await client.store.get_run(lost[0]) is None  # the client's store opens again
    with_client = function_loads(server) - base
    new = await carries_on(workers, procs, client)
    await asyncio.sleep(SETTLE)
    running = function_loads(server) - base - with_client
    await stay_lost(server, workers.url, client, lost, new, gate)  # opens a fresh store
    opened = function_loads(server) - base - with_client - running
    await asyncio.sleep(2.0)
    idle = function_loads(server) - base - with_client - running - opened
    summary = (
        f"{with_client} by the client's report and its open, {running} while the new runs "
        f"ran, {opened} by a store opened afterwards, {idle} in the 2 s after (bound "
        f"{LOAD_BOUND} per worker, {CLIENT_LOAD_BOUND} for the client)"
    )
    assert 1 <= with_client <= CLIENT_LOAD_BOUND, summary
    assert running == 0, f"FUNCTION LOAD after the loss was dealt with: {summary}"
    assert opened == 1, summary
    assert idle == 0, f"FUNCTION LOAD in a loop: {summary}"
    for proc in procs:
        assert len(proc.loss_errors()) == 1, workers.describe("reported more than once")
        # A run lost with the data is dropped, not promised a recovery that cannot come.
        assert "engine error" not in proc.text(), workers.describe("a lost run's misleading log")
    return summary


def stop(workers: Workers, procs: list[WorkerProcess]) -> None:
    """SIGTERM each by PID: a graceful exit, code 0."""
    for proc in procs:
        proc.proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            code = proc.proc.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail(workers.describe(f"{proc.worker_id} did not stop on SIGTERM"))
        assert code == 0, workers.describe(f"{proc.worker_id} exited {code}")


async def test_workers_carry_on_after_the_server_restarts_empty(
    own_server: ValkeyProcess, workers: Workers, tmp_path: Path
) -> None:
    server = own_server
    store = ValkeyStore.from_url(workers.url)
    client = WorkflowClient(store)
    gate = tmp_path / "gate"
    try:
        procs, lost = await start_serving(workers, store, client, gate)
        server.restart()  # SIGKILL by PID, then an empty server on the same port
        gate.touch()  # the steps in flight return: their writes meet the empty server

        async def all_reported() -> bool:
            assert all(p.alive() for p in procs), workers.describe("a worker exited")
            return all(p.loss_errors() for p in procs)

        detected = await wait_for("each worker reporting the loss", workers, 20, all_reported)
        await asyncio.sleep(SETTLE)
        by_workers = function_loads(server)  # the test's own store has not called yet
        assert WORKERS <= by_workers <= WORKERS * LOAD_BOUND, workers.describe(f"{by_workers}")
        for proc in procs:
            [line] = proc.loss_errors()
            assert f"Valkey at {server.url}/0 LOST ITS DATA" in line, line
            assert "run_id changed" in line, line
        assert all(p.alive() for p in procs), workers.describe("a worker exited")

        took = await client_reports_once(store, lost[0], dataloss.CHECK_EVERY_SECONDS + GAP)
        assert len(store.data_loss) == 1 and "run_id changed" in store.data_loss[0]
        loads = await measured_loads(server, by_workers, workers, procs, client, lost, gate)
        print(
            f"\n[restart] reported by both workers {detected:.2f}s after the restart, by "
            f"the client {took:.2f}s after its first call; FUNCTION LOAD on the new server: "
            f"{by_workers} by the workers, {loads}"
        )
        assert len(store.data_loss) == 1
        stop(workers, procs)
    finally:
        await store.close()


async def test_workers_carry_on_after_the_server_is_flushed(
    own_server: ValkeyProcess, workers: Workers, tmp_path: Path
) -> None:
    server = own_server
    store = ValkeyStore.from_url(workers.url)
    client = WorkflowClient(store)
    gate = tmp_path / "gate"
    raw: Any = server.client()
    try:
        procs, lost = await start_serving(workers, store, client, gate)
        before = function_loads(server)
        raw.flushall()  # the server keeps running: the library stays, the markers go
        # The guarantee: each worker reports within a check interval and a gap, generously.
        bound = generous(dataloss.CHECK_EVERY_SECONDS + GAP)
        flushed = time.monotonic()
        reported: dict[str, float] = {}

        async def all_reported() -> bool:
            assert all(p.alive() for p in procs), workers.describe("a worker exited")
            for proc in procs:
                if proc.loss_errors():
                    reported.setdefault(proc.worker_id, time.monotonic() - flushed)
            return len(reported) == len(procs)

        await wait_for("each worker reporting the flush", workers, bound + 5, all_reported)
        for proc in procs:
            [line] = proc.loss_errors()
            assert f"Valkey at {server.url}/0 LOST ITS DATA" in line, line
            assert "FLUSHALL or FLUSHDB" in line and "kept running" in line, line
        await asyncio.sleep(SETTLE)
        by_workers = function_loads(server) - before
        assert WORKERS <= by_workers <= WORKERS * LOAD_BOUND, workers.describe(f"{by_workers}")
        gate.touch()  # the steps in flight return: their writes find their runs gone

        took = await client_reports_once(store, lost[0], bound)
        assert len(store.data_loss) == 1 and "kept running" in store.data_loss[0]
        loads = await measured_loads(
            server, before + by_workers, workers, procs, client, lost, gate
        )
        print(
            f"\n[flush] reported by the workers after "
            f"{', '.join(f'{t:.2f}s' for t in sorted(reported.values()))} (bound "
            f"{bound:.1f}s), by the client {took:.2f}s after its first call; FUNCTION "
            f"LOAD since the flush: {by_workers} by the workers, {loads}"
        )
        assert max(reported.values()) <= bound, reported
        for proc in procs:  # the library stayed: no call found it missing
            assert "had lost the pyrula function library" not in proc.text()
        assert len(store.data_loss) == 1
        stop(workers, procs)
    finally:
        raw.close()
        await store.close()
