"""Conformance: creating, reading, listing, waiting for, cancelling and retrying runs."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from pyrula.workflows.engine.rerun import retry_run
from pyrula.workflows.errors import (
    IdempotencyConflict,
    InvalidRunState,
    LeaseLost,
    RunNotFound,
)
from pyrula.workflows.records import Outcome, RunRecord, RunStatus
from pyrula.workflows.stores.base import CompleteStore, Store, lease_news_of

from .conftest import START, FakeClock
from .helpers import COMPLETED, PARAMS, claim_one, create, entry, new_run, running

# Unicode of every width, escapes, odd spacing and integers no float can hold.
PAYLOAD = (
    '{ "s" : "h\u00e9llo \u2713 \U0001d11e \\u0000 \\"q\\"",'
    '  "big": 123456789012345678901234567890,'
    ' "neg": -98765432109876543210987654321, "f": 1.5e300, "l": [ ] }'
)


async def test_is_a_store(store: Store) -> None:
    assert isinstance(store, Store)
    assert isinstance(store, CompleteStore)  # every part: signals, run history, events
    assert lease_news_of(store) is not None
    assert isinstance(store.url, str) and store.url
    await store.open()  # idempotent


async def test_now_is_the_injected_clock(store: Store, clock: FakeClock) -> None:
    assert await store.now() == START
    clock.advance(5)
    assert await store.now() == START + 5


async def test_create_and_get(store: Store) -> None:
    run, created = await store.create_run(new_run("wf", run_id="r1", owner="acme"))
    assert created
    assert run.run_id == "r1" and run.workflow == "wf" and run.params == PARAMS
    assert run.status is RunStatus.QUEUED and run.owner == "acme"
    assert run.idempotency_key is None
    assert run.created_at == run.available_at == run.updated_at == START
    assert run.started_at is None and run.finished_at is None
    assert run.result is None and run.error is None and run.worker_id is None
    assert run.lease_token == 0 and run.lease_expires_at is None
    assert not run.cancel_requested and run.recoveries == 0 and run.claims == 0
    assert not run.is_terminal
    assert await store.get_run("r1") == run


async def test_get_unknown_is_none(store: Store) -> None:
    assert await store.get_run("nope") is None


async def test_duplicate_run_id_is_refused(store: Store) -> None:
    await store.create_run(new_run(run_id="r1"))
    with pytest.raises(InvalidRunState):
        await store.create_run(new_run(run_id="r1"))


async def test_a_generated_id_is_created_as_any_other(store: Store) -> None:
    # NewRun.generated_id (the client made the id up) only lets a store skip looking
    # for an earlier holder of the id: every store creates the run as usual.
    new = replace(new_run(run_id="gen-1", idempotency_key="k-gen"), generated_id=True)
    run, created = await store.create_run(new)
    assert created and run.run_id == "gen-1" and run.idempotency_key == "k-gen"
    assert await store.get_run("gen-1") == run
    assert await store.create_run(new) == (run, False)
    with pytest.raises(InvalidRunState):
        await store.create_run(replace(new, idempotency_key=None))


async def test_payloads_round_trip_exactly(store: Store) -> None:
    run, _ = await store.create_run(new_run(params=PAYLOAD))
    assert (await store.get_run(run.run_id)).params == PAYLOAD  # type: ignore[union-attr]
    assert (await store.list_runs())[0].params == PAYLOAD
    lease = await claim_one(store)
    assert lease.run.params == PAYLOAD
    await store.append_journal(lease.token, entry(run.run_id, 0, value=PAYLOAD))
    await store.append_journal(lease.token, entry(run.run_id, 1, ok=False, value=PAYLOAD[::-1]))
    journal = await store.load_journal(run.run_id)
    assert [e.value for e in journal] == [PAYLOAD, PAYLOAD[::-1]]
    done = await store.finish_run(run.run_id, lease.token, Outcome(RunStatus.COMPLETED, PAYLOAD))
    assert done.result == PAYLOAD
    assert (await store.wait_run(run.run_id, 0)).result == PAYLOAD


async def test_failed_outcome_keeps_error_text(store: Store) -> None:
    lease = await running(store)
    error = '{"type_name": "Boom", "message": "\u00fcber \U0001f4a5"}'
    run = await store.finish_run(lease.run_id, lease.token, Outcome(RunStatus.FAILED, error=error))
    assert run.status is RunStatus.FAILED and run.error == error and run.result is None
    assert (await store.get_run(lease.run_id)) == run


# -- list ----------------------------------------------------------------------------
async def test_list_runs_newest_first_with_filters(store: Store, clock: FakeClock) -> None:
    a = await create(store, "wf", owner="x")
    clock.advance(1)
    b = await create(store, "other", owner="y")
    c = await create(store, "wf", owner="y")  # same time as b: insertion order decides
    lease = await claim_one(store, "wf")  # claims a
    assert lease.run_id == a

    def ids(runs: list[RunRecord]) -> list[str]:
        return [r.run_id for r in runs]

    assert ids(await store.list_runs()) == [c, b, a]
    assert ids(await store.list_runs(workflow="wf")) == [c, a]
    assert ids(await store.list_runs(owner="y")) == [c, b]
    assert ids(await store.list_runs(status=RunStatus.RUNNING)) == [a]
    assert ids(await store.list_runs(status=RunStatus.QUEUED)) == [c, b]
    assert ids(await store.list_runs(workflow="wf", owner="y", status=RunStatus.QUEUED)) == [c]
    assert ids(await store.list_runs(workflow="wf", owner="x", status=RunStatus.QUEUED)) == []
    assert ids(await store.list_runs(workflow="missing")) == []
    assert ids(await store.list_runs(limit=2)) == [c, b]
    assert ids(await store.list_runs(workflow="wf", limit=1)) == [c]
    assert await store.list_runs(limit=0) == []


# -- idempotency ---------------------------------------------------------------------
async def test_idempotent_create_returns_the_same_run(store: Store, clock: FakeClock) -> None:
    first, created = await store.create_run(new_run(idempotency_key="k"))
    assert created and first.idempotency_key == "k"
    clock.advance(3)
    again, created = await store.create_run(new_run(idempotency_key="k"))
    assert not created
    assert again == first  # the stored run, not a new one with a new id or time
    assert len(await store.list_runs()) == 1


async def test_idempotent_create_after_the_run_moved_on(store: Store) -> None:
    first, _ = await store.create_run(new_run(idempotency_key="k"))
    lease = await claim_one(store)
    await store.finish_run(first.run_id, lease.token, COMPLETED)
    again, created = await store.create_run(new_run(idempotency_key="k"))
    assert not created and again.run_id == first.run_id
    assert again.status is RunStatus.COMPLETED


async def test_idempotency_conflicts(store: Store) -> None:
    first, _ = await store.create_run(new_run("wf", '{"a":1}', idempotency_key="k"))
    taken = f"idempotency key 'k' is taken by run '{first.run_id}' of workflow 'wf'"
    with pytest.raises(IdempotencyConflict) as params_differ:
        await store.create_run(new_run("wf", '{"a":2}', idempotency_key="k"))
    assert f"{taken}, submitted with other params" in str(params_differ.value)
    with pytest.raises(IdempotencyConflict) as workflow_differs:
        await store.create_run(new_run("other", '{"a":1}', idempotency_key="k"))
    assert f"{taken}; this submit is for workflow 'other'" in str(workflow_differs.value)
    # Equal JSON spelled differently is different text: the store does not parse it.
    with pytest.raises(IdempotencyConflict):
        await store.create_run(new_run("wf", '{ "a": 1 }', idempotency_key="k"))
    assert [r.run_id for r in await store.list_runs()] == [first.run_id]


async def test_runs_without_a_key_never_collide(store: Store) -> None:
    await create(store)
    await create(store)
    _, created = await store.create_run(new_run(idempotency_key="a"))
    _, created_b = await store.create_run(new_run(idempotency_key="b"))
    assert created and created_b
    assert len(await store.list_runs()) == 4


# -- delay and start_at --------------------------------------------------------------
async def test_delay_gates_the_claim(store: Store, clock: FakeClock) -> None:
    run_id = await create(store, delay=10)
    run = await store.get_run(run_id)
    assert run is not None and run.available_at == START + 10 and run.created_at == START
    assert await store.claim_runs("w1", ["wf"], 10, 30) == []
    clock.advance(9.5)
    assert await store.claim_runs("w1", ["wf"], 10, 30) == []
    clock.advance(0.5)
    assert [lease.run_id for lease in await store.claim_runs("w1", ["wf"], 10, 30)] == [run_id]


async def test_start_at_wins_over_delay(store: Store, clock: FakeClock) -> None:
    run_id = await create(store, delay=100, start_at=START + 5)
    assert (await store.get_run(run_id)).available_at == START + 5  # type: ignore[union-attr]
    past = await create(store, start_at=START - 50)
    clock.advance(5)
    leases = await store.claim_runs("w1", ["wf"], 10, 30)
    assert [lease.run_id for lease in leases] == [past, run_id]


# -- wait_run ------------------------------------------------------------------------
async def test_wait_run_is_woken_by_finish(store: Store) -> None:
    lease = await running(store)
    waiter = asyncio.create_task(store.wait_run(lease.run_id, timeout=10))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    started = time.monotonic()
    await store.finish_run(lease.run_id, lease.token, COMPLETED)
    run = await asyncio.wait_for(waiter, 5)
    assert time.monotonic() - started < 5
    assert run.status is RunStatus.COMPLETED and run.result == '"done"'


async def test_wait_run_without_timeout_is_woken(store: Store) -> None:
    run_id = await create(store)
    waiter = asyncio.create_task(store.wait_run(run_id, timeout=None))
    await asyncio.sleep(0.02)
    await store.cancel_run(run_id)
    run = await asyncio.wait_for(waiter, 5)
    assert run.status is RunStatus.CANCELLED


async def test_wait_run_is_woken_by_terminate(store: Store) -> None:
    lease = await running(store)
    waiter = asyncio.create_task(store.wait_run(lease.run_id, timeout=10))
    await asyncio.sleep(0.02)
    await store.terminate_run(lease.run_id)
    assert (await asyncio.wait_for(waiter, 5)).status is RunStatus.TERMINATED


async def test_wait_run_timeout_returns_the_run_as_it_is(store: Store) -> None:
    lease = await running(store)
    started = time.monotonic()
    run = await store.wait_run(lease.run_id, timeout=0.1)
    assert 0.05 <= time.monotonic() - started < 5
    assert run.status is RunStatus.RUNNING and run.lease_token == lease.token
    assert (await store.wait_run(lease.run_id, timeout=0)).status is RunStatus.RUNNING


async def test_wait_run_returns_a_terminal_run_at_once(store: Store) -> None:
    run_id = await create(store)
    await store.cancel_run(run_id)
    run = await asyncio.wait_for(store.wait_run(run_id, timeout=None), 5)
    assert run.status is RunStatus.CANCELLED


async def test_wait_run_ignores_non_terminal_changes(store: Store) -> None:
    lease = await running(store)
    waiter = asyncio.create_task(store.wait_run(lease.run_id, timeout=10))
    await asyncio.sleep(0.02)
    await store.cancel_run(lease.run_id)  # running: only cancel_requested
    await asyncio.sleep(0.1)
    assert not waiter.done()
    await store.finish_run(lease.run_id, lease.token, Outcome(RunStatus.CANCELLED))
    run = await asyncio.wait_for(waiter, 5)
    assert run.status is RunStatus.CANCELLED and run.cancel_requested


async def test_wait_run_unknown(store: Store) -> None:
    with pytest.raises(RunNotFound):
        await store.wait_run("nope", timeout=1)
    with pytest.raises(RunNotFound):
        await store.wait_run("nope", timeout=None)


async def test_close_wakes_waiters(store: Store) -> None:
    lease = await running(store)
    waiter = asyncio.create_task(store.wait_run(lease.run_id, timeout=None))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await store.close()
    run = await asyncio.wait_for(waiter, 5)
    assert run.run_id == lease.run_id and run.status is RunStatus.RUNNING
    await store.close()  # idempotent


# -- cancel --------------------------------------------------------------------------
async def test_cancel_queued_ends_it_at_once(store: Store, clock: FakeClock) -> None:
    run_id = await create(store)
    clock.advance(2)
    run = await store.cancel_run(run_id)
    assert run.status is RunStatus.CANCELLED and run.is_terminal
    assert run.finished_at == run.updated_at == START + 2 and run.cancel_requested
    assert await store.get_run(run_id) == run
    assert await store.claim_runs("w1", ["wf"], 10, 30) == []


async def test_cancel_running_requests_it(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    clock.advance(2)
    run = await store.cancel_run(lease.run_id)
    assert run.status is RunStatus.RUNNING and run.cancel_requested
    assert run.finished_at is None and run.updated_at == START + 2
    assert run.lease_token == lease.token  # the worker keeps its lease
    assert await store.get_run(lease.run_id) == run
    assert await store.cancel_run(lease.run_id) == run  # asking twice changes nothing


async def test_cancel_terminal_or_unknown(store: Store) -> None:
    lease = await running(store)
    await store.finish_run(lease.run_id, lease.token, COMPLETED)
    with pytest.raises(InvalidRunState):
        await store.cancel_run(lease.run_id)
    with pytest.raises(RunNotFound):
        await store.cancel_run("nope")


# -- terminate -----------------------------------------------------------------------
async def test_terminate_running_fences_the_worker(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    clock.advance(1)
    run = await store.terminate_run(lease.run_id)
    assert run.status is RunStatus.TERMINATED and run.is_terminal
    assert run.lease_token > lease.token and run.lease_expires_at is None
    assert run.finished_at == START + 1
    assert await store.get_run(lease.run_id) == run
    with pytest.raises(LeaseLost):
        await store.finish_run(lease.run_id, lease.token, COMPLETED)
    with pytest.raises(LeaseLost):
        await store.release_run(lease.run_id, lease.token)
    renewed = await store.renew_leases("w1", [(lease.run_id, lease.token)], 30)
    assert renewed.lost == (lease.run_id,)


async def test_terminate_queued_and_terminal(store: Store) -> None:
    run_id = await create(store)
    run = await store.terminate_run(run_id)
    assert run.status is RunStatus.TERMINATED and run.lease_token > 0
    with pytest.raises(InvalidRunState):
        await store.terminate_run(run_id)
    with pytest.raises(RunNotFound):
        await store.terminate_run("nope")


# -- retry ---------------------------------------------------------------------------
async def test_retry_failed_drops_the_trailing_error(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    run_id = lease.run_id
    await store.append_journal(lease.token, entry(run_id, 0, "a", value='"A"'))
    await store.append_journal(lease.token, entry(run_id, 1, "b", ok=False, value='{"e":1}'))
    await store.finish_run(run_id, lease.token, Outcome(RunStatus.FAILED, error='{"e":1}'))
    clock.advance(7)

    run = await retry_run(store, run_id)  # the engine's retry: it chooses the edit
    assert run.status is RunStatus.QUEUED and not run.is_terminal
    assert run.error is None and run.result is None and run.finished_at is None
    assert run.available_at == run.updated_at == START + 7
    assert not run.cancel_requested and run.recoveries == 0 and run.lease_expires_at is None
    assert await store.get_run(run_id) == run
    assert [(e.position, e.name, e.ok) for e in await store.load_journal(run_id)] == [
        (0, "a", True)
    ]

    again = await claim_one(store)
    assert again.run_id == run_id and again.token > lease.token and again.run.claims == 2
    await store.append_journal(again.token, entry(run_id, 0, "a", value='"A"'))  # replay
    await store.append_journal(again.token, entry(run_id, 1, "b", value='"B"'))
    done = await store.finish_run(run_id, again.token, COMPLETED)
    assert done.status is RunStatus.COMPLETED


async def test_retry_keeps_an_ok_journal(store: Store) -> None:
    lease = await running(store)
    await store.append_journal(lease.token, entry(lease.run_id, 0, "a"))
    await store.terminate_run(lease.run_id)
    await retry_run(store, lease.run_id)
    assert len(await store.load_journal(lease.run_id)) == 1


async def test_retry_removes_the_positions_it_is_given(store: Store) -> None:
    lease = await running(store)
    run_id = lease.run_id
    for position in (-3, 0, 1, 2):
        await store.append_journal(lease.token, entry(run_id, position, f"s{position}"))
    await store.finish_run(run_id, lease.token, Outcome(RunStatus.FAILED, error='{"e":1}'))
    run = await store.retry_run(run_id, [-3, 2, 7], seen_claims=1)  # 7: none there
    assert run.status is RunStatus.QUEUED
    assert [e.position for e in await store.load_journal(run_id)] == [0, 1]


async def test_a_plain_retry_keeps_the_journal(store: Store) -> None:
    lease = await running(store)
    run_id = lease.run_id
    await store.append_journal(lease.token, entry(run_id, 0, "a", ok=False, value='{"e":1}'))
    await store.finish_run(run_id, lease.token, Outcome(RunStatus.FAILED, error='{"e":1}'))
    await store.retry_run(run_id)
    assert [e.position for e in await store.load_journal(run_id)] == [0]


async def test_a_retry_of_a_run_claimed_since_it_was_read_changes_nothing(store: Store) -> None:
    lease = await running(store)
    run_id = lease.run_id
    await store.append_journal(lease.token, entry(run_id, 0, "a", ok=False, value='{"e":1}'))
    await store.finish_run(run_id, lease.token, Outcome(RunStatus.FAILED, error='{"e":1}'))
    with pytest.raises(InvalidRunState, match="claimed again since"):
        await store.retry_run(run_id, [0], seen_claims=0)
    run = await store.get_run(run_id)
    assert run is not None and run.status is RunStatus.FAILED and run.claims == 1
    assert [e.position for e in await store.load_journal(run_id)] == [0]


async def test_retry_clears_cancel_request_and_recoveries(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    await store.cancel_run(lease.run_id)
    clock.advance(60)
    report = await store.recover_expired(max_recoveries=5, limit=10)
    assert report.requeued == (lease.run_id,)
    lease = await claim_one(store)
    assert lease.run.recoveries == 1 and lease.run.cancel_requested
    await store.finish_run(lease.run_id, lease.token, Outcome(RunStatus.CANCELLED))
    run = await store.retry_run(lease.run_id)
    assert not run.cancel_requested and run.recoveries == 0


@pytest.mark.parametrize("end", ["failed", "cancelled", "terminated", "dead"])
async def test_retry_every_retryable_status(store: Store, clock: FakeClock, end: str) -> None:
    lease = await running(store)
    if end == "failed":
        await store.finish_run(lease.run_id, lease.token, Outcome(RunStatus.FAILED, error="{}"))
    elif end == "cancelled":
        await store.finish_run(lease.run_id, lease.token, Outcome(RunStatus.CANCELLED))
    elif end == "terminated":
        await store.terminate_run(lease.run_id)
    else:
        clock.advance(60)
        assert (await store.recover_expired(0, 10)).dead == (lease.run_id,)
    assert (await store.get_run(lease.run_id)).status.value == end  # type: ignore[union-attr]
    assert (await store.retry_run(lease.run_id)).status is RunStatus.QUEUED


async def test_retry_refuses_other_statuses(store: Store) -> None:
    queued = await create(store)
    with pytest.raises(InvalidRunState):
        await store.retry_run(queued)
    lease = await claim_one(store)
    with pytest.raises(InvalidRunState):
        await store.retry_run(lease.run_id)
    await store.finish_run(lease.run_id, lease.token, COMPLETED)
    with pytest.raises(InvalidRunState):
        await store.retry_run(lease.run_id)
    with pytest.raises(RunNotFound):
        await store.retry_run("nope")
