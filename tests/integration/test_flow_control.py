"""Fairness across tenants and flow control (rate limits, per-owner concurrency) on each
store, with real workers and through ``claim_runs`` directly."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections import Counter, defaultdict
from typing import Any

import pytest

from pyrula.workflows import (
    ConfigurationError,
    InvalidParams,
    RunRecord,
    Store,
    WorkflowClient,
    WorkflowContext,
    workflow,
)
from pyrula.workflows.rate import Rate
from pyrula.workflows.records import NewRun
from pyrula.workflows.registry import Registry
from tests.conftest import StartWorker


async def _queue(store: Store, workflow_name: str, owner: str, count: int, prefix: str) -> None:
    for i in range(count):
        await store.create_run(
            NewRun(run_id=f"{prefix}-{i:05d}", workflow=workflow_name, params="{}", owner=owner)
        )


# -- fairness ----------------------------------------------------------------------------
async def test_a_small_tenant_behind_a_big_backlog_is_claimed_within_a_few_claims(
    engine_store: Store,
) -> None:
    await _queue(engine_store, "wf", "big", 2_000, "big")
    first = await engine_store.claim_runs("w", ["wf"], 3, 60)  # the backlog is being served
    assert [lease.run.owner for lease in first] == ["big"] * 3
    await _queue(engine_store, "wf", "small", 10, "small")

    order: list[str] = []
    while len(order) < 30:
        [lease] = await engine_store.claim_runs("w", ["wf"], 1, 60)
        order.append(lease.run_id)
    owners = [run_id.split("-")[0] for run_id in order]
    assert owners.index("small") <= 2  # its first claim comes within the next few claims
    assert owners[:20].count("small") == 10  # then the tenants alternate until it is done
    assert owners[20:] == ["big"] * 10
    smalls = [r for r in order if r.startswith("small")]
    assert smalls == sorted(smalls)  # FIFO within a tenant
    bigs = [r for r in order if r.startswith("big")]
    assert bigs == sorted(bigs) and bigs[0] == "big-00003"


async def test_an_idle_tenant_banks_no_credit(engine_store: Store) -> None:
    await _queue(engine_store, "wf", "a", 5, "a")
    await _queue(engine_store, "wf", "b", 5, "b")
    claimed = [lease.run.owner for lease in await engine_store.claim_runs("w", ["wf"], 10, 60)]
    assert sorted(claimed) == ["a"] * 5 + ["b"] * 5
    # "a" keeps a backlog; "b" went idle long ago and now comes back with a burst.
    await _queue(engine_store, "wf", "a", 6, "a2")
    await _queue(engine_store, "wf", "b", 6, "b2")
    leases = await engine_store.claim_runs("w", ["wf"], 12, 60)
    owners = [lease.run.owner for lease in leases]
    longest = max(len(list(g)) for g in _runs_of(owners))
    assert longest == 1, owners  # strict alternation: b's idle time bought it no burst


def _runs_of(items: list[str]) -> list[list[str]]:
    groups: list[list[str]] = []
    for item in items:
        if groups and groups[-1][0] == item:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


async def test_a_worker_interleaves_tenants(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    started: list[str] = []

    @workflow(registry=registry)
    async def job(ctx: WorkflowContext) -> None:
        started.append(ctx.owner)

    client = WorkflowClient(engine_store, registry=registry)
    for _ in range(40):
        await client.submit(job, owner="big")
    for _ in range(5):
        await client.submit(job, owner="small")
    await start_worker(engine_store, [job], max_concurrent_runs=1)
    for _ in range(200):
        if len(started) == 45:
            break
        await asyncio.sleep(0.02)
    assert len(started) == 45
    assert started.index("small") <= 2
    assert started[:10].count("small") == 5


# -- rate limits -------------------------------------------------------------------------
def _starts(runs: list[RunRecord]) -> list[float]:
    return sorted(r.started_at for r in runs if r.started_at is not None)


async def test_a_rate_of_ten_a_second_spaces_thirty_runs_over_three_seconds(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry, rate_limit=Rate(per_second=10))
    async def limited(ctx: WorkflowContext, i: int) -> int:
        return i

    client = WorkflowClient(engine_store, registry=registry)
    handles = [await client.submit(limited, {"i": i}) for i in range(30)]
    await start_worker(engine_store, [limited])
    assert [await h.result(timeout=60) for h in handles] == list(range(30))
    starts = _starts(await engine_store.list_runs(workflow="limited", limit=100))
    assert len(starts) == 30
    assert starts[-1] - starts[0] >= 2.5  # 29 gaps of 0.1 s: about 2.9 s
    for i, start in enumerate(starts):  # never more than ten starts in any second
        assert sum(1 for s in starts[i:] if s < start + 1.0 - 1e-6) <= 11


async def test_a_rate_key_from_params_limits_each_customer_on_its_own(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry, rate_limit=Rate(per_second=4, key="c:{customer}"))
    async def call_api(ctx: WorkflowContext, customer: str, i: int) -> str:
        return customer

    client = WorkflowClient(engine_store, registry=registry)
    handles = [
        await client.submit(call_api, {"customer": customer, "i": i}, owner=customer)
        for customer in ("acme", "globex")
        for i in range(4)
    ]
    await start_worker(engine_store, [call_api])
    for h in handles:
        await h.result(timeout=10)
    per_customer: dict[str, list[float]] = defaultdict(list)
    for run in await engine_store.list_runs(workflow="call_api", limit=100):
        assert run.started_at is not None
        per_customer[run.owner].append(run.started_at)
    acme, globex = sorted(per_customer["acme"]), sorted(per_customer["globex"])
    for starts in (acme, globex):
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        assert min(gaps) >= 0.2  # 4/s per customer: 0.25 s apart
    # globex did not wait behind acme's bucket: one bucket for both would space all eight
    # starts 0.25 s apart (a rate never lets starts come closer, however loaded the
    # machine); two full buckets let each customer's starts come together.
    merged = sorted(acme + globex)
    assert min(b - a for a, b in itertools.pairwise(merged)) < 0.2, (acme, globex)


async def test_a_rate_key_splits_limits_within_one_owner(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    """Runs of one tenant with different keys: one key's empty bucket must not hold back
    another key's runs (no head-of-line blocking inside a tenant)."""

    @workflow(registry=registry, rate_limit=Rate(per_second=2, key="c:{customer}"))
    async def call_api(ctx: WorkflowContext, customer: str, i: int) -> str:
        return customer

    client = WorkflowClient(engine_store, registry=registry)
    # a's bucket allows one start every 0.5 s: 1.5 s for all four
    a_runs = [await client.submit(call_api, {"customer": "a", "i": i}) for i in range(4)]
    other = await client.submit(call_api, {"customer": "b", "i": 0})
    await start_worker(engine_store, [call_api])
    assert await other.result(timeout=30) == "b"
    assert [await h.result(timeout=30) for h in a_runs] == ["a"] * 4
    starts: dict[str, list[float]] = defaultdict(list)
    for run in await engine_store.list_runs(workflow="call_api", limit=100):
        assert run.started_at is not None
        starts[json.loads(run.params)["customer"]].append(run.started_at)
    a_starts, [b_start] = sorted(starts["a"]), starts["b"]
    # b's own bucket is full: it started before a's bucket let a's last run start (at
    # least 1.5 s after its first, however loaded the machine), not behind a's runs.
    assert len(a_starts) == 4 and b_start < a_starts[-1], (a_starts, b_start)


