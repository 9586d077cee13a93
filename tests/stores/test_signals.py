"""Conformance: signals. Sending, waking a waiting run, consuming them into the journal."""

from __future__ import annotations

import asyncio

import pytest

from pyrula.workflows.errors import (
    InvalidRunState,
    LeaseLost,
    NondeterminismError,
    RunNotFound,
)
from pyrula.workflows.records import JournalEntry, RunStatus, Wait
from pyrula.workflows.stores.base import Store

from .conftest import START, FakeClock
from .helpers import COMPLETED, TTL, claim_one, create, entry, idle_wait, running, status
from .test_runs import PAYLOAD


def signal_entry(run_id: str, position: int, name: str) -> JournalEntry:
    """What the engine journals for a consumed signal (the store fills in the value)."""
    return entry(run_id, position, name, kind="signal", value="null")


async def test_signal_sent_before_the_wait_is_kept(store: Store) -> None:
    lease = await running(store)
    await store.send_signal(lease.run_id, "approve", '{"by":"ann"}')
    assert await status(store, lease.run_id) is RunStatus.RUNNING  # nothing else changes
    assert await store.suspend_run(lease.run_id, lease.token, Wait(signal="approve")) is False
    got = await store.consume_signal(lease.token, signal_entry(lease.run_id, 0, "approve"))
    assert got == '{"by":"ann"}'


async def test_signals_queue_in_order_per_name(store: Store) -> None:
    lease = await running(store)
    for name, payload in [("a", "1"), ("b", '"x"'), ("a", "2"), ("a", "3")]:
        await store.send_signal(lease.run_id, name, payload)
    taken = [
        await store.consume_signal(lease.token, signal_entry(lease.run_id, position, name))
        for position, name in enumerate(["a", "a", "b", "a", "a", "b"])
    ]
    assert taken == ["1", "2", '"x"', "3", None, None]
    journal = await store.load_journal(lease.run_id)
    assert [(e.position, e.kind, e.name, e.value) for e in journal] == [
        (0, "signal", "a", "1"),
        (1, "signal", "a", "2"),
        (2, "signal", "b", '"x"'),
        (3, "signal", "a", "3"),
    ]
    assert all(e.token == lease.token and e.ok for e in journal)


async def test_signal_wakes_a_run_waiting_for_it(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    await store.suspend_run(lease.run_id, lease.token, Wait(signal="go", wake_at=START + 100))
    waiter = idle_wait(store, ["wf"])
    await asyncio.sleep(0.05)
    await store.send_signal(lease.run_id, "other", "1")
    assert await status(store, lease.run_id) is RunStatus.WAITING
    assert not waiter.done()
    clock.advance(3)
    await store.send_signal(lease.run_id, "go", PAYLOAD)
    await asyncio.wait_for(waiter, 5)
    run = await store.get_run(lease.run_id)
    assert run is not None and run.status is RunStatus.QUEUED
    assert run.available_at == run.updated_at == START + 3
    assert run.wait_signal is None and run.wake_at is None
    again = await claim_one(store, worker="w2")
    assert again.run_id == lease.run_id and again.token > lease.token
    # The payload is there for the resumed run, byte for byte; the other one too.
    got = await store.consume_signal(again.token, signal_entry(lease.run_id, 0, "go"))
    assert got == PAYLOAD
    assert await store.consume_signal(again.token, signal_entry(lease.run_id, 1, "other")) == "1"


async def test_signal_does_not_wake_other_waits(store: Store) -> None:
    sleeper = await running(store)
    await store.suspend_run(sleeper.run_id, sleeper.token, Wait(wake_at=START + 10))
    child = await create(store, "child")
    parent = await running(store)
    await store.suspend_run(parent.run_id, parent.token, Wait(child=child))
    await store.send_signal(sleeper.run_id, "go", "1")
    await store.send_signal(parent.run_id, "go", "1")
    assert await status(store, sleeper.run_id) is RunStatus.SLEEPING
    assert await status(store, parent.run_id) is RunStatus.WAITING


async def test_send_signal_to_unknown_or_ended_run(store: Store) -> None:
    with pytest.raises(RunNotFound):
        await store.send_signal("nope", "go", "1")
    lease = await running(store)
    await store.finish_run(lease.run_id, lease.token, COMPLETED)
    with pytest.raises(InvalidRunState):
        await store.send_signal(lease.run_id, "go", "1")
    queued = await create(store)
    await store.send_signal(queued, "go", "1")  # a queued run keeps it for later
    await store.cancel_run(queued)
    with pytest.raises(InvalidRunState):
        await store.send_signal(queued, "go", "2")


async def test_consume_with_nothing_pending(store: Store) -> None:
    lease = await running(store)
    assert await store.consume_signal(lease.token, signal_entry(lease.run_id, 0, "go")) is None
    assert await store.load_journal(lease.run_id) == []
    await store.send_signal(lease.run_id, "other", "1")
    assert await store.consume_signal(lease.token, signal_entry(lease.run_id, 0, "go")) is None
    assert await store.load_journal(lease.run_id) == []


async def test_retried_consume_returns_the_journaled_value(store: Store) -> None:
    lease = await running(store)
    await store.send_signal(lease.run_id, "go", "1")
    await store.send_signal(lease.run_id, "go", "2")
    first = signal_entry(lease.run_id, 0, "go")
    assert await store.consume_signal(lease.token, first) == "1"
    # The reply was lost and the call repeated: the same signal, not the next one.
    assert await store.consume_signal(lease.token, first) == "1"
    assert len(await store.load_journal(lease.run_id)) == 1
    assert await store.consume_signal(lease.token, signal_entry(lease.run_id, 1, "go")) == "2"


async def test_consume_at_a_position_taken_by_something_else(store: Store) -> None:
    lease = await running(store)
    await store.append_journal(lease.token, entry(lease.run_id, 0, "step-a"))
    await store.send_signal(lease.run_id, "go", "1")
    with pytest.raises(NondeterminismError, match="position 0"):
        await store.consume_signal(lease.token, signal_entry(lease.run_id, 0, "go"))
    # Atomic: the signal was not taken.
    assert await store.consume_signal(lease.token, signal_entry(lease.run_id, 1, "go")) == "1"


async def test_consume_is_fenced(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    await store.send_signal(lease.run_id, "go", "1")
    with pytest.raises(LeaseLost):
        await store.consume_signal(lease.token + 1, signal_entry(lease.run_id, 0, "go"))
    with pytest.raises(RunNotFound):
        await store.consume_signal(1, signal_entry("nope", 0, "go"))
    clock.advance(TTL)
    await store.recover_expired(5, 10)
    with pytest.raises(LeaseLost):  # the lease expired and the run went back to the queue
        await store.consume_signal(lease.token, signal_entry(lease.run_id, 0, "go"))
    again = await claim_one(store)
    assert await store.consume_signal(again.token, signal_entry(lease.run_id, 0, "go")) == "1"
    [journaled] = await store.load_journal(lease.run_id)
    assert journaled.token == again.token and journaled.value == "1"
