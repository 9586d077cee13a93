"""Shared pieces of the benchmarks: the benchmark workflows, timing and printing helpers.

Imported by the scripts in ``bench/`` (run as ``python bench/<name>.py`` from the repo
root, which puts ``bench/`` on ``sys.path``) and by ``bench/serve_worker.py``, the worker
process they spawn. Only pyrula's public API is used.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pyrula.workflows import (
    StepContext,
    Store,
    WorkerOptions,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowWorker,
    open_store,
    step,
    workflow,
)

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent


# -- the benchmark workflows -------------------------------------------------------------
@step
async def noop(ctx: StepContext) -> int:
    """The trivial async step: all its cost is the engine's."""
    return 1


@step
def noop_sync(ctx: StepContext) -> int:
    """The trivial sync step: runs on the executor thread pool."""
    return 1


async def noop_plain() -> int:
    """The function an inline ``ctx.step(name, fn)`` runs."""
    return 1


@workflow
async def bench_decorated_steps(ctx: WorkflowContext, k: int) -> int:
    """``k`` awaits of the ``@step`` function ``noop``."""
    total = 0
    for _ in range(k):
        total += await noop()
    return total


@workflow
async def bench_inline_steps(ctx: WorkflowContext, k: int) -> int:
    """``k`` inline ``ctx.step("noop", noop_plain)`` calls."""
    total = 0
    for _ in range(k):
        total += await ctx.step("noop", noop_plain)
    return total


@workflow
async def bench_sync_steps(ctx: WorkflowContext, k: int) -> int:
    """``k`` awaits of the sync ``@step`` function ``noop_sync`` (one thread hop each)."""
    total = 0
    for _ in range(k):
        total += await noop_sync()
    return total


@workflow
async def bench_three_steps(ctx: WorkflowContext, n: int = 0) -> int:
    """The end-to-end unit of work: three trivial async steps."""
    a = await ctx.step("one", noop_plain)
    b = await ctx.step("two", noop_plain)
    c = await ctx.step("three", noop_plain)
    return int(a + b + c + n)


@workflow
async def bench_sleep(ctx: WorkflowContext, seconds: float) -> float:
    """Sleep durably for ``seconds``, then journal the store's time (``ctx.now()``) on
    waking: the timer benchmark reads both from the journal. Returns the wake-up time."""
    await ctx.sleep(seconds)
    woke = await ctx.now()
    return woke.timestamp()


@workflow
async def bench_noop(ctx: WorkflowContext) -> int:
    """A run with no steps: its cost is the claim, the journal load and the finish."""
    return 1


@workflow
async def bench_one_step(ctx: WorkflowContext) -> int:
    """The no-op run of the Valkey throughput benchmark: one trivial inline step."""
    return await ctx.step("one", noop_plain)


BENCH_WORKFLOWS: dict[str, WorkflowDefinition] = {
    definition.name: definition
    for definition in (
        bench_decorated_steps,
        bench_inline_steps,
        bench_sync_steps,
        bench_three_steps,
        bench_sleep,
        bench_noop,
        bench_one_step,
    )
}
"""The benchmark workflows by name, for :func:`serve` in a spawned worker process."""


# -- figures -----------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank on sorted ``values``."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def header(title: str) -> None:
    """Print what ran, where and when: the context every figure needs."""
    print(f"== {title}")
    print(
        f"   {datetime.datetime.now().astimezone().isoformat(timespec='seconds')} | "
        f"Python {platform.python_version()} ({platform.python_implementation()}) | "
        f"{platform.system()} {platform.machine()} | {os.cpu_count()} cores | "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print()


def row(*cells: Any, widths: Sequence[int]) -> None:
    """Print one table row; the first cell left-aligned, the rest right-aligned."""
    parts = []
    for i, (cell, width) in enumerate(zip(cells, widths, strict=False)):
        text = f"{cell:.1f}" if isinstance(cell, float) else str(cell)
        parts.append(text.ljust(width) if i == 0 else text.rjust(width))
    print("  ".join(parts))


def verdict(measured: float, target: float, *, higher_is_better: bool) -> str:
    ok = measured >= target if higher_is_better else measured <= target
    return "meets target" if ok else "MISSES target"


# -- the worker process ------------------------------------------------------------------
def start_worker(store_url: str, *, concurrency: int) -> subprocess.Popen[bytes]:
    """Start ``bench/serve_worker.py`` serving ``bench_three_steps`` on ``store_url``."""
    return subprocess.Popen(
        [
            sys.executable,
            str(BENCH_DIR / "serve_worker.py"),
            store_url,
            "--concurrency",
            str(concurrency),
        ],
        cwd=REPO_ROOT,
    )


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """Stop the worker by its PID: SIGTERM (graceful), then SIGKILL after 10 s."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


async def wait_for_worker(store: Store, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Return once a worker has registered in ``store`` (its first heartbeat)."""
    deadline = time.monotonic() + timeout
    while not await store.list_workers():
        if proc.poll() is not None:
            raise RuntimeError(f"the worker process exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no worker registered within {timeout}s")
        await asyncio.sleep(0.05)


# -- self-spawned worker processes (timer_lateness.py, tenant_claims.py) -----------------
def start_script_worker(
    script: str, store_url: str, workflows: Sequence[str], options: Mapping[str, float]
) -> subprocess.Popen[bytes]:
    """Start ``python bench/<script> --serve <store_url> ...``: the script's own worker mode,
    serving ``workflows`` (names in :data:`BENCH_WORKFLOWS`) with ``options`` (WorkerOptions
    fields). Stop it with :func:`stop_worker`."""
    argv = [sys.executable, str(BENCH_DIR / script), "--serve", store_url]
    for name in workflows:
        argv += ["--serve-workflow", name]
    for field, value in options.items():
        argv += ["--serve-option", f"{field}={value!r}"]
    return subprocess.Popen(argv, cwd=REPO_ROOT)


def parse_options(pairs: Sequence[str]) -> dict[str, float]:
    """``["timer_poll_interval_s=0.5", ...]`` -> WorkerOptions keyword arguments."""
    options: dict[str, float] = {}
    for pair in pairs:
        field, _, value = pair.partition("=")
        options[field] = int(value) if value.isdigit() else float(value)
    return options


async def serve(store_url: str, workflows: Sequence[str], options: Mapping[str, float]) -> None:
    """Run one WorkflowWorker on ``store_url`` until SIGTERM or SIGINT (graceful stop)."""
    store = open_store(store_url)
    worker = WorkflowWorker(
        store,
        workflows=[BENCH_WORKFLOWS[name] for name in workflows],
        options=WorkerOptions(**options),  # type: ignore[arg-type]
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, worker.stop)
    try:
        await worker.run()
    finally:
        await store.close()
