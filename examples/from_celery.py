import asyncio
import tempfile
import threading
from datetime import timedelta

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


# @app.task(autoretry_for=(ConnectionError,), max_retries=2) becomes a retried step.
@step(retry=RetryPolicy(max_attempts=3, initial_backoff=0.05, retryable=(ConnectionError,)))
def send_email(ctx: StepContext, address: str) -> dict:
    if ctx.attempt == 1:
        raise ConnectionError("provider unreachable")
    return {"sent_to": address, "attempts": ctx.attempt}


# The task body; its registered name is what callers submit.
@workflow(name="docs_from_celery_welcome")
async def welcome(ctx: WorkflowContext, user_id: int) -> dict:
    address = await ctx.step("load_address", lambda: f"user-{user_id}@example.com")
    return await send_email(address)


# Broker and result backend in one. A fresh file per run of this example; an app keeps one path.
store = open_store(default=f"sqlite:///{tempfile.mkdtemp()}/welcome.db")
client = WorkflowClient(store)  # one per process, shared between threads

# `celery worker`: in production, `pyrula worker --workflow app` in its own process.
worker = WorkflowWorker(
    workflows=[welcome],
    store=store,
    options=WorkerOptions(claim_poll_interval=0.05, timer_poll_interval_s=0.1),
)
thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
thread.start()


def enqueue_welcome(user_id: int):
    # send_welcome.apply_async((user_id,), countdown=1, task_id=f"welcome:{user_id}")
    return client.submit(
        "docs_from_celery_welcome",
        {"user_id": user_id},
        delay=timedelta(seconds=1),
        idempotency_key=f"welcome:{user_id}",
    )


try:
    run = enqueue_welcome(42)
    assert enqueue_welcome(42).run_id == run.run_id  # a repeated key returns the first run
    assert run.result(timeout=30) == {"sent_to": "user-42@example.com", "attempts": 2}
finally:
    worker.stop()
    thread.join(timeout=10)
    client.close()
