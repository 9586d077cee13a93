"""Single node: the finishes of one event-loop turn go to the server in one call
(stores/valkey/finishing.py), each with its own outcome."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pyrula.workflows import LeaseLost, NondeterminismError, StoreUnavailable
from pyrula.workflows.records import FlowControl, Outcome, RunStatus
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.stores.valkey.finishing import MAX_BATCH
from tests.stores.helpers import COMPLETED, TTL, create, entry
from tests.valkey.servers import ValkeyProcess, fresh_namespace

from .conftest import MakeStore, function_calls


async def claimed(store: ValkeyStore, count: int) -> list[Any]:
    for _ in range(count):
        await create(store)
    leases = await store.claim_runs("w", ["wf"], count, TTL)
    assert len(leases) == count
    return leases


async def test_finishes_of_one_turn_share_one_call(make_store: MakeStore) -> None:
    store = await make_store("single", shard_count=8)
    leases = await claimed(store, 5)
    names = function_calls(store)
    finished = await asyncio.gather(
        *(store.finish_run(lease.run_id, lease.token, COMPLETED) for lease in leases)
    )
    assert names == ["finish_many"]
    assert [run.run_id for run in finished] == [lease.run_id for lease in leases]
    assert all(run.status is RunStatus.COMPLETED and run.result == '"done"' for run in finished)
    # One at a time, each is its own call (a batch of one).
    [again] = await claimed(store, 1)
    await store.finish_run(again.run_id, again.token, COMPLETED)
    assert names.count("finish_many") == 2


async def test_a_lost_lease_fails_its_finish_alone(make_store: MakeStore) -> None:
    store = await make_store("single", shard_count=8)
    first, lost, last = await claimed(store, 3)
    await store.terminate_run(lost.run_id)
    failed = Outcome(RunStatus.FAILED, error='{"type": "E", "message": "m"}')
    names = function_calls(store)
    results = await asyncio.gather(
        store.finish_run(first.run_id, first.token, COMPLETED),
        store.finish_run(lost.run_id, lost.token, COMPLETED),
        store.finish_run(last.run_id, last.token, failed),
        return_exceptions=True,
    )
    assert names == ["finish_many"] and isinstance(results[1], LeaseLost), results
    assert [r.status for r in (results[0], results[2])] == [  # type: ignore[union-attr]
        RunStatus.COMPLETED,
        RunStatus.FAILED,
    ]
    record = await store.get_run(lost.run_id)
    assert record is not None and record.status is RunStatus.TERMINATED


async def test_a_replay_that_went_elsewhere_fails_its_finish_alone(
    make_store: MakeStore,
) -> None:
    """A finish carrying its last step: one whose position holds another entry is
    nondeterminism, and writes nothing; the other finishes of the batch go through."""
    store = await make_store("single", shard_count=8)
    ok, odd = await claimed(store, 2)
    await store.append_journal(odd.token, entry(odd.run_id, 0, "first"))
    names = function_calls(store)
    results = await asyncio.gather(
        store.finish_run(ok.run_id, ok.token, COMPLETED, entry(ok.run_id, 0, "first")),
        store.finish_run(odd.run_id, odd.token, COMPLETED, entry(odd.run_id, 0, "other")),
        return_exceptions=True,
    )
    assert names == ["finish_many"] and isinstance(results[1], NondeterminismError), results
    assert results[0].status is RunStatus.COMPLETED  # type: ignore[union-attr]
    assert [e.name for e in await store.load_journal(ok.run_id)] == ["first"]
    record = await store.get_run(odd.run_id)
    assert record is not None and record.status is RunStatus.RUNNING


async def test_a_cancelled_finish_leaves_the_others_of_its_batch(make_store: MakeStore) -> None:
    """Cancelled once its batch is on its way, a finish is written all the same (its
    caller sees CancelledError); the others of the batch get their own outcomes."""
    store = await make_store("single", shard_count=8)
    leases = await claimed(store, 3)
    names = function_calls(store)
    tasks = [
        asyncio.create_task(store.finish_run(lease.run_id, lease.token, COMPLETED))
        for lease in leases
    ]
    await asyncio.sleep(0)  # all three joined the batch
    tasks[0].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert names == ["finish_many"] and isinstance(done[0], asyncio.CancelledError)
    assert all(run.status is RunStatus.COMPLETED for run in done[1:])  # type: ignore[union-attr]
    cancelled = await store.get_run(leases[0].run_id)
    assert cancelled is not None and cancelled.status is RunStatus.COMPLETED


async def test_a_server_gone_fails_every_finish_of_the_batch() -> None:
    """The call fails as a whole (the server stopped before it): every finish in it
    raises, and each goes through once the server is back."""
    process = ValkeyProcess(persist=True)
    process.start()
    store = ValkeyStore(process.url, namespace=fresh_namespace(), shard_count=8)
    try:
        await store.open()
        leases = await claimed(store, 2)
        process.stop()
        names = function_calls(store)
        results = await asyncio.gather(
            *(store.finish_run(lease.run_id, lease.token, COMPLETED) for lease in leases),
            return_exceptions=True,
        )
        assert names == ["finish_many"], names
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        process.start()
        for lease in leases:
            run = await store.get_run(lease.run_id)
            assert run is not None and run.status is RunStatus.RUNNING
            finished = await store.finish_run(lease.run_id, lease.token, COMPLETED)
            assert finished.status is RunStatus.COMPLETED
    finally:
        await store.close()
        process.cleanup()


@pytest.mark.parametrize("count", [1, 40, MAX_BATCH + 6])
async def test_finishes_on_many_shards(make_store: MakeStore, count: int) -> None:
    store = await make_store("single")
    leases = await claimed(store, count)
    names = function_calls(store)
    finished = await asyncio.gather(
        *(store.finish_run(lease.run_id, lease.token, COMPLETED) for lease in leases)
    )
    assert names == ["finish_many"] * -(-count // MAX_BATCH)  # at most MAX_BATCH a call
    assert {run.status for run in finished} == {RunStatus.COMPLETED}
    hint = store._keys.hint("wf")
    assert await store._server.client().llen(hint + "i") == 0


async def test_runs_capped_per_owner_free_their_slots_in_one_batch(make_store: MakeStore) -> None:
    """Each finish's follow-ups (here the owner's concurrency slots) are applied as a
    single finish's would be."""
    store = await make_store("single", shard_count=8)
    capped = FlowControl(owner_concurrency=2)
    ids = [await create(store, owner="t", flow=capped) for _ in range(4)]
    first: list[Any] = []
    for _ in range(4):  # a claim across shards may come back short of the cap
        first += await store.claim_runs("w", ["wf"], 4, TTL)
    assert len(first) == 2  # the owner's two slots taken
    names = function_calls(store)
    await asyncio.gather(*(store.finish_run(x.run_id, x.token, COMPLETED) for x in first))
    assert names == ["finish_many"]
    rest: list[Any] = []
    for _ in range(4):
        rest += await store.claim_runs("w", ["wf"], 4, TTL)
    assert sorted(lease.run_id for lease in first + rest) == sorted(ids)
