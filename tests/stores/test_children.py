"""Conformance: child runs. Starting them, cascading cancel and terminate, waking parents."""

from __future__ import annotations

import asyncio

import pytest

from pyrula.workflows.errors import InvalidRunState, LeaseLost, NondeterminismError
from pyrula.workflows.records import (
    FlowControl,
    JournalEntry,
    Lease,
    Outcome,
    RunRecord,
    RunStatus,
    Wait,
)
from pyrula.workflows.stores.base import Store

from .conftest import START, FakeClock
from .helpers import COMPLETED, TTL, claim_one, create, entry, new_run, running, status


def child_entry(parent: str, position: int, child_id: str) -> JournalEntry:
    return entry(parent, position, "child", kind="child", value=f'"{child_id}"')


async def spawn(
    store: Store, parent: Lease, child_id: str, position: int = 0, workflow: str = "child"
) -> RunRecord:
    return await store.start_child(
        parent.token,
        child_entry(parent.run_id, position, child_id),
        new_run(workflow, run_id=child_id, parent_run_id=parent.run_id),
    )


async def test_start_child_creates_the_run_and_the_entry(store: Store, clock: FakeClock) -> None:
    parent = await running(store)
    clock.advance(2)
    flow = FlowControl(owner_concurrency=3)
    child = await store.start_child(
        parent.token,
        child_entry(parent.run_id, 0, "c1"),
        new_run(
            "child", '{"n":2}', run_id="c1", owner="acme", parent_run_id=parent.run_id, flow=flow
        ),
    )
    assert child.run_id == "c1" and child.workflow == "child" and child.params == '{"n":2}'
    assert child.status is RunStatus.QUEUED and child.parent_run_id == parent.run_id
    assert child.owner == "acme" and child.flow == flow and child.created_at == START + 2
    assert await store.get_run("c1") == child
    [journaled] = await store.load_journal(parent.run_id)
    assert (journaled.kind, journaled.value, journaled.token) == ("child", '"c1"', parent.token)
    assert (await claim_one(store, "child")).run_id == "c1"


async def test_start_child_is_idempotent(store: Store) -> None:
    parent = await running(store)
    first = await spawn(store, parent, "c1")
    again = await spawn(store, parent, "c1")
    assert again == first
    assert len(await store.load_journal(parent.run_id)) == 1
    assert len(await store.list_runs(workflow="child")) == 1


async def test_start_child_refusals_change_nothing(store: Store) -> None:
    parent = await running(store)
    with pytest.raises(LeaseLost):
        await store.start_child(
            parent.token + 1,
            child_entry(parent.run_id, 0, "c1"),
            new_run("child", run_id="c1", parent_run_id=parent.run_id),
        )
    await store.append_journal(parent.token, entry(parent.run_id, 0, "a-step"))
    with pytest.raises(NondeterminismError):
        await spawn(store, parent, "c1", position=0)
    await create(store, "child", run_id="taken")  # not a child of this parent
    with pytest.raises(InvalidRunState):
        await spawn(store, parent, "taken", position=1)
    assert await store.get_run("c1") is None
    assert [e.name for e in await store.load_journal(parent.run_id)] == ["a-step"]


async def family(store: Store) -> dict[str, Lease | str]:
    """A running parent with a queued child, a running child whose own child sleeps,
    and a child that already completed."""
    parent = await running(store, "p", run_id="p")
    await spawn(store, parent, "c-queued", 0)
    await spawn(store, parent, "c-running", 1, workflow="busy")
    await spawn(store, parent, "c-done", 2, workflow="quick")
    busy = await claim_one(store, "busy")
    await spawn(store, busy, "g-sleeping", 0, workflow="g")
    grandchild = await claim_one(store, "g")
    await store.suspend_run(grandchild.run_id, grandchild.token, Wait(wake_at=START + 99))
    quick = await claim_one(store, "quick")
    await store.finish_run(quick.run_id, quick.token, COMPLETED)
    return {"parent": parent, "busy": busy}


