"""A workflow with a retried step, a worker, and a caller: `python app.py` exits 0.

In production the worker is its own process (`pyrula worker --workflow app`); here it
runs on a thread only to keep the example in one file.
"""

import asyncio
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


@step(retry=RetryPolicy(max_attempts=3, initial_backoff=0.05, retryable=(ConnectionError,)))
def send_email(ctx: StepContext, address: str) -> dict:
    if ctx.attempt == 1:
        raise ConnectionError("provider unreachable")
    return {"sent_to": address, "attempts": ctx.attempt}


@workflow(name="welcome")
async def welcome(ctx: WorkflowContext, user_id: int) -> dict:
    address = await ctx.step("load_address", lambda: f"user-{user_id}@example.com")
    return await send_email(address)


def main() -> int:
    store = open_store()  # PYRULA_STORE_URL, else sqlite:///pyrula.db in this folder
    client = WorkflowClient(store)  # one per process, shared between threads
    worker = WorkflowWorker(
        workflows=[welcome], store=open_store(), options=WorkerOptions(claim_poll_interval=0.05)
    )
    thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
    thread.start()
    try:
        run = client.submit("welcome", {"user_id": 42})
        print("welcome:", run.result(timeout=30))
    finally:
        worker.stop()
        thread.join(timeout=10)
        client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
