"""A step that holds the GIL, or the event loop, longer than its run's lease (reliability
plan, scenario 5).

Lease renewal runs on the worker's event loop, in the worker's process. A sync step runs
on a pool thread, which keeps the loop free only while the step lets go of the GIL: a
step inside one long C call that never releases it (here a backtracking ``re.search``)
stalls the loop, and so the renewal, for the whole call; so does an async step computing
without awaiting. Two real worker processes share a real store (the SQLite file, or a
namespace on a real valkey-server). The starved worker's lease lapses while it is alive,
the other worker recovers and claims the run and runs the step again; when the starved
one wakes, fencing refuses whatever it tries to write (journal entry, outcome), so the
run ends once, with the successor's journal entry and result. The step's side effect
runs twice at most (at-least-once). A sync step spinning in pure Python, for contrast,
keeps its lease: the interpreter hands the GIL to the loop every switch interval.

On SQLite a starved worker may also be holding the database's write lock: its store
thread runs Python between ``BEGIN IMMEDIATE`` and ``COMMIT``, so a GIL held by a step
at that moment keeps the lock until the step's call returns, every other process's
writes wait, and nobody can take the run over until the starved worker wakes (then it
may renew, or requeue and reclaim, the run itself). The regex case meets that by chance
(about 1 run in 5 here), and accepts it only with the lock seen taken;
``test_a_starved_worker_inside_a_sqlite_write_lets_the_others_take_its_run`` makes it
certain, and is a strict xfail: the defect is left for the SQLite store's owners.

Measured and printed: how long the step held the CPU, how soon the run was stolen, the
claims taken from the live worker, the refusals it met on waking (its log), on SQLite how
often the write lock was found taken meanwhile, and how long a submit waited for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from pyrula.workflows import LeaseLost, RunStatus, WorkflowClient
from pyrula.workflows.records import JournalEntry, Outcome
from pyrula.workflows.stores.base import Store
from tests.fixtures import starving_workflows
from tests.fixtures.starving_workflows import TX_HOOK_ENV, WORKFLOW
from tests.valkey.servers import valkey_server  # noqa: F401  (fixture)

from . import harness
from .harness import Cluster, Worker
from .nemesis import opened_store

pytestmark = pytest.mark.slow

LOCK_TTL = 1.5
ORPHAN_SCAN = 0.5
HOLD = 2.5 * LOCK_TTL
"""How long the first start of the step holds the CPU: past the lease and the next scan."""
REDO = 2.0
"""How long the successor's start of the step takes (sleeping: it releases the GIL), so
that the starved worker mostly wakes while its successor is still mid-step and only the
token tells them apart."""
LOST_LINES = ("lease lost", "could not record its outcome")
"""What a worker logs when the store refused its lease renewal or a fenced write."""


@pytest.fixture(params=["sqlite", "valkey"])
async def hog_store(
    request: pytest.FixtureRequest, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Store]:
    """The cluster's store; its workers import the starving workflows."""
    monkeypatch.setattr(harness, "WORKFLOW_MODULE", starving_workflows.__name__)
    async with opened_store(request, cluster, request.param) as store:
        yield store


def ledger_of(cluster: Cluster, run_id: str, phase: str) -> list[dict[str, Any]]:
    return [x for x in cluster.ledger() if x["run_id"] == run_id and x["phase"] == phase]


def lost_lines(worker: Worker, run_id: str) -> list[str]:
    return [
        line
        for line in worker.log_text().splitlines()
        if run_id in line and any(needle in line for needle in LOST_LINES)
    ]


def kind_of(line: str) -> str:
    """Which refusal a worker's log line reports."""
    if "could not record its outcome" in line:
        return "outcome refused"
    if "abandoning" in line:
        return "journal write refused"
    return "renewal refused"


async def watch_write_lock(cluster: Cluster, until: asyncio.Event) -> tuple[int, int]:
    """(probes, probes that found the SQLite write lock taken) until ``until`` is set."""
    probes = busy = 0
    while not until.is_set():
        free = await asyncio.to_thread(cluster.write_lock_free, 0.05)
        probes, busy = probes + 1, busy + (not free)
        await asyncio.sleep(0.1)
    return probes, busy


async def start_pair(
    cluster: Cluster, store: Store, env: dict[str, str] | None = None
) -> tuple[Worker, Worker]:
    a, b = (
        cluster.start_worker(name, env=env, lock_ttl=LOCK_TTL, orphan_scan_interval=ORPHAN_SCAN)
        for name in "ab"
    )
    await cluster.wait_ready(store, a, b)
    return a, b


