"""Composition: ``ctx.gather`` (concurrent steps in one run) and ``ctx.run_child``.

    python examples/composition.py

Part 1 runs in WorkflowTestEnv: steps gathered concurrently, child runs gathered,
a child's error reaching the parent, a cancel that reaches the child, and a parent
retried after its child failed (the child runs again).
Part 2 has two real workers (threads, one SQLite file): one serves only the parent
workflow, the other only the child, so the child runs on whichever worker serves it.
See docs/composition.md.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from typing import Any

from pyrula.workflows import (
    DurableInvocationError,
    Fatal,
    RunStatus,
    StepContext,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    open_store,
    step,
    workflow,
)
from pyrula.workflows.sync import WorkflowClient
from pyrula.workflows.testing import WorkflowTestEnv

WAIT_LIMIT = 30.0
in_flight = {"now": 0, "peak": 0}


@step
async def fetch_price(ctx: StepContext, supplier: str, sku: str) -> dict[str, Any]:
    in_flight["now"] += 1
    in_flight["peak"] = max(in_flight["peak"], in_flight["now"])
    await asyncio.sleep(0.05)  # an HTTP call, say
    in_flight["now"] -= 1
    return {"supplier": supplier, "price": len(supplier) * 10 + len(sku)}


@workflow(name="best_price")
async def best_price(ctx: WorkflowContext, sku: str) -> dict[str, Any]:
    suppliers = ["acme", "globex", "initech"]
    # Three steps at once; journal positions are taken in argument order, so a replay
    # finds each result where it expects it, whichever finished first.
    quotes = await ctx.gather(*(fetch_price(s, sku) for s in suppliers))
    return min(quotes, key=lambda q: q["price"])


@workflow(name="ship_parcel")
async def ship_parcel(ctx: WorkflowContext, parcel: str) -> str:
    if parcel.startswith("bad"):
        raise ValueError(f"cannot ship {parcel}")
    await ctx.sleep(3600)  # waits for the courier; a child can sleep like any run
    return await ctx.step("label", lambda: f"label:{parcel}")  # type: ignore[no-any-return]


@workflow(name="ship_order")
async def ship_order(ctx: WorkflowContext, parcels: list[str]) -> list[Any]:
    # Child runs, concurrently; with return_exceptions a failed child comes back as its
    # exception (a DurableInvocationError) instead of raising.
    results = await ctx.gather(
        *(ctx.run_child("ship_parcel", {"parcel": p}) for p in parcels),
        return_exceptions=True,
    )
    return [
        f"failed: {r.error_message}" if isinstance(r, DurableInvocationError) else r
        for r in results
    ]


@workflow(name="ship_one")
async def ship_one(ctx: WorkflowContext, parcel: str) -> str:
    try:
        return await ctx.run_child(ship_parcel, {"parcel": parcel})  # type: ignore[no-any-return]
    except DurableInvocationError as exc:  # the child's error, with its type and message
        return f"failed: {exc.error_type}: {exc.error_message}"


async def in_the_test_env() -> None:
    async with WorkflowTestEnv(workflows=[best_price, ship_parcel, ship_order, ship_one]) as env:
        assert await env.run("best_price", {"sku": "tea"}) == {"supplier": "acme", "price": 43}
        assert in_flight["peak"] == 3  # the three steps ran at the same time

        results = await env.run("ship_order", {"parcels": ["p1", "bad-p2", "p3"]})
        print("ship_order:", results)
        assert results == ["label:p1", "failed: cannot ship bad-p2", "label:p3"]

        print("ship_one:", await env.run("ship_one", {"parcel": "bad-x"}))

        # Cancelling the parent cancels the child it waits for.
        parent = await env.submit("ship_one", {"parcel": "p9"})
        await env.advance(60)  # the child sleeps; the parent waits for it
        [child] = await env.store.list_runs(workflow="ship_parcel", status=RunStatus.SLEEPING)
        assert child.parent_run_id == parent.run_id
        await parent.cancel()
        assert await parent.status() is RunStatus.CANCELLED
        assert (await env.client.handle("ship_parcel", child.run_id).status()) is (
            RunStatus.CANCELLED
        )


carrier = {"up": False}


def book(label: str) -> str:
    if not carrier["up"]:
        raise Fatal(f"carrier down, cannot book {label}")
    return f"booked {label}"


@workflow(name="book_courier")
async def book_courier(ctx: WorkflowContext, parcel: str) -> str:
    label = await ctx.step("label", lambda: f"label:{parcel}")
    return await ctx.step("book", book, label)  # type: ignore[no-any-return]


@workflow(name="dispatch")
async def dispatch(ctx: WorkflowContext, parcel: str) -> str:
    booking = await ctx.run_child(book_courier, {"parcel": parcel})
    return await ctx.step("notify", lambda: f"notified: {booking}")  # type: ignore[no-any-return]


async def retry_after_a_child_failed() -> None:
    async with WorkflowTestEnv(workflows=[book_courier, dispatch]) as env:
        handle = await env.submit("dispatch", {"parcel": "p7"})
        try:
            await env.result(handle)
            raise AssertionError("dispatch should have failed")
        except DurableInvocationError as exc:  # the child's failure failed the parent
            print("dispatch failed:", exc.error_message)
        carrier["up"] = True  # the cause is fixed
        await handle.retry()  # retries the failed child first; the parent then goes on
        print("dispatch after retry:", await env.result(handle))
        [child] = await env.store.list_runs(workflow="book_courier")
        assert child.status is RunStatus.COMPLETED  # the same child run, run again


@workflow(name="nightly_export")
async def nightly_export(ctx: WorkflowContext, tables: list[str]) -> dict[str, int]:
    counts = await ctx.gather(*(ctx.run_child("export_table", {"table": t}) for t in tables))
    return dict(zip(tables, counts, strict=True))


@workflow(name="export_table")
async def export_table(ctx: WorkflowContext, table: str) -> int:
    return await ctx.step("export", lambda: len(table) * 100)  # type: ignore[no-any-return]


def across_workers(path: str) -> None:
    store = open_store(f"sqlite:///{path}")
    client = WorkflowClient(store)
    options = WorkerOptions(claim_poll_interval=0.05)
    # One worker serves the parent workflow only, the other the child only.
    parents = WorkflowWorker(store=store, workflows=[nightly_export], options=options)
    children = WorkflowWorker(store=store, workflows=[export_table], options=options)
    threads = [
        threading.Thread(target=lambda w=w: asyncio.run(w.run()), daemon=True)  # type: ignore[misc]
        for w in (parents, children)
    ]
    for thread in threads:
        thread.start()
    try:
        run = client.submit("nightly_export", {"tables": ["users", "orders"]})
        result = run.result(timeout=WAIT_LIMIT)
        print("nightly_export:", result)
        assert result == {"users": 500, "orders": 600}
        exports = asyncio.run(store.list_runs(workflow="export_table"))
        assert len(exports) == 2
        assert all(child.worker_id == children.worker_id for child in exports)
    finally:
        for worker in (parents, children):
            worker.stop()
        for thread in threads:
            thread.join(timeout=30)
        client.close()


def main() -> None:
    asyncio.run(in_the_test_env())
    asyncio.run(retry_after_a_child_failed())
    with tempfile.TemporaryDirectory() as directory:
        across_workers(f"{directory}/composition.db")


if __name__ == "__main__":
    main()
