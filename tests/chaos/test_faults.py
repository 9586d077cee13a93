"""Fault-injection suite: many runs, three worker processes, faults, then the checker.

A driver submits ``RUNS`` three-step runs (steps sleep 10-50 ms) over ``SUBMIT_SPREAD``
seconds to ``WORKERS`` worker processes started with fault points on; a supervisor
restarts killed workers until every run is terminal or ``QUIESCE`` seconds pass. The
checker (``check.py``) then enforces no lost run, one correct outcome per run, no
re-execution of a journaled step, and duplicates only where a fault explains them.

Each scenario prints its seed; ``PYRULA_CHAOS_SEED=<seed>`` replays the dice (worker
fault seeds, step delays, pause victims). Artifacts (database, ledger, worker logs,
expected.json, faults.json) stay in the test's tmp dir; ``python -m tests.chaos.check
DIR`` re-checks them.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from dataclasses import dataclass
from typing import Any

import pytest

from pyrula.workflows import RunStatus, WorkflowClient
from pyrula.workflows.records import JournalEntry, RunRecord
from pyrula.workflows.stores.base import Store
from tests.fixtures.chaos_workflows import WORKFLOW, expected_result

from .check import FaultWindow, Snapshot, check, quiesce
from .harness import LOCK_TTL, Cluster, Supervisor, Worker
from .nemesis import judge

pytestmark = pytest.mark.slow

RUNS = 40
WORKERS = 3
SUBMIT_SPREAD = 6.0
QUIESCE = 30.0
PAUSE = LOCK_TTL + 1.5


@dataclass(frozen=True)
class Scenario:
    name: str
    faultpoints: str
    seed: int
    """Default seed; PYRULA_CHAOS_SEED overrides it."""
    pauses: int = 0
    """SIGSTOP/SIGCONT cycles (each longer than lock_ttl) of a random worker."""


SCENARIOS = [
    Scenario("after_step_before_journal", "after_step_before_journal=kill@0.05", 1101),
    Scenario("after_journal_before_reply", "after_journal_before_reply=raise@0.3", 2202),
    Scenario("sigstop_twice", "", 3303, pauses=2),
    Scenario("after_claim_before_outcome", "after_claim=kill@0.05;before_outcome=kill@0.05", 4404),
]


async def submit_runs(
    store: Store, rng: random.Random, runs: int = RUNS, spread: float = SUBMIT_SPREAD
) -> dict[str, int]:
    """Submit ``runs`` three-step runs evenly over ``spread`` seconds (0: all at once);
    return run id -> expected result."""
    client = WorkflowClient(store)
    expected: dict[str, int] = {}
    for n in range(runs):
        delays = [round(rng.uniform(0.01, 0.05), 3) for _ in range(3)]
        handle = await client.submit(WORKFLOW, {"n": n, "delays": delays})
        expected[handle.run_id] = expected_result(n)
        await asyncio.sleep(spread / runs)
    return expected


async def pause_a_holder(
    cluster: Cluster, store: Store, supervisor: Supervisor, rng: random.Random
) -> tuple[Worker, float, int]:
    """SIGSTOP a random worker that holds at least one run; return it, when, how many.

    A stopped worker holding nothing tests nothing, so a pick that holds no run is
    resumed at once (a pause of milliseconds, far below lock_ttl) and another is tried.
    """
    deadline = time.monotonic() + 4.0
    while True:
        alive = sorted((w for w in supervisor.slots if w.alive()), key=lambda w: w.worker_id)
        victim = rng.choice(alive)
        paused_at = await asyncio.to_thread(cluster.pause, victim)
        running = await store.list_runs(status=RunStatus.RUNNING)
        held = sum(r.worker_id == victim.worker_id for r in running)
        if held or time.monotonic() > deadline:
            return victim, paused_at, held
        victim.send(signal.SIGCONT)
        await asyncio.sleep(rng.uniform(0.005, 0.03))


async def pause_workers(
    cluster: Cluster, store: Store, supervisor: Supervisor, rng: random.Random, count: int
) -> list[FaultWindow]:
    """``count`` times: SIGSTOP a random run holder for PAUSE s (> lock_ttl), SIGCONT it."""
    windows: list[FaultWindow] = []
    for i in range(count):
        await asyncio.sleep(0.5 if i == 0 else 0.3)
        victim, paused_at, held = await pause_a_holder(cluster, store, supervisor, rng)
        await asyncio.sleep(PAUSE)
        victim.send(signal.SIGCONT)
        resumed_at = time.time()
        print(f"paused {victim.worker_id} holding {held} runs for {resumed_at - paused_at:.2f}s")
        # Wasted work of the victim: steps in flight when it stopped, and a step it may
        # start on resuming before its renewal notices the lease is gone.
        windows.append(FaultWindow("stop", victim.pid, paused_at - 1.0, resumed_at + LOCK_TTL))
    return windows


def fired(cluster: Cluster) -> int:
    return sum(w.log_text().count("fault point ") for w in cluster.workers)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
async def test_fault_scenario(cluster: Cluster, store: Store, scenario: Scenario) -> None:
    seed = int(os.environ.get("PYRULA_CHAOS_SEED") or scenario.seed)
    print(f"\n[{scenario.name}] seed {seed} (replay: PYRULA_CHAOS_SEED={seed})")
    supervisor = Supervisor(cluster, WORKERS, faultpoints=scenario.faultpoints, seed=seed)
    await supervisor.start(store)
    started = time.monotonic()
    pauser = None
    if scenario.pauses:
        pauser = asyncio.create_task(
            pause_workers(cluster, store, supervisor, random.Random(seed + 1), scenario.pauses)
        )
    expected = await submit_runs(store, random.Random(seed))
    pauses = await pauser if pauser is not None else []
    await quiesce(store, list(expected), QUIESCE)  # faults still happen until then
    faults = [*supervisor.faults, *pauses]
    kills = sum(f.kind == "kill" for f in faults)
    report, summary = await judge(
        cluster,
        store,
        expected,
        faults,
        label=f"{scenario.name}, seed {seed}",
        quiesce_for=0,  # done above
        extra=f"fault points fired {fired(cluster)}, workers killed {kills}, paused "
        f"{len(pauses)}, {time.monotonic() - started:.1f}s",
    )
    await supervisor.halt()
    assert report.ok, summary
    assert not supervisor.unexpected_exits, f"{supervisor.unexpected_exits}\n{summary}"
    assert report.figures["completed"] == RUNS, summary
    if scenario.faultpoints:
        assert fired(cluster) > 0, f"no fault fired; the scenario tested nothing\n{summary}"
    if "kill" in scenario.faultpoints:
        assert kills > 0, summary
    if scenario.pauses:  # each paused holder's runs were taken over by another worker
        assert report.figures["recoveries"] >= scenario.pauses, summary
    if not faults:  # lost replies alone must never make a step run twice
        assert report.figures["dup_step_execs"] == 0, summary
    assert len(pauses) == scenario.pauses


async def test_lost_replies_past_the_retry_window_hand_the_run_on(
    cluster: Cluster, store: Store
) -> None:
    """Every journal reply lost for a whole retry window: the run is abandoned to another
    worker (its lease lapses), never recorded as failed, and the step whose write did
    land is not run again."""
    faulty = cluster.start_worker(
        "faulty", env={"PYRULA_FAULTPOINTS": "after_journal_before_reply=raise@1"}, lock_ttl=1.0
    )
    await cluster.wait_ready(store, faulty)
    client = WorkflowClient(store)
    handle = await client.submit(WORKFLOW, {"n": 4, "delays": [0.01, 0.01, 0.01]})
    deadline = time.monotonic() + 15
    while "abandoning the run" not in faulty.log_text():
        if (await handle.record()).is_terminal:
            break
        assert time.monotonic() < deadline, cluster.describe("the faulty worker never gave up")
        await asyncio.sleep(0.05)
    faulty.send(signal.SIGKILL)
    faulty.wait(5)
    record = await handle.record()
    assert record.status is RunStatus.RUNNING, record  # abandoned, not failed

    healthy = cluster.start_worker("healthy")
    assert await handle.result(timeout=20) == expected_result(4)
    ledger = [line for line in cluster.ledger() if line["phase"] == "start"]
    assert [(line["step"], line["pid"]) for line in ledger] == [
        ("add_seven", faulty.pid),
        ("double", healthy.pid),
        ("minus_three", healthy.pid),
    ]


def _run(run_id: str, status: RunStatus, result: str | None, token: int) -> RunRecord:
    return RunRecord(
        run_id, WORKFLOW, "{}", status, "", None, 0.0, 0.0, 0.0,
        finished_at=200.0, result=result, lease_token=token,
    )  # fmt: skip


def _history(
    run_id: str, token: int, pid: int = 10
) -> tuple[list[JournalEntry], list[dict[str, Any]]]:
    steps = ("add_seven", "double", "minus_three")
    journal = [
        JournalEntry(run_id, i, "step", s, True, "0", token=token, recorded_at=100.0 + i)
        for i, s in enumerate(steps)
    ]
    ledger = [
        {"run_id": run_id, "step": s, "phase": "start", "pid": pid, "token": token, "t": 99.5 + i}
        for i, s in enumerate(steps)
    ]
    return journal, ledger


def test_checker_flags_each_violation() -> None:
    """The checker is only worth its figures if it fails: feed it one broken history each."""
    runs: dict[str, RunRecord | None] = {}
    journals: dict[str, list[JournalEntry]] = {}
    ledger: list[dict[str, Any]] = []
    for run_id in ("ok", "lost", "wrong", "rerun", "wasted", "explained"):
        journals[run_id], lines = _history(run_id, token=2)
        ledger += lines
        runs[run_id] = _run(run_id, RunStatus.COMPLETED, "19", 2)
    runs["lost"] = _run("lost", RunStatus.RUNNING, None, 2)
    runs["wrong"] = _run("wrong", RunStatus.COMPLETED, "18", 2)
    ledger.append(
        {"run_id": "rerun", "step": "double", "phase": "start", "pid": 10, "token": 3, "t": 150.0}
    )
    ledger.append(
        {"run_id": "wasted", "step": "double", "phase": "start", "pid": 11, "token": 1, "t": 99.0}
    )
    ledger.append(
        {
            "run_id": "explained",
            "step": "double",
            "phase": "start",
            "pid": 12,
            "token": 1,
            "t": 99.0,
        }
    )
    expected = dict.fromkeys(runs, 19)
    later = Snapshot({**runs, "ok": _run("ok", RunStatus.FAILED, None, 2)}, journals)
    faults = [FaultWindow("kill", 12, 0.0, 120.0)]
    report = check(
        expected=expected, ledger=ledger, snapshot=Snapshot(runs, journals), later=later,
        faults=faults, max_in_flight=4,
    )  # fmt: skip
    text = report.text(limit=100)
    for needle in (
        "I1 lost: run lost",
        "I6 run wrong returned 18",
        "I3 run rerun: double journaled",
        "I4 run wasted: double by pid 11",
        "I2 run ok outcome changed",
        "I4 3 duplicate step executions > 1 in flight",
    ):
        assert needle in text
    assert "explained" not in text
    figures = report.figures
    assert (figures["lost"], figures["reexecutions"], figures["dup_step_execs"]) == (1, 1, 3)
    assert figures["in_flight_at_faults"] == 1 and figures["wrong_results"] == 1

    ok_ledger = [line for line in ledger if line["run_id"] == "ok"]
    report = check(expected={"ok": 19}, ledger=ok_ledger, snapshot=Snapshot(runs, journals))
    assert report.ok, report.text()
    twice = [*ok_ledger, {**ok_ledger[2], "t": 101.9}]
    report = check(expected={"ok": 19}, ledger=twice, snapshot=Snapshot(runs, journals))
    assert "claimant 2 started minus_three 2 times" in report.text()
