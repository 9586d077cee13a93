"""Conformance: a retry (the engine's, ``engine.rerun.retry_run``, which chooses the
journal edit and has the store make it) removes exactly the step that failed the run."""

from __future__ import annotations

from pyrula.workflows.engine.rerun import retry_run
from pyrula.workflows.records import JournalEntry, Outcome, RunStatus
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.rules import backoff_position

from .helpers import claim_one, entry, running

ERROR = '{"module":"builtins","type":"ValueError","message":"x","traceback":""}'


def backoff(run_id: str, position: int, attempt: int) -> JournalEntry:
    return JournalEntry(
        run_id=run_id,
        position=backoff_position(position, attempt),
        kind="backoff",
        name="flaky",
        ok=False,
        value=f'{{"attempt":{attempt},"wake_at":1}}',
    )


async def test_the_failed_position_and_its_backoffs_are_cleared(store: Store) -> None:
    lease = await running(store)
    run_id = lease.run_id
    # A gather: the failing step at 0 finished after the one at 1 succeeded.
    await store.append_journal(lease.token, backoff(run_id, 0, 1))
    await store.append_journal(lease.token, backoff(run_id, 0, 2))
    await store.append_journal(lease.token, entry(run_id, 1, "fine"))
    await store.append_journal(lease.token, entry(run_id, 0, "flaky", ok=False, value=ERROR))
    failed = Outcome(RunStatus.FAILED, error=ERROR, failed_position=0)
    record = await store.finish_run(run_id, lease.token, failed)
    assert record.failed_position == 0
    retried = await retry_run(store, run_id)
    assert retried.failed_position is None
    assert [(e.position, e.name) for e in await store.load_journal(run_id)] == [(1, "fine")]
    again = await claim_one(store)
    assert again.run_id == run_id


async def test_without_a_position_the_last_error_entry_goes(store: Store) -> None:
    lease = await running(store)
    run_id = lease.run_id
    await store.append_journal(lease.token, entry(run_id, 0, "a"))
    await store.append_journal(lease.token, entry(run_id, 1, "b", ok=False, value=ERROR))
    await store.finish_run(run_id, lease.token, Outcome(RunStatus.FAILED, error=ERROR))
    await retry_run(store, run_id)
    assert [e.position for e in await store.load_journal(run_id)] == [0]


async def test_an_ok_entry_at_the_failed_position_is_kept(store: Store) -> None:
    # The run failed after the step (in workflow code raising the step's error object
    # would not leave an ok entry, but a stale position must never delete a result).
    lease = await running(store)
    run_id = lease.run_id
    await store.append_journal(lease.token, entry(run_id, 0, "a"))
    failed = Outcome(RunStatus.FAILED, error=ERROR, failed_position=0)
    await store.finish_run(run_id, lease.token, failed)
    await retry_run(store, run_id)
    assert [e.position for e in await store.load_journal(run_id)] == [0]
