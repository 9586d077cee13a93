"""Fair claiming: claim throughput with every run under one owner vs spread over many.

For each store (MemoryStore, SqliteStore) and each owner count T (1 and --tenants,
default 100), on a fresh store holding N queued runs of ``bench_noop`` (a workflow with
no steps; run i belongs to owner ``tenant-{i mod T}``):

1. Claims/s: this process drains the queue with ``claim_runs(limit=1)``, one claim after
   the other, N claims in all (each must get exactly one run); claims/s = N / elapsed,
   and each claim's latency gives p50 and p99. With T owners the first T claims must go
   to T different owners (deficit round robin), which is checked.
2. End-to-end no-op runs/s with ONE worker (concurrency 50): N runs are queued first,
   then a worker serves them (SQLite: a worker process, this script's ``--serve`` mode,
   stopped by PID; Memory: a worker in this process). Runs/s = N / (the store-recorded
   span from the first run's ``started_at`` to the last one's ``finished_at``), so worker
   start-up is not counted.

The baseline is T = 1 on the same store in the same run: printed last, the ratio
T-owners / 1-owner for each figure (1.00 = owners cost nothing).

    python bench/tenant_claims.py [--runs 5000] [--tenants 100] [--stores memory,sqlite]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from common import (
    bench_noop,
    header,
    parse_options,
    percentile,
    row,
    serve,
    start_script_worker,
    stop_worker,
    wait_for_worker,
)
from pyrula.workflows import (
    MemoryStore,
    RunStatus,
    Store,
    WorkerOptions,
    WorkflowWorker,
    open_store,
)
from pyrula.workflows.records import NewRun

INSERT_BATCH = 200
"""create_run calls in flight at once while filling the queue."""
WIDTHS = (12, 8, 10, 11, 11, 11, 10)


@dataclass(frozen=True)
class Figures:
    claims_per_s: float
    claim_p50_ms: float
    claim_p99_ms: float
    runs_per_s: float
    first_owners: int
    """Distinct owners among the first ``tenants`` claims."""


def owner_of(i: int, tenants: int) -> str:
    return f"tenant-{i % tenants:03d}"


async def fill(store: Store, n: int, tenants: int) -> list[str]:
    """Queue ``n`` runs of ``bench_noop``, round robin over ``tenants`` owners."""
    ids: list[str] = []
    for first in range(0, n, INSERT_BATCH):
        batch = [
            NewRun(
                run_id=uuid.uuid4().hex,
                workflow=bench_noop.name,
                params="{}",
                owner=owner_of(i, tenants),
            )
            for i in range(first, min(n, first + INSERT_BATCH))
        ]
        await asyncio.gather(*(store.create_run(new) for new in batch))
        ids += [new.run_id for new in batch]
    return ids


async def drain_claims(store: Store, n: int, tenants: int) -> tuple[float, list[float], int]:
    """(claims/s, per-claim seconds, distinct owners in the first ``tenants`` claims)."""
    latencies: list[float] = []
    owners: list[str] = []
    started = time.perf_counter()
    for _ in range(n):
        before = time.perf_counter()
        leases = await store.claim_runs("bench-claimer", [bench_noop.name], 1, 300.0)
        latencies.append(time.perf_counter() - before)
        if len(leases) != 1:
            raise RuntimeError(f"expected one claimable run, got {len(leases)}")
        if len(owners) < tenants:
            owners.append(leases[0].run.owner)
    elapsed = time.perf_counter() - started
    if await store.claim_runs("bench-claimer", [bench_noop.name], 1, 300.0):
        raise RuntimeError("a run was left queued after N claims")
    return n / elapsed, latencies, len(set(owners))


async def store_span(store: Store, ids: list[str], timeout: float) -> float:
    """Wait for every run; runs/s over the store-recorded first start -> last finish."""
    runs = [await store.wait_run(run_id, timeout=timeout) for run_id in ids]
    if any(run.status is not RunStatus.COMPLETED for run in runs):
        raise RuntimeError("a run did not complete")
    first = min(run.started_at or 0.0 for run in runs)
    last = max(run.finished_at or 0.0 for run in runs)
    return len(ids) / (last - first)


async def sqlite_end_to_end(url: str, ids: list[str], options: Mapping[str, float]) -> float:
    store = open_store(url)
    await store.open()
    proc = start_script_worker("tenant_claims.py", url, [bench_noop.name], options)
    try:
        await wait_for_worker(store, proc, timeout=30)
        return await store_span(store, ids, timeout=600)
    finally:
        stop_worker(proc)
        await store.close()


async def memory_end_to_end(store: Store, ids: list[str], options: Mapping[str, float]) -> float:
    worker = WorkflowWorker(
        store,
        workflows=[bench_noop],
        options=WorkerOptions(**options),  # type: ignore[arg-type]
    )
    serving = asyncio.create_task(worker.run())
    try:
        return await store_span(store, ids, timeout=600)
    finally:
        worker.stop()
        await serving


async def one_case(
    make: Callable[[str], Store], name: str, n: int, tenants: int, options: Mapping[str, float]
) -> Figures:
    """Both measurements for one store kind and owner count, each on a fresh store."""
    claim_store = make(f"claims-{tenants}")
    await claim_store.open()
    try:
        await fill(claim_store, n, tenants)
        rate, latencies, first_owners = await drain_claims(claim_store, n, tenants)
    finally:
        await claim_store.close()
    e2e_store = make(f"e2e-{tenants}")
    await e2e_store.open()
    try:
        ids = await fill(e2e_store, n, tenants)
        if name == "sqlite":
            await e2e_store.close()  # the worker process and a fresh handle take over
            runs_per_s = await sqlite_end_to_end(e2e_store.url, ids, options)
        else:
            runs_per_s = await memory_end_to_end(e2e_store, ids, options)
    finally:
        await e2e_store.close()
    ms = [v * 1e3 for v in latencies]
    return Figures(rate, percentile(ms, 50), percentile(ms, 99), runs_per_s, first_owners)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5000, help="queued runs per case (N)")
    parser.add_argument("--tenants", type=int, default=100, help="owners in the spread case")
    parser.add_argument("--stores", default="memory,sqlite", help="memory, sqlite or both")
    parser.add_argument("--concurrency", type=int, default=50, help="worker max_concurrent_runs")
    parser.add_argument("--serve", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--serve-workflow", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--serve-option", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:  # the worker process this script spawns
        await serve(args.serve, args.serve_workflow, parse_options(args.serve_option))
        return

    n = args.runs
    options = {"max_concurrent_runs": args.concurrency}
    header(
        f"tenant claims: {n} queued no-op runs, 1 owner vs {args.tenants} owners; "
        f"claim_runs(limit=1) drain, and 1 worker (concurrency {args.concurrency})"
    )
    row(
        "store", "owners", "claims/s", "claim p50", "claim p99", "e2e runs/s", "fair", widths=WIDTHS
    )
    row("", "", "", "ms", "ms", "", "", widths=WIDTHS)
    results: dict[tuple[str, int], Figures] = {}
    with tempfile.TemporaryDirectory(prefix="pyrula-bench-") as tmp:
        root = Path(tmp)

        def make_sqlite(label: str) -> Store:
            return open_store(f"sqlite:///{root / f'{label}.db'}")

        def make_memory(label: str) -> Store:
            return MemoryStore()

        makers = {"memory": make_memory, "sqlite": make_sqlite}
        for name in args.stores.split(","):
            if name not in makers:
                raise SystemExit(f"unknown store {name!r}: use memory and/or sqlite")
            for tenants in (1, args.tenants):
                figures = await one_case(makers[name], name, n, tenants, options)
                results[(name, tenants)] = figures
                row(
                    name,
                    tenants,
                    f"{figures.claims_per_s:.0f}",
                    f"{figures.claim_p50_ms:.3f}",
                    f"{figures.claim_p99_ms:.3f}",
                    f"{figures.runs_per_s:.0f}",
                    f"{figures.first_owners}/{tenants}",
                    widths=WIDTHS,
                )
    print()
    print(f"ratios {args.tenants} owners / 1 owner (1.00 = owners cost nothing):")
    for name in args.stores.split(","):
        one, many = results[(name, 1)], results[(name, args.tenants)]
        print(
            f"  {name:<7} claims/s x{many.claims_per_s / one.claims_per_s:.2f}, "
            f"claim p50 x{many.claim_p50_ms / one.claim_p50_ms:.2f}, "
            f"e2e runs/s x{many.runs_per_s / one.runs_per_s:.2f}"
        )
    print("  ('fair' = distinct owners among the first <owners> claims of the drain)")


if __name__ == "__main__":
    asyncio.run(main())
