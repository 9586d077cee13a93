"""A production worker process on Valkey: the page docs/production-worker.md in one file.

Run it from the repository root against a Valkey server (or any node of a cluster)::

    python -m examples.valkey_worker --url redis://localhost:6379
    PYRULA_STORE_URL=redis://localhost:6379 python -m examples.valkey_worker
    PYRULA_STORE_URL='redis://localhost:6379/0?namespace=staging' python -m examples.valkey_worker
    python -m examples.valkey_worker --url 'valkey://node-1:6379?cluster=true'

The URL is ``--url``, else ``PYRULA_STORE_URL``, else ``redis://localhost:6379``. Store
options (``namespace``, ``shard_count``, ``cluster``, ...) may ride in its query string;
the namespace otherwise comes from ``PYRULA_VALKEY_NAMESPACE``, else ``"default"``.

What it does:

1. imports the app's workflows (``examples.workflows``) and defines ``nightly_report``,
   so the worker serves both;
2. stores the nightly schedule in Valkey (once per deploy is enough; doing it again
   replaces the definition, so restarts are harmless);
3. serves until SIGTERM or SIGINT, then stops gracefully: no new claims, in-flight runs
   get ``shutdown_grace`` seconds, the rest go back to the queue, its shard leases are
   released at once, and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from typing import Any

# Import your @workflow-decorated modules so they register before run()
import examples.workflows  # noqa: F401
from pyrula.workflows import (
    Schedule,
    ValkeyStore,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)

DEFAULT_URL = "redis://localhost:6379"


@workflow(name="nightly_report")
async def nightly_report(ctx: WorkflowContext, window: str) -> dict[str, Any]:
    """The scheduled workflow: one step that would build a report over ``window``."""
    rows = await ctx.step("count_orders", lambda: 42)
    return {"window": window, "orders": rows}


def install_schedules(store: ValkeyStore) -> None:
    """Store the schedules this app needs. They live in Valkey, so every worker serving
    the workflow sees them without a restart; a fixed id plus ``replace=True`` makes this
    safe to run on every start."""
    store.schedule_create(
        Schedule.create(
            "nightly_report", "0 2 * * *", {"window": "24h"}, schedule_id="nightly_report"
        ),
        replace=True,
    )


async def serve(store: ValkeyStore) -> None:
    worker = WorkflowWorker(store=store, options=WorkerOptions(shutdown_grace=30.0))
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, worker.stop)
    loop.add_signal_handler(signal.SIGINT, worker.stop)
    try:
        await worker.run()  # blocks until worker.stop() is called
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", help=f"Valkey URL (default: $PYRULA_STORE_URL or {DEFAULT_URL})")
    args = parser.parse_args(argv)
    url = args.url or os.environ.get("PYRULA_STORE_URL") or DEFAULT_URL
    store = ValkeyStore.from_url(url)  # namespace=, shard_count=, cluster=... may ride in the URL
    install_schedules(store)
    asyncio.run(serve(store))


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    main()
