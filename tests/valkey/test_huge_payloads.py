"""Huge payloads on a real valkey-server (reliability plan, scenario 26).

Run params and step results of 1 MB and 10 MB, with ``max_payload_bytes`` set on the
client and on the worker above the size (the run goes through end to end, on an
in-process worker) and below it (``PayloadTooLarge`` at submit, nothing stored; a step
result over the worker's limit fails its run). While the big run goes through, a second
process pings the server in a loop (its worst round trip is how long the server's event
loop was blocked, as a client saw it) and the server's own latency monitor and slow log
record its slowest commands. Those, the worker's own event loop lag, the time each replay
of the run takes (the run sleeps after its big step, so every wake-up replays the journal
with the big result) and the worker's RSS across replays are printed, not asserted
(timings are figures, not tests); only the RSS is asserted, loosely (no copy of the result
kept per replay).

100 MB is not run. Measured by hand (2026-11-30, this file with the skip removed): it
goes through, 15 s end to end, but the journal write of the 100 MB result held
valkey-server for 2.2 s (worst PING 2.2 s) and the worker's event loop stalled 3.6 s
(encoding and decoding it), longer than a lease renewal interval: payloads that size
belong in object storage, with their key in the run (the default ``max_payload_bytes``,
1 MiB, refuses them). Renewals and journal writes read no payload on the server (they
read the whole record: 6.5 - 110 ms of server time per renewal of a run with 10 MB
params).
How a reply of many megabytes is read (linear in its size, not quadratic as it was:
8 MB read x70 slower than 1 MB) is held by ``tests/unit/test_resp.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from pyrula.workflows import (
    DurableInvocationError,
    PayloadTooLarge,
    RunStatus,
    WorkflowClient,
    WorkflowContext,
    workflow,
)
from pyrula.workflows.records import JournalEntry
from pyrula.workflows.registry import Registry, WorkflowDefinition
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.conftest import StartWorker

from .servers import ValkeyProcess, fresh_namespace

MB = 1_000_000
NAPS = 4
"""Sleeps after the big step: each wake-up claims the run again and replays its journal."""
LENIENT_LEASE = {"lock_ttl": 30.0}
"""The worker shares this test's event loop, which encoding and decoding a 10 MB payload
stalls (0.1 - 0.5 s measured): a short lease could lapse on a busy machine, which is
scenario 5's business, not this one's."""

PINGER = """
import json, signal, sys, time
import valkey
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
client = valkey.Valkey(port=int(sys.argv[1]))
worst, count, over = 0.0, 0, 0
print("ready", flush=True)
while not stop:
    began = time.perf_counter()
    client.ping()
    took = time.perf_counter() - began
    worst, count, over = max(worst, took), count + 1, over + (took > 0.05)
    time.sleep(0.002)
