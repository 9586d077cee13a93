"""Reliability plan scenario 20: shard lease expiry and handover.

8 shards, ``shard_lease_ttl`` 2 s, ``shard_lease_interval`` 0.5 s, three worker processes
(tests/fixtures/run_worker.py) under a steady stream of runs. The holder of shard 0 is
SIGKILLed inside a step; another holder is SIGSTOPped inside a step for 2 x ttl, then
resumed. :class:`LeaseWatch` samples the lease keys with the server's ``TIME`` every 20 ms
and reads ``MONITOR`` for every lease tick and claim (``claim_due``'s last arguments are
the shards the claimer names as its own). Shard leases only steer where a worker claims
first (the per-run fenced claim lock stops double runs), so a claim on another worker's
shard is counted, not refused; tests/chaos/check.py checks the side-effect ledger.
Then 10 and 1 in-process lease loops for 8 shards.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import WorkflowClient, open_store
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.chaos.check import FaultWindow, check, quiesce, take_snapshot
from tests.chaos.harness import LOCK_TTL, Cluster, Worker, generous
from tests.fixtures.chaos_workflows import WORKFLOW, expected_result
from tests.valkey.servers import ValkeyProcess, fresh_namespace

from .conftest import MakeStore
from .lease_watch import SAMPLE_EVERY, SHARDS, LeaseWatch

TTL = 2.0
INTERVAL = 0.5


async def until(what: Callable[[], bool], timeout: float, describe: Callable[[], str]) -> float:
    """Wait for ``what``; return when it held (time.time())."""
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, describe()
        await asyncio.sleep(0.02)
    return time.time()


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)] if ordered else 0.0


# -- real worker processes -----------------------------------------------------------
@pytest.fixture
def watched(tmp_path: Path, own_server: ValkeyProcess) -> Iterator[tuple[Cluster, LeaseWatch]]:
    """Worker processes on the test's own server (MONITOR sees all of it), in a fresh
    namespace with fast shard leases; every one SIGKILLed by its PID and reaped after."""
    namespace = fresh_namespace()
    cluster = Cluster(tmp_path)
    cluster.url = (
        f"{own_server.url}/0?namespace={namespace}&shard_count={SHARDS}"
        f"&shard_lease_ttl={TTL}&shard_lease_interval={INTERVAL}"
    )
    watch = LeaseWatch(own_server.port, namespace)
    watch.start()
    try:
        yield cluster, watch
    finally:
        for worker in cluster.workers:  # a stopped one must run again to die
            worker.send(signal.SIGCONT)
        cluster.kill_all()
        watch.stop()
        watch.save(tmp_path / "leases.json")


@pytest.fixture
async def client_store(watched: tuple[Cluster, LeaseWatch]) -> AsyncIterator[ValkeyStore]:
    store = open_store(watched[0].url)
    assert isinstance(store, ValkeyStore)
    try:
        yield store
    finally:
        await store.close()


async def submit_steadily(client: WorkflowClient, expected: dict[str, int]) -> None:
    """A run every 0.1 s, each due 50 ms later (so it waits in its shard's queue)."""
    n = 0
    while True:
        n += 1
        handle = await client.submit(WORKFLOW, {"n": n, "delays": [0.02, 0.25, 0.02]}, delay=0.05)
        expected[handle.run_id] = expected_result(n)
        await asyncio.sleep(0.1)


async def step_in_flight(cluster: Cluster, worker: Worker) -> dict[str, Any]:
    """Wait until ``worker`` is inside a ``double`` step (its ledger start, no end yet)."""
    deadline = time.monotonic() + 10
    while True:
        ledger = cluster.ledger()
        ended = {(x["run_id"], x["token"], x["step"]) for x in ledger if x["phase"] == "end"}
        for x in reversed(ledger):
            if (x["pid"], x["step"], x["phase"]) == (worker.pid, "double", "start") and (
                (x["run_id"], x["token"], "double") not in ended and time.time() - x["t"] < 0.1
            ):
                return dict(x)
        assert time.monotonic() < deadline, cluster.describe(f"{worker.worker_id}: no step")
        await asyncio.sleep(0.01)


@pytest.mark.slow
async def test_kill_and_stop_hand_every_shard_over_without_overlap(
    watched: tuple[Cluster, LeaseWatch], client_store: ValkeyStore, tmp_path: Path
) -> None:
    cluster, watch = watched
    describe: Callable[[], str] = lambda: cluster.describe(f"lease state {watch.latest()}")  # noqa: E731
    workers = [cluster.start_worker(name) for name in ("a", "b", "c")]
    await cluster.wait_ready(client_store, *workers)

    def balanced(among: set[str]) -> bool:
        s = watch.latest()
        target = math.ceil(SHARDS / len(among))
        return all(s.owner(x) in among for x in range(SHARDS)) and all(
            len(s.held_by(w)) <= target for w in among
        )

    converged = await until(lambda: balanced({w.worker_id for w in workers}), 10, describe)
    expected: dict[str, int] = {}
    submitter = asyncio.create_task(submit_steadily(WorkflowClient(client_store), expected))
    try:
        await asyncio.sleep(1.0)
        # SIGKILL the holder of shard 0 inside a step.
        victim = next(w for w in workers if w.worker_id == watch.latest().owner(0))
        in_flight = [await step_in_flight(cluster, victim)]
        before = watch.latest()
        victim_shards = before.held_by(victim.worker_id)
        victim.send(signal.SIGKILL)
        killed_at = time.time()
        assert victim.wait(5) == -signal.SIGKILL
        rest = [w for w in workers if w is not victim]
        zombie, survivor = sorted(rest, key=lambda w: -len(before.held_by(w.worker_id)))
        pair = {zombie.worker_id, survivor.worker_id}
        handed = await until(lambda: balanced(pair), TTL + 5, describe)
        await asyncio.sleep(0.5)
        # SIGSTOP another holder inside a step for 2 x ttl, then SIGCONT it.
        in_flight.append(await step_in_flight(cluster, zombie))
        zombie_shards = watch.latest().held_by(zombie.worker_id)
        zombie.send(signal.SIGSTOP)
        await until(lambda: zombie.state() in ("T", "t"), 2, describe)
        stopped_at = time.time()
        taken = await until(lambda: balanced({survivor.worker_id}), TTL + 5, describe)
        await asyncio.sleep(max(0.0, stopped_at + 2 * TTL - time.time()))
        resumed_at = time.time()
        zombie.send(signal.SIGCONT)
        z = zombie.worker_id
        rebalanced = await until(
            lambda: balanced(pair) and len(watch.latest().held_by(z)) == 4, 5, describe
        )
        await asyncio.sleep(1.0)
    finally:
        submitter.cancel()
        await asyncio.gather(submitter, return_exceptions=True)
    left = await quiesce(client_store, list(expected), timeout=30)
    assert not left, cluster.describe(f"runs not finished: {left[:5]}")
    snapshot = await take_snapshot(client_store, expected)
    await asyncio.sleep(0.5)
    later = await take_snapshot(client_store, expected)
    watch.stop()
    ledger = cluster.ledger()
    faults = [
        FaultWindow("kill", victim.pid, victim.started, killed_at),
        FaultWindow("stop", zombie.pid, stopped_at - 1.0, resumed_at + LOCK_TTL),
    ]
    report = check(
        expected=expected, ledger=ledger, snapshot=snapshot, later=later, faults=faults,
        max_in_flight=4,
    )  # fmt: skip

    # -- what the watch saw ------------------------------------------------------------
    gaps = watch.unowned_gaps(since=converged)
    kill_handover = watch.handover(victim_shards, pair, killed_at)
    stop_handover = watch.handover(zombie_shards, {survivor.worker_id}, stopped_at)
    overlaps = watch.overlaps()
    lapsed, given_back = watch.stale_claims()
    ticks = (c.t for c in watch.calls if c.worker == z and c.name == "lease_tick")
    first_tick = next((t for t in ticks if t > resumed_at), math.inf)
    # Two live workers after the resume: a rebalance gives the resumed one 4 at most.
    over_target = [(s.t, s.held_by(z)) for s in watch.samples if s.t > resumed_at
                   and len(s.held_by(z)) > SHARDS // 2]  # fmt: skip
    # Dequeues: each claim's first ledger start, against the shard's holder just before.
    by_pid = {w.pid: w.worker_id for w in workers}
    claims = {(x["run_id"], x["token"]): x for x in reversed(ledger) if x["phase"] == "start"}
    dequeues: Counter[str] = Counter()
    for line in claims.values():
        shard = client_store._keys.shard_of(line["run_id"])
        holder, claimer = watch.around(line["t"])[0].owner(shard), by_pid[line["pid"]]
        dequeues["own" if holder == claimer else "unowned" if holder is None else "other"] += 1
        if claimer == z and line["t"] > resumed_at and shard in zombie_shards and holder != z:
            dequeues["zombie_after_resume_on_its_lost_shards"] += 1
    figures = {
        "converged_s": converged - workers[0].started,
        "kill_to_all_owned_s": handed - killed_at,
        "kill_handover_s": kill_handover,
        "stop_to_all_owned_s": taken - stopped_at,
        "stop_handover_s": stop_handover,
        "resume_to_first_tick_s": first_tick - resumed_at,
        "resume_to_rebalanced_s": rebalanced - resumed_at,
        "unowned_gaps": len(gaps),
        "unowned_gap_p99_s": p99(gaps),
        "unowned_gap_max_s": max(gaps, default=0.0),
        "overlaps": len(overlaps),
        "claims_naming_lapsed_shards": len(lapsed),
        "claims_naming_shards_given_back_in_flight": len(given_back),
        "zombie_over_target_samples": len(over_target),
        "dequeues": dict(dequeues),
        **report.figures,
    }
    figures = json.loads(json.dumps(figures), parse_float=lambda x: round(float(x), 3))
    (tmp_path / "figures.json").write_text(json.dumps(figures, indent=1))
    print("scenario 20 figures:", json.dumps(figures))
    assert report.ok, report.text() + "\n" + cluster.describe("chaos check failed")
    # The steps in flight at the faults ran again under a new claim, which alone journaled
    # them: the stopped worker, resumed, finished its step and was refused (fencing).
    for line in in_flight:
        journal = await client_store.load_journal(line["run_id"])
        (entry,) = [e for e in journal if e.name == "double"]
        assert entry.token > line["token"], (line, journal)
    late = [x for x in ledger if x["pid"] == zombie.pid and x["phase"] == "end"
            and x["run_id"] == in_flight[1]["run_id"] and x["step"] == "double"]  # fmt: skip
    assert late and late[0]["t"] >= resumed_at, late  # the zombie did finish its step late
    assert f"run {in_flight[1]['run_id']}: lease lost" in zombie.log_text()
    assert report.figures["in_flight_at_faults"] >= 2, figures
    # The dead and the stopped worker's shards owned again within ttl + interval (+ slack);
    # none ever unowned past one interval (a lapsed or given-back one goes at a next tick).
    assert max(kill_handover.values()) <= generous(TTL + INTERVAL), figures
    assert max(stop_handover.values()) <= generous(TTL + INTERVAL), figures
    assert max(gaps, default=0.0) <= generous(INTERVAL + 4 * SAMPLE_EVERY), figures
    assert overlaps == [], overlaps[:5]
    # The resumed worker ticks at once and holds only what a rebalance gives it; no worker
    # (nor it, before its tick's reply) claims as its own a shard whose lease had lapsed.
    assert first_tick - resumed_at <= generous(INTERVAL), figures
    assert over_target == [], over_target[:5]
    assert lapsed == [], lapsed[:5]
    assert zombie.alive() and survivor.alive()


# -- in-process lease loops ----------------------------------------------------------
FAST = {"shard_count": SHARDS, "shard_lease_ttl": 1.0, "shard_lease_interval": 0.25}


async def crashable_loop(store: ValkeyStore, worker: str) -> None:
    """A lease loop that, cancelled, leaves its leases to lapse (as a crash would)."""
    while True:
        await store.lease_shards(worker)
        await asyncio.sleep(store.shard_lease_interval)


async def server_view(store: ValkeyStore) -> dict[int, str]:
    """The shards with a valid lease (by the server's TIME) and their holders."""
    sec, usec = await store._server.command("TIME")
    now = int(sec) + int(usec) / 1e6
    flat = await store._server.command("HGETALL", store._keys.lease_holders)
    items = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=False)
    out = {}
    for shard, value in items:
        holder, _, expires = (value.decode() if isinstance(value, bytes) else value).rpartition("|")
        if float(expires) > now:
            out[int(shard)] = holder
    return out


async def test_ten_workers_for_eight_shards(make_store: MakeStore, topology: str) -> None:
    """8 own one shard each, 2 are idle; a crashed holder's shard goes to an idle one."""
    first = await make_store(topology, **FAST)
    stores = [first] + [
        await make_store(topology, namespace=first.namespace, **FAST) for _ in range(9)
    ]
    names = [f"w{i}" for i in range(10)]
    loops = [asyncio.create_task(crashable_loop(s, n)) for s, n in zip(stores, names, strict=True)]
    try:
        started = time.monotonic()
        while len(set((view := await server_view(first)).values())) < SHARDS:
            assert time.monotonic() - started < 10, view
            await asyncio.sleep(0.02)
        converged = time.monotonic() - started
        for _ in range(15):  # steady across several renewals: 8 owners, none twice
            view = await server_view(first)
            assert len(view) == SHARDS and len(set(view.values())) == SHARDS, view
            await asyncio.sleep(0.05)
        beliefs = {n: s.owned_shards(n) for s, n in zip(stores, names, strict=True)}
        assert sorted(x for b in beliefs.values() for x in b) == list(range(SHARDS)), beliefs
        idle = [n for n, b in beliefs.items() if not b]
        assert len(idle) == 2 and max(len(b) for b in beliefs.values()) == 1, beliefs
        victim = next(n for n, b in beliefs.items() if b)
        (shard,) = beliefs[victim]
        loops[names.index(victim)].cancel()  # a crash: its lease lapses after the ttl
        crashed = time.monotonic()
        # Handed over within ttl + interval (the guarantee), generously.
        within = generous(FAST["shard_lease_ttl"] + FAST["shard_lease_interval"])
        while (await server_view(first)).get(shard) in (None, victim):
            assert time.monotonic() - crashed < within, victim
            await asyncio.sleep(0.02)
        handover = time.monotonic() - crashed
        assert handover <= within
        view = await server_view(first)
        assert view[shard] in idle and len(set(view.values())) == SHARDS, view
        print(f"10 workers/8 shards: converged in {converged:.2f}s, handover {handover:.2f}s")
    finally:
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)


