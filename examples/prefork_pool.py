"""The prefork pool: CPU-bound steps on two processes, and a hard step timeout.

    python examples/prefork_pool.py

Starts ``pyrula worker --workflow examples.prefork_pool --processes 2`` on a throw-away
SQLite file, then, as a client:

1. submits two CPU-bound runs at once: two pool processes run them side by side (each
   has a core and a GIL of its own), so their pids differ;
2. submits a run whose ``@step(timeout=1, hard=True)`` blocks in ``time.sleep(30)``: the
   supervisor kills that pool process at one second, the run fails with StepTimeout,
   and a fresh process replaces the killed one.

The worker is stopped by its pid at the end. See docs/worker.md#pools-prefork-threads-solo.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyrula.workflows import SqliteStore, WorkflowContext, step, workflow
from pyrula.workflows.errors import DurableInvocationError
from pyrula.workflows.sync import WorkflowClient

ROOT = Path(__file__).resolve().parent.parent


def crunch(n: int) -> tuple[int, int]:
    """Pure-Python work; returns its result and the pid of the process that ran it."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total, os.getpid()


@step(timeout=1.0, hard=True)
def fetch_report(ctx: object, seconds: float) -> str:
    time.sleep(seconds)  # blocked in C: only killing the process ends it at the timeout
    return "fetched"


@workflow(name="example_crunch")
async def crunch_numbers(ctx: WorkflowContext, n: int) -> list[int]:
    total, pid = await ctx.step("crunch", crunch, n)
    return [total, pid]


@workflow(name="example_report")
async def report(ctx: WorkflowContext, seconds: float) -> str:
    return await fetch_report(seconds)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="prefork-example-") as tmp:
        db = Path(tmp) / "pool.db"
        worker = subprocess.Popen(
            [sys.executable, "-m", "pyrula.cli.main", "worker", "--workflow",
             "examples.prefork_pool", "--store", f"sqlite:///{db}", "--processes", "2",
             "--claim-poll-interval", "0.05", "--loglevel", "WARNING"],
            cwd=ROOT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            with WorkflowClient(SqliteStore(db)) as client:
                runs = [client.submit(crunch_numbers, {"n": 3_000_000}) for _ in range(2)]
                pids = {run.result(timeout=120)[1] for run in runs}
                print(f"two CPU-bound runs ran in {len(pids)} processes")
                began = time.monotonic()
                try:
                    client.submit(report, {"seconds": 30.0}).result(timeout=60)
                except DurableInvocationError as exc:
                    took = time.monotonic() - began
                    print(f"the report run failed after about {round(took)}s: {exc}")
                seen = {w.worker_id for w in client.list_workers(include_dead=True)}
                now, deadline = seen, time.monotonic() + 60
                while time.monotonic() < deadline:  # the replacement registers as it serves
                    now = {w.worker_id for w in client.list_workers(include_dead=True)}
                    if now - seen:
                        break
                    time.sleep(0.1)
                print(f"a fresh pool process replaced the killed one: {bool(now - seen)}")
                after = client.submit(crunch_numbers, {"n": 1000}).result(timeout=60)
                print(f"and the pool serves on: {after[0]}")
        finally:
            os.kill(worker.pid, signal.SIGTERM)
            worker.wait(60)


if __name__ == "__main__":
    main()