print(json.dumps({"worst": worst, "count": count, "over_50ms": over}), flush=True)
"""
"""A second client, in a process of its own (this one's GIL is busy with the payloads):
PING in a loop until SIGTERM, then print the worst round trip."""


def blob(size: int) -> str:
    return "x" * (size - 12)  # the params' JSON ({"blob":"..."}) is ``size`` bytes or so


def admin_client(server: ValkeyProcess) -> Any:
    """A blocking valkey-py client of ``server`` (untyped: valkey-py's methods are)."""
    return server.client()


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture
async def big_store(own_server: ValkeyProcess) -> AsyncIterator[ValkeyStore]:
    """A store in a fresh namespace on a server of this test's own, with its latency
    monitor and slow log recording every command over 10 ms."""
    admin = admin_client(own_server)
    try:
        admin.config_set("latency-monitor-threshold", 10)
        admin.config_set("slowlog-log-slower-than", 10_000)
        admin.config_set("slowlog-max-len", 1000)
    finally:
        admin.close()
    store = ValkeyStore(own_server.url, namespace=fresh_namespace())
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@contextlib.contextmanager
def pinging(server: ValkeyProcess) -> Iterator[dict[str, Any]]:
    """A pinger process for the block's duration; its figures fill the yielded dict."""
    proc = subprocess.Popen(
        [sys.executable, "-c", PINGER, str(server.port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    figures: dict[str, Any] = {}
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield figures
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        figures.update(json.loads(out.strip().splitlines()[-1]))
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


def server_blocks(server: ValkeyProcess) -> tuple[float, list[str]]:
    """The longest a command blocked the server (LATENCY LATEST, seconds) and the
    slowest commands of the slow log, as "name ms"."""
    admin = admin_client(server)
    try:
        latest = admin.execute_command("LATENCY", "LATEST")
        worst = max((int(row[3]) for row in latest), default=0) / 1000
        slow = sorted(admin.slowlog_get(1000), key=lambda e: -int(e["duration"]))[:4]
    finally:
        admin.close()
    names = []
    for entry in slow:
        command = entry["command"]
        words = command.split() if isinstance(command, bytes) else [command]
        name = words[1] if words[0].upper() == b"FCALL" and len(words) > 1 else words[0]
        label = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        names.append(f"{label.rsplit('_', 1)[-1]} {int(entry['duration']) / 1000:.0f}ms")
    return worst, names


async def loop_lag(stop: asyncio.Event) -> float:
    """The longest this event loop (the worker's too) went without running a 10 ms
    timer, minus the 10 ms, until ``stop`` is set."""
    worst = 0.0
    while not stop.is_set():
        began = time.monotonic()
        await asyncio.sleep(0.01)
        worst = max(worst, time.monotonic() - began - 0.01)
    return worst


def echo_workflow(registry: Registry, replays: list[tuple[float, float]]) -> WorkflowDefinition:
    """``huge.echo``: a step returning the params' blob reversed (a big step result),
    then NAPS sleeps; the result is small. Each pass of the workflow's code after the
    step (the first run, then every replay) notes when and the process's RSS."""

    @workflow(registry=registry, name="huge.echo")
    async def echo(ctx: WorkflowContext, blob: str) -> dict[str, Any]:
        copy = await ctx.step("reverse", lambda: blob[::-1])
        replays.append((time.monotonic(), rss_mb()))
        for _ in range(NAPS):
            await ctx.sleep(0.2)
        return {"len": len(copy), "sha": hashlib.sha256(copy.encode()).hexdigest()}

    return echo


@pytest.mark.parametrize("size", [1 * MB, 10 * MB])
async def test_params_over_the_limit_are_refused_at_submit(
    big_store: ValkeyStore, registry: Registry, size: int
) -> None:
    echo = echo_workflow(registry, [])
    client = WorkflowClient(big_store, registry=registry, max_payload_bytes=size // 2)
    with pytest.raises(PayloadTooLarge, match="over the maximum"):
        await client.submit(echo, {"blob": blob(size)}, run_id="too-big")
    assert await big_store.get_run("too-big") is None
    assert await big_store.list_runs(limit=10) == []


async def test_a_step_result_over_the_workers_limit_fails_the_run(
    big_store: ValkeyStore, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry, name="huge.grow")
    async def grow(ctx: WorkflowContext, size: int) -> int:
        return len(await ctx.step("grow", lambda: "y" * size))

    await start_worker(big_store, [grow], max_payload_bytes=MB // 2)
    client = WorkflowClient(big_store, registry=registry)
    handle = await client.submit(grow, {"size": MB})
    with pytest.raises(DurableInvocationError) as failure:
        await handle.result(timeout=20)
    assert failure.value.error_type.endswith("PayloadTooLarge")
    assert (await handle.record()).status is RunStatus.FAILED
    assert await big_store.load_journal(handle.run_id) != []  # the refusal, journaled


@pytest.mark.parametrize(
    "size",
    [
        1 * MB,
        pytest.param(10 * MB, marks=pytest.mark.slow),
        pytest.param(
            100 * MB,
            marks=pytest.mark.skip(
                reason="measured by hand, not run: 100 MB goes through (15 s end to end) "
                "but one write of it blocks valkey-server ~2 s and the worker's event loop "
                "~3.6 s, which no default lock_ttl tolerates (see the module docstring)"
            ),
        ),
    ],
)
async def test_big_params_and_step_results_go_through_end_to_end(
    own_server: ValkeyProcess,
    big_store: ValkeyStore,
    registry: Registry,
    start_worker: StartWorker,
    size: int,
) -> None:
    replays: list[tuple[float, float]] = []
    echo = echo_workflow(registry, replays)
    limit = size + size // 10
    await start_worker(big_store, [echo], max_payload_bytes=limit, **LENIENT_LEASE)
    client = WorkflowClient(big_store, registry=registry, max_payload_bytes=limit)
    payload = blob(size)
    stop = asyncio.Event()
    lag = asyncio.create_task(loop_lag(stop))
    rss_before = rss_mb()
    with pinging(own_server) as pings:
        began = time.monotonic()
        handle = await client.submit(echo, {"blob": payload})
        submitted = time.monotonic() - began
        result = await handle.result(timeout=120)
        total = time.monotonic() - began
        stop.set()
        worst_lag = await lag
    server_worst, slowest = server_blocks(own_server)
    record = await handle.record()
    journal = await big_store.load_journal(handle.run_id)
    steps = [e for e in journal if e.kind == "step"]
    gaps = [later[0] - earlier[0] for earlier, later in itertools.pairwise(replays)]
    print(
        f"\n[{size // MB} MB] submit {submitted:.2f}s, end to end {total:.2f}s; worst PING "
        f"{pings['worst'] * 1000:.0f} ms over {pings['count']} pings ({pings['over_50ms']} "
        f"over 50 ms); server's slowest command {server_worst * 1000:.0f} ms "
        f"(slow log: {', '.join(slowest)}); this process's event loop (client and worker) "
        f"stalled up to {worst_lag:.2f}s; claims {record.claims}, passes over the big "
        f"step {len(replays)}, between them {[round(g, 2) for g in gaps]}s; RSS "
        f"{rss_before:.0f} MB before, {[round(r) for _, r in replays]} MB at each pass"
    )
    expected = hashlib.sha256(payload[::-1].encode()).hexdigest()
    assert result == {"len": len(payload), "sha": expected}
    assert record.status is RunStatus.COMPLETED and record.claims >= 2
    # The first pass, then a replay per wake-up, from the journal a new claim loaded (a
    # sleep already over once its entry was written, the big step's entry before it, goes
    # on in place, so fewer passes than sleeps is fine).
    assert 2 <= len(replays) <= NAPS + 1
    # Loose: replays must not pile up copies of the big result (a leak would add a copy,
    # ``size`` bytes or more, per replay).
    growth = replays[-1][1] - replays[1][1]
    assert growth < 4 * size / 2**20 + 16, f"RSS grew {growth:.0f} MB over the replays"
    assert len(steps) == 1 and len(steps[0].value) >= size - 12
    assert pings["count"] > 0, pings


def hgetall_calls(server: ValkeyProcess) -> int:
    """How many HGETALLs the server ran so far (Lua's included: commandstats)."""
    admin = admin_client(server)
    try:
        stats = admin.info("commandstats")
    finally:
        admin.close()
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))


async def test_renewals_and_journal_writes_do_not_read_the_payloads(
    own_server: ValkeyProcess, big_store: ValkeyStore, registry: Registry
) -> None:
    """A lease renewal (every lock_ttl / 3 for every running run) and a journal write read
    the run's status and token, never its whole record: an HGETALL copied 10 MB params
    inside the server at each one (6.5 - 110 ms of server time per renewal, measured,
    against ~0.05 ms)."""
    echo = echo_workflow(registry, [])
    client = WorkflowClient(big_store, registry=registry, max_payload_bytes=11 * MB)
    large = await client.submit(echo, {"blob": blob(10 * MB)})
    (lease,) = await big_store.claim_runs("renewer", [echo.name], 1, 30.0)
    assert lease.run_id == large.run_id
    before = hgetall_calls(own_server)
    for _ in range(5):
        result = await big_store.renew_leases("renewer", [(lease.run_id, lease.token)], 30.0)
        assert not result.lost
    entry = JournalEntry(lease.run_id, 0, "step", "first", True, "1")
    await big_store.append_journal(lease.token, entry)
    assert hgetall_calls(own_server) == before
    assert [e.value for e in await big_store.load_journal(lease.run_id)] == ["1"]
