"""Crash, graceful stop and paused-holder tests with real worker processes.

Each test runs ``chaos.three_steps`` (``add_seven``, ``double``, ``minus_three``) with a
long ``double`` step, so the test can act on the worker while that step is in flight.
The step ledger (one O_APPEND line per step start and end) says what really executed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from pyrula.workflows import LeaseLost, RunStatus, WorkflowClient
from pyrula.workflows.records import JournalEntry, Outcome
from tests.fixtures.chaos_workflows import WORKFLOW, expected_result

from .check import take_snapshot
from .harness import FAST_OPTIONS, LOCK_TTL, ORPHAN_SCAN, Cluster, Worker, generous

pytestmark = pytest.mark.slow


def starts(ledger: list[dict[str, Any]], run_id: str, step: str) -> list[dict[str, Any]]:
    return [
        line
        for line in ledger
        if line["run_id"] == run_id and line["step"] == step and line["phase"] == "start"
    ]


def step_started(run_id: str, step: str, pid: int | None = None) -> Any:
    def match(line: dict[str, Any]) -> bool:
        return (
            line["run_id"] == run_id
            and line["step"] == step
            and line["phase"] == "start"
            and (pid is None or line["pid"] == pid)
        )

    return match


async def two_workers(cluster: Cluster, store: Any) -> tuple[Worker, Worker]:
    a, b = cluster.start_worker("a"), cluster.start_worker("b")
    await cluster.wait_ready(store, a, b)
    return a, b


async def test_sigkill_mid_step_hands_the_run_to_another_worker(
    cluster: Cluster, store: Any
) -> None:
    """The acceptance test: SIGKILL the holder inside step 2; the other worker finishes."""
    a, b = await two_workers(cluster, store)
    client = WorkflowClient(store)
    handle = await client.submit(WORKFLOW, {"n": 5, "delays": [0.05, 3.0, 0.05]})
    run_id = handle.run_id
    line = await cluster.wait_ledger(step_started(run_id, "double"), timeout=15)
    victim = cluster.by_pid(line["pid"])
    survivor = b if victim is a else a
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.time()
    assert victim.wait(5) == -signal.SIGKILL

    assert await handle.result(timeout=30) == expected_result(5)
    ledger = cluster.ledger()
    first, second, third = (
        starts(ledger, run_id, s) for s in ("add_seven", "double", "minus_three")
    )
    assert len(first) == 1 and first[0]["pid"] == victim.pid, first
    assert 1 <= len(second) <= 2, second
    assert [s["pid"] for s in second] == [victim.pid, survivor.pid], second
    assert [s["pid"] for s in third] == [survivor.pid], third

    recovery = second[1]["t"] - killed_at
    bound = generous(LOCK_TTL + ORPHAN_SCAN)  # the guarantee: a lease ttl and one scan
    print(f"\nrecovery: kill -> step 2 restarted on the survivor in {recovery:.2f}s (< {bound}s)")
    assert 0 < recovery < bound, f"recovery took {recovery:.2f}s, bound {bound}s"

    record = await handle.record()
    assert record.worker_id == survivor.worker_id
    assert record.recoveries == 1 and record.claims == 2
    journal = await store.load_journal(run_id)
    assert [e.name for e in journal] == ["add_seven", "double", "minus_three"]
    assert [e.token for e in journal] == [
        first[0]["token"],
        second[1]["token"],
        second[1]["token"],
    ]
    assert second[1]["token"] > second[0]["token"]


async def test_sigterm_requeues_the_run_and_another_worker_finishes_it(
    cluster: Cluster, store: Any
) -> None:
    a = cluster.start_worker("a")
    await cluster.wait_ready(store, a)
    client = WorkflowClient(store)
    handle = await client.submit(WORKFLOW, {"n": 11, "delays": [0.05, 3.0, 0.05]})
    run_id = handle.run_id
    await cluster.wait_ledger(step_started(run_id, "double", a.pid), timeout=15)

    sent = time.monotonic()
    a.send(signal.SIGTERM)
    code = a.wait(15)
    took = time.monotonic() - sent
    # The guarantee: a stop takes at most the grace and the cancel timeout.
    bound = generous(float(FAST_OPTIONS["shutdown_grace"]) + float(FAST_OPTIONS["cancel_timeout"]))
    print(f"\ngraceful stop: exit {code} {took:.2f}s after SIGTERM (< {bound}s)")
    assert code == 0, cluster.describe(f"worker exited {code}")
    assert took < bound

    record = await handle.record()
    assert record.status is RunStatus.QUEUED, record
    assert await store.list_runs(status=RunStatus.RUNNING) == []
    assert [e.name for e in await store.load_journal(run_id)] == ["add_seven"]
    assert "requeued" in a.log_text()

    b = cluster.start_worker("b")
    await cluster.wait_ready(store, b)
    assert await handle.result(timeout=30) == expected_result(11)
    ledger = cluster.ledger()
    assert [s["pid"] for s in starts(ledger, run_id, "add_seven")] == [a.pid]
    assert [s["pid"] for s in starts(ledger, run_id, "double")] == [a.pid, b.pid]
    assert [s["pid"] for s in starts(ledger, run_id, "minus_three")] == [b.pid]
    handover = starts(ledger, run_id, "double")[1]["t"] - b.started
    print(f"handover: step 2 restarted {handover:.2f}s after the second worker was spawned")
    assert handover < LOCK_TTL, "the requeued run waited for a lease to lapse"
    record = await handle.record()
    assert record.recoveries == 0 and record.worker_id == b.worker_id


async def test_sigstopped_holder_is_fenced_after_another_worker_recovers(
    cluster: Cluster, store: Any
) -> None:
    a, b = await two_workers(cluster, store)
    client = WorkflowClient(store)
    handle = await client.submit(WORKFLOW, {"n": 2, "delays": [0.05, 1.5, 0.05]})
    run_id = handle.run_id
    line = await cluster.wait_ledger(step_started(run_id, "double"), timeout=15)
    zombie = cluster.by_pid(line["pid"])
    other = b if zombie is a else a
    zombie_token = line["token"]
    await asyncio.to_thread(cluster.pause, zombie)

    assert await handle.result(timeout=30) == expected_result(2)
    assert zombie.state() in ("T", "t"), "the paused worker ran on"
    before = await take_snapshot(store, [run_id])
    resumed_at = time.time()
    zombie.send(signal.SIGCONT)

    deadline = time.monotonic() + 10
    while "lease lost" not in zombie.log_text() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(LOCK_TTL / 3 + 0.5)  # let any other late write land
    log = zombie.log_text()
    # On SIGCONT the step's 10 ms poll timer is the first one due, so the step ends and
    # its journal write (fenced by the old token) reaches the store before the renewal
    # can report the lease lost: the runner's message says the write was refused.
    refused = f"run {run_id}: lease lost; abandoning it to its new holder"
    assert refused in log, cluster.describe("the zombie's late journal write was not refused")
    print("\nresumed zombie: its late journal write was refused (LeaseLost)")

    after = await take_snapshot(store, [run_id])
    record = after.runs[run_id]
    assert record is not None and record.status is RunStatus.COMPLETED
    assert after == before, "the resumed zombie changed the run or its journal"
    assert record.worker_id == other.worker_id and record.recoveries == 1
    journal = after.journals[run_id]
    new_token = record.lease_token
    assert new_token > zombie_token
    assert [e.token for e in journal] == [zombie_token, new_token, new_token]
    ledger = cluster.ledger()
    doubles = starts(ledger, run_id, "double")
    assert [(s["pid"], s["token"]) for s in doubles] == [
        (zombie.pid, zombie_token),
        (other.pid, new_token),
    ]
    late_ends = [
        e for e in ledger if e["pid"] == zombie.pid and e["phase"] == "end" and e["t"] > resumed_at
    ]
    assert late_ends, "the zombie's step never finished after SIGCONT"

    # The store refuses the zombie's token outright (fencing, G4).
    entry = JournalEntry(run_id, 1, "step", "double", True, "24")
    with pytest.raises(LeaseLost):
        await store.append_journal(zombie_token, entry)
    with pytest.raises(LeaseLost):
        await store.finish_run(run_id, zombie_token, Outcome(RunStatus.COMPLETED, result="0"))

    # The zombie is not wedged: with the other worker gone, it serves the next run.
    other.send(signal.SIGTERM)
    assert other.wait(15) == 0
    assert zombie.alive()
    next_run = await client.submit(WORKFLOW, {"n": 3, "delays": [0.01, 0.01, 0.01]})
    assert await next_run.result(timeout=20) == expected_result(3)
    assert (await next_run.record()).worker_id == zombie.worker_id
