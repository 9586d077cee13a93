"""SIGTERM with a grace longer than the lease: the draining worker keeps renewing.

docs/worker.md, Graceful shutdown: the worker stops claiming, then "waits up to
``shutdown_grace`` for in-flight runs to finish. Lease renewal keeps running during this
wait, so their leases can't lapse." A worker that stopped renewing when told to stop (the
Temporal sdk-java #2903 trap) would have its run, mid-step, recovered by the other
worker's orphan scan after ``lock_ttl``: the step would run twice, the run be claimed
twice. Here the step lasts three leases and the grace covers it.
"""

from __future__ import annotations

import signal
import time

import pytest

from pyrula.workflows import WorkflowClient
from pyrula.workflows.stores.sqlite import SqliteStore
from tests.fixtures.chaos_workflows import WORKFLOW, expected_result

from .harness import Cluster, generous

pytestmark = pytest.mark.slow

LOCK_TTL = 1.0
STEP = 3.0  # three leases
GRACE = 20.0
"""Far longer than the step left at SIGTERM: the drain ends with the run, not the grace."""


async def test_a_draining_worker_keeps_its_leases_and_finishes_the_run(
    cluster: Cluster, store: SqliteStore
) -> None:
    a, b = (
        cluster.start_worker(
            name, lock_ttl=LOCK_TTL, shutdown_grace=GRACE, orphan_scan_interval=0.2
        )
        for name in ("a", "b")
    )
    await cluster.wait_ready(store, a, b)
    client = WorkflowClient(store)
    handle = await client.submit(WORKFLOW, {"n": 4, "delays": [0.05, STEP, 0.05]})

    def started(line: dict[str, object]) -> bool:
        return line["run_id"] == handle.run_id and line["step"] == "double"

    line = await cluster.wait_ledger(started, timeout=15)
    victim = cluster.by_pid(int(str(line["pid"])))
    other = b if victim is a else a
    sent = time.monotonic()
    victim.send(signal.SIGTERM)

    # It stops claiming at once: a run submitted now goes to the other worker.
    later = await client.submit(WORKFLOW, {"n": 5, "delays": [0.01, 0.01, 0.01]})
    assert await later.result(timeout=10) == expected_result(5)

    code = victim.wait(GRACE + 5)
    took = time.monotonic() - sent
    print(f"\ndrain: exit {code} {took:.2f}s after SIGTERM (step {STEP}s, lease {LOCK_TTL}s)")
    assert code == 0, cluster.describe(f"the draining worker exited {code}")
    # The guarantee: the drain ends once the run's step (at most STEP) is done, not when
    # the grace runs out (generous for a loaded machine, and still well within it).
    assert took < generous(STEP) < GRACE, "the worker waited out its grace, not its run"
    assert await handle.result(timeout=5) == expected_result(4)

    record = await handle.record()
    assert record.claims == 1 and record.recoveries == 0, record
    assert record.worker_id == victim.worker_id
    ledger = [x for x in cluster.ledger() if x["phase"] == "start"]
    mine = [(x["step"], x["pid"]) for x in ledger if x["run_id"] == handle.run_id]
    assert mine == [
        ("add_seven", victim.pid),
        ("double", victim.pid),
        ("minus_three", victim.pid),
    ], mine
    assert {x["pid"] for x in ledger if x["run_id"] == later.run_id} == {other.pid}
    assert "draining 1 runs" in victim.log_text()
    assert "lease lost" not in victim.log_text()
