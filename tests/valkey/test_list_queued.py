"""list_runs(status=QUEUED) on ValkeyStore reads the queues (each shard's owner queues,
and a single node's ready lists), not the history: it must list exactly what walking the
history lists, in the same order, for every filter and limit, on 8 shards, single node
and cluster."""

from __future__ import annotations

import pytest

from pyrula.workflows.records import FlowControl, Outcome, RunRecord, RunStatus
from pyrula.workflows.stores.valkey import ValkeyStore, runs
from tests.stores.conftest import FakeClock
from tests.stores.helpers import new_run

from .conftest import MakeStore


async def populate(store: ValkeyStore) -> None:
    """Queued runs in every place a queued run can be, among runs that are not queued."""
    for i in range(12):  # the ready list (single node), or the default owner's queues
        await store.create_run(new_run("plain", params=f'{{"i":{i}}}'))
    for i in range(4):  # delayed: the shards' queues
        await store.create_run(new_run("plain", delay=300 + i))
    for i in range(10):  # named owners (and a rate): the owner queues
        owner = ("acme", "beta")[i % 2]
        await store.create_run(new_run("owned", owner=owner, params=f'{{"i":{i}}}'))
    await store.create_run(
        new_run("owned", owner="acme", flow=FlowControl(rate_key="api", rate_per_second=1.0))
    )
    await store.create_run(new_run("owned"))  # the default owner among named ones
    # Not queued: running, released back (queued again), ended.
    leases = await store.claim_runs("w1", ["plain", "owned"], 6, 30.0)
    assert len(leases) == 6
    await store.release_run(leases[0].run_id, leases[0].token)
    await store.finish_run(leases[1].run_id, leases[1].token, Outcome(RunStatus.COMPLETED, "1"))
    for run in (await store.list_runs(workflow="plain", limit=3))[:2]:
        if run.status is RunStatus.QUEUED:
            await store.cancel_run(run.run_id)


def walked(runs: list[RunRecord], workflow: str | None, owner: str | None) -> list[RunRecord]:
    return [
        r
        for r in runs
        if r.status is RunStatus.QUEUED
        and (workflow is None or r.workflow == workflow)
        and (owner is None or r.owner == owner)
    ]


@pytest.mark.parametrize("how", ["queues", "equal times", "history"])
@pytest.mark.parametrize(
    ("workflow", "owner"),
    [(None, None), ("plain", None), ("owned", None), ("owned", "acme"), (None, ""), ("x", None)],
)
async def test_queued_runs_are_listed_as_the_history_would(
    make_store: MakeStore,
    topology: str,
    workflow: str | None,
    owner: str | None,
    how: str,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read from the queues; with every run created at one time (ties between shards,
    ordered by id); and with more runs queued than the queues are read for (the history
    walk instead)."""
    options = {"clock": clock} if how == "equal times" else {}
    store = await make_store(topology, shard_count=8, **options)
    if how == "history":
        monkeypatch.setattr(runs, "QUEUE_READ_MAX", 3)
    await populate(store)
    everything = await store.list_runs(limit=1000)  # the history walk
    expected = walked(everything, workflow, owner)
    if workflow != "x":
        assert expected, "the population has queued runs of this filter"
    for limit in (1, 3, 1000):
        got = await store.list_runs(
            workflow=workflow, owner=owner, status=RunStatus.QUEUED, limit=limit
        )
        assert [r.run_id for r in got] == [r.run_id for r in expected[:limit]]
        assert got == expected[:limit]


async def test_an_empty_namespace_lists_nothing(make_store: MakeStore, topology: str) -> None:
    store = await make_store(topology, shard_count=4)
    assert await store.list_runs(status=RunStatus.QUEUED) == []
