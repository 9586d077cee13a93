"""SqliteStore claim latency and three-step throughput against the depth of the queue.

For each depth D (default 100, 1,000, 10,000, 100,000), on a fresh database:

1. D claimable runs of ``bench_three_steps`` are inserted with ``store.create_run``.
2. Claim latency: ``claim_runs(limit=1)`` then ``release_run`` of what it got, timed
   together (and the claim alone), ``--probes`` times; p50 and p99. A released run
   goes to the back of the queue, so the depth stays D.
3. Throughput: M more runs (``--measured``) are inserted with a start time in the past,
   so they are at the head of the queue, in front of the D others. A worker process
   (``bench/serve_worker.py``, stopped by PID) serves the queue; the rate is M divided by
   the store-recorded span from the first measured run's start to the last one's
   finish, so worker start-up is not counted. The queue never drops below D meanwhile.

The baseline is the first depth: every figure is also shown as a ratio to it. A small
unshown pass runs first, so that the baseline does not also pay for the cold start.

    python bench/queue_depth.py [--depths 100,1000,10000,100000] [--probes 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

from common import (
    bench_three_steps,
    header,
    percentile,
    row,
    start_worker,
    stop_worker,
    wait_for_worker,
)
from pyrula.workflows import RunStatus, Store, open_store
from pyrula.workflows.records import NewRun

INSERT_BATCH = 200
"""create_run calls in flight at once while filling the backlog."""
WIDTHS = (9, 10, 14, 14, 14, 14, 12)


def new_run(start_at: float | None = None) -> NewRun:
    return NewRun(
        run_id=uuid.uuid4().hex,
        workflow=bench_three_steps.name,
        params='{"n": 0}',
        start_at=start_at,
    )


async def fill(store: Store, count: int, start_at: float | None = None) -> list[str]:
    """Insert ``count`` runs, ``INSERT_BATCH`` at a time; return their ids in order."""
    ids: list[str] = []
    for first in range(0, count, INSERT_BATCH):
        batch = [
            new_run(None if start_at is None else start_at + (first + i) * 1e-3)
            for i in range(min(INSERT_BATCH, count - first))
        ]
        await asyncio.gather(*(store.create_run(new) for new in batch))
        ids += [new.run_id for new in batch]
    return ids


async def probe_claims(store: Store, probes: int) -> tuple[list[float], list[float]]:
    """(claim + release seconds, claim-only seconds) for ``probes`` single claims."""
    both: list[float] = []
    claim_only: list[float] = []
    for _ in range(probes + 20):  # the first 20 warm up the page cache and statements
        started = time.perf_counter()
        leases = await store.claim_runs("bench-prober", [bench_three_steps.name], 1, 30.0)
        claimed = time.perf_counter()
        if len(leases) != 1:
            raise RuntimeError(f"expected one claimable run, got {len(leases)}")
        await store.release_run(leases[0].run_id, leases[0].token)
        both.append(time.perf_counter() - started)
        claim_only.append(claimed - started)
    return both[20:], claim_only[20:]


async def measured_throughput(store: Store, url: str, measured: int, concurrency: int) -> float:
    """Runs/s over ``measured`` runs put at the head of the queue, one worker process."""
    ids = await fill(store, measured, start_at=await store.now() - 3600.0)
    proc = start_worker(url, concurrency=concurrency)
    try:
        await wait_for_worker(store, proc, timeout=30)
        runs = [await store.wait_run(run_id, timeout=300) for run_id in ids]
    finally:
        stop_worker(proc)
    if any(run.status is not RunStatus.COMPLETED for run in runs):
        raise RuntimeError("a measured run did not complete")
    first = min(run.started_at or 0.0 for run in runs)
    last = max(run.finished_at or 0.0 for run in runs)
    return measured / (last - first)


async def one_depth(
    root: Path, depth: int, probes: int, measured: int, concurrency: int
) -> tuple[float, float, float, float, float, float]:
    """(fill s, claim+release p50, p99, claim p50, p99 in ms, runs/s) at ``depth``."""
    url = f"sqlite:///{root / f'depth-{depth}.db'}"
    store = open_store(url)
    await store.open()
    try:
        started = time.perf_counter()
        await fill(store, depth)
        filled = time.perf_counter() - started
        both, claim_only = await probe_claims(store, probes)
        rate = await measured_throughput(store, url, measured, concurrency)
    finally:
        await store.close()
    ms = [percentile(values, q) * 1e3 for values in (both, claim_only) for q in (50, 99)]
    return filled, ms[0], ms[1], ms[2], ms[3], rate


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="100,1000,10000,100000")
    parser.add_argument("--probes", type=int, default=2000, help="claims timed per depth")
    parser.add_argument("--measured", type=int, default=1000, help="runs timed per depth (M)")
    parser.add_argument("--concurrency", type=int, default=50, help="worker max_concurrent_runs")
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]

    header(
        f"queue depth: SqliteStore, {args.probes} claim probes and {args.measured} "
        "measured three-step runs per depth, 1 worker process"
    )
    row(
        "depth",
        "fill s",
        "claim+rel p50",
        "claim+rel p99",
        "claim p50",
        "claim p99",
        "runs/s",
        widths=WIDTHS,
    )
    row("", "", "ms", "ms", "ms", "ms", "", widths=WIDTHS)
    results = []
    with tempfile.TemporaryDirectory(prefix="pyrula-bench-") as tmp:
        # Not shown: a small first pass, so the baseline depth is not also the cold start.
        warm_up = Path(tmp) / "warm-up"
        warm_up.mkdir()
        await one_depth(warm_up, 100, 200, 200, args.concurrency)
        for depth in depths:
            result = await one_depth(Path(tmp), depth, args.probes, args.measured, args.concurrency)
            results.append((depth, result))
            filled, p50, p99, c50, c99, rate = result
            row(
                f"{depth:,}",
                f"{filled:.1f}",
                f"{p50:.2f}",
                f"{p99:.2f}",
                f"{c50:.2f}",
                f"{c99:.2f}",
                f"{rate:.0f}",
                widths=WIDTHS,
            )
    print()
    base_depth, base = results[0]
    print(f"ratios to depth {base_depth:,} (1.00 = flat):")
    for depth, (_, p50, p99, _, _, rate) in results[1:]:
        print(
            f"  {depth:>7,}: claim+release p50 x{p50 / base[1]:.2f}, p99 x{p99 / base[2]:.2f}, "
            f"throughput x{rate / base[5]:.2f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
