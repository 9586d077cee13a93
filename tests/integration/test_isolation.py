"""Suspect runs (recovered ``SUSPECT_AFTER`` times) run alone on their worker
(pyrula/workflows/isolation.py), so a run that kills its worker takes no bystander with
it. tests/chaos/test_poison_runs.py shows the same with real processes that die."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from pyrula.workflows import MemoryStore, RunStatus, WorkflowClient, WorkflowContext, workflow
from pyrula.workflows.isolation import DEFER_FOR, DRAIN_AFTER, SUSPECT_AFTER, Isolation
from pyrula.workflows.records import Lease, RunRecord
from pyrula.workflows.registry import Registry
from tests.conftest import StartWorker


async def make_suspect(store: MemoryStore, workflow_name: str) -> None:
    """Let the run's lease lapse and recover it, SUSPECT_AFTER times (a dead worker's)."""
    for _ in range(SUSPECT_AFTER):
        (lease,) = await store.claim_runs("ghost", [workflow_name], 1, 0.02)
        await asyncio.sleep(0.05)
        report = await store.recover_expired(max_recoveries=10, limit=10)
        assert list(report.requeued) == [lease.run_id]


async def test_a_suspect_runs_alone_and_the_others_after_it(
    registry: Registry, start_worker: StartWorker
) -> None:
    store = MemoryStore()
    spans: dict[int, tuple[float, float]] = {}

    @workflow(registry=registry)
    async def tracked(ctx: WorkflowContext, n: int) -> int:
        started = time.monotonic()
        await asyncio.sleep(0.2)
        spans[n] = (started, time.monotonic())
        return n

    client = WorkflowClient(store, registry=registry)
    suspect = await client.submit(tracked, {"n": 0})
    await make_suspect(store, "tracked")
    others = [await client.submit(tracked, {"n": n}) for n in (1, 2, 3)]
    await start_worker(store, [tracked], max_concurrent_runs=4)
    assert await suspect.result(timeout=10) == 0
    assert [await h.result(timeout=10) for h in others] == [1, 2, 3]
    alone = spans[0]
    for n in (1, 2, 3):  # none ran beside the suspect (all four would, one batch)
        assert spans[n][0] >= alone[1] or spans[n][1] <= alone[0], (n, spans)
    record = await suspect.record()
    assert record.status is RunStatus.COMPLETED and record.recoveries == SUSPECT_AFTER


def lease(run_id: str, recoveries: int) -> Lease:
    run = RunRecord(
        run_id=run_id,
        workflow="wf",
        params="{}",
        status=RunStatus.RUNNING,
        owner="",
        idempotency_key=None,
        created_at=0.0,
        available_at=0.0,
        updated_at=0.0,
    )
    return Lease(run=replace(run, recoveries=recoveries), token=1, expires_at=30.0)


def test_a_busy_worker_hands_a_suspect_back_then_drains_for_it() -> None:
    policy = Isolation(max_recoveries=5)
    normal, suspect = lease("n", 0), lease("s", SUSPECT_AFTER)
    plan = policy.plan([normal, suspect], in_flight=2)
    assert plan.start == [normal] and plan.alone is None
    assert plan.back == [(suspect, DEFER_FOR)]
    for _ in range(DRAIN_AFTER - 2):
        policy.plan([suspect], in_flight=2)
    assert not policy.draining and not policy.blocks_claims(2)
    policy.plan([suspect], in_flight=2)  # the DRAIN_AFTER-th hand-back
    assert policy.draining and policy.blocks_claims(2) and not policy.blocks_claims(0)
    # Drained: the next claim takes the suspect alone and hands the rest back at once.
    plan = policy.plan([suspect, normal], in_flight=0)
    assert plan.alone == suspect and plan.start == [] and plan.back == [(normal, 0.0)]
    assert not policy.draining
    policy.running = object()
    assert policy.blocks_claims(0)


def test_the_threshold_follows_a_lower_max_recoveries() -> None:
    assert Isolation(max_recoveries=1).suspect(lease("s", 1))
    assert not Isolation(max_recoveries=5).suspect(lease("s", SUSPECT_AFTER - 1))
