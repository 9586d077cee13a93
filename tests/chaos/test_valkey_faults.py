"""The fault-injection suite on a real valkey-server: worker faults, then the checker.

``test_faults.py`` runs the checker on SQLite only; fencing, journal writes, outcomes,
recovery and dead-lettering are separate Lua functions on Valkey (plus the ready list
and shard leases), so the same invariants are checked here against them: three worker
processes on one namespace, ``RUNS`` three-step runs, and fault points that SIGKILL a
worker between a step and its journal write and lose journal replies, plus SIGKILLs
from outside of random workers holding runs (mid-step, mid-claim or mid-write).
Paused holders (SIGSTOP) on Valkey, with the token check itself exercised, are
``test_zombie_fencing.py``.

Seeds print; ``PYRULA_CHAOS_SEED=<seed>`` replays the dice.
"""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest

from pyrula.workflows.stores.valkey import ValkeyStore
from tests.valkey.servers import ValkeyProcess, valkey_server  # noqa: F401  (fixture)

from .harness import Cluster, Supervisor
from .nemesis import judge, kill_holders, valkey_store, valkey_url  # noqa: F401  (fixture)
from .test_faults import RUNS, fired, submit_runs

pytestmark = pytest.mark.slow

WORKERS = 3


@pytest.fixture
def on_valkey(cluster: Cluster, valkey_server: ValkeyProcess) -> Cluster:  # noqa: F811
    cluster.url = valkey_url(valkey_server)
    return cluster


async def test_kills_and_lost_replies_on_valkey(
    on_valkey: Cluster,
    valkey_store: ValkeyStore,  # noqa: F811
) -> None:
    cluster, store = on_valkey, valkey_store
    seed = int(os.environ.get("PYRULA_CHAOS_SEED") or 5505)
    print(f"\n[valkey kills] seed {seed} (replay: PYRULA_CHAOS_SEED={seed})")
    points = "after_step_before_journal=kill@0.04;after_journal_before_reply=raise@0.2"
    supervisor = Supervisor(cluster, WORKERS, faultpoints=points, seed=seed)
    await supervisor.start(store)
    started = time.monotonic()
    killer = asyncio.create_task(
        kill_holders(store, supervisor, random.Random(seed + 7), count=3, gap=1.5)
    )
    expected = await submit_runs(store, random.Random(seed))
    outside = await killer
    report, summary = await judge(
        cluster,
        store,
        expected,
        supervisor.faults,
        label="valkey kills",
        extra=f"kills from outside {outside}, fault points fired {fired(cluster)}, "
        f"{time.monotonic() - started:.1f}s",
    )
    await supervisor.halt()
    assert report.ok, summary
    assert report.figures["completed"] == RUNS, summary
    assert fired(cluster) > 0 and outside > 0, summary  # the scenario injected something
    assert report.figures["recoveries"] > 0, summary  # and a dead holder's run moved on
    assert not supervisor.unexpected_exits, supervisor.unexpected_exits
    assert store.data_loss == []
