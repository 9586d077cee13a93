"""``pyrula worker -A proj_pool`` with the prefork pool: pool processes, each one run at
a time; a SIGKILLed one's run handed back at once; hard time limits; recycling per
process; a store restart during a replacement. Real worker processes on SQLite and a
real valkey-server; every process started here is stopped by PID."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunRecord, open_store
from pyrula_compat.exceptions import TimeLimitExceeded
from tests.compat.conftest import (
    WorkerProcess,
    Workers,
    broker_url,
    lines,
    proj_workers,
    pyrula_command,
    wait_until,
)
from tests.integration.test_cli_recycle import alive, children_of
from tests.valkey.servers import ValkeyProcess

pytestmark = pytest.mark.slow
T = 30
POOL = ["--pool", "prefork", "-c", "2"]


@pytest.fixture(params=["sqlite", "valkey"])
def kind(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture
def workers(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, proj_app: Any
) -> Iterator[Workers]:
    with proj_workers(broker_url(kind, tmp_path, request), tmp_path, proj_app) as group:
        seen: set[int] = set()
        try:
            yield group
        finally:
            for worker in group.started:
                seen |= children_of(worker.proc.pid)
            group.kill_all()
            for pid in seen:  # pool processes outliving their supervisor, by PID
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def run_record(url: str, run_id: str) -> RunRecord | None:
    async def main() -> RunRecord | None:
        store = open_store(url)
        await store.open()
        try:
            return await store.get_run(run_id)
        finally:
            await store.close()

    return asyncio.run(main())


def started(path: Path) -> list[tuple[int, str]]:
    return [(int(pid), what) for pid, what in (line.split(" ", 1) for line in lines(str(path)))]


def test_two_pool_processes_run_two_tasks_at_once(workers: Workers, tmp_path: Path) -> None:
    import proj_pool as p

    signals = tmp_path / "signals"
    supervisor = workers.start(*POOL, app="proj_pool", env={"POOL_SIGNALS": str(signals)})
    path = tmp_path / "hold"
    # Each task waits for the other to start: they meet only if they run at once.
    results = [p.meet.delay(str(path), 2) for _ in range(2)]
    pids = {r.get(timeout=2 * T) for r in results}
    assert len(pids) == 2 and supervisor.proc.pid not in pids
    events = [what for _, what in started(path)]
    assert events[:2] == ["start", "start"] and "alone" not in events, events
    inits = {pid for pid, what in started(signals) if what == "worker_process_init"}
    assert pids <= inits  # worker_process_init fired in each pool process
    assert "2 pool processes" in supervisor.stdout
    assert supervisor.stop() == 0
    ends = {pid for pid, what in started(signals) if what == "worker_process_shutdown"}
    assert pids <= ends


def test_a_sigkilled_pool_process_hands_its_run_back_at_once(
    workers: Workers, tmp_path: Path
) -> None:
    import proj_pool as p

    # A long lease and a rare orphan scan: only the supervisor can requeue it quickly.
    workers.start(*POOL, "--lock-ttl", "120", "--orphan-scan-interval", "300", app="proj_pool")
    path = tmp_path / "hold"
    result = p.hold.delay(str(path), 1.0)
    wait_until(lambda: started(path), T, "the task to start")
    victim = started(path)[0][0]
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: len(started(path)) >= 2, T, "the task to start again")
    # Handed back by the supervisor: its 120 s lease did not have to lapse (generous for
    # a loaded machine, which may take seconds to start a pool process).
    assert time.monotonic() - killed < 25
    assert result.get(timeout=T) != victim
    assert [what for _, what in started(path)] == ["start", "start", "end"]  # once
    record = run_record(workers.broker, result.id)
    assert record is not None and record.recoveries == 1  # counts toward dead-lettering


def test_a_hard_time_limit_kills_the_pool_process_and_fails_the_task(
    workers: Workers, tmp_path: Path
) -> None:
    import proj_pool as p

    workers.start(*POOL, app="proj_pool")
    path = tmp_path / "stuck"
    result = p.stuck.delay(str(path))
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=T)
    events = started(path)
    killed = events[0][0]
    assert not alive(killed)
    # Killed in its second sleep (past the 1.5 s limit): it never wrote "survived", which
    # it would 5 s later, nor returned it.
    assert [what for _, what in events] == ["start", "soft"]
    after = tmp_path / "after"
    pids = {p.pid.delay(str(after)).get(timeout=T) for _ in range(4)}
    assert killed not in pids  # a fresh process replaced it


@pytest.mark.parametrize("kind", ["sqlite"])  # the store plays no part in it
def test_max_tasks_per_child_replaces_each_pool_process(workers: Workers, tmp_path: Path) -> None:
    import proj_pool as p

    supervisor = workers.start(*POOL, "--max-tasks-per-child", "2", app="proj_pool")
    path = tmp_path / "pids"
    pids = [p.pid.delay(str(path)).get(timeout=T) for _ in range(6)]
    assert len(set(pids)) >= 3  # two processes, two runs each, then replaced
    assert all(pids.count(pid) <= 2 for pid in set(pids))
    assert len(children_of(supervisor.proc.pid)) <= 3  # two, and one draining at most
    assert supervisor.stop() == 0


def test_a_store_restart_while_a_pool_process_is_replaced_keeps_the_pool(
    tmp_path: Path, proj_app: Any
) -> None:
    import proj_pool as p

    server = ValkeyProcess(persist=True)
    server.start()
    url = f"{server.url}/0?namespace=prefork"
    seen: set[int] = set()
    try:
        with proj_workers(url, tmp_path, proj_app) as workers:
            try:
                supervisor = workers.start(
                    "--pool", "prefork", "-c", "1", "--max-tasks-per-child", "1", app="proj_pool"
                )
                path = tmp_path / "pids"
                first = p.pid.delay(str(path)).get(timeout=T)
                wait_until(lambda: children_of(supervisor.proc.pid) - {first}, T, "a new child")
                server.kill()
                (current,) = children_of(supervisor.proc.pid) - {first} or {0}
                os.kill(current, signal.SIGKILL)  # replaced while the store is down
                wait_until(
                    lambda: children_of(supervisor.proc.pid) - {first, current}, T, "a new child"
                )
                time.sleep(2.0)  # the replacement waits for the store instead of exiting
                seen |= children_of(supervisor.proc.pid)
                assert supervisor.proc.poll() is None, supervisor.stderr
                assert "not starting another" not in supervisor.stderr
                server.start()
                assert p.pid.delay(str(path)).get(timeout=T) not in (first, current)
                assert supervisor.stop() == 0
            finally:
                for worker in workers.started:
                    seen |= children_of(worker.proc.pid)
                workers.kill_all()
    finally:
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        server.cleanup()


def run_worker(tmp_path: Path, *flags: str) -> Any:
    import subprocess

    from tests.compat.conftest import HERE, REPO_ROOT

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)]),
        "CELERY_BROKER_URL": f"sqlite:///{tmp_path / 'bad.db'}",
    }
    return subprocess.run(
        [*pyrula_command(), "worker", "-A", "proj_pool", *flags],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("value", ["0", "-2"])
def test_zero_concurrency_is_a_usage_error_before_anything_starts(
    tmp_path: Path, value: str
) -> None:
    ran = run_worker(tmp_path, "-c", value)
    assert ran.returncode == 2, ran.stderr
    assert f"-c/--concurrency {value}: give 1 or more" in ran.stderr
    assert "pyrula worker" not in ran.stdout and "supervisor" not in ran.stdout
    assert not (tmp_path / "bad.db").exists()  # nothing was stored


def test_an_unknown_pool_is_accepted_with_a_note(workers: Workers) -> None:
    worker: WorkerProcess = workers.start("--pool", "gevent", "-c", "4", app="proj_pool")
    assert "note: --pool gevent: not available in pyrula; the threads pool runs instead" in (
        worker.stderr
    )
    assert "up to 4 runs at once" in worker.stdout and "supervisor" not in worker.stdout
    assert worker.stop() == 0


@pytest.mark.parametrize("kind", ["sqlite"])
def test_autoscale_grows_the_pool_while_every_process_is_busy(
    workers: Workers, tmp_path: Path
) -> None:
    import proj_pool as p

    supervisor = workers.start("--pool", "prefork", "--autoscale", "2,1", app="proj_pool")
    assert "through 1 to 2 pool processes" in supervisor.stdout
    path = tmp_path / "hold"
    first = p.hold.delay(str(path), 3.0)
    wait_until(lambda: started(path), T, "the first task to start")
    second = p.hold.delay(str(path), 0.1)  # the only process is busy: a second one starts
    assert len({first.get(timeout=T), second.get(timeout=T)}) == 2
    assert [what for _, what in started(path)][:3] == ["start", "start", "end"]
    assert "autoscale: every pool process is busy; growing to 2" in supervisor.stderr
    assert supervisor.stop() == 0
