"""Conformance: set_progress, a fenced report of a running run's custom state."""

from __future__ import annotations

import pytest

from pyrula.workflows.errors import LeaseLost, RunNotFound
from pyrula.workflows.records import Outcome, RunRecord, RunStatus, Wait
from pyrula.workflows.stores.base import Store

from .conftest import START, FakeClock
from .helpers import COMPLETED, TTL, claim_one, create, running

PAYLOAD = '{ "s" : "h\u00e9llo \u2713 \U0001d11e \\u0000", "big": 123456789012345678901234567890 }'


async def progress(store: Store, run_id: str) -> tuple[str | None, str | None]:
    run = await store.get_run(run_id)
    assert run is not None
    return run.progress_state, run.progress_info


async def test_a_new_run_has_no_progress(store: Store) -> None:
    lease = await running(store)
    assert (lease.run.progress_state, lease.run.progress_info) == (None, None)
    assert await progress(store, lease.run_id) == (None, None)


async def test_progress_is_visible_at_once(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    clock.advance(3)
    await store.set_progress(lease.run_id, lease.token, "uploading", '{"done":1,"of":4}')
    run = await store.get_run(lease.run_id)
    assert run is not None and run.status is RunStatus.RUNNING
    assert run.progress_state == "uploading" and run.progress_info == '{"done":1,"of":4}'
    assert run.updated_at == START + 3
    assert [r.progress_state for r in await store.list_runs()] == ["uploading"]
    # The latest report wins; the info is kept byte for byte.
    await store.set_progress(lease.run_id, lease.token, "h\u00e9 \u2713", PAYLOAD)
    assert await progress(store, lease.run_id) == ("h\u00e9 \u2713", PAYLOAD)


async def test_a_stale_token_is_lease_lost(store: Store, clock: FakeClock) -> None:
    lease = await running(store)
    await store.set_progress(lease.run_id, lease.token, "one", "1")
    clock.advance(TTL)
    assert (await store.recover_expired(5, 10)).requeued == (lease.run_id,)
    again = await claim_one(store)
    assert again.run_id == lease.run_id and again.token > lease.token
    with pytest.raises(LeaseLost):
        await store.set_progress(lease.run_id, lease.token, "zombie", "2")
    assert await progress(store, lease.run_id) == ("one", "1")  # the old report stays
    await store.set_progress(again.run_id, again.token, "two", "3")
    assert await progress(store, lease.run_id) == ("two", "3")


async def test_only_a_running_run_reports(store: Store) -> None:
    queued = await create(store, "other")
    with pytest.raises(LeaseLost):
        await store.set_progress(queued, 0, "early", "0")
    lease = await running(store)
    assert await store.suspend_run(lease.run_id, lease.token, Wait(wake_at=START + 60))
    with pytest.raises(LeaseLost):
        await store.set_progress(lease.run_id, lease.token, "asleep", "0")
    with pytest.raises(RunNotFound):
        await store.set_progress("nope", 1, "x", "0")
    assert await progress(store, queued) == (None, None)
    assert await progress(store, lease.run_id) == (None, None)


@pytest.mark.parametrize(
    "outcome",
    [COMPLETED, Outcome(RunStatus.FAILED, error="{}"), Outcome(RunStatus.CANCELLED)],
    ids=["completed", "failed", "cancelled"],
)
async def test_progress_is_kept_after_the_run_ends(store: Store, outcome: Outcome) -> None:
    lease = await running(store)
    await store.set_progress(lease.run_id, lease.token, "almost", '{"pct":99}')
    done = await store.finish_run(lease.run_id, lease.token, outcome)
    assert done.status is outcome.status
    assert (done.progress_state, done.progress_info) == ("almost", '{"pct":99}')
    waited: RunRecord = await store.wait_run(lease.run_id, 0)
    assert (waited.progress_state, waited.progress_info) == ("almost", '{"pct":99}')
    with pytest.raises(LeaseLost):  # nothing more once it ended
        await store.set_progress(lease.run_id, lease.token, "after", "0")
    assert await progress(store, lease.run_id) == ("almost", '{"pct":99}')


async def test_progress_survives_release_and_terminate(store: Store) -> None:
    lease = await running(store)
    await store.set_progress(lease.run_id, lease.token, "half", "50")
    await store.release_run(lease.run_id, lease.token)
    assert await progress(store, lease.run_id) == ("half", "50")
    again = await claim_one(store)
    assert again.run.progress_state == "half"
    ended = await store.terminate_run(again.run_id)
    assert (ended.progress_state, ended.progress_info) == ("half", "50")