async def test_one_worker_owns_all_eight_shards_while_it_renews(
    make_store: MakeStore,
) -> None:
    """A lone worker holds every shard across renewals, and releases them at a clean stop.
    One that missed its renewals (stopped, blocked, cut off) must not claim as its own
    the shards whose leases lapsed meanwhile: what a tick gave counts for one ttl from
    when it was sent (the process test above found a resumed worker's first claim naming
    its old shards, sent before its next tick's reply came)."""
    store = await make_store("single", **FAST)
    loop = asyncio.create_task(store.shard_lease_loop("solo"))
    try:
        deadline = time.monotonic() + 5
        while store.owned_shards("solo") != frozenset(range(SHARDS)):
            assert time.monotonic() < deadline, store.owned_shards("solo")
            await asyncio.sleep(0.02)
        for _ in range(15):  # held across several renewals (and past one ttl)
            assert await server_view(store) == dict.fromkeys(range(SHARDS), "solo")
            await asyncio.sleep(0.1)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert await store.shard_holders() == {}  # a clean stop released them all

    sent: list[tuple[Any, ...]] = []
    call = store._server.call

    async def recording(name: str, key: str, *args: Any) -> Any:
        if name == "claim_due":
            sent.append(args)
        return await call(name, key, *args)

    async def claim_naming() -> list[str]:  # the shards a claim names as the worker's own
        await store.claim_runs("w", ["wf"], 1, 5.0)
        return list(sent[-1][9:])  # after ns, worker, limit, ttl, ahead, n, one triple

    store._server.call = recording  # type: ignore[method-assign]
    everything = [str(s) for s in range(SHARDS)]
    assert len(await store.lease_shards("w")) == SHARDS
    assert await claim_naming() == everything
    await asyncio.sleep(FAST["shard_lease_ttl"] + 0.05)  # no renewal: the leases lapse
    assert store.owned_shards("w") == frozenset()
    assert await claim_naming() == []
    assert len(await store.lease_shards("w")) == SHARDS  # a tick says what it holds again
    assert await claim_naming() == everything