async def test_cancel_cascades_to_children(store: Store) -> None:
    await family(store)
    run = await store.cancel_run("p")
    assert run.status is RunStatus.RUNNING and run.cancel_requested
    queued = await store.get_run("c-queued")
    assert queued is not None and queued.status is RunStatus.CANCELLED and queued.cancel_requested
    busy = await store.get_run("c-running")
    assert busy is not None and busy.status is RunStatus.RUNNING and busy.cancel_requested
    assert await status(store, "g-sleeping") is RunStatus.CANCELLED  # recursively
    done = await store.get_run("c-done")
    assert done is not None and done.status is RunStatus.COMPLETED and not done.cancel_requested


async def test_terminate_cascades_to_children(store: Store) -> None:
    members = await family(store)
    busy = members["busy"]
    assert isinstance(busy, Lease)
    assert (await store.terminate_run("p")).status is RunStatus.TERMINATED
    for run_id in ("c-queued", "c-running", "g-sleeping"):
        assert await status(store, run_id) is RunStatus.TERMINATED, run_id
    assert await status(store, "c-done") is RunStatus.COMPLETED
    with pytest.raises(LeaseLost):  # the running child's worker is fenced out
        await store.append_journal(busy.token, entry("c-running", 1))


async def test_cancelling_a_child_leaves_its_parent_alone(store: Store) -> None:
    parent = await running(store)
    await spawn(store, parent, "c1")
    await store.cancel_run("c1")
    run = await store.get_run(parent.run_id)
    assert run is not None and run.status is RunStatus.RUNNING and not run.cancel_requested


async def end_child(store: Store, clock: FakeClock, child_id: str, how: str) -> None:
    if how == "cancel":
        await store.cancel_run(child_id)
        return
    if how == "terminate":
        await store.terminate_run(child_id)
        return
    lease = await claim_one(store, "child")
    if how == "finish":
        await store.finish_run(child_id, lease.token, Outcome(RunStatus.FAILED, error="{}"))
    else:  # dead-lettered: its worker vanished once too often
        clock.advance(TTL)
        assert (await store.recover_expired(0, 10)).dead == (child_id,)


@pytest.mark.parametrize("how", ["finish", "cancel", "terminate", "dead"])
async def test_a_child_ending_wakes_its_waiting_parent(
    store: Store, clock: FakeClock, how: str
) -> None:
    parent = await running(store)
    await spawn(store, parent, "c1")
    assert await store.suspend_run(parent.run_id, parent.token, Wait(child="c1"))
    waiter = asyncio.create_task(store.wait_for_work(["wf"], timeout=10))
    await asyncio.sleep(0.05)
    clock.advance(1)
    await end_child(store, clock, "c1", how)
    await asyncio.wait_for(waiter, 5)
    run = await store.get_run(parent.run_id)
    assert run is not None and run.status is RunStatus.QUEUED and run.wait_child is None
    assert run.available_at == clock()
    again = await claim_one(store)
    assert again.run_id == parent.run_id and again.token > parent.token


async def test_only_the_awaited_child_wakes_the_parent(store: Store) -> None:
    parent = await running(store)
    await spawn(store, parent, "c1")
    await spawn(store, parent, "c2", position=1)
    await store.suspend_run(parent.run_id, parent.token, Wait(child="c2"))
    await store.cancel_run("c1")
    assert await status(store, parent.run_id) is RunStatus.WAITING
    await store.cancel_run("c2")
    assert await status(store, parent.run_id) is RunStatus.QUEUED


async def test_a_child_ending_leaves_a_parent_that_is_not_waiting(store: Store) -> None:
    parent = await running(store)
    await spawn(store, parent, "c1")
    await store.cancel_run("c1")
    run = await store.get_run(parent.run_id)
    assert run is not None and run.status is RunStatus.RUNNING
    await store.append_journal(parent.token, entry(parent.run_id, 1))  # still holds its lease


async def test_cancelling_a_waiting_parent_ends_it_and_its_child(store: Store) -> None:
    parent = await running(store)
    await spawn(store, parent, "c1")
    await store.suspend_run(parent.run_id, parent.token, Wait(child="c1"))
    run = await store.cancel_run(parent.run_id)
    assert run.status is RunStatus.CANCELLED and run.wait_child is None
    assert await status(store, "c1") is RunStatus.CANCELLED
    assert await status(store, parent.run_id) is RunStatus.CANCELLED  # not requeued by c1
