"""The worker's CPU per run with and without ``--metrics-port`` (Prometheus metrics and
the readiness probe), on a SQLite store.

Each round starts a real ``pyrula worker`` process serving ``bench_three_steps`` (three
trivial steps), submits N runs from this process, waits until every one completed and
reads the worker's CPU time (user + system, ``/proc/<pid>/stat``) from the first submit
to the last completion. With the port, ``/metrics`` is scraped every ``--scrape``
seconds meanwhile, as Prometheus would. Rounds alternate without and with the port;
the medians of CPU per run are compared (target: under 5 % more).

    python bench/metrics_overhead.py [--runs 2000] [--rounds 5] [--scrape 5]

Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from common import BENCH_DIR, bench_three_steps, header, median, row, stop_worker, verdict
from pyrula.workflows import RunStatus, SqliteStore
from pyrula.workflows.sync import WorkflowClient

TARGET_PCT = 5.0
WIDTHS = (26, 16, 16, 12)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_round(runs: int, metrics: bool, scrape: float) -> float:
    """CPU seconds per run of one worker process."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.db"
        url = f"sqlite:///{path}"
        port = free_port()
        argv = [
            sys.executable, "-m", "pyrula.cli.main", "worker", "--workflow", "common",
            "--store", url, "--claim-poll-interval", "0.05", "--loglevel", "warning",
            *(["--metrics-port", str(port)] if metrics else []),
        ]  # fmt: skip
        proc = subprocess.Popen(
            argv, cwd=BENCH_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        stop = threading.Event()
        try:
            with WorkflowClient(SqliteStore(path)) as client:
                deadline = time.monotonic() + 30
                while not client.list_workers():
                    assert proc.poll() is None and time.monotonic() < deadline, "no worker"
                    time.sleep(0.05)
                if metrics:
                    threading.Thread(target=scraper, args=(port, scrape, stop), daemon=True).start()
                before = cpu_seconds(proc.pid)
                handles = [client.submit(bench_three_steps, {"n": i}) for i in range(runs)]
                for handle in handles:
                    handle.result(timeout=120)
                after = cpu_seconds(proc.pid)
                assert handles[-1].status() is RunStatus.COMPLETED
        finally:
            stop.set()
            stop_worker(proc)
    return (after - before) / runs


def scraper(port: int, every: float, stop: threading.Event) -> None:
    while not stop.wait(every):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                reply.read()
        except OSError:
            return


def hooks_per_run(runs: int) -> float:
    """CPU seconds per run of the metrics instrument's own hooks (a run's start and end,
    three steps' start and end), called in this process on real records."""
    from pyrula.cli.metrics import PrometheusMetrics
    from pyrula.workflows import MemoryStore
    from pyrula.workflows.engine.execution import ExecutionSettings, RunExecution
    from pyrula.workflows.records import Lease, RunRecord

    run = RunRecord(
        run_id="r", workflow="bench_three_steps", params="{}", status=RunStatus.RUNNING,
        owner="", idempotency_key=None, created_at=time.time(), available_at=time.time(),
        updated_at=time.time(), claims=1,
    )  # fmt: skip
    lease = Lease(run, 1, time.time() + 30)
    instrument = PrometheusMetrics()
    execution = RunExecution(MemoryStore(), lease, {}, ExecutionSettings())
    started = time.process_time()
    for _ in range(runs):
        scope = instrument.run_started(lease, "bench_three_steps")
        for name in ("one", "two", "three"):
            step = instrument.step_started(execution, name, 1)
            instrument.step_ended(step, execution, name, None)
        instrument.run_ended(scope, lease, "bench_three_steps", "completed")
    return (time.process_time() - started) / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scrape", type=float, default=5.0, help="seconds between scrapes")
    args = parser.parse_args()
    plain: list[float] = []
    measured: list[float] = []
    for _ in range(args.rounds):
        plain.append(one_round(args.runs, False, args.scrape))
        measured.append(one_round(args.runs, True, args.scrape))
    without, with_port = median(plain), median(measured)
    more = (with_port - without) / without * 100
    header(f"worker CPU per run, {args.runs} runs x {args.rounds} rounds (medians)")
    row("", "without", "--metrics-port", "more", widths=WIDTHS)
    row(
        "CPU per run (us)", f"{without * 1e6:.0f}", f"{with_port * 1e6:.0f}", f"{more:+.1f} %",
        widths=WIDTHS,
    )  # fmt: skip
    hooks = hooks_per_run(20_000)
    row("hooks alone, per run (us)", "", f"{hooks * 1e6:.1f}", f"{hooks / without * 100:+.1f} %",
        widths=WIDTHS)  # fmt: skip
    pairs = zip(plain, measured, strict=True)
    print("rounds, us without/with:", ", ".join(f"{a * 1e6:.0f}/{b * 1e6:.0f}" for a, b in pairs))
    meets = verdict(more, TARGET_PCT, higher_is_better=False)
    print(f"target: under {TARGET_PCT:.0f} % more: {meets}")


if __name__ == "__main__":
    main()
