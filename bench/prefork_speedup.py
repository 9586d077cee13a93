"""CPU-bound tasks (20 ms of pure Python each) through the worker's pools: how many times
faster ``-c 2`` prefork runs them than ``-c 1``, and what the threads pool does.

Each round starts, on a fresh SQLite file, the worker of every configuration in turn
(``pyrula worker -A prefork_speedup -c 1`` / ``-c 2`` / ``--pool threads -c 2``, and
natively ``--workflow prefork_speedup --processes 1`` / ``2``), warms it up, then times
``--tasks`` tasks submitted at once from their first submit to their last result.
Rounds interleave the configurations, so a noisy neighbour hits them all alike. The
speed-up is tasks/s of a configuration over tasks/s of its ``-c 1`` in the same round.
The worker processes' CPU per task (the supervisor and its pool processes, from
``/proc``) is printed too: what a task costs, whatever else the machine runs.

    python bench/prefork_speedup.py [--tasks 200] [--rounds 3] [--milliseconds 20]
                                    [--store sqlite|valkey]

``--store valkey`` runs a throw-away valkey-server (``bench/valkey_server.py``), each
configuration in a namespace of its own. The client (this process) runs on the same
machine; its CPU per task is printed, since on two cores it competes with the pool.

Needs two free cores to show x2; on a shared machine read the load average printed.
This file is also the module the workers import (the Celery app, the task, the
workflow).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path

from pyrula.workflows import WorkflowContext, workflow
from pyrula_compat import Celery

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent

app = Celery("prefork_speedup", broker=os.environ.get("CELERY_BROKER_URL", "memory://"))


def spin(milliseconds: float) -> int:
    """Pure-Python work for ``milliseconds`` of this thread's CPU time."""
    deadline = time.thread_time() + milliseconds / 1000
    count = 0
    while time.thread_time() < deadline:
        count += 1
    return count


@app.task(name="prefork_speedup.burn")
def burn(milliseconds: float) -> int:
    return spin(milliseconds)


@workflow(name="prefork_speedup_burn")
async def burn_flow(ctx: WorkflowContext, milliseconds: float) -> int:
    return await ctx.step("burn", spin, milliseconds)


CONFIGS: dict[str, tuple[str, list[str]]] = {
    "-A, -c 1 (prefork)": ("celery", ["-A", "prefork_speedup", "-c", "1"]),
    "-A, -c 2 (prefork)": ("celery", ["-A", "prefork_speedup", "-c", "2"]),
    "-A, --pool threads -c 2": (
        "celery",
        ["-A", "prefork_speedup", "--pool", "threads", "-c", "2"],
    ),
    "--processes 1": ("native", ["--workflow", "prefork_speedup", "--processes", "1"]),
    "--processes 2": ("native", ["--workflow", "prefork_speedup", "--processes", "2"]),
}
BASELINE = {"celery": "-A, -c 1 (prefork)", "native": "--processes 1"}


def start(flags: list[str], url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CELERY_BROKER_URL": url, "PYRULA_STORE_URL": url}
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH_DIR), str(REPO_ROOT)])
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pyrula.cli.main", "worker", *flags,
             "--claim-poll-interval", "0.05", "--loglevel", "WARNING"],
            cwd=BENCH_DIR, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live children, from /proc."""
    total = 0.0
    pids = {pid}
    with suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                pids.update(int(p) for p in handle.read().split())
    for each in pids:
        with suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{each}/stat") as handle:
                fields = handle.read().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def timed(kind: str, url: str, tasks: int, milliseconds: float, worker: int) -> tuple[float, float]:
    """Tasks/s of ``tasks`` tasks submitted at once (after a warm-up), and the worker
    processes' CPU seconds per task meanwhile."""
    if kind == "celery":
        app.conf.broker_url = url
        for result in [burn.delay(1) for _ in range(8)]:
            result.get(timeout=120)
        cpu, began = tree_cpu(worker), time.perf_counter()
        results = [burn.delay(milliseconds) for _ in range(tasks)]
        for result in results:
            result.get(timeout=600)
    else:
        from pyrula.workflows import open_store
        from pyrula.workflows.sync import WorkflowClient

        with WorkflowClient(open_store(url)) as client:
            for handle in [client.submit(burn_flow, {"milliseconds": 1}) for _ in range(8)]:
                handle.result(timeout=120)
            cpu, began = tree_cpu(worker), time.perf_counter()
            params = {"milliseconds": milliseconds}
            handles = [client.submit(burn_flow, params) for _ in range(tasks)]
            for handle in handles:
                handle.result(timeout=600)
    elapsed = time.perf_counter() - began
    return tasks / elapsed, (tree_cpu(worker) - cpu) / tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--milliseconds", type=float, default=20.0)
    parser.add_argument("--store", choices=("sqlite", "valkey"), default="sqlite")
    args = parser.parse_args()
    server = None
    if args.store == "valkey":
        from valkey_server import BenchValkey

        server = BenchValkey().start()
    try:
        run_rounds(args, server.url if server is not None else None)
    finally:
        if server is not None:
            server.stop()


def run_rounds(args: argparse.Namespace, valkey_url: str | None) -> None:
    print(f"== prefork speed-up, {args.tasks} tasks of {args.milliseconds:g} ms CPU each")
    store = "SQLite" if valkey_url is None else "one valkey-server"
    print(f"   {os.cpu_count()} cores | load average {os.getloadavg()[0]:.2f} | {store}")
    client_cpu: list[float] = []
    worker_cpu: dict[str, list[float]] = {name: [] for name in CONFIGS}
    rates: dict[str, list[float]] = {name: [] for name in CONFIGS}
    ratios: dict[str, list[float]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="prefork-bench-") as tmp:
        for round_number in range(args.rounds):
            measured: dict[str, float] = {}
            for name, (kind, flags) in CONFIGS.items():
                label = f"r{round_number}-{len(measured)}"
                if valkey_url is None:
                    url = f"sqlite:///{tmp}/{label}.db"
                else:
                    url = f"{valkey_url}/0?namespace=bench{label}"
                proc = start(flags, url, Path(tmp) / "workers.log")
                try:
                    cpu = time.process_time()
                    measured[name], per_task = timed(
                        kind, url, args.tasks, args.milliseconds, proc.pid
                    )
                    client_cpu.append((time.process_time() - cpu) / (args.tasks + 8))
                    worker_cpu[name].append(per_task)
                finally:
                    stop(proc)
            for name, (kind, _) in CONFIGS.items():
                rates[name].append(measured[name])
                ratios[name].append(measured[name] / measured[BASELINE[kind]])
            print(f"   round {round_number + 1}: " + ", ".join(
                f"{name} {measured[name]:.1f}/s" for name in CONFIGS))  # fmt: skip
    print()
    print(
        f"{'configuration':28}  {'tasks/s (median)':>16}  {'x its -c 1, each round':>24}"
        f"  {'worker CPU/task':>15}"
    )
    for name in CONFIGS:
        each = " ".join(f"x{r:.2f}" for r in ratios[name])
        cpu = statistics.median(worker_cpu[name]) * 1000
        print(f"{name:28}  {statistics.median(rates[name]):16.1f}  {each:>24}  {cpu:12.2f} ms")
    print(f"   client CPU per task (median): {statistics.median(client_cpu) * 1e6:.0f} us")
    print(f"   load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
