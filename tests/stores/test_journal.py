"""Conformance: the journal, its fencing and its replay rules."""

from __future__ import annotations

import pytest

from pyrula.workflows.errors import LeaseLost, NondeterminismError, RunNotFound
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.base import Store

from .conftest import START, FakeClock
from .helpers import COMPLETED, TTL, claim_one, create, entry, running, status


async def test_append_and_load_in_order(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    run_id = lease.run_id
    assert await store.load_journal(run_id) == []
    for position, name in enumerate(["a", "b", "c"]):
        clock.advance(1)
        cancel = await store.append_journal(
            lease.token, entry(run_id, position, name, value=f'"{name}"', attempts=position + 1)
        )
        assert cancel is False
    journal = await store.load_journal(run_id)
    assert [(e.run_id, e.position, e.name, e.value) for e in journal] == [
        (run_id, 0, "a", '"a"'),
        (run_id, 1, "b", '"b"'),
        (run_id, 2, "c", '"c"'),
    ]
    assert [e.attempts for e in journal] == [1, 2, 3]
    assert [e.kind for e in journal] == ["step"] * 3
    assert all(e.ok for e in journal)
    assert [e.token for e in journal] == [lease.token] * 3  # the store records the token
    assert [e.recorded_at for e in journal] == [START + 1, START + 2, START + 3]


async def test_load_journal_of_unknown_run(store: Store) -> None:
    assert await store.load_journal("nope") == []


async def test_journals_are_per_run(store: Store) -> None:
    one = await running(store)
    two = await running(store)
    await store.append_journal(one.token, entry(one.run_id, 0, "x"))
    await store.append_journal(two.token, entry(two.run_id, 0, "y"))
    assert [e.name for e in await store.load_journal(one.run_id)] == ["x"]
    assert [e.name for e in await store.load_journal(two.run_id)] == ["y"]


async def test_identical_repeat_is_accepted_unchanged(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    first = entry(lease.run_id, 0, "a", ok=False, value='{"e":"x"}')
    await store.append_journal(lease.token, first)
    await store.append_journal(lease.token, entry(lease.run_id, 1, "b"))
    before = await store.load_journal(lease.run_id)
    clock.advance(5)
    # A retried write whose reply was lost; attempts do not take part in the comparison.
    assert (
        await store.append_journal(
            lease.token, entry(lease.run_id, 0, "a", ok=False, value='{"e":"x"}', attempts=9)
        )
        is False
    )
    assert await store.load_journal(lease.run_id) == before


@pytest.mark.parametrize(
    "changed",
    [
        {"name": "other"},
        {"ok": False},
        {"value": "2"},
        {"kind": "sleep"},
    ],
    ids=["name", "ok", "value", "kind"],
)
async def test_different_entry_at_a_taken_position(store: Store, changed: dict) -> None:  # type: ignore[type-arg]
    lease = await running(store)
    await store.append_journal(lease.token, entry(lease.run_id, 0, "step", value="1"))
    fields = {"name": "step", "value": "1", "ok": True, "kind": "step"} | changed
    with pytest.raises(NondeterminismError, match="position 0"):
        await store.append_journal(lease.token, entry(lease.run_id, 0, **fields))
    assert len(await store.load_journal(lease.run_id)) == 1


async def test_positions_may_be_written_out_of_order(store: Store) -> None:
    """Steps run concurrently (ctx.gather) finish in any order: any free position goes."""
    lease = await running(store)
    await store.append_journal(lease.token, entry(lease.run_id, 2, "c"))
    await store.append_journal(lease.token, entry(lease.run_id, 0, "a"))
    await store.append_journal(lease.token, entry(lease.run_id, 5, "f"))
    await store.append_journal(lease.token, entry(lease.run_id, 1, "b"))
    journal = await store.load_journal(lease.run_id)
    assert [(e.position, e.name) for e in journal] == [(0, "a"), (1, "b"), (2, "c"), (5, "f")]
    assert await store.append_journal(lease.token, entry(lease.run_id, 5, "f")) is False
    with pytest.raises(NondeterminismError, match="position 5"):
        await store.append_journal(lease.token, entry(lease.run_id, 5, "other"))
    with pytest.raises(NondeterminismError, match="position 2"):
        await store.append_journal(lease.token, entry(lease.run_id, 2, "c", value="2"))
    assert await store.load_journal(lease.run_id) == journal


async def test_append_reports_cancel_requested(store: Store) -> None:
    lease = await running(store)
    assert await store.append_journal(lease.token, entry(lease.run_id, 0)) is False
    await store.cancel_run(lease.run_id)
    assert await store.append_journal(lease.token, entry(lease.run_id, 1)) is True
    assert await store.append_journal(lease.token, entry(lease.run_id, 0)) is True  # a repeat


async def test_stale_token_is_lease_lost(store: Store) -> None:
    lease = await running(store)
    with pytest.raises(LeaseLost):
        await store.append_journal(lease.token + 1, entry(lease.run_id, 0))
    with pytest.raises(LeaseLost):
        await store.append_journal(lease.token - 1, entry(lease.run_id, 0))
    assert await store.load_journal(lease.run_id) == []


async def test_append_after_terminate_is_lease_lost(store: Store) -> None:
    lease = await running(store)
    await store.append_journal(lease.token, entry(lease.run_id, 0))
    await store.terminate_run(lease.run_id)
    with pytest.raises(LeaseLost):
        await store.append_journal(lease.token, entry(lease.run_id, 1))
    with pytest.raises(LeaseLost):  # even an identical repeat
        await store.append_journal(lease.token, entry(lease.run_id, 0))
    assert len(await store.load_journal(lease.run_id)) == 1


async def test_old_token_after_recover_and_reclaim(store: Store, clock: FakeClock) -> None:
    old = await running(store)
    await store.append_journal(old.token, entry(old.run_id, 0, "a"))
    clock.advance(TTL)
    await store.recover_expired(5, 10)
    new = await claim_one(store, worker="w2")
    assert new.run_id == old.run_id and new.token > old.token
    with pytest.raises(LeaseLost):
        await store.append_journal(old.token, entry(old.run_id, 1, "b"))
    await store.append_journal(new.token, entry(new.run_id, 0, "a"))  # replayed
    await store.append_journal(new.token, entry(new.run_id, 1, "b"))
    journal = await store.load_journal(new.run_id)
    assert [(e.name, e.token) for e in journal] == [("a", old.token), ("b", new.token)]


async def test_append_needs_a_running_run(store: Store) -> None:
    queued = await create(store)
    with pytest.raises(LeaseLost):
        await store.append_journal(0, entry(queued, 0))
    lease = await claim_one(store)
    await store.release_run(lease.run_id, lease.token)
    with pytest.raises(LeaseLost):
        await store.append_journal(lease.token, entry(lease.run_id, 0))
    with pytest.raises(RunNotFound):
        await store.append_journal(1, entry("nope", 0))


# -- the last step's entry carried by finish_run ------------------------------------------
async def test_finish_writes_the_last_steps_entry_with_the_outcome(store: Store) -> None:
    lease = await running(store)
    await store.append_journal(lease.token, entry(lease.run_id, 0, value='"a"'))
    done = await store.finish_run(
        lease.run_id, lease.token, COMPLETED, entry(lease.run_id, 1, value='"b"')
    )
    assert done.status is RunStatus.COMPLETED
    assert [(e.position, e.value) for e in await store.load_journal(lease.run_id)] == [
        (0, '"a"'),
        (1, '"b"'),
    ]


async def test_finish_with_an_entry_already_there_is_fine_and_a_different_one_is_refused(
    store: Store,
) -> None:
    lease = await running(store)
    await store.append_journal(lease.token, entry(lease.run_id, 0))
    with pytest.raises(NondeterminismError, match="position 0"):
        await store.finish_run(
            lease.run_id, lease.token, COMPLETED, entry(lease.run_id, 0, "other")
        )
    # Nothing was written: the run still runs, with its journal as it was.
    assert await status(store, lease.run_id) is RunStatus.RUNNING
    assert [e.name for e in await store.load_journal(lease.run_id)] == ["step"]
    done = await store.finish_run(lease.run_id, lease.token, COMPLETED, entry(lease.run_id, 0))
    assert done.status is RunStatus.COMPLETED


async def test_finish_with_a_stale_token_writes_no_entry(store: Store) -> None:
    lease = await running(store)
    with pytest.raises(LeaseLost):
        await store.finish_run(lease.run_id, lease.token + 1000, COMPLETED, entry(lease.run_id, 0))
    assert await store.load_journal(lease.run_id) == []
    with pytest.raises(ValueError, match="journal entry of"):
        await store.finish_run(lease.run_id, lease.token, COMPLETED, entry("another-run", 0))
