"""ValkeyStore.list_runs walks each shard's history a budget of entries per call and goes
on where the last call stopped: with a budget of three, it must list exactly what one
call per shard lists, also when runs share a creation time (the index's score), and
with runs created and deleted between its calls."""

from __future__ import annotations

import pytest

from pyrula.workflows.records import Outcome, RunStatus
from pyrula.workflows.stores.valkey import ValkeyStore, runs
from tests.stores.conftest import FakeClock
from tests.stores.helpers import new_run

from .conftest import MakeStore

FILTERS = [
    {},
    {"status": RunStatus.COMPLETED},
    {"status": RunStatus.RUNNING},
    {"workflow": "b"},
    {"owner": "acme"},
    {"workflow": "a", "status": RunStatus.CANCELLED, "owner": ""},
]


async def populate(store: ValkeyStore, clock: FakeClock | None) -> None:
    for i in range(40):
        if clock is not None and i % 10 == 0:
            clock.advance(1)  # ten runs a creation time
        owner = "acme" if i % 3 == 0 else ""
        run, _ = await store.create_run(new_run("ab"[i % 2], owner=owner))
        if i % 4 == 0:
            await store.cancel_run(run.run_id)
    leases = await store.claim_runs("w1", ["a", "b"], 12, 30.0)
    for lease in leases[:6]:
        await store.finish_run(lease.run_id, lease.token, Outcome(RunStatus.COMPLETED, "1"))


async def listings(store: ValkeyStore) -> list[list[str]]:
    return [
        [r.run_id for r in await store.list_runs(limit=limit, **where)]  # type: ignore[arg-type]
        for where in FILTERS
        for limit in (1, 5, 100)
    ]


@pytest.mark.parametrize("same_times", [True, False])
async def test_a_small_budget_lists_the_same(
    make_store: MakeStore,
    topology: str,
    same_times: bool,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = await make_store(topology, shard_count=2, **({"clock": clock} if same_times else {}))
    await populate(store, clock if same_times else None)
    whole = await listings(store)
    assert any(len(found) == 100 or found for found in whole)
    monkeypatch.setattr(runs, "LIST_BUDGET", "3")
    assert await listings(store) == whole


async def test_runs_created_and_deleted_meanwhile(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await make_store("single", shard_count=1)
    await populate(store, None)
    before = [r.run_id for r in await store.list_runs(limit=100)]
    monkeypatch.setattr(runs, "LIST_BUDGET", "3")
    real_shards = store._shards
    calls = 0

    async def meddling(batch: list[tuple[int, object]]) -> list[object]:
        nonlocal calls
        calls += 1
        if calls == 3:  # between two of the listing's calls
            await store.create_run(new_run("a"))  # newer than all: not in this listing
            ended = (await store.list_runs(status=RunStatus.CANCELLED, limit=1))[0]
            await store.delete_run(ended.run_id)
            before.remove(ended.run_id)
        return await real_shards(batch)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_shards", meddling)
    got = [r.run_id for r in await store.list_runs(limit=100)]
    assert calls > 3
    # Every run older than where the listing stood when the changes came is listed once.
    assert got[-20:] == before[-20:] and len(got) == len(set(got))