def of_run(run_id: str, phase: str, first: bool) -> Callable[[dict[str, Any]], bool]:
    """Matches the ledger lines of ``run_id``'s step: its first start's, or a later one's."""
    return lambda x: (x["run_id"], x["phase"], x["first"]) == (run_id, phase, first)


@pytest.mark.parametrize("how", ["regex", "async_spin"])
async def test_a_starved_lease_holder_loses_the_run_and_is_fenced(
    cluster: Cluster, hog_store: Store, how: str
) -> None:
    store = hog_store
    kind = "sqlite" if cluster.url.startswith("sqlite") else "valkey"
    a, b = await start_pair(cluster, store)
    client = WorkflowClient(store)
    began = time.monotonic()
    handle = await client.submit(WORKFLOW, {"how": how, "seconds": HOLD, "redo": REDO})
    run_id = handle.run_id
    step_name = f"{how}_hog"
    redo, woke = of_run(run_id, "start", False), of_run(run_id, "end", True)

    first = await cluster.wait_ledger(of_run(run_id, "start", True), timeout=15)
    starved = cluster.by_pid(first["pid"])
    successor = b if starved is a else a
    stop_probing = asyncio.Event()
    probing = asyncio.create_task(
        watch_write_lock(cluster, stop_probing) if kind == "sqlite" else asyncio.sleep(0, (0, 0))
    )
    try:  # the step's second start (another worker took the run over), or its first end
        line = await cluster.wait_ledger(lambda x: redo(x) or woke(x), timeout=HOLD + 15)
    finally:
        stop_probing.set()
        probes, busy = await probing
    during = redo(line) and line["pid"] == successor.pid
    status_then = "(not checked)"
    if during:
        # While the successor holds the run, the store refuses the starved worker's token.
        status_then = (await handle.record()).status.value
        late_entry = JournalEntry(run_id, 0, "step", step_name, True, '{"pid":0}')
        with pytest.raises(LeaseLost):
            await store.append_journal(first["token"], late_entry)
        with pytest.raises(LeaseLost):
            await store.finish_run(run_id, first["token"], Outcome(RunStatus.COMPLETED, result="0"))

    result = await handle.result(timeout=HOLD + REDO + 20)
    total = time.monotonic() - began
    starved_end = await cluster.wait_ledger(woke, timeout=HOLD + 15)
    await asyncio.sleep(1.0)  # the starved worker's late writes, if any, land meanwhile
    held = starved_end["held"]
    starts = ledger_of(cluster, run_id, "start")
    taken = next((x for x in starts if not x["first"]), None)
    refused = lost_lines(starved, run_id)
    final = await handle.record()
    journal = [e for e in await store.load_journal(run_id) if e.kind == "step"]
    if during:
        assert taken is not None
        ends = [x for x in ledger_of(cluster, run_id, "end") if not x["first"]]
        mid = bool(ends) and starved_end["t"] < ends[0]["t"]
        tail = "mid-step of its successor" if mid else "after the run ended"
        path = f"stolen by the other worker {taken['t'] - first['t']:.2f}s in"
        path += f"; the starved one woke {tail}"
    elif taken is not None:
        by = "the other worker" if taken["pid"] == successor.pid else "the starved one itself"
        path = (
            f"taken by {by} only {taken['t'] - first['t']:.2f}s in, after the starved one "
            "woke: until then it held the SQLite write lock, so nobody could recover the run"
        )
    else:
        path = (
            "never taken: the starved worker held the SQLite write lock, so nobody could "
            "recover the run, and on waking it renewed its lease and finished the run"
        )
    print(
        f"\n[{kind}/{how}] held the CPU {held:.2f}s (lock_ttl {LOCK_TTL}s); {path}; claims "
        f"{final.claims} (recoveries {final.recoveries}); step starts {len(starts)}; journal "
        f"entries for it {len(journal)}; refusals the starved execution logged on waking "
        f"(renewal or fenced write) {len(refused)}: {[kind_of(line) for line in refused]}; "
        f"store refused its token (journal, outcome) while the run was {status_then}; "
        f"sqlite write lock taken in {busy}/{probes} probes while it starved; "
        f"run took {total:.2f}s"
    )
    if not during:
        # Only a starved worker that happened to hold SQLite's write lock keeps the others
        # from its run until it wakes (see test_a_starved_worker_inside_a_sqlite_write_...).
        assert kind == "sqlite" and how == "regex" and busy > 0, path
    # Whatever the path: one outcome, from the last claim; one journal entry, its own.
    owner = starved if taken is None else cluster.by_pid(taken["pid"])
    token = first["token"] if taken is None else taken["token"]
    assert final.status is RunStatus.COMPLETED
    assert final.worker_id == owner.worker_id and final.lease_token == token
    assert result["pid"] == owner.pid and result["token"] == token, result
    assert final.claims == len(starts) and final.recoveries == len(starts) - 1
    assert len(starts) <= 2, starts  # at-least-once: the starved start and one redo
    assert [(e.name, e.token) for e in journal] == [(step_name, token)]
    if taken is not None:
        assert refused, cluster.describe("the starved execution never learnt it lost the run")
    assert starved.alive() and successor.alive()
    await asyncio.sleep(0.5)  # the one outcome stays
    again = await handle.record()
    assert (again.status, again.result, again.finished_at) == (
        final.status,
        final.result,
        final.finished_at,
    )
    assert [(e.name, e.token) for e in await store.load_journal(run_id)] == [(step_name, token)]


