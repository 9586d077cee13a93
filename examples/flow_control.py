"""Fairness and flow control: owners (tenants), ``Rate`` and ``owner_concurrency``.

    python examples/flow_control.py

1. Fairness: a tenant that queues 3 runs behind another tenant's 30 is served at once.
2. In WorkflowTestEnv (virtual time): ``Rate(per_second=10)`` spaces 30 runs over about
   3 seconds; a key template gives each customer its own limit; ``owner_concurrency``
   caps the runs of one owner running at once.
3. Two real workers (threads) on one SQLite file share one rate limit.
See docs/fairness.md and docs/flow-control.md.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections import Counter
from typing import Any

from pyrula.workflows import (
    RunStatus,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    open_store,
    workflow,
)
from pyrula.workflows.rate import Rate
from pyrula.workflows.sync import WorkflowClient
from pyrula.workflows.testing import WorkflowTestEnv

WAIT_LIMIT = 60.0


@workflow(name="sync_account")
async def sync_account(ctx: WorkflowContext, account: str) -> str:
    return account


@workflow(name="call_api", rate_limit=Rate(per_second=10))
async def call_api(ctx: WorkflowContext, n: int) -> float:
    return (await ctx.now()).timestamp()  # when the run started, in store time


@workflow(name="call_customer_api", rate_limit=Rate(key="api:{customer}", per_second=1))
async def call_customer_api(ctx: WorkflowContext, customer: str, n: int) -> float:
    return (await ctx.now()).timestamp()


running = Counter[str]()
peak = Counter[str]()


@workflow(name="render_video", owner_concurrency=2)
async def render_video(ctx: WorkflowContext, video: int) -> int:
    running[ctx.owner] += 1
    peak[ctx.owner] = max(peak[ctx.owner], running[ctx.owner])
    await ctx.step("render", asyncio.sleep, 0.05)  # real time: the runs overlap
    running[ctx.owner] -= 1
    return video


@workflow(name="shared_limit", rate_limit=Rate(per_second=5))
async def shared_limit(ctx: WorkflowContext, n: int) -> int:
    return n


def fairness(path: str) -> None:
    store = open_store(f"sqlite:///{path}")
    client = WorkflowClient(store)
    big = [client.submit("sync_account", {"account": f"a{i}"}, owner="big-co") for i in range(30)]
    small = [
        client.submit("sync_account", {"account": f"s{i}"}, owner="small-co") for i in range(3)
    ]
    worker = WorkflowWorker(
        store=store,
        workflows=[sync_account],
        options=WorkerOptions(max_concurrent_runs=1, claim_poll_interval=0.05),  # one at a time
    )
    thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
    thread.start()
    try:
        for handle in big + small:
            handle.result(timeout=WAIT_LIMIT)
        order = sorted((h.record() for h in big + small), key=lambda r: r.started_at or 0.0)
        owners = [run.owner for run in order]
        print("claim order:", " ".join("S" if o == "small-co" else "b" for o in owners))
        # small-co's runs alternate with big-co's instead of waiting behind all 30.
        assert owners.index("small-co") <= 1 and owners[:6].count("small-co") == 3
    finally:
        worker.stop()
        thread.join(timeout=30)
        client.close()


async def virtual_time() -> None:
    workflows = [call_api, call_customer_api, render_video]
    async with WorkflowTestEnv(workflows=workflows) as env:
        handles = [await env.submit("call_api", {"n": n}) for n in range(30)]
        starts = [await env.result(handle) for handle in handles]
        print(f"30 runs at 10/s started over {max(starts) - min(starts):.1f}s")
        assert 2.8 <= max(starts) - min(starts) <= 3.0

        # One bucket per customer: bo's runs, queued behind all of ana's, don't wait for
        # ana's bucket. A run whose key is out of tokens lets other keys' runs go by.
        handles = [
            await env.submit("call_customer_api", {"customer": c, "n": n})
            for c in ("ana", "bo")
            for n in range(3)
        ]
        starts = [await env.result(handle) for handle in handles]
        ana, bo = starts[:3], starts[3:]
        assert max(ana) - min(ana) >= 2.0 and max(bo) - min(bo) >= 2.0  # 1/s each
        assert bo[0] - ana[0] < 0.5  # but bo does not wait for ana

        handles = [
            await env.submit("render_video", {"video": v}, owner=owner)
            for v in range(6)
            for owner in ("studio-a", "studio-b")
        ]
        for handle in handles:
            await env.result(handle)
        print("most running at once per owner:", dict(peak))
        assert peak == {"studio-a": 2, "studio-b": 2}


def shared_by_workers(path: str) -> None:
    store = open_store(f"sqlite:///{path}")
    client = WorkflowClient(store)
    options = WorkerOptions(claim_poll_interval=0.05)
    workers = [WorkflowWorker(store=store, workflows=[shared_limit], options=options) for _ in "ab"]
    threads = [threading.Thread(target=asyncio.run, args=(w.run(),), daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    try:
        began = time.monotonic()
        handles = [client.submit("shared_limit", {"n": n}) for n in range(10)]
        for handle in handles:
            handle.result(timeout=WAIT_LIMIT)
        elapsed = time.monotonic() - began
        records: list[Any] = [h.record() for h in handles]
        by_worker = Counter(r.worker_id for r in records)
        print(f"10 runs at 5/s over two workers took {elapsed:.1f}s; per worker {dict(by_worker)}")
        # The first starts at once, the other nine a fifth of a second apart: >= 1.8 s.
        # A limit per worker (Celery's) would let two workers do it in about 0.9 s.
        assert elapsed >= 1.7
        assert all(r.status is RunStatus.COMPLETED for r in records)
    finally:
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join(timeout=30)
        client.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        fairness(f"{directory}/fairness.db")
        asyncio.run(virtual_time())
        shared_by_workers(f"{directory}/shared.db")


if __name__ == "__main__":
    main()
