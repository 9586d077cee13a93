"""Durable timer lateness: how long after its wake time a sleeping run resumes.

N runs of ``bench_sleep`` (``await ctx.sleep(d)`` then ``await ctx.now()``) are submitted
with d spread evenly over [--min-sleep, --max-sleep] (in shuffled order), served by ONE
worker process on a SqliteStore (``--serve`` mode of this script, stopped by PID) and,
unless ``--stores sqlite``, by an in-process worker on a MemoryStore. For each run, from
its journal:

    lateness = (journaled ctx.now() after the sleep) - (journaled wake time of the sleep)

Both are the store's clock as read in the worker process. Lateness covers the timer loop
noticing the due time, ``fire_timers`` queueing the run, the claim, loading the journal
and the replay up to ``ctx.now()``. Printed: p50, p99 and max over all runs, and over
the "quiet" runs only: those whose wake time came after the last run had gone to sleep
(the others woke while the worker was still starting runs).

The baseline, measured in the same window: the lateness of a bare ``asyncio.sleep``
(1 to 20 ms, over and over) in this process while each case runs. It is the floor set by
the OS and the event loop, and it shows the machine's own stalls (on a shared machine
a process that gets no CPU for 100 ms makes every timer due meanwhile 100 ms late). In
the MemoryStore case the probe shares the worker's event loop, so it also shows the time
the loop spent busy with the worker's own work.

Worker options are the WorkerOptions defaults (timer_poll_interval_s=5.0,
claim_poll_interval=0.1, max_concurrent_runs=50) unless given: the timer loop sleeps until
the next due time the store knows of, capped by timer_poll_interval_s.

    python bench/timer_lateness.py [--runs 1000] [--min-sleep 2] [--max-sleep 5]
        [--stores sqlite,memory] [--timer-poll-interval 5.0] [--claim-poll-interval 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from common import (
    bench_sleep,
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
    WorkflowClient,
    WorkflowWorker,
    open_store,
)

WIDTHS = (30, 6, 9, 9, 9, 9, 9)


@dataclass(frozen=True)
class Result:
    """Lateness in seconds, for all runs and for the quiet ones; the submit span."""

    late: list[float]
    quiet: list[float]
    probe: list[float]
    """Lateness of bare ``asyncio.sleep`` calls in this process meanwhile."""
    submit_s: float
    asleep_s: float
    """From the first submit until the last run had gone to sleep."""


def durations(n: int, low: float, high: float) -> list[float]:
    """``n`` sleep durations spread evenly over [low, high], in a fixed shuffled order."""
    values = [low + (high - low) * i / max(1, n - 1) for i in range(n)]
    random.Random(0).shuffle(values)
    return values


async def run_all(store: Store, sleeps: Sequence[float], timeout: float) -> Result:
    """Submit one ``bench_sleep`` run per duration, wait for all, read their journals."""
    client = WorkflowClient(store)
    probe: list[float] = []
    probing = asyncio.create_task(asyncio_probe(probe))
    try:
        started = await store.now()
        handles = [await client.submit(bench_sleep, {"seconds": d}) for d in sleeps]
        submitted = await store.now()
        for _, handle in sorted(zip(sleeps, handles, strict=True), key=lambda pair: pair[0]):
            run = await store.wait_run(handle.run_id, timeout=timeout)
            if run.status is not RunStatus.COMPLETED:
                raise RuntimeError(f"run {run.run_id} ended {run.status.value}: {run.error}")
    finally:
        probing.cancel()
    pairs: list[tuple[float, float, float]] = []  # (asleep at, wake time, woke at)
    for handle in handles:
        journal = {entry.kind: entry for entry in await store.load_journal(handle.run_id)}
        sleep, now = journal["sleep"], journal["now"]
        pairs.append((sleep.recorded_at, float(json.loads(sleep.value)), json.loads(now.value)))
    last_asleep = max(asleep for asleep, _, _ in pairs)
    late = [woke - wake for _, wake, woke in pairs]
    quiet = [woke - wake for _, wake, woke in pairs if wake > last_asleep]
    return Result(late, quiet, probe, submitted - started, last_asleep - started)


async def sqlite_case(
    root: Path, sleeps: Sequence[float], options: Mapping[str, float], timeout: float
) -> Result:
    url = f"sqlite:///{root / 'timers.db'}"
    store = open_store(url)
    await store.open()
    proc = start_script_worker("timer_lateness.py", url, [bench_sleep.name], options)
    try:
        await wait_for_worker(store, proc, timeout=30)
        return await run_all(store, sleeps, timeout)
    finally:
        stop_worker(proc)
        await store.close()


async def memory_case(
    sleeps: Sequence[float], options: Mapping[str, float], timeout: float
) -> Result:
    store = MemoryStore()
    worker = WorkflowWorker(
        store,
        workflows=[bench_sleep],
        options=WorkerOptions(**options),  # type: ignore[arg-type]
    )
    serving = asyncio.create_task(worker.run())
    try:
        return await run_all(store, sleeps, timeout)
    finally:
        worker.stop()
        await serving


async def asyncio_probe(late: list[float]) -> None:
    """Until cancelled: ``await asyncio.sleep(d)`` for d cycling over 1..20 ms, appending
    each one's lateness (perf_counter) to ``late``."""
    i = 0
    while True:
        delay = 0.001 + 0.019 * (i % 20) / 19
        started = time.perf_counter()
        await asyncio.sleep(delay)
        late.append(time.perf_counter() - started - delay)
        i += 1


