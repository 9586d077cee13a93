"""A paused lease holder resumes while its successor is still running the run.

``test_crash.py`` resumes its zombie only after the new claimant has finished the run,
so the zombie's late write meets a run that has ended; and the fault suites' steps are
so short that the same happens there. Neither needs the token check itself: a store that
fenced on the run's status alone would pass them. Here the successor is mid-step when
the zombie resumes, so the run is ``running`` and only the token tells the two apart
(docs/concepts.md, Leases and fencing tokens; G4 in the reliability plan): the zombie's
writes must be refused with ``LeaseLost`` (checked through the store while the successor
runs, then by resuming the zombie), it must start nothing more, and the journal must be
written by the successor alone from the stolen step on.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pyrula.workflows import LeaseLost, RunStatus, WorkflowClient
from pyrula.workflows.records import JournalEntry, Outcome
from pyrula.workflows.stores.base import Store
from tests.fixtures.chaos_workflows import WORKFLOW, expected_result
from tests.valkey.servers import ValkeyProcess, valkey_server  # noqa: F401  (fixture)

from .harness import LOCK_TTL, Cluster
from .nemesis import opened_store

pytestmark = pytest.mark.slow

STEP = 6.0
"""The successor claims ~lock_ttl + one scan after the pause, then runs this long: the
zombie must resume while that step still runs, which leaves a loaded machine ~4 s."""
PAUSE = LOCK_TTL + 1.5


@pytest.fixture(params=["sqlite", "valkey"])
async def fenced_store(request: pytest.FixtureRequest, cluster: Cluster) -> AsyncIterator[Store]:
    async with opened_store(request, cluster, request.param) as store:
        yield store


def starts(ledger: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    return [x for x in ledger if x["run_id"] == run_id and x["phase"] == "start"]


async def test_a_zombie_resumed_mid_run_of_its_successor_is_fenced_by_token(
    cluster: Cluster, fenced_store: Store
) -> None:
    store = fenced_store
    a, b = cluster.start_worker("a"), cluster.start_worker("b")
    await cluster.wait_ready(store, a, b)
    client = WorkflowClient(store)
    handle = await client.submit(WORKFLOW, {"n": 6, "delays": [0.05, STEP, 0.05]})
    run_id = handle.run_id

    def doubling(pid: int | None = None) -> Any:
        return lambda x: (
            x["run_id"] == run_id
            and x["step"] == "double"
            and x["phase"] == "start"
            and (pid is None or x["pid"] == pid)
        )

    line = await cluster.wait_ledger(doubling(), timeout=15)
    zombie = cluster.by_pid(line["pid"])
    successor = b if zombie is a else a
    zombie_token = line["token"]
    await asyncio.to_thread(cluster.pause, zombie)
    taken = await cluster.wait_ledger(doubling(successor.pid), timeout=PAUSE + 5)
    wait = PAUSE - (time.time() - line["t"])
    await asyncio.sleep(max(0.0, wait))
    record = await handle.record()
    assert record.status is RunStatus.RUNNING and record.worker_id == successor.worker_id
    # The run is running now, so only the token refuses the zombie's writes.
    late_entry = JournalEntry(run_id, 1, "step", "double", True, "26")
    with pytest.raises(LeaseLost):
        await store.append_journal(zombie_token, late_entry)
    with pytest.raises(LeaseLost):
        await store.finish_run(run_id, zombie_token, Outcome(RunStatus.COMPLETED, result="0"))
    assert time.time() < taken["t"] + STEP - 0.3, "the successor finished too soon to test"
    resumed_at = time.time()
    zombie.send(signal.SIGCONT)

    assert await handle.result(timeout=20) == expected_result(6)
    await asyncio.sleep(0.5)  # let any late write of the zombie land
    # Its late journal write is refused, or its renewal learns first that the lease is
    # gone and stops the run before the write: either way it says so and writes nothing.
    assert f"run {run_id}: lease lost" in zombie.log_text(), cluster.describe("no lost lease")
    late = [x for x in starts(cluster.ledger(), run_id) if x["pid"] == zombie.pid
            and x["t"] > resumed_at]  # fmt: skip
    assert late == [], f"the resumed zombie started {late}"
    journal = await store.load_journal(run_id)
    new_token = taken["token"]
    assert new_token > zombie_token
    assert [(e.name, e.token) for e in journal] == [
        ("add_seven", zombie_token),
        ("double", new_token),
        ("minus_three", new_token),
    ]
    record = await handle.record()
    assert record.lease_token == new_token and record.worker_id == successor.worker_id
    assert zombie.alive() and zombie.state() not in ("T", "t")
