"""The worker processes of test_trigger_processes.py: a batch trigger and a projection.

Run as the chaos harness's launcher (``harness.LAUNCHER`` points here for those tests),
so it takes ``tests/fixtures/run_worker.py``'s flags, and serves, with explicit lists:

* ``ingest(ctx, events)``, the workflow of the batch trigger ``ingest`` (at most 20
  events a run, 0.3 s wait): each execution appends ``{"kind": "ingest", "run", "events",
  "pid"}`` to the side-effect ledger (``PYRULA_TEST_LEDGER``; a run re-executed after its
  worker was killed writes its line again);
* ``noop(ctx, i)``, a trivial workflow;
* the projection ``trigger_app.deliveries``: each delivered batch appends one line
  ``{"kind": "projection", "worker", "runs": [[run_id, status, finished_at], ...]}``,
  then sleeps ``PYRULA_TEST_PROJECTION_PAUSE`` seconds (if set) before it returns.

Its definitions live in registries of their own, so importing the module (the tests do,
for the names) adds none of them to the process-wide defaults (the ledger writer comes
from tests/fixtures/chaos_workflows, whose import registers that module's workflow).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pyrula.workflows import (  # noqa: E402
    RunRecord,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    open_store,
)
from pyrula.workflows.decorators import workflow  # noqa: E402
from pyrula.workflows.projections import Projection, ProjectionRegistry, projection  # noqa: E402
from pyrula.workflows.registry import Registry  # noqa: E402
from pyrula.workflows.triggers import TriggerRegistry, batch_trigger  # noqa: E402
from tests.fixtures.chaos_workflows import ledger_write  # noqa: E402
from tests.fixtures.run_worker import FLOAT_OPTIONS, INT_OPTIONS, parse  # noqa: E402

TRIGGER = "ingest"
MAX_SIZE = 20
MAX_WAIT = 0.3
POLL = 0.05
PROJECTION = "trigger_app.deliveries"
SETTLE = 0.5
PAUSE_ENV = "PYRULA_TEST_PROJECTION_PAUSE"
"""Seconds the projection function sleeps after writing a batch's line (default 0): a
worker killed meanwhile has not moved the projection's cursor past that batch."""

registry = Registry()


@workflow(registry=registry, name="ingest")
async def ingest(ctx: WorkflowContext, events: list[Any]) -> int:
    ledger_write({"kind": "ingest", "run": ctx.run_id, "events": events, "pid": os.getpid()})
    await ctx.step("pause", _pause)  # a moment mid-run, for the kills to land in
    return len(events)


async def _pause() -> None:
    await asyncio.sleep(0.02)


@workflow(registry=registry, name="noop")
async def noop(ctx: WorkflowContext, i: int) -> int:
    return i


INGEST = batch_trigger(
    TRIGGER, ingest, max_size=MAX_SIZE, max_wait=MAX_WAIT, registry=TriggerRegistry()
)


this: dict[str, str] = {"worker": ""}
"""This process's worker id (set by serve before the worker starts)."""


@projection(PROJECTION, settle=SETTLE, registry=ProjectionRegistry())
def deliveries(runs: list[RunRecord]) -> None:
    ledger_write(
        {
            "kind": "projection",
            "worker": this["worker"],
            "runs": [[run.run_id, run.status.value, run.finished_at] for run in runs],
        }
    )
    time.sleep(float(os.environ.get(PAUSE_ENV) or 0))  # a plain def runs in a thread


DELIVERIES: Projection = deliveries  # the decorator returns the Projection


async def serve(argv: list[str] | None = None) -> None:
    args = parse(argv)  # --module is ignored: this module is the app
    settings: dict[str, Any] = {
        name: getattr(args, name)
        for name in (*FLOAT_OPTIONS, *INT_OPTIONS)
        if getattr(args, name) is not None
    }
    options = WorkerOptions(
        worker_id=args.worker_id,
        trigger_poll_interval=POLL,
        projection_poll_interval=POLL,
        **settings,
    )
    store = open_store(args.store)
    worker = WorkflowWorker(
        store,
        [ingest, noop],
        options,
        registry=registry,
        triggers=[INGEST],
        projections=[DELIVERIES],
    )
    this["worker"] = worker.worker_id
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, worker.stop)
    try:
        await worker.run()
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=getattr(logging, parse(argv).log_level.upper()),
        format="%(asctime)s.%(msecs)03d %(process)d %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    asyncio.run(serve(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
