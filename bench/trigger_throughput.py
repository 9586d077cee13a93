"""Batch triggers: events/s end to end, against one run per event, in the same rounds.

    python bench/trigger_throughput.py                 # SQLite and a local valkey-server
    python bench/trigger_throughput.py --events 20000 --rounds 5 --stores valkey

For each store and round, the same N events go through a worker (in this process, on
the same event loop as the client, so both sides share one core's worth of Python):

* ``per-run``: one run per event (``client.submit`` each), a one-step workflow;
* ``trigger, 1/call``: ``client.send_event`` each, a batch trigger (``max_size`` 100,
  ``max_wait`` 0.05 s) whose one-step workflow takes the batch;
* ``trigger, 100/call``: the same trigger, ``client.send_events`` of 100 at a time.

Figure: events / (first send to the last event handled by its run's step). The ratio to
``per-run`` is taken within each round. Uses only pyrula's public API.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from common import header, median, row
from pyrula.workflows import (
    Store,
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    batch_trigger,
    workflow,
)
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores.sqlite import SqliteStore
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.triggers import TriggerRegistry
from valkey_server import BenchValkey

REGISTRY = Registry()
TRIGGERS = TriggerRegistry()


HANDLED = [0]
"""Events handled so far in this process (the worker runs here): read without a store call."""


def handle(count: int) -> int:
    HANDLED[0] += count
    return count


@workflow(name="bench_event", registry=REGISTRY)
async def bench_event(ctx: WorkflowContext, event: int) -> int:
    return await ctx.step("handle", lambda: handle(1))  # type: ignore[no-any-return]


@workflow(name="bench_batch", registry=REGISTRY)
async def bench_batch(ctx: WorkflowContext, events: list[int]) -> int:
    return await ctx.step("handle", lambda: handle(len(events)))  # type: ignore[no-any-return]


TRIGGER = batch_trigger("bench-events", bench_batch, max_size=100, max_wait=0.05,
                        registry=TRIGGERS)  # fmt: skip


async def timed(store: Store, n: int, send: Callable[[WorkflowClient], Awaitable[None]]) -> float:
    """Events/s of one system: a worker on ``store``, ``send`` the events, wait for all."""
    options = WorkerOptions(claim_poll_interval=0.05, trigger_poll_interval=0.01)
    worker = WorkflowWorker(
        store, [bench_event, bench_batch], options, registry=REGISTRY, triggers=[TRIGGER]
    )
    task = asyncio.create_task(worker.run())
    client = WorkflowClient(store, registry=REGISTRY)
    try:
        HANDLED[0] = 0
        started = time.perf_counter()
        await send(client)
        while HANDLED[0] < n:
            await asyncio.sleep(0.005)
        return n / (time.perf_counter() - started)
    finally:
        worker.stop()
        await task


async def one_round(make_store: Callable[[], Store], n: int) -> dict[str, float]:
    async def per_run(client: WorkflowClient) -> None:
        for i in range(n):
            await client.submit(bench_event, {"event": i})

    async def one_per_call(client: WorkflowClient) -> None:
        for i in range(n):
            await client.send_event("bench-events", i)

    async def hundred_per_call(client: WorkflowClient) -> None:
        for start in range(0, n, 100):
            await client.send_events("bench-events", list(range(start, min(start + 100, n))))

    out: dict[str, float] = {}
    systems: list[tuple[str, Any]] = [
        ("per-run", per_run),
        ("trigger, 1/call", one_per_call),
        ("trigger, 100/call", hundred_per_call),
    ]
    for name, send in systems:
        store = make_store()  # an empty store for each system and round
        await store.open()
        try:
            out[name] = await timed(store, n, send)
        finally:
            await store.close()
    return out


async def bench(kind: str, make_store: Callable[[], Store], n: int, rounds: int) -> None:
    results = [await one_round(make_store, n) for _ in range(rounds)]
    names = list(results[0])
    print(f"\n{kind}: {n:,} events, {rounds} rounds; events/s median (min - max), ratio to per-run")
    row("system", "events/s", "min", "max", "x per-run", widths=(20, 10, 10, 10, 10))
    for name in names:
        rates = [r[name] for r in results]
        ratios = [r[name] / r["per-run"] for r in results]
        row(name, f"{median(rates):,.0f}", f"{min(rates):,.0f}", f"{max(rates):,.0f}",
            f"x{median(ratios):.1f}", widths=(20, 10, 10, 10, 10))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stores", default="sqlite,valkey")
    args = parser.parse_args()
    header("Batch triggers vs one run per event")
    stores = args.stores.split(",")
    made = itertools.count()
    if "sqlite" in stores:
        with tempfile.TemporaryDirectory() as tmp:

            def sqlite() -> Store:
                return SqliteStore(Path(tmp) / f"bench-{next(made)}.db")

            asyncio.run(bench("SQLite", sqlite, args.events, args.rounds))
    if "valkey" in stores:
        with BenchValkey() as server:

            def valkey() -> Store:
                return ValkeyStore(server.url, namespace=f"bench-{next(made)}")

            asyncio.run(bench("Valkey", valkey, args.events, args.rounds))


if __name__ == "__main__":
    main()
