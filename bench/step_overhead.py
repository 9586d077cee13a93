"""Per-step engine overhead on the MemoryStore, in microseconds per step.

A workflow runs K trivial steps in this process (InlineWorkflowRunner, MemoryStore); the
same function called K times directly is the baseline measured in the same run.
Overhead per step = (workflow run time - direct time) / K, median of the rounds.
The run's fixed cost (submit, claim, load journal, finish; measured with K=0) is
included, amortised over K, and also printed on its own.

    python bench/step_overhead.py [--steps 1000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from common import (
    bench_decorated_steps,
    bench_inline_steps,
    bench_sync_steps,
    header,
    median,
    noop,
    noop_plain,
    noop_sync,
    row,
    verdict,
)
from pyrula.workflows import InlineWorkflowRunner, WorkflowDefinition

TARGET_US = 50.0
WIDTHS = (34, 12, 12, 14, 10)


async def time_direct(call: Callable[[], Awaitable[Any]], k: int) -> float:
    started = time.perf_counter()
    for _ in range(k):
        await call()
    return time.perf_counter() - started


async def direct_async_step(k: int) -> float:
    return await time_direct(lambda: noop.fn(None), k)


async def direct_inline(k: int) -> float:
    return await time_direct(noop_plain, k)


async def direct_sync(k: int) -> float:
    # The sync baseline is the plain call on the loop thread: no thread hop.
    fn = noop_sync.fn
    started = time.perf_counter()
    for _ in range(k):
        fn(None)
    return time.perf_counter() - started


async def time_hop(k: int) -> float:
    """K bare ``run_in_executor`` round trips of the same function: the thread hop alone."""
    loop = asyncio.get_running_loop()
    fn = noop_sync.fn
    started = time.perf_counter()
    for _ in range(k):
        await loop.run_in_executor(None, fn, None)
    return time.perf_counter() - started


async def time_run(runner: InlineWorkflowRunner, definition: WorkflowDefinition, k: int) -> float:
    started = time.perf_counter()
    result = await runner.run(definition, {"k": k})
    elapsed = time.perf_counter() - started
    assert result == k, result
    return elapsed


async def measure(
    definition: WorkflowDefinition,
    direct: Callable[[int], Awaitable[float]],
    k: int,
    rounds: int,
) -> tuple[float, float, float, float]:
    """Medians over ``rounds`` of µs/step: (overhead, workflow, direct, engine part).

    The engine part is the workflow time minus a bare ``run_in_executor`` round trip per
    step, timed in the same round (it only means something for sync steps). Each round
    runs on a fresh MemoryStore, so journals of earlier rounds don't pile up.
    """
    await time_run(InlineWorkflowRunner(), definition, k)  # warm-up
    await direct(k)
    await time_hop(k)  # also starts the default executor's threads
    overheads, totals, directs, engine = [], [], [], []
    for _ in range(rounds):
        runner = InlineWorkflowRunner()
        run_s = await time_run(runner, definition, k)
        direct_s = await direct(k)
        hop_s = await time_hop(k)
        overheads.append((run_s - direct_s) / k * 1e6)
        totals.append(run_s / k * 1e6)
        directs.append(direct_s / k * 1e6)
        engine.append((run_s - hop_s) / k * 1e6)
    return median(overheads), median(totals), median(directs), median(engine)


async def fixed_cost(rounds: int) -> float:
    """µs for one run with no steps: submit, claim, journal load, outcome, read back."""
    runner = InlineWorkflowRunner()
    await time_run(runner, bench_inline_steps, 0)
    samples = [await time_run(runner, bench_inline_steps, 0) for _ in range(rounds * 20)]
    return median(samples) * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps per run (K)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the median is shown")
    args = parser.parse_args()
    k, rounds = args.steps, args.rounds

    header(f"step overhead: K={k} steps per run, median of {rounds} rounds, MemoryStore")
    row("variant", "workflow", "direct", "overhead", "ratio", widths=WIDTHS)
    row("", "µs/step", "µs/step", "µs/step", "wf/direct", widths=WIDTHS)
    cases = [
        ("async @step  (await noop())", bench_decorated_steps, direct_async_step),
        ("async inline (ctx.step(name, fn))", bench_inline_steps, direct_inline),
        ("sync @step   (thread hop)", bench_sync_steps, direct_sync),
    ]
    results: dict[str, float] = {}
    sync_engine = 0.0
    for label, definition, direct in cases:
        overhead, total, plain, sync_engine = await measure(definition, direct, k, rounds)
        results[label] = overhead
        row(label, total, plain, overhead, f"{total / plain:.0f}x", widths=WIDTHS)
    print()
    print(f"fixed cost of one run with no steps: {await fixed_cost(rounds):.0f} µs")
    print()
    for label, overhead in list(results.items())[:2]:
        print(
            f"{label.split('(')[0].strip()}: {overhead:.1f} µs/step vs target "
            f"< {TARGET_US:.0f} µs: {verdict(overhead, TARGET_US, higher_is_better=False)}"
        )
    sync_overhead = results[cases[2][0]]
    print(
        f"sync @step: {sync_overhead:.1f} µs/step, no target; without the bare "
        f"run_in_executor round trip (timed in the same rounds) {sync_engine:.1f} µs/step "
        "is left (see docs/performance.md)"
    )


if __name__ == "__main__":
    asyncio.run(main())
