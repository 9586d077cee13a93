"""Durability across processes: a worker SIGKILLed mid-task, and beat with two workers."""

from __future__ import annotations

import itertools
import time

import pytest

from pyrula_compat import states
from tests.compat.conftest import Workers, broker_url, lines, proj_workers, wait_until

pytestmark = pytest.mark.slow
T = 30


@pytest.fixture(params=["sqlite", "valkey"])
def kind(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture
def workers(kind: str, tmp_path, request: pytest.FixtureRequest, proj_app):  # type: ignore[no-untyped-def]
    with proj_workers(broker_url(kind, tmp_path, request), tmp_path, proj_app) as group:
        yield group


def test_a_task_whose_worker_is_sigkilled_completes_on_another(workers: Workers) -> None:
    import proj.tasks as t

    first = workers.start()
    marker = str(workers.tmp / "marker")
    result = t.slow.delay(1.5, marker)
    wait_until(lambda: lines(marker), T, "the task to start on the first worker")
    assert result.state == states.PENDING  # running: task_track_started is off, as in Celery
    first.kill()  # SIGKILL mid-task: nothing is acked, the lease lapses
    workers.start()
    assert result.get(timeout=T) == 1.5
    pids = [line.split()[1] for line in lines(marker)]
    assert len(pids) == 2 and pids[0] == str(first.proc.pid) != pids[1]


def test_beat_schedule_fires_each_slot_once_with_two_workers(workers: Workers, proj_app) -> None:  # type: ignore[no-untyped-def]
    ticks = str(workers.tmp / "ticks")
    env = {"PROJ_BEAT": ticks}
    a = workers.start(env=env)
    b = workers.start(env=env)
    started = time.monotonic()
    wait_until(lambda: len(lines(ticks)) >= 3, T, "three ticks")
    elapsed = time.monotonic() - started
    time.sleep(0.5)
    stamps = [float(x.split()[0]) for x in lines(ticks)]
    assert {x.split()[1] for x in lines(ticks)} == {"tick-every-2s"}  # Celery beat's header
    gaps = [later - earlier for earlier, later in itertools.pairwise(stamps)]
    assert all(gap > 1.0 for gap in gaps), gaps  # every 2 s, never twice for one slot
    assert len(stamps) <= elapsed / 2 + 2
    assert "beat schedule synced" in a.stderr + b.stderr  # the fixture stops both
