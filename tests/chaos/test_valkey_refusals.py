"""The valkey-server refuses writes for a while (reliability plan, scenario 13) while
worker processes are mid-run, then takes them again.

* ``oom``: ``maxmemory`` below what the server holds (``noeviction``): every write,
  and every ``FCALL`` of a function that may write, fails with ``OOM``. docs/valkey.md:
  "At maxmemory a write then fails (OOM), which the store raises as StoreUnavailable:
  the worker backs off and retries, losing nothing."
* ``misconf``: a failed background save with ``stop-writes-on-bgsave-error yes``: the
  server refuses writes with ``MISCONF`` until a save succeeds again.

A MISCONF refusal that outlasts ``lock_ttl`` (renewals fail too, leases lapse by the
server's clock), and a brief OOM well inside the lease. Expect: a submit during the
refusal raises a ``StoreError`` and stores nothing; afterwards every run completes
exactly once with no journaled step run again, no run is failed because of the store,
and the workers live on; a brief OOM costs no recovery at all (documented as
StoreUnavailable, retried).
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import valkey

from pyrula.workflows import StoreError, StoreUnavailable, WorkflowClient
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.fixtures.chaos_workflows import WORKFLOW, expected_result
from tests.valkey.servers import ValkeyProcess

from .check import Report
from .harness import LOCK_TTL, Cluster, Supervisor
from .nemesis import every_worker_window, judge, log_has, valkey_url

pytestmark = pytest.mark.slow


def refuse_oom(server: ValkeyProcess) -> Callable[[], None]:
    client = server.client()
    client.config_set("maxmemory", "1")
    client.config_set("maxmemory-policy", "noeviction")

    def lift() -> None:
        client.config_set("maxmemory", "0")
        client.close()

    return lift


def bgsave_status(client: valkey.Valkey) -> str:
    info: dict[str, Any] = client.info("persistence")  # type: ignore[assignment]
    return str(info["rdb_last_bgsave_status"])


def refuse_misconf(server: ValkeyProcess) -> Callable[[], None]:
    """Point the server's ``dir`` at a directory, remove it, and ask for a save: the save
    fails and, with a save point set, writes are refused until one succeeds."""
    client = server.client()
    doomed = server.dir / "doomed"
    doomed.mkdir()
    client.config_set("save", "3600 1")
    client.config_set("stop-writes-on-bgsave-error", "yes")
    client.config_set("dir", str(doomed))
    shutil.rmtree(doomed)
    client.bgsave()
    deadline = time.monotonic() + 10
    while bgsave_status(client) != "err":
        assert time.monotonic() < deadline, "the background save did not fail"
        time.sleep(0.02)

    def lift() -> None:
        client.config_set("dir", str(server.dir))
        client.bgsave()
        deadline = time.monotonic() + 10
        while bgsave_status(client) != "ok":
            assert time.monotonic() < deadline, "the background save did not recover"
            time.sleep(0.02)
        client.config_set("save", "")
        client.close()

    return lift


REFUSALS = {"oom": refuse_oom, "misconf": refuse_misconf}


@pytest.fixture
def refusing_valkey() -> Iterator[ValkeyProcess]:
    """A server of the test's own whose ``dir`` may be changed (a protected config)."""
    server = ValkeyProcess("--enable-protected-configs", "yes")
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


async def refused_episode(
    cluster: Cluster, server: ValkeyProcess, kind: str, seconds: float, lock_ttl: float
) -> tuple[Report, str, StoreError, Supervisor]:
    """Two workers, eight runs with a 1 s middle step; once two of those steps are in
    flight the server refuses writes for ``seconds``; then quiesce and check. A submit
    made during the refusal must fail and store nothing."""
    cluster.url = valkey_url(server)
    store = ValkeyStore.from_url(cluster.url)
    try:
        await store.open()
        supervisor = Supervisor(cluster, 2, faultpoints="", seed=0, lock_ttl=lock_ttl)
        await supervisor.start(store)
        client = WorkflowClient(store)
        expected: dict[str, int] = {}
        for n in range(8):
            handle = await client.submit(WORKFLOW, {"n": n, "delays": [0.05, 1.0, 0.05]})
            expected[handle.run_id] = expected_result(n)
        deadline = time.monotonic() + 15
        while sum(line["step"] == "double" for line in cluster.ledger()) < 2:
            assert time.monotonic() < deadline, cluster.describe("no step 2 in flight")
            await asyncio.sleep(0.02)

        refused_at = time.time()
        lift = await asyncio.to_thread(REFUSALS[kind], server)
        refused_id = uuid.uuid4().hex
        try:
            with pytest.raises(StoreError) as refused:
                await client.submit(WORKFLOW, {"n": 99, "delays": [0, 0, 0]}, run_id=refused_id)
            print(f"\n[{kind}] a submit meanwhile: {type(refused.value).__name__}: {refused.value}")
            await asyncio.sleep(seconds)
        finally:
            await asyncio.to_thread(lift)
        lifted_at = time.time()
        faults = every_worker_window(
            supervisor.slots, kind, refused_at - 2.0, lifted_at + lock_ttl + 1.0
        )
        report, summary = await judge(
            cluster, store, expected, faults, label=f"valkey {kind}", quiesce_for=40
        )
        await supervisor.halt()
        assert await store.get_run(refused_id) is None  # refused whole, nothing half-made
        assert report.ok, summary
        assert report.figures["completed"] == len(expected), summary
        assert not supervisor.faults and not supervisor.unexpected_exits, summary
        assert all(w.alive() for w in supervisor.slots), summary
        assert log_has(supervisor.slots, "WARNING"), cluster.describe("nobody noticed")
        assert not log_has(supervisor.slots, "LOST ITS DATA"), summary
        assert store.data_loss == []
        return report, summary, refused.value, supervisor
    finally:
        await store.close()


async def test_refused_writes_for_longer_than_a_lease_lose_nothing(
    cluster: Cluster, refusing_valkey: ValkeyProcess
) -> None:
    """MISCONF for longer than a lease: every in-flight run loses its lease and is
    recovered; each may waste the step it had in flight, nothing more."""
    await refused_episode(cluster, refusing_valkey, "misconf", LOCK_TTL + 1.0, LOCK_TTL)


async def test_a_brief_oom_is_waited_out_like_an_outage(
    cluster: Cluster, refusing_valkey: ValkeyProcess
) -> None:
    """docs/valkey.md: OOM is StoreUnavailable, "the worker backs off and retries,
    losing nothing"; and "a server that is down for a few seconds costs nothing but the
    wait; no finished step runs again". A refusal of 1 s, well inside the 3 s lease (and
    the fenced writes' retry window), must then cost no recovery and no duplicate."""
    report, summary, refused, _ = await refused_episode(
        cluster, refusing_valkey, "oom", 1.0, lock_ttl=3.0
    )
    assert isinstance(refused, StoreUnavailable), refused
    assert report.figures["recoveries"] == 0, summary
    assert report.figures["dup_step_execs"] == 0, summary
