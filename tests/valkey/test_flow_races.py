"""Owner concurrency on Valkey when claimers race for the same run: a claimer that finds
the run at an owner's head already holding its slot (another claimer took it) must leave
that slot alone. It used to release it when its own claim did not get the run, which let
a second run of the owner start under ``owner_concurrency=1`` (found by an audit with
three workers: four runs of one owner at once)."""

from __future__ import annotations

from typing import Any

import pytest

from pyrula.workflows.records import FlowControl, RunStatus
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.stores.helpers import new_run

from .conftest import MakeStore

CAP_ONE = FlowControl(owner_concurrency=1)


@pytest.mark.parametrize("shard_count", [1, 4])
async def test_a_claimer_beaten_to_a_capped_run_does_not_free_its_slot(
    make_store: MakeStore, shard_count: int
) -> None:
    first = await make_store("single", shard_count=shard_count)
    assert isinstance(first, ValkeyStore)
    second = ValkeyStore(first.url, namespace=first.namespace, shard_count=shard_count)
    await second.open()
    try:
        for i in range(3):
            await first.create_run(new_run(run_id=f"a{i}", owner="A", flow=CAP_ONE))
        take = second._flow_take
        raced: list[str] = []

        async def beaten(run: list[str], workflow: str, ttl: float) -> Any:
            if not raced:  # the other claimer takes the head run first
                leases = await first.claim_runs("w1", ["wf"], 1, 30.0)
                raced.extend(lease.run_id for lease in leases)
            return await take(run, workflow, ttl)

        second._flow_take = beaten  # type: ignore[method-assign]
        got = await second.claim_runs("w2", ["wf"], 1, 30.0)
        assert raced == ["a0"] and got == []  # the owner's one slot is a0's
        running = await first.list_runs(workflow="wf", status=RunStatus.RUNNING)
        assert [run.run_id for run in running] == ["a0"]
        assert await second.claim_runs("w2", ["wf"], 1, 30.0) == []  # still held
    finally:
        await second.close()