@pytest.mark.parametrize(
    "bad",
    [
        {"per_second": 0},
        {"per_second": -1},
        {"per_second": math.nan},
        {"per_second": math.inf},
        {"per_second": "10"},
        {"per_second": True},
        {"per_second": 10, "burst": 0},
        {"per_second": 10, "burst": 0.5},
        {"per_second": 10, "key": 5},
    ],
)
def test_a_bad_rate_is_refused_at_decoration(bad: dict[str, Any], registry: Registry) -> None:
    with pytest.raises(ConfigurationError):

        @workflow(registry=registry, rate_limit=Rate(**bad))
        async def limited(ctx: WorkflowContext) -> None:
            return None

    assert registry.find("limited") is None


@pytest.mark.parametrize("bad", [Rate, 10, {"per_second": 10}])
def test_rate_limit_takes_a_rate(bad: Any, registry: Registry) -> None:
    with pytest.raises(ConfigurationError):
        workflow(registry=registry, rate_limit=bad)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_a_bad_owner_concurrency_is_refused(bad: Any, registry: Registry) -> None:
    with pytest.raises(ConfigurationError):
        workflow(registry=registry, owner_concurrency=bad)


async def test_a_rate_key_naming_a_missing_param_is_refused_at_submit(
    engine_store: Store, registry: Registry
) -> None:
    @workflow(registry=registry, rate_limit=Rate(per_second=1, key="c:{customer}"))
    async def keyed(ctx: WorkflowContext, **params: Any) -> None:
        return None

    client = WorkflowClient(engine_store, registry=registry)
    with pytest.raises(InvalidParams):
        await client.submit(keyed, {"other": 1})
    assert await engine_store.list_runs() == []  # refused before anything was stored


# -- per-owner concurrency ---------------------------------------------------------------
async def test_owner_concurrency_caps_each_owner_while_others_proceed(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    log: list[tuple[str, str]] = []

    async def work(owner: str) -> None:
        running[owner] += 1
        peak[owner] = max(peak[owner], running[owner])
        log.append(("start", owner))
        await asyncio.sleep(0.15)
        running[owner] -= 1
        log.append(("end", owner))

    @workflow(registry=registry, owner_concurrency=2)
    async def capped(ctx: WorkflowContext) -> None:
        await ctx.step("work", work, ctx.owner)

    client = WorkflowClient(engine_store, registry=registry)
    handles = [await client.submit(capped, owner="busy") for _ in range(6)]
    handles += [await client.submit(capped, owner="light") for _ in range(2)]
    await start_worker(engine_store, [capped], max_concurrent_runs=10)
    for h in handles:
        await h.result(timeout=10)
    assert peak == {"busy": 2, "light": 2}
    # "light" did not queue behind "busy"'s six runs: both its runs started before
    # busy's last run did.
    last_busy_start = max(i for i, e in enumerate(log) if e == ("start", "busy"))
    light_starts = [i for i, e in enumerate(log) if e == ("start", "light")]
    assert max(light_starts) < last_busy_start