async def test_a_sync_step_spinning_in_python_keeps_its_lease(
    cluster: Cluster, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contrast: pure-Python bytecode gives the GIL up every switch interval, so the
    loop's renewals go on and nobody steals the run."""
    monkeypatch.setattr(harness, "WORKFLOW_MODULE", starving_workflows.__name__)
    a, b = await start_pair(cluster, store)
    handle = await WorkflowClient(store).submit(
        WORKFLOW, {"how": "thread_spin", "seconds": HOLD, "redo": REDO}
    )
    result = await handle.result(timeout=HOLD + 20)
    final = await handle.record()
    starts = ledger_of(cluster, handle.run_id, "start")
    print(
        f"\n[sqlite/thread_spin] held {result['held']:.2f}s on a pool thread; claims "
        f"{final.claims}, recoveries {final.recoveries}, step starts {len(starts)}"
    )
    assert result["first"] is True and result["held"] >= HOLD
    assert final.claims == 1 and final.recoveries == 0 and len(starts) == 1
    assert not any(lost_lines(w, handle.run_id) for w in (a, b))


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="defect: the SQLite store runs Python between BEGIN IMMEDIATE and COMMIT on its "
    "thread (stores/sqlite/db.py Database.write: fn(conn, now) then conn.commit()), so a "
    "worker whose GIL is held by a step while that thread is mid-transaction keeps the "
    "database's write lock for as long: every other process's writes (recovery, claims, "
    "submits) wait, up to busy_timeout (30 s), and nobody can take its runs over. Seen by "
    "chance in ~1 of 5 runs of the regex case above; made certain here",
)
async def test_a_starved_worker_inside_a_sqlite_write_lets_the_others_take_its_run(
    cluster: Cluster, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness, "WORKFLOW_MODULE", starving_workflows.__name__)
    await start_pair(cluster, store, env={TX_HOOK_ENV: "1"})
    client = WorkflowClient(store)
    handle = await client.submit(WORKFLOW, {"how": "regex_in_tx", "seconds": HOLD, "redo": REDO})
    run_id = handle.run_id
    first = await cluster.wait_ledger(of_run(run_id, "start", True), timeout=15)
    starved = cluster.by_pid(first["pid"])
    await cluster.wait_ledger(of_run(run_id, "hog", True), timeout=15)
    await asyncio.sleep(0.3)  # into the starvation
    began = time.monotonic()  # another process's write: this test's own submit
    other = await client.submit(WORKFLOW, {"how": "thread_spin", "seconds": 0.01, "redo": 0})
    submit_wait = time.monotonic() - began
    await handle.result(timeout=HOLD + REDO + 40)
    await other.result(timeout=20)
    starved_end = await cluster.wait_ledger(of_run(run_id, "end", True), timeout=HOLD + 15)
    if not starved_end.get("in_tx"):
        pytest.skip("the starved worker began no write transaction to hold")
    taken = next((x for x in ledger_of(cluster, run_id, "start") if not x["first"]), None)
    final = await handle.record()
    if taken is None:
        fate = "was never taken over"
    else:
        by = "the starved worker itself" if taken["pid"] == starved.pid else "the other worker"
        fate = f"was taken by {by} {taken['t'] - first['t']:.2f}s in"
    print(
        f"\n[sqlite/regex_in_tx] held the CPU {starved_end['held']:.2f}s inside a write "
        f"transaction; a submit from another process waited {submit_wait:.2f}s; the run "
        f"{fate}; claims {final.claims}"
    )
    # What scenario 5 expects: the other worker takes the run over while the starved one
    # is still in its step, and a submit does not wait out the starvation.
    assert taken is not None and taken["pid"] != starved.pid, "never taken over by another"
    assert taken["t"] < starved_end["t"], "taken over only once the starved worker woke"
    assert submit_wait < LOCK_TTL, f"a submit waited {submit_wait:.2f}s for the write lock"
