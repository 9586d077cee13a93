"""Structured logs: every record as one JSON object, naming the run, step and attempt.

    python examples/json_logs.py

An embedded worker (memory store) with ``JsonFormatter`` on the root logger, as
``pyrula worker --log-format json`` installs it. A workflow's step fails once and is
retried (WARNING), logs on its second attempt (INFO, with the step and attempt), and a
second step fails the run (ERROR, with the traceback). The script prints the lines and
checks their fields. See docs/worker.md#logging-formats-json-sentry.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging

from pyrula.workflows import (
    MemoryStore,
    RetryPolicy,
    WorkerOptions,
    WorkflowClient,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.log_context import JsonFormatter

log = logging.getLogger("shop.payments")
tries: list[int] = []


def charge(order: str) -> str:
    tries.append(1)
    if len(tries) == 1:
        raise ConnectionError("gateway reset")
    log.info("charged %s", order)
    return f"receipt-{order}"


def ship(order: str) -> None:
    raise LookupError(f"no address for {order}")


@workflow(name="checkout")
async def checkout(ctx: WorkflowContext, order: str) -> None:
    quick = RetryPolicy(max_attempts=2, initial_backoff=0.05, jitter=0.0)
    await ctx.step("charge", charge, order, retry=quick)
    await ctx.step("ship", ship, order, retry=RetryPolicy(max_attempts=1))


async def main() -> list[dict[str, object]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    store = MemoryStore()
    worker = WorkflowWorker(
        store=store, workflows=[checkout],
        options=WorkerOptions(worker_id="shop-worker-1", claim_poll_interval=0.05),
    )  # fmt: skip
    serving = asyncio.create_task(worker.run())
    try:
        handle = await WorkflowClient(store).submit(checkout, {"order": "o-7"})
        try:
            await handle.result(timeout=30)
        except Exception as exc:  # the run failed, as it should
            print(f"run failed: {type(exc).__name__}")
    finally:
        worker.stop()
        await serving
        root.removeHandler(handler)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    return [r for r in records if r.get("run_id") == handle.run_id]


if __name__ == "__main__":
    records = asyncio.run(main())
    for record in records:
        shown = {k: v for k, v in record.items() if k != "exc_info"}
        print(json.dumps(shown))
    [retry] = [r for r in records if r["level"] == "WARNING"]
    assert (retry["step"], retry["attempt"], retry["worker"]) == ("charge", 1, "shop-worker-1")
    [charged] = [r for r in records if r["message"] == "charged o-7"]
    assert (charged["step"], charged["attempt"], charged["logger"]) == (
        "charge",
        2,
        "shop.payments",
    )
    [failed] = [r for r in records if r["level"] == "ERROR"]
    assert failed["exc_type"] == "LookupError" and "in ship" in str(failed["exc_info"])
    assert all(r["workflow"] == "checkout" for r in records)
    print("json logs: ok")
