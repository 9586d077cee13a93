"""Faults for the chaos tests beyond the fault points: SIGKILLs of run holders from
outside, worker clusters on a real valkey-server, and ``judge``: quiesce, take two
snapshots a second apart, and run the checker of ``check.py``.

Reuses ``harness.Cluster``/``Supervisor`` and the helpers of ``test_faults``; a Valkey
cluster is a ``Cluster`` whose URL points at a namespace of its own on a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
from collections.abc import AsyncIterator, Iterator

import pytest

from pyrula.workflows import RunStatus, open_store
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.valkey.servers import ValkeyProcess, fresh_namespace

from .check import FaultWindow, Report, check, fault_dicts, quiesce, take_snapshot
from .harness import FAST_OPTIONS, Cluster, Supervisor, Worker

MAX_IN_FLIGHT = int(FAST_OPTIONS["max_concurrent_runs"])
VALKEY_SHARDS = 8


def valkey_url(server: ValkeyProcess, namespace: str | None = None) -> str:
    """A store URL on ``server`` in a fresh namespace, with fast shard leases."""
    return (
        f"{server.url}/0?namespace={namespace or fresh_namespace()}"
        f"&shard_count={VALKEY_SHARDS}&shard_lease_ttl=2&shard_lease_interval=0.5"
    )


@pytest.fixture
def own_valkey() -> Iterator[ValkeyProcess]:
    """A valkey-server of the test's own, with the append-only file on and
    ``appendfsync always``, for tests that pause, kill or restart it (stopped by PID)."""
    server = ValkeyProcess(persist=True)
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@contextlib.asynccontextmanager
async def opened_store(
    request: pytest.FixtureRequest, cluster: Cluster, kind: str
) -> AsyncIterator[Store]:
    """The cluster's store, opened: its SQLite file, or with ``kind`` "valkey" a fresh
    namespace on the session's valkey-server (``cluster.url`` set, for its workers)."""
    if kind == "valkey":
        server = request.getfixturevalue("valkey_server")
        assert isinstance(server, ValkeyProcess)
        cluster.url = valkey_url(server)
    store = open_store(cluster.url)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def valkey_store(cluster: Cluster) -> AsyncIterator[ValkeyStore]:
    """This process's store on the cluster's URL (a test sets ``cluster.url`` first)."""
    store = open_store(cluster.url)
    assert isinstance(store, ValkeyStore), cluster.url
    try:
        yield store
    finally:
        await store.close()


async def holders(store: Store) -> dict[str, int]:
    """worker id -> how many running runs it holds."""
    held: dict[str, int] = {}
    for run in await store.list_runs(status=RunStatus.RUNNING, limit=1000):
        if run.worker_id:
            held[run.worker_id] = held.get(run.worker_id, 0) + 1
    return held


HOLDER_POLL = 0.02
"""Seconds between two looks for a worker holding a run, when none did."""


async def kill_holders(
    store: Store, supervisor: Supervisor, rng: random.Random, count: int, gap: float
) -> int:
    """``count`` times, ``gap`` seconds apart: SIGKILL a random live worker that holds a
    run (its steps are mid-flight, or its journal or outcome write is). A moment when no
    worker holds a run (runs are short, and come in spread out) is waited out, up to
    ``gap`` seconds more, so the kills do not depend on the timing of the machine. The
    supervisor records each death as a fault window and starts a replacement. Returns
    the kills."""
    kills = 0
    loop = asyncio.get_running_loop()
    for _ in range(count):
        await asyncio.sleep(gap * rng.uniform(0.6, 1.4))
        deadline = loop.time() + gap
        while True:
            held = await holders(store)
            alive = [w for w in supervisor.slots if w.alive() and held.get(w.worker_id)]
            if alive or loop.time() >= deadline:
                break
            await asyncio.sleep(HOLDER_POLL)
        if not alive:
            continue
        victim = rng.choice(sorted(alive, key=lambda w: w.worker_id))
        victim.send(signal.SIGKILL)
        kills += 1
    return kills


def every_worker_window(
    workers: list[Worker], kind: str, start: float, end: float
) -> list[FaultWindow]:
    """A fault on the store hits every worker: each may waste the steps it had in flight."""
    return [FaultWindow(kind, w.pid, start, end) for w in workers]


async def judge(
    cluster: Cluster,
    store: Store,
    expected: dict[str, int],
    faults: list[FaultWindow],
    *,
    label: str,
    quiesce_for: float = 30.0,
    extra: str = "",
) -> tuple[Report, str]:
    """Quiesce, snapshot twice a second apart, save the artifacts and run the checker.
    Returns the report and a one-paragraph summary for assertion messages."""
    pending = await quiesce(store, list(expected), quiesce_for)
    snapshot = await take_snapshot(store, expected)
    await asyncio.sleep(1.0)
    later = await take_snapshot(store, expected)
    cluster.save("expected.json", expected)
    cluster.save("faults.json", fault_dicts(faults))
    report = check(
        expected=expected,
        ledger=cluster.ledger(),
        snapshot=snapshot,
        later=later,
        faults=faults,
        max_in_flight=MAX_IN_FLIGHT,
    )
    summary = (
        f"[{label}] {report.text()}\nfaults {len(faults)}, unfinished after quiesce "
        f"{len(pending)} {extra}\n(artifacts in {cluster.dir})"
    )
    print(summary)
    return report, summary


def log_has(workers: list[Worker], needle: str) -> bool:
    return any(needle in w.log_text() for w in workers)
