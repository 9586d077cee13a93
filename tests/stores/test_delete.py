"""Conformance: delete_run forgets a run that ended, and only such a run."""

from __future__ import annotations

import pytest

from pyrula.workflows.errors import InvalidRunState, RunNotFound
from pyrula.workflows.records import Outcome, RunStatus, Wait
from pyrula.workflows.stores.base import Store

from .conftest import START, FakeClock
from .helpers import COMPLETED, TTL, claim_one, create, entry, new_run, running, status


async def end_run(store: Store, clock: FakeClock, run_id: str, how: str) -> None:
    """End the queued run ``run_id`` (of workflow "wf") as ``how`` says."""
    if how == "cancelled":
        await store.cancel_run(run_id)
        return
    lease = await claim_one(store)
    assert lease.run_id == run_id
    if how == "completed":
        await store.finish_run(run_id, lease.token, COMPLETED)
    elif how == "failed":
        await store.finish_run(run_id, lease.token, Outcome(RunStatus.FAILED, error="{}"))
    elif how == "terminated":
        await store.terminate_run(run_id)
    else:  # dead: its worker vanished once too often
        clock.advance(TTL)
        assert (await store.recover_expired(0, 10)).dead == (run_id,)
    assert (await status(store, run_id)).value == how


@pytest.mark.parametrize("how", ["completed", "failed", "cancelled", "terminated", "dead"])
async def test_a_run_that_ended_is_deleted(store: Store, clock: FakeClock, how: str) -> None:
    run_id = await create(store)
    await end_run(store, clock, run_id, how)
    assert await store.delete_run(run_id) is True
    assert await store.get_run(run_id) is None
    assert await store.list_runs() == []
    assert await store.load_journal(run_id) == []
    with pytest.raises(RunNotFound):
        await store.wait_run(run_id, 0)
    assert await store.delete_run(run_id) is False  # already gone


async def test_delete_takes_the_journal_and_signals(store: Store) -> None:
    lease = await running(store, run_id="r1")
    await store.append_journal(lease.token, entry("r1", 0, "a", value='"old-a"'))
    await store.append_journal(lease.token, entry("r1", 1, "b", value='"old-b"'))
    await store.send_signal("r1", "go", '"stale"')  # pending when the run ends
    await store.finish_run("r1", lease.token, COMPLETED)
    assert await store.delete_run("r1") is True
    # A new run under the same id inherits nothing of the old one.
    again = await running(store, run_id="r1")
    assert again.run.claims == 1 and again.run.status is RunStatus.RUNNING
    assert await store.load_journal("r1") == []
    assert await store.consume_signal(again.token, entry("r1", 0, "go", kind="signal")) is None
    assert await store.load_journal("r1") == []


async def test_the_idempotency_key_can_be_used_again(store: Store) -> None:
    first, created = await store.create_run(new_run(params='{"n":1}', idempotency_key="k"))
    assert created
    await store.cancel_run(first.run_id)
    assert await store.delete_run(first.run_id) is True
    # Different params under the same key: no conflict, since the key was forgotten.
    second, created = await store.create_run(new_run(params='{"n":2}', idempotency_key="k"))
    assert created and second.run_id != first.run_id and second.idempotency_key == "k"
    repeat, created = await store.create_run(new_run(params='{"n":2}', idempotency_key="k"))
    assert not created and repeat.run_id == second.run_id


async def test_unknown_run_is_false(store: Store) -> None:
    assert await store.delete_run("nope") is False


async def test_a_run_that_has_not_ended_is_refused(store: Store) -> None:
    queued = await create(store, "other")
    lease = await running(store)
    sleeping = await running(store)
    assert await store.suspend_run(sleeping.run_id, sleeping.token, Wait(wake_at=START + 60))
    waiting = await running(store)
    assert await store.suspend_run(waiting.run_id, waiting.token, Wait(signal="go"))
    for run_id in (queued, lease.run_id, sleeping.run_id, waiting.run_id):
        before = await store.get_run(run_id)
        assert before is not None and not before.is_terminal
        with pytest.raises(InvalidRunState):
            await store.delete_run(run_id)
        assert await store.get_run(run_id) == before
    # The refusal changed nothing: the running run still writes and finishes.
    await store.append_journal(lease.token, entry(lease.run_id, 0))
    await store.finish_run(lease.run_id, lease.token, COMPLETED)
    assert len(await store.load_journal(lease.run_id)) == 1


async def test_deleting_one_run_leaves_the_others(store: Store) -> None:
    keep = await running(store, run_id="keep")
    await store.append_journal(keep.token, entry("keep", 0))
    await store.send_signal("keep", "go", '"mine"')
    gone = await running(store, run_id="gone")
    await store.append_journal(gone.token, entry("gone", 0))
    await store.finish_run("gone", gone.token, COMPLETED)
    queued = await create(store, run_id="queued")  # the same workflow and owner
    assert await store.delete_run("gone") is True
    assert [e.run_id for e in await store.load_journal("keep")] == ["keep"]
    signal = entry("keep", 1, "go", kind="signal")
    assert await store.consume_signal(keep.token, signal) == '"mine"'
    assert [run.run_id for run in await store.list_runs()] == [queued, "keep"]
    assert (await claim_one(store)).run_id == queued  # its owner is still served


async def test_deleting_a_finished_child_leaves_its_parent_alone(store: Store) -> None:
    parent = await running(store)
    child = new_run("child", run_id="c1", parent_run_id=parent.run_id)
    child_entry = entry(parent.run_id, 0, "child", kind="child", value='"c1"')
    await store.start_child(parent.token, child_entry, child)
    await store.cancel_run("c1")
    assert await store.delete_run("c1") is True
    assert await store.get_run("c1") is None
    run = await store.cancel_run(parent.run_id)  # the cascade finds no child to cancel
    assert run.status is RunStatus.RUNNING and run.cancel_requested
    assert len(await store.load_journal(parent.run_id)) == 1


async def test_an_owner_whose_runs_were_all_deleted_is_served_again(store: Store) -> None:
    """Deleting the last run of an owner loses nothing of fairness: its next run lines
    up behind the owner already waiting, as a newly active owner's would."""
    await create(store, owner="b", run_id="b1")
    await create(store, owner="b", run_id="b2")
    await create(store, owner="a", run_id="a1")
    first = await claim_one(store)
    assert first.run_id == "a1"  # a tie of turns goes by owner name
    await store.finish_run("a1", first.token, COMPLETED)
    assert await store.delete_run("a1") is True
    await create(store, owner="a", run_id="a2")
    await create(store, owner="a", run_id="a3")
    got = [(await claim_one(store)).run_id for _ in range(4)]
    assert got == ["b1", "a2", "b2", "a3"]
    assert await store.claim_runs("w1", ["wf"], 10, TTL) == []
