"""Store faults with worker processes running: the valkey-server hangs, or is killed and
restarted from its append-only file, while runs are mid-step. Then the checker.

* ``hang``: SIGSTOP the server for longer than ``lock_ttl`` and than the store's
  ``socket_timeout`` (1 s here), then SIGCONT. Calls time out on the client while the
  server still holds them, and run them when it resumes: a journal write or outcome the
  worker gave up on may land late, replies arrive on connections that timed out, and
  leases expire by the server's clock meanwhile. Nothing may be lost, no journaled step
  may run again, and the workers must come through alive.
* ``kill``: SIGKILL the server mid-load and start it again on its data directory
  (``appendfsync always``) while a client keeps submitting. Every submit that returned a
  run id must end completed; every one that raised may or may not exist, but if it does
  it completes too. With persistence nothing is reported as data loss.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import pytest

from pyrula.workflows import StoreUnavailable, WorkflowClient
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.fixtures.chaos_workflows import WORKFLOW, expected_result
from tests.valkey.servers import ValkeyProcess

from .harness import LOCK_TTL, Cluster, Supervisor
from .nemesis import (  # noqa: F401  (fixtures)
    every_worker_window,
    judge,
    log_has,
    own_valkey,
    valkey_store,
    valkey_url,
)

pytestmark = pytest.mark.slow

WORKERS = 2


@pytest.fixture
def on_own_valkey(cluster: Cluster, own_valkey: ValkeyProcess) -> Cluster:  # noqa: F811
    cluster.url = valkey_url(own_valkey) + "&socket_timeout=1"
    return cluster


async def test_a_hung_server_longer_than_the_lease_loses_nothing(
    on_own_valkey: Cluster,
    own_valkey: ValkeyProcess,  # noqa: F811
    valkey_store: ValkeyStore,  # noqa: F811
) -> None:
    cluster, store, server = on_own_valkey, valkey_store, own_valkey
    supervisor = Supervisor(cluster, WORKERS, faultpoints="", seed=0)
    await supervisor.start(store)
    client = WorkflowClient(store)
    expected: dict[str, int] = {}
    for n in range(12):
        handle = await client.submit(WORKFLOW, {"n": n, "delays": [0.05, 1.0, 0.05]})
        expected[handle.run_id] = expected_result(n)
    deadline = time.monotonic() + 15
    while sum(line["step"] == "double" for line in cluster.ledger()) < 3:
        assert time.monotonic() < deadline, cluster.describe("no step 2 in flight")
        await asyncio.sleep(0.02)

    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    stopped = time.time()
    try:
        await asyncio.sleep(LOCK_TTL + 1.5)  # > lock_ttl and > socket_timeout
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    resumed = time.time()
    faults = every_worker_window(
        supervisor.slots, "store-stop", stopped - 2.0, resumed + LOCK_TTL + 1.0
    )
    report, summary = await judge(
        cluster, store, expected, faults, label="valkey hang", quiesce_for=40
    )
    await supervisor.halt()
    assert report.ok, summary
    assert report.figures["completed"] == len(expected), summary
    # The workers lived through it (no restarts) and saw the store time out.
    assert not supervisor.faults and not supervisor.unexpected_exits, summary
    assert all(w.alive() for w in supervisor.slots), summary
    assert log_has(supervisor.slots, "WARNING"), cluster.describe("no worker noticed the hang")
    assert not log_has(supervisor.slots, "LOST ITS DATA"), summary
    assert not log_has(supervisor.slots, "Traceback"), cluster.describe("a traceback")
    assert store.data_loss == []


async def test_a_killed_server_restarted_from_its_aof_loses_no_acknowledged_run(
    on_own_valkey: Cluster,
    own_valkey: ValkeyProcess,  # noqa: F811
    valkey_store: ValkeyStore,  # noqa: F811
) -> None:
    cluster, store, server = on_own_valkey, valkey_store, own_valkey
    supervisor = Supervisor(cluster, WORKERS, faultpoints="", seed=0)
    await supervisor.start(store)
    client = WorkflowClient(store)
    acked: dict[str, int] = {}
    unknown: dict[str, int] = {}
    stop_submitting = asyncio.Event()

    async def submitter() -> None:
        n = 0
        while not stop_submitting.is_set():
            run_id = uuid.uuid4().hex
            params = {"n": n, "delays": [0.02, 0.3, 0.02]}
            try:  # the key makes a retry of a submit whose reply was lost safe
                await client.submit(WORKFLOW, params, run_id=run_id, idempotency_key=run_id)
                acked[run_id] = expected_result(n)
            except StoreUnavailable:
                unknown[run_id] = expected_result(n)
            n += 1
            await asyncio.sleep(0.05)

    feeding = asyncio.create_task(submitter())
    await asyncio.sleep(1.5)
    killed = time.time()
    server.kill()  # SIGKILL: only what the append-only file holds survives
    await asyncio.sleep(2.0)
    server.start()  # same port, same directory: it loads the append-only file
    restarted = time.time()
    await asyncio.sleep(1.5)
    stop_submitting.set()
    await feeding

    landed = {}
    for run_id, want in unknown.items():
        found = None
        for _ in range(50):
            try:
                found = await store.get_run(run_id)
                break
            except StoreUnavailable:
                await asyncio.sleep(0.1)
        if found is not None:
            landed[run_id] = want
    expected = {**acked, **landed}
    faults = every_worker_window(
        supervisor.slots, "store-kill", killed - 2.0, restarted + LOCK_TTL + 2.0
    )
    report, summary = await judge(
        cluster,
        store,
        expected,
        faults,
        label="valkey kill",
        quiesce_for=40,
        extra=f"acked {len(acked)}, raised {len(unknown)} (of which landed {len(landed)})",
    )
    await supervisor.halt()
    assert report.ok, summary
    assert len(acked) >= 20 and unknown, summary  # submits went on before and after
    assert report.figures["completed"] == len(expected), summary
    assert not supervisor.faults and not supervisor.unexpected_exits, summary
    assert store.data_loss == [], store.data_loss
    assert not log_has(cluster.workers, "LOST ITS DATA"), summary
