"""End-to-end three-step runs per second with ONE worker process on SqliteStore (WAL).

This process submits N runs of ``bench_three_steps`` through the async WorkflowClient
while a worker process (``bench/serve_worker.py``, spawned here and stopped by PID)
executes them; the clock runs from the first submit until ``wait_run`` has returned for
every run. Measured in the same run, as baselines:

* the submit rate into the same kind of store with no worker competing for it;
* the same runs through an in-process worker on the MemoryStore: the engine without
  SQLite (and without a second process);
* the raw SQLite write-transaction rate of this machine (BEGIN IMMEDIATE, one-row
  INSERT, COMMIT, WAL, synchronous=NORMAL, no pyrula), and the run rate it would allow
  at the store's write transactions per run.

    python bench/sqlite_throughput.py [--runs 2000] [--concurrency 50]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from pathlib import Path

from common import (
    bench_three_steps,
    header,
    start_worker,
    stop_worker,
    verdict,
    wait_for_worker,
)
from pyrula.workflows import (
    MemoryStore,
    RunHandle,
    RunStatus,
    WorkerOptions,
    WorkflowClient,
    WorkflowWorker,
    open_store,
)

TARGET_RUNS_PER_S = 300.0
WRITES_PER_RUN = 6
"""Write transactions per run: create, claim (shared by a batch, counted whole here),
three journal appends, finish."""


def raw_commit_rate(path: Path, count: int) -> float:
    """Commits per second of one-row write transactions, straight through sqlite3."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        started = time.perf_counter()
        for i in range(count):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (id, body) VALUES (?, ?)", (i, '{"n": 1}'))
            conn.execute("COMMIT")
        return count / (time.perf_counter() - started)
    finally:
        conn.close()


async def submit_all(client: WorkflowClient, n: int) -> list[RunHandle]:
    return [await client.submit(bench_three_steps, {"n": i}) for i in range(n)]


async def submit_only(url: str, n: int) -> float:
    """Submits per second into a fresh store with nothing else using it."""
    store = open_store(url)
    await store.open()
    try:
        client = WorkflowClient(store)
        await submit_all(client, 50)  # warm-up
        started = time.perf_counter()
        await submit_all(client, n)
        return n / (time.perf_counter() - started)
    finally:
        await store.close()


async def memory_end_to_end(n: int, concurrency: int) -> float:
    """Runs per second through an in-process worker on a MemoryStore."""
    store = MemoryStore()
    worker = WorkflowWorker(
        store,
        workflows=[bench_three_steps],
        options=WorkerOptions(max_concurrent_runs=concurrency),
    )
    serving = asyncio.create_task(worker.run())
    try:
        client = WorkflowClient(store)
        started = time.perf_counter()
        handles = await submit_all(client, n)
        for handle in handles:
            await handle.result(timeout=120)
        return n / (time.perf_counter() - started)
    finally:
        worker.stop()
        await serving


async def end_to_end(url: str, n: int, concurrency: int) -> tuple[float, float, float]:
    """(runs/s end to end, submits/s meanwhile, seconds to the last completion)."""
    store = open_store(url)
    await store.open()
    proc = start_worker(url, concurrency=concurrency)
    try:
        await wait_for_worker(store, proc, timeout=30)
        client = WorkflowClient(store)
        started = time.perf_counter()
        handles = await submit_all(client, n)
        submitted = time.perf_counter()
        for i, handle in enumerate(handles):
            run = await store.wait_run(handle.run_id, timeout=120)
            if run.status is not RunStatus.COMPLETED or run.result != str(3 + i):
                raise RuntimeError(f"run {i} ended {run.status.value}: {run.result or run.error}")
        elapsed = time.perf_counter() - started
        return n / elapsed, n / (submitted - started), elapsed
    finally:
        stop_worker(proc)
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs to submit (N)")
    parser.add_argument("--concurrency", type=int, default=50, help="worker max_concurrent_runs")
    args = parser.parse_args()
    n = args.runs

    header(f"SQLite throughput: {n} three-step runs, 1 worker process, WAL")
    with tempfile.TemporaryDirectory(prefix="pyrula-bench-") as tmp:
        root = Path(tmp)
        commits = raw_commit_rate(root / "raw.db", 5000)
        memory = await memory_end_to_end(n, args.concurrency)
        alone = await submit_only(f"sqlite:///{root / 'submit.db'}", n)
        runs_s, submits_s, elapsed = await end_to_end(
            f"sqlite:///{root / 'e2e.db'}", n, args.concurrency
        )
    ceiling = commits / WRITES_PER_RUN
    print(f"raw sqlite3 write transactions:     {commits:8.0f} /s  (baseline)")
    print(f"  -> ceiling at {WRITES_PER_RUN} writes per run:   {ceiling:8.0f} runs/s")
    print(f"in-process worker on MemoryStore:   {memory:8.0f} runs/s  (baseline)")
    print(f"submit alone (no worker):           {alone:8.0f} runs/s")
    print(f"submit while the worker runs:       {submits_s:8.0f} runs/s")
    print(
        f"end to end (concurrency {args.concurrency}):      {runs_s:8.0f} runs/s  "
        f"({elapsed:.2f} s for {n} runs; {runs_s / ceiling:.0%} of the raw-SQLite ceiling, "
        f"{runs_s / memory:.0%} of the MemoryStore rate)"
    )
    print()
    print(
        f"end to end: {runs_s:.0f} runs/s vs target >= {TARGET_RUNS_PER_S:.0f}: "
        f"{verdict(runs_s, TARGET_RUNS_PER_S, higher_is_better=True)}"
    )


if __name__ == "__main__":
    asyncio.run(main())
