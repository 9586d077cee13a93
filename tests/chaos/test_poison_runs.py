"""A poison run: a step that ends its worker process every time (``os._exit(137)``).

Worker processes under a supervisor that restarts the dead, ``max_recoveries=2``. The
promise (docs/errors.md, RunDeadLettered; docs/worker.md, orphan recovery loop): a run
that keeps killing its workers is dead-lettered after ``max_recoveries`` recoveries, so
the fleet stops crash-looping, and the other runs keep flowing, none lost, none re-run.

The first test gives each worker one slot, so a crash takes down the poison run alone.
The second shows what happens to a healthy run that shares the dying worker: it is
recovered with the poison run, claimed again beside it, and dead-lettered with it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator

import pytest

from pyrula.workflows import DurableInvocationError, RunStatus, WorkflowClient
from pyrula.workflows.stores.base import Store
from tests.fixtures.chaos_workflows import WORKFLOW, expected_result
from tests.fixtures.fault_workflows import POISON, POISON_EXIT
from tests.valkey.servers import ValkeyProcess, valkey_server  # noqa: F401  (fixture)

from . import harness
from .check import FaultWindow
from .harness import Cluster, Supervisor
from .nemesis import judge, opened_store

pytestmark = pytest.mark.slow

MAX_RECOVERIES = 2
LOCK_TTL = 1.0
HEALTHY = 16


@pytest.fixture(params=["sqlite", "valkey"])
async def fleet_store(
    request: pytest.FixtureRequest, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Store]:
    """The cluster's store (SQLite file, or a fresh namespace on the session's Valkey),
    with workers importing the poison workflow as well."""
    monkeypatch.setattr(harness, "WORKFLOW_MODULE", "tests.fixtures.fault_workflows")
    async with opened_store(request, cluster, request.param) as store:
        yield store


def crashes(cluster: Cluster) -> list[FaultWindow]:
    """A fault window for every worker that exited with the poison's code."""
    return [
        FaultWindow("crash", w.pid, w.started, w.ended or time.time())
        for w in cluster.workers
        if w.proc.poll() == POISON_EXIT
    ]


async def test_a_run_that_kills_its_worker_every_time_is_dead_lettered(
    cluster: Cluster, fleet_store: Store
) -> None:
    store = fleet_store
    supervisor = Supervisor(
        cluster,
        2,
        faultpoints="",
        seed=0,
        lock_ttl=LOCK_TTL,
        max_recoveries=MAX_RECOVERIES,
        max_concurrent_runs=1,  # a crash takes the poison run alone (see the next test)
    )
    await supervisor.start(store)
    client = WorkflowClient(store, require_registered=False)
    poison = await client.submit(POISON, {"n": 1})

    rng = random.Random(77)
    expected: dict[str, int] = {}
    deadline = time.monotonic() + 40
    while (await poison.status()) is not RunStatus.DEAD:
        assert time.monotonic() < deadline, cluster.describe("the poison run never died")
        if len(expected) < HEALTHY:
            delays = [round(rng.uniform(0.01, 0.03), 3) for _ in range(3)]
            handle = await client.submit(WORKFLOW, {"n": len(expected), "delays": delays})
            expected[handle.run_id] = expected_result(len(expected))
        await asyncio.sleep(0.25)
    dead_at = time.monotonic()
    for n in range(len(expected), HEALTHY):  # the rest after it died: served at once
        handle = await client.submit(WORKFLOW, {"n": n, "delays": [0.01, 0.01, 0.01]})
        expected[handle.run_id] = expected_result(n)

    report, summary = await judge(
        cluster, store, expected, crashes(cluster), label=f"poison on {store.url}"
    )
    await asyncio.sleep(max(0.0, dead_at + 2 * LOCK_TTL - time.monotonic()))
    await supervisor.halt()

    # Dead-lettered with a reason, after exactly max_recoveries + 1 workers died on it.
    record = await poison.record()
    assert record.status is RunStatus.DEAD, record
    assert record.claims == MAX_RECOVERIES + 1, record
    with pytest.raises(DurableInvocationError) as dead:
        await poison.result(timeout=1)
    assert dead.value.error_type == "pyrula.workflows.errors.RunDeadLettered"
    assert f"max_recoveries={MAX_RECOVERIES}" in dead.value.error_message
    ledger = cluster.ledger()
    starts = [x for x in ledger if x["run_id"] == poison.run_id and x["phase"] == "start"]
    crash_starts = [x for x in starts if x["step"] == "crash_the_worker"]
    first_starts = [x for x in starts if x["step"] == "add_seven"]
    assert len(crash_starts) == MAX_RECOVERIES + 1, crash_starts
    assert len(first_starts) == 1, "the journaled first step ran again on a recovery"
    # The crash loop stopped: no worker died after the run was dead-lettered.
    died = [w for w in cluster.workers if w.proc.poll() == POISON_EXIT]
    assert len(died) == MAX_RECOVERIES + 1, cluster.describe(f"{len(died)} workers died")
    assert len(supervisor.unexpected_exits) == MAX_RECOVERIES + 1, supervisor.unexpected_exits
    assert all(w.alive() for w in supervisor.slots), summary
    # The healthy runs all completed, once each, nothing journaled ran again.
    assert report.ok, summary
    assert report.figures["completed"] == HEALTHY, summary


async def test_a_healthy_run_that_shared_the_poisoned_worker_still_completes(
    cluster: Cluster, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker (restarted when it dies) with four slots; a healthy run with a 1 s
    step and the poison run come due at the same moment, so one claim takes both. The
    healthy run never killed anything: it must end completed, not dead."""
    monkeypatch.setattr(harness, "WORKFLOW_MODULE", "tests.fixtures.fault_workflows")
    supervisor = Supervisor(
        cluster, 1, faultpoints="", seed=0, lock_ttl=LOCK_TTL, max_recoveries=MAX_RECOVERIES
    )
    await supervisor.start(store)
    client = WorkflowClient(store, require_registered=False)
    at = time.time() + 0.5  # both due together: one claim takes both
    healthy = await client.submit(WORKFLOW, {"n": 3, "delays": [0.01, 1.0, 0.01]}, start_at=at)
    poison = await client.submit(POISON, {"n": 1}, start_at=at)
    deadline = time.monotonic() + 30
    while (await poison.status()) is not RunStatus.DEAD:
        assert time.monotonic() < deadline, cluster.describe("the poison run never died")
        await asyncio.sleep(0.1)
    await supervisor.halt()
    record = await healthy.record()
    print(f"\nhealthy run beside the poison: {record.status.value}, claims {record.claims}")
    assert record.status is not RunStatus.DEAD, record.error
    assert await healthy.result(timeout=10) == expected_result(3)
