"""Projections: keep a read model of your own up to date from the runs that end.

    python examples/projections.py

1. A projection keeps a table of order states (a SQLite table of the app's own) from the
   runs of ``checkout`` that end, with an upsert, so a batch delivered twice is harmless.
2. Two real workers on one SQLite store file run checkouts; one of them at a time holds
   the projection. Midway, the worker holding it stops and the other takes over from
   the stored cursor.
3. Every order is in the table with the status its run ended with.
See docs/projections.md.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tempfile
import threading
import time

from pyrula.workflows import (
    RunRecord,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    open_store,
    projection,
    workflow,
)
from pyrula.workflows.sync import WorkflowClient

DB_PATH: list[str] = []


@workflow(name="checkout")
async def checkout(ctx: WorkflowContext, order: str, amount: int) -> dict[str, int]:
    if amount <= 0:
        raise ValueError(f"order {order}: nothing to charge")
    return {"charged": amount}


@projection("order-states", workflows=["checkout"], settle=0.0)
def order_states(runs: list[RunRecord]) -> None:
    """Upsert each ended checkout's state: at least once delivery needs no more."""
    with sqlite3.connect(DB_PATH[0]) as db:
        db.executemany(
            "INSERT INTO orders (order_id, status, result) VALUES (?, ?, ?) "
            "ON CONFLICT (order_id) DO UPDATE SET status = excluded.status, "
            "result = excluded.result",
            [(json.loads(run.params)["order"], run.status.value, run.result) for run in runs],
        )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        DB_PATH.append(f"{tmp}/read_model.db")
        with sqlite3.connect(DB_PATH[0]) as db:
            db.execute("CREATE TABLE orders (order_id TEXT PRIMARY KEY, status TEXT, result TEXT)")
        url = f"sqlite:///{tmp}/pyrula.db"
        options = WorkerOptions(claim_poll_interval=0.05, projection_poll_interval=0.05)
        workers = [WorkflowWorker(open_store(url), options=options) for _ in range(2)]
        threads = [threading.Thread(target=lambda w=w: asyncio.run(w.run())) for w in workers]
        for thread in threads:
            thread.start()
        with WorkflowClient(open_store(url)) as client:
            for n in range(20):
                client.submit("checkout", {"order": f"o{n}", "amount": n % 7})
            wait_rows(10)
            holder = lease_holder(url)
            stopped = next(w for w in workers if w.worker_id == holder)
            stopped.stop()  # a clean stop hands the projection over at once
            print("stopped the worker holding the projection")
            for n in range(20, 30):
                client.submit("checkout", {"order": f"o{n}", "amount": n % 7})
            rows = wait_rows(30)
            assert lease_holder(url) != holder
        for worker in workers:
            worker.stop()
        for thread in threads:
            thread.join()

    failed = sorted(order for order, status in rows.items() if status == "failed")
    assert failed == ["o0", "o14", "o21", "o28", "o7"], failed
    assert all(status == "completed" for order, status in rows.items() if order not in failed)
    print(f"{len(rows)} orders in the read model, failed: {failed}")


def wait_rows(count: int) -> dict[str, str]:
    deadline = time.monotonic() + 30
    while True:
        with sqlite3.connect(DB_PATH[0]) as db:
            rows = dict(db.execute("SELECT order_id, status FROM orders").fetchall())
        if len(rows) >= count:
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(rows)} of {count} orders in the read model after 30 s")
        time.sleep(0.05)


def lease_holder(url: str) -> str | None:
    store = open_store(url)
    try:
        lease = asyncio.run(store.get_cursor("projection-lease:order-states"))
    finally:
        asyncio.run(store.close())
    return None if lease is None else json.loads(lease).get("worker")


if __name__ == "__main__":
    main()
