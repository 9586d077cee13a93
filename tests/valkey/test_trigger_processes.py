"""Batch triggers and projections across real worker processes on a real valkey-server.

The processes are the chaos harness's (``tests/chaos/harness.py``: started, SIGKILLed
and reaped by PID, replaced by a ``Supervisor``) running ``trigger_app.py`` instead of
the plain launcher. What the tests check is read from the store; the workers' ledger
(``trigger_app``) can repeat a run by design (one killed mid-run executes again).

* Kills while firing: three workers fire the ``ingest`` trigger while a client sends
  2,000 events and a worker is SIGKILLed every ~0.3 s: every event ends in exactly one
  run of at most 20, nothing stays buffered, every run completes.
* A projection across a kill: the worker holding the projection's lease is SIGKILLed
  in the middle of a batch; the other takes over once the lease lapses (a worker's
  lease lasts its ``lock_ttl``, 2 s here; the takeover is measured and printed),
  delivers that batch again and every run that ends, in end order.

Seeds print; ``PYRULA_CHAOS_SEED=<seed>`` replays the dice (the client's chunks and
pauses, the kills' timing and victims; which worker is live at a kill is the machine's).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunRecord, RunStatus, WorkflowClient, open_store
from pyrula.workflows.projections import LEASE_TTL, decode_cursor
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.sync import WorkflowClient as BlockingClient
from tests.chaos import harness
from tests.chaos.harness import LOCK_TTL, Cluster, Supervisor, Worker, generous
from tests.chaos.nemesis import valkey_store, valkey_url  # noqa: F401  (fixture)
from tests.valkey import trigger_app
from tests.valkey.servers import ValkeyProcess

pytestmark = pytest.mark.slow

APP = Path(trigger_app.__file__).resolve()
EVENTS = 2_000
CHUNK_MAX = 45
LULLS = 0.15
WORKERS = 3
KILL_EVERY = 0.3
MIN_KILLS = 5
DRAIN_TIMEOUT = 90.0
RUNS = 200
PAUSE = 1.0
"""Seconds the projection function sleeps after each batch's line in the projection
test: under LOCK_TTL (the lease the worker holds through a batch), and long enough for
the test to see the line and kill the worker before the batch's cursor moves."""


