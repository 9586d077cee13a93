"""The quickstart, in one file: a workflow, a worker in a thread, a blocking client.

    python examples/quickstart.py

In production the worker runs in its own process (``pyrula worker --workflow myapp``,
or see examples/worker_process.py); here it runs in a thread to keep one file.
Every snippet in docs/quickstart.md is taken from this file.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from datetime import timedelta
from typing import Any

from pyrula.workflows import (
    DurableInvocationError,
    Poison,
    RetryPolicy,
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


def load_address(user_id: int) -> str:
    if user_id < 0:
        raise Poison(f"no user {user_id}")  # bad input: never retried
    return f"user{user_id}@example.com"


@step(retry=RetryPolicy(max_attempts=3, initial_backoff=0.1, retryable=(ConnectionError,)))
def send_welcome(ctx: StepContext, address: str) -> dict[str, Any]:
    if ctx.attempt == 1:
        raise ConnectionError("mail server unreachable")  # retried by the policy
    return {"to": address, "attempts": ctx.attempt}


@workflow(name="onboard_user")
async def onboard_user(ctx: WorkflowContext, user_id: int) -> dict[str, Any]:
    address = await ctx.step("load_address", load_address, user_id)
    email = await send_welcome(address)
    return {"user_id": user_id, "email": email}


def main() -> None:
    # One SQLite file is queue, journal and results. PYRULA_STORE_URL, if set, wins.
    directory = tempfile.mkdtemp()  # deleted at the end, whatever happens
    try:
        store = open_store(default=f"sqlite:///{directory}/quickstart.db")
        client = WorkflowClient(store)  # blocking; one per process, shared between threads

        worker = WorkflowWorker(
            store=store,
            workflows=[onboard_user],
            options=WorkerOptions(claim_poll_interval=0.05, timer_poll_interval_s=0.1),
        )
        thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
        thread.start()

        try:
            run = client.submit("onboard_user", {"user_id": 42})
            result = run.result(timeout=30)
            print("result:", result)
            assert result == {"user_id": 42, "email": {"to": "user42@example.com", "attempts": 2}}
            assert run.status() is RunStatus.COMPLETED

            first = client.submit("onboard_user", {"user_id": 7}, idempotency_key="onboard:7")
            again = client.submit("onboard_user", {"user_id": 7}, idempotency_key="onboard:7")
            assert again.run_id == first.run_id  # a repeated key returns the first run

            later = client.submit("onboard_user", {"user_id": 8}, delay=timedelta(seconds=1))
            assert later.status() is RunStatus.QUEUED  # not claimable for a second
            print("delayed result:", later.result(timeout=30))

            bad = client.submit("onboard_user", {"user_id": -1})
            try:
                bad.result(timeout=30)
                raise AssertionError("the run should have failed")
            except DurableInvocationError as exc:
                print("failed run:", exc.error_type, "-", exc.error_message)
                assert isinstance(exc.original, Poison)
            assert bad.status() is RunStatus.FAILED
        finally:
            worker.stop()
            thread.join(timeout=30)
            client.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
