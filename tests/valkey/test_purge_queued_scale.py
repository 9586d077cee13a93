"""``purge_queued`` on ValkeyStore costs the same per purged run however long the queue:
each page resumes where the last one stopped (lua/purge.lua) instead of listing the
queued runs again from the newest, which past ``runs.QUEUE_READ_MAX`` is a walk of the
history that grows with every page.

Measured without a clock: the server's own count of the commands it ran (``INFO
commandstats``, the functions' inner calls included) per purged run, for 1,000 and for
8,000 queued runs, on a server of the test's own."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import valkey

from pyrula.workflows.purging import purge_queued
from pyrula.workflows.records import NewRun, RunStatus
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.stores.conftest import START, FakeClock
from tests.valkey.servers import ValkeyProcess, fresh_namespace

from .conftest import MakeStore

PAGE = 200
"""The purge's page (ValkeyStore's largest): 8,000 runs take 40 pages of it."""
MOST_PER_RUN = 16
"""Commands the server may run per purged run (about 8 for the ready list, 13 for the
fair queues of named owners, which keep each owner's turn)."""


def commands(url: str) -> int:
    """Every command the server has run so far."""
    client: Any = valkey.Valkey.from_url(url)
    try:
        stats = client.info("commandstats")
        return sum(int(entry["calls"]) for entry in stats.values())
    finally:
        client.close()


def backlog(kind: str, count: int) -> list[NewRun]:
    """``count`` runs that wait to start: on the ready list (single node), delayed in the
    default owner's queues, or of named owners (the fair queues and their due index)."""
    runs = []
    for i in range(count):
        owner = ("acme", "beta", "gamma")[i % 3] if kind == "owned" else ""
        delay = 3600.0 if kind == "delayed" else 0.0
        runs.append(NewRun(uuid.uuid4().hex, kind, "{}", owner=owner, delay=delay))
    return runs


async def queue(store: ValkeyStore, runs: list[NewRun]) -> None:
    for start in range(0, len(runs), 500):
        await asyncio.gather(*(store.create_run(run) for run in runs[start : start + 500]))


async def commands_per_run(url: str, kind: str, count: int) -> float:
    store = ValkeyStore(url, namespace=fresh_namespace(), shard_count=16)
    await store.open()
    try:
        await queue(store, backlog(kind, count))
        before = commands(url)
        assert await purge_queued(store, [kind], page_size=PAGE) == count
        spent = commands(url) - before
        assert await store.list_runs(workflow=kind, status=RunStatus.QUEUED) == []
        return spent / count
    finally:
        await store.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ready", "delayed", "owned"])
async def test_a_purge_costs_the_same_per_run_at_1000_and_8000_queued(
    own_server: ValkeyProcess, kind: str
) -> None:
    small = await commands_per_run(own_server.url, kind, 1000)
    large = await commands_per_run(own_server.url, kind, 8000)
    assert small <= MOST_PER_RUN, f"{small:.2f} commands per run at 1,000"
    assert large <= MOST_PER_RUN, f"{large:.2f} commands per run at 8,000"
    # Linear: the per-page costs spread over fewer runs at 1,000, never more at 8,000.
    assert large <= small + 0.25, f"{small:.2f} per run at 1,000, {large:.2f} at 8,000"


async def test_started_and_later_runs_are_kept_across_pages(
    make_store: MakeStore, topology: str, clock: FakeClock
) -> None:
    """Runs that are kept (started once and queued again, or sent after the purge began)
    sit among the purged ones in every queue (the ready list, the default owner's queue
    of delayed runs, the named owners'); with a page of 2 every call resumes after one it
    kept, and every run that waits to start is purged once."""
    store = await make_store(topology, shard_count=4, clock=clock)

    def batch(delays: list[float]) -> list[NewRun]:
        runs = [NewRun(uuid.uuid4().hex, "wf", "{}") for _ in range(6)]
        runs += [NewRun(uuid.uuid4().hex, "wf", "{}", delay=d) for d in delays]
        return runs + [NewRun(uuid.uuid4().hex, "owned", "{}", owner=o) for o in "abab"]

    before = batch([10.0, 30.0, 50.0, 70.0])
    await queue(store, before)
    leases = await store.claim_runs("w1", ["wf", "owned"], 4, 30.0)
    assert len(leases) == 4
    started = {lease.run_id for lease in leases}
    running = leases[0].run_id
    for lease in leases[1:]:  # started once, queued again: under way, not purged
        await store.release_run(lease.run_id, lease.token)
    clock.advance(5)
    after = batch([15.0, 35.0, 55.0])  # due between the delayed runs sent before
    await queue(store, after)

    purged = await store.purge_queued(["wf", "owned", "absent"], START + 1, 2)

    assert purged == len(before) - len(started)
    for run in before + after:
        record = await store.get_run(run.run_id)
        assert record is not None
        if run.run_id in started or run in after:
            assert record.status in (RunStatus.QUEUED, RunStatus.RUNNING), record
            assert not record.cancel_requested
        else:
            assert record.status is RunStatus.CANCELLED and record.cancel_requested
            assert record.error is None and record.started_at is None
    # A purge that begins now takes the runs sent since, and leaves the started ones.
    assert await purge_queued(store, ["wf", "owned"], page_size=2) == len(after)
    left = await store.list_runs(status=RunStatus.QUEUED)
    assert {r.run_id for r in left} == started - {running}