@pytest.fixture
def cluster(
    tmp_path: Path, valkey_server: ValkeyProcess, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    """The harness's worker processes, running trigger_app, on a fresh namespace of the
    session's valkey-server; every process SIGKILLed by its PID and reaped at teardown
    (their logs print if the test failed)."""
    monkeypatch.setattr(harness, "LAUNCHER", APP)
    monkeypatch.setattr(harness, "WORKFLOW_MODULE", trigger_app.__name__)
    cluster = Cluster(tmp_path)
    cluster.url = valkey_url(valkey_server)
    try:
        yield cluster
    finally:
        cluster.kill_all()
        print(cluster.describe("worker logs:", tail=40))


def seed_of(default: int, label: str) -> int:
    seed = int(os.environ.get("PYRULA_CHAOS_SEED") or default)
    print(f"\n[{label}] seed {seed} (replay: PYRULA_CHAOS_SEED={seed})")
    return seed


def ledger(cluster: Cluster, kind: str) -> list[dict[str, Any]]:
    return [line for line in cluster.ledger() if line.get("kind") == kind]


# -- kills while firing ---------------------------------------------------------------------
def chunks_of(rng: random.Random) -> list[list[int]]:
    """0..EVENTS-1 cut into chunks of random sizes (1..CHUNK_MAX)."""
    chunks: list[list[int]] = []
    start = 0
    while start < EVENTS:
        size = min(rng.randint(1, CHUNK_MAX), EVENTS - start)
        chunks.append(list(range(start, start + size)))
        start += size
    return chunks


def pause(rng: random.Random) -> float:
    """Mostly a burst (batches fill up to MAX_SIZE); now and then a lull longer than
    MAX_WAIT (a batch fires part full when its oldest event has waited)."""
    if rng.random() < LULLS:
        return rng.uniform(trigger_app.MAX_WAIT, 2 * trigger_app.MAX_WAIT)
    return rng.uniform(0.0, 0.05)


def send(url: str, chunks: list[list[int]], pauses: list[float], stop: threading.Event) -> None:
    """The client: each chunk with one blocking ``send_events``, a pause after each
    (until ``stop`` is set: the test ended early)."""
    client = BlockingClient(open_store(url))
    try:
        for chunk, rest in zip(chunks, pauses, strict=True):
            client.send_events(trigger_app.TRIGGER, chunk, timeout=30)
            if stop.wait(rest):
                return
    finally:
        client.close()


async def kill_randomly(
    store: ValkeyStore,
    supervisor: Supervisor,
    rng: random.Random,
    sending: asyncio.Future[None],
) -> int:
    """Every ~KILL_EVERY seconds SIGKILL a random worker that serves (its heartbeat is in
    the store), while the client sends and until MIN_KILLS; the supervisor starts a
    replacement. Returns the kills."""
    kills = 0
    while not sending.done() or kills < MIN_KILLS:
        await asyncio.sleep(KILL_EVERY * rng.uniform(0.6, 1.4))
        serving = {info.worker_id for info in await store.list_workers()}
        live = [w for w in supervisor.slots if w.alive() and w.worker_id in serving]
        if live:
            rng.choice(sorted(live, key=lambda w: w.worker_id)).send(signal.SIGKILL)
            kills += 1
    return kills


async def drained(store: ValkeyStore, cluster: Cluster, timeout: float) -> list[RunRecord]:
    """The ingest runs once the buffer is empty and every run has ended."""
    deadline = time.monotonic() + timeout
    while True:
        buffered = await store.read_events(trigger_app.TRIGGER, 1)
        runs = await store.list_runs(workflow="ingest", limit=10 * EVENTS)
        if not buffered and runs and all(run.status.is_terminal for run in runs):
            return runs
        if time.monotonic() > deadline:
            pending = Counter(run.status.value for run in runs)
            raise AssertionError(
                cluster.describe(f"not drained in {timeout}s: buffer {buffered[:1]}, {pending}")
            )
        await asyncio.sleep(0.2)


async def test_every_event_in_exactly_one_run_while_workers_are_killed(
    cluster: Cluster,
    valkey_store: ValkeyStore,  # noqa: F811
) -> None:
    store = valkey_store
    seed = seed_of(4404, "trigger kills")
    rng = random.Random(seed)
    chunks = chunks_of(rng)
    pauses = [pause(rng) for _ in chunks]
    supervisor = Supervisor(cluster, WORKERS, faultpoints="", seed=seed)
    await supervisor.start(store)
    started = time.monotonic()
    stop = threading.Event()
    sending = asyncio.ensure_future(asyncio.to_thread(send, cluster.url, chunks, pauses, stop))
    try:
        kills = await kill_randomly(store, supervisor, random.Random(seed + 1), sending)
        await sending
        sent_in = time.monotonic() - started
        runs = await drained(store, cluster, DRAIN_TIMEOUT)
    finally:
        stop.set()
        await supervisor.halt()
        await asyncio.wait([sending], timeout=35)

    holds = {run.run_id: json.loads(run.params)["events"] for run in runs}
    where: dict[int, list[str]] = {}
    for run_id, events in holds.items():
        for value in events:
            where.setdefault(value, []).append(run_id)
    missing = sorted(set(range(EVENTS)) - set(where))
    twice = {value: ids for value, ids in where.items() if len(ids) > 1}
    summary = (
        f"seed {seed}: {len(chunks)} chunks sent in {sent_in:.1f}s, {kills} kills, "
        f"{len(runs)} runs ({Counter(len(e) for e in holds.values()).most_common(3)} by size), "
        f"{sum(run.recoveries > 0 for run in runs)} recovered, drained after "
        f"{time.monotonic() - started:.1f}s"
    )
    print(summary)
    assert not missing and not twice, f"{summary}: missing {missing[:20]}, twice {twice}"
    assert set(where) == set(range(EVENTS)), summary  # nothing else either
    assert all(1 <= len(events) <= trigger_app.MAX_SIZE for events in holds.values()), summary
    assert await store.read_events(trigger_app.TRIGGER, 10) == []
    unfinished = [
        (run.run_id, run.status.value) for run in runs if run.status is not RunStatus.COMPLETED
    ]
    assert not unfinished, f"{summary}: {unfinished}"
    assert all(json.loads(run.result or "0") == len(holds[run.run_id]) for run in runs), summary
    # Each execution got its run's own events: the ledger's lines (several for a run that
    # was re-executed) name only the store's runs, with the same events, and cover each.
    executed = ledger(cluster, "ingest")
    assert {line["run"] for line in executed} == set(holds), summary
    assert all(line["events"] == holds[line["run"]] for line in executed), summary
    assert kills >= MIN_KILLS, summary
    assert not supervisor.unexpected_exits, supervisor.unexpected_exits
    assert store.data_loss == []


# -- a projection across a kill -------------------------------------------------------------
async def lease(store: ValkeyStore) -> dict[str, Any]:
    """The projection's lease: ``{"worker": id, "until": store time}`` (``{}``: free)."""
    text = await store.get_cursor(trigger_app.DELIVERIES.lease_name)
    held: dict[str, Any] = json.loads(text) if text else {}
    return held


async def submit(store: ValkeyStore, first: int, count: int) -> list[str]:
    client = WorkflowClient(store, registry=trigger_app.registry)
    return [(await client.submit("noop", {"i": i})).run_id for i in range(first, first + count)]


async def wait_for(
    what: str, cluster: Cluster, timeout: float, check: Callable[[], Awaitable[bool]]
) -> None:
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout:
            raise AssertionError(cluster.describe(f"{what}: not within {timeout}s"))
        await asyncio.sleep(0.05)


def end_key(entry: list[Any]) -> tuple[float, str]:
    """A delivered ``[run_id, status, finished_at]``'s place in the end order."""
    return float(entry[2]), str(entry[0])


async def test_a_projection_moves_on_when_its_holder_is_killed(
    cluster: Cluster,
    valkey_store: ValkeyStore,  # noqa: F811
) -> None:
    """The holder is SIGKILLed in the middle of a batch (its function has written the
    batch's line and sleeps PAUSE before returning, so the cursor has not moved): the
    other worker takes the lease once it lapses, delivers that batch again, then every
    run that ends afterwards."""
    store = valkey_store
    env = {trigger_app.PAUSE_ENV: str(PAUSE)}
    workers = [cluster.start_worker(f"p{i}", env=env) for i in range(2)]
    await cluster.wait_ready(store, *workers)
    by_id: dict[str, Worker] = {w.worker_id: w for w in workers}
    run_ids = await submit(store, 0, RUNS // 2)

    async def delivering() -> bool:
        return bool(ledger(cluster, "projection"))

    await wait_for("a first delivery", cluster, 30, delivering)
    held = await lease(store)
    holder = by_id[held["worker"]]
    left = float(held["until"]) - await store.now()
    holder.send(signal.SIGKILL)
    killed = time.monotonic()
    assert holder.wait(10) == -signal.SIGKILL
    [other] = [w for w in workers if w is not holder]
    cut = ledger(cluster, "projection")
    cursor = decode_cursor(await store.get_cursor(trigger_app.DELIVERIES.cursor_name))
    assert cursor is None or cursor < end_key(cut[-1]["runs"][-1]), "killed after the batch"
    run_ids += await submit(store, RUNS // 2, RUNS - RUNS // 2)

    async def taken_over() -> bool:
        return (await lease(store)).get("worker") == other.worker_id

    await wait_for("the other worker taking the lease", cluster, LEASE_TTL + 30, taken_over)
    takeover = time.monotonic() - killed

    async def all_delivered() -> bool:
        lines = ledger(cluster, "projection")
        return {entry[0] for line in lines for entry in line["runs"]} >= set(run_ids)

    await wait_for("every run delivered", cluster, 60, all_delivered)
    print(
        f"\n[projection takeover] the killed holder's lease had {left:.2f}s left; the other "
        f"worker held it {takeover:.2f}s after the kill (lock_ttl {LOCK_TTL}s, "
        f"projections.LEASE_TTL {LEASE_TTL}s unused by workers); {len(cut)} batch(es) "
        "written before the kill"
    )
    # Taken over once the killed holder's lease ran out (left) and the other worker looked
    # again (3 s), generously for a loaded machine.
    assert takeover < left + generous(3.0), (takeover, left)

    ended = await store.ended_runs(None, 10 * RUNS)
    assert {run.run_id for run in ended} == set(run_ids)
    assert all(run.status is RunStatus.COMPLETED for run in ended)
    lines = ledger(cluster, "projection")
    # One worker at a time: the holder's batches, then the other's, never interleaved;
    # the other's first is the batch the holder died in, again.
    owners = [line["worker"] for line in lines]
    assert owners == [holder.worker_id] * len(cut) + [other.worker_id] * (len(lines) - len(cut))
    assert lines[len(cut)]["runs"][0] == cut[-1]["runs"][0]
    # Each batch in end order, as the store ended them (status and time included).
    finished = {run.run_id: run.finished_at for run in ended}
    for line in lines:
        keys = [end_key(entry) for entry in line["runs"]]
        assert keys == sorted(set(keys)), line
        assert all(entry[1] == "completed" for entry in line["runs"]), line
        assert all(finished[entry[0]] == entry[2] for entry in line["runs"]), line
    # At least once, in end order overall: the batches with repeats dropped are the
    # store's ended runs, in its order.
    once: list[str] = []
    for line in lines:
        once += [entry[0] for entry in line["runs"] if entry[0] not in once]
    assert once == [run.run_id for run in ended]
