"""A small durable workflow on the embedded SQLite store.

The order is submitted twice with one idempotency key: the second submit finds the
first run and returns its journaled result without charging again.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading

from pyrula.workflows import (
    RetryPolicy,
    StepContext,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    open_store,
    step,
    workflow,
)
from pyrula.workflows.sync import WorkflowClient


@step(retry=RetryPolicy(max_attempts=3, initial_backoff=0.05))
def charge_card(ctx: StepContext, order_id: str, amount: int) -> dict:
    if ctx.attempt == 1:
        raise ConnectionError("payment provider timed out")  # retried by the policy
    return {"order_id": order_id, "charged": amount, "attempts": ctx.attempt}


@workflow(name="demo_checkout")
async def checkout(ctx: WorkflowContext, order_id: str, amount: int) -> dict:
    stock = await ctx.step("reserve_stock", lambda: {"order_id": order_id, "reserved": True})
    payment = await charge_card(order_id, amount)
    receipt = await ctx.step("send_receipt", lambda: f"receipt for {order_id} sent")
    return {"stock": stock, "payment": payment, "receipt": receipt}


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="pyrula-demo-") as directory:
        store = open_store(default=f"sqlite:///{os.path.join(directory, 'demo.db')}")
        client = WorkflowClient(store)
        worker = WorkflowWorker(
            store=store,
            workflows=[checkout],
            options=WorkerOptions(claim_poll_interval=0.05, timer_poll_interval_s=0.1),
        )
        thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
        thread.start()
        try:
            run = client.submit(
                "demo_checkout",
                {"order_id": "A-1001", "amount": 4200},
                idempotency_key="order:A-1001",
            )
            print(f"run {run.run_id} on {store.url}")
            print("result:", run.result(timeout=30))
            again = client.submit(
                "demo_checkout",
                {"order_id": "A-1001", "amount": 4200},
                idempotency_key="order:A-1001",
            )
            print("same key, same run:", again.run_id == run.run_id, "->", again.result(timeout=30))
            print("status:", run.status().value)
        finally:
            worker.stop()
            thread.join(timeout=30)
            client.close()


if __name__ == "__main__":
    main()
