"""Small builders shared by the conformance tests."""

from __future__ import annotations

import asyncio
import uuid

from pyrula.workflows.records import (
    DEFAULT_OWNER,
    NO_FLOW,
    FlowControl,
    JournalEntry,
    Lease,
    NewRun,
    Outcome,
    RunStatus,
)
from pyrula.workflows.stores.base import Store

TTL = 30.0
PARAMS = '{"x":1}'
COMPLETED = Outcome(RunStatus.COMPLETED, result='"done"')


def new_run(
    workflow: str = "wf",
    params: str = PARAMS,
    *,
    run_id: str | None = None,
    owner: str = DEFAULT_OWNER,
    idempotency_key: str | None = None,
    delay: float = 0.0,
    start_at: float | None = None,
    parent_run_id: str | None = None,
    flow: FlowControl = NO_FLOW,
    expires_at: float | None = None,
) -> NewRun:
    return NewRun(
        run_id=run_id or uuid.uuid4().hex,
        workflow=workflow,
        params=params,
        owner=owner,
        idempotency_key=idempotency_key,
        delay=delay,
        start_at=start_at,
        parent_run_id=parent_run_id,
        flow=flow,
        expires_at=expires_at,
    )


def entry(
    run_id: str,
    position: int,
    name: str = "step",
    *,
    ok: bool = True,
    value: str = "1",
    kind: str = "step",
    attempts: int = 1,
) -> JournalEntry:
    return JournalEntry(
        run_id=run_id,
        position=position,
        kind=kind,
        name=name,
        ok=ok,
        value=value,
        attempts=attempts,
    )


async def create(
    store: Store,
    workflow: str = "wf",
    *,
    owner: str = DEFAULT_OWNER,
    delay: float = 0.0,
    start_at: float | None = None,
    params: str = PARAMS,
    flow: FlowControl = NO_FLOW,
    run_id: str | None = None,
    expires_at: float | None = None,
) -> str:
    run, created = await store.create_run(
        new_run(
            workflow,
            params,
            owner=owner,
            delay=delay,
            start_at=start_at,
            flow=flow,
            run_id=run_id,
            expires_at=expires_at,
        )
    )
    assert created
    return run.run_id


async def claim_one(store: Store, workflow: str = "wf", worker: str = "w1") -> Lease:
    leases = await store.claim_runs(worker, [workflow], 1, TTL)
    assert len(leases) == 1, leases
    return leases[0]


async def running(store: Store, workflow: str = "wf", *, run_id: str | None = None) -> Lease:
    """A freshly created and claimed run."""
    await create(store, workflow, run_id=run_id)
    return await claim_one(store, workflow)


def idle_wait(store: Store, workflows: list[str], timeout: float = 10) -> asyncio.Task[None]:
    """``wait_for_work`` as a worker calls it: after a claim that came up short (which
    spends earlier wake-ups: a store may return spuriously once after a full claim)."""

    async def wait() -> None:
        assert await store.claim_runs("idle", workflows, 1, 30) == []
        await store.wait_for_work(workflows, timeout=timeout)

    return asyncio.create_task(wait())


async def status(store: Store, run_id: str) -> RunStatus:
    run = await store.get_run(run_id)
    assert run is not None, run_id
    return run.status