def show(label: str, values: Sequence[float]) -> None:
    ms = [v * 1e3 for v in values]
    row(
        label,
        len(ms),
        f"{percentile(ms, 50):.1f}",
        f"{percentile(ms, 99):.1f}",
        f"{max(ms):.1f}",
        f"{min(ms):.1f}",
        f"{sum(ms) / len(ms):.1f}",
        widths=WIDTHS,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="sleeping runs (N)")
    parser.add_argument("--min-sleep", type=float, default=2.0, help="shortest sleep, s")
    parser.add_argument("--max-sleep", type=float, default=5.0, help="longest sleep, s")
    parser.add_argument("--stores", default="sqlite,memory", help="sqlite, memory or both")
    parser.add_argument("--timer-poll-interval", type=float, help="timer_poll_interval_s")
    parser.add_argument("--claim-poll-interval", type=float, help="claim_poll_interval")
    parser.add_argument("--concurrency", type=int, help="max_concurrent_runs")
    parser.add_argument("--serve", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--serve-workflow", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--serve-option", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:  # the worker process this script spawns
        await serve(args.serve, args.serve_workflow, parse_options(args.serve_option))
        return

    options: dict[str, float] = {}
    for field, value in (
        ("timer_poll_interval_s", args.timer_poll_interval),
        ("claim_poll_interval", args.claim_poll_interval),
        ("max_concurrent_runs", args.concurrency),
    ):
        if value is not None:
            options[field] = value
    effective = WorkerOptions(**options)  # type: ignore[arg-type]
    sleeps = durations(args.runs, args.min_sleep, args.max_sleep)
    timeout = args.max_sleep + 120.0
    stores = args.stores.split(",")

    header(
        f"timer lateness: {args.runs} runs sleeping {args.min_sleep:g}-{args.max_sleep:g} s, "
        "1 worker"
    )
    print(
        f"WorkerOptions: timer_poll_interval_s={effective.timer_poll_interval_s:g}, "
        f"claim_poll_interval={effective.claim_poll_interval:g}, "
        f"max_concurrent_runs={effective.max_concurrent_runs}, "
        f"timer_max_batch={effective.timer_max_batch}" + ("  (defaults)" if not options else "")
    )
    print()
    row("lateness, ms", "count", "p50", "p99", "max", "min", "mean", widths=WIDTHS)
    results: list[tuple[str, Result]] = []
    with tempfile.TemporaryDirectory(prefix="pyrula-bench-") as tmp:
        for name in stores:
            if name == "sqlite":
                result = await sqlite_case(Path(tmp), sleeps, options, timeout)
                label = "SqliteStore, worker process"
            elif name == "memory":
                result = await memory_case(sleeps, options, timeout)
                label = "MemoryStore, in-process"
            else:
                raise SystemExit(f"unknown store {name!r}: use sqlite and/or memory")
            results.append((label, result))
            show(label, result.late)
            if result.quiet and len(result.quiet) < len(result.late):
                show("  quiet runs only", result.quiet)
            show("  baseline: asyncio.sleep", result.probe)
    print()
    for label, result in results:
        print(
            f"{label}: submits took {result.submit_s:.2f} s; the last run went to sleep "
            f"{result.asleep_s:.2f} s after the first submit; {len(result.quiet)} runs woke "
            "after that (quiet)"
        )
        print(
            f"  p99 lateness = {percentile(result.late, 99) / effective.timer_poll_interval_s:.1%}"
            f" of timer_poll_interval_s, "
            f"{percentile(result.late, 99) / effective.claim_poll_interval:.2f}x "
            "claim_poll_interval"
        )


if __name__ == "__main__":
    asyncio.run(main())
