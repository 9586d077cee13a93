"""``pyrula beat`` as real processes: Celery's beat service on pyrula.

A beat fires the app's ``beat_schedule`` (``proj_beat``: one entry every second) and a
``pyrula worker`` executes the runs; two beats at once fire each slot once; a beat is no
worker (``pyrula status`` does not list it); a stop signal ends it with exit 0; without
an app it fires the stored schedules of the default store. Every process is stopped by
its PID.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.workflows import RunRecord, Schedule, open_store
from tests.compat.conftest import (
    HERE,
    REPO_ROOT,
    WorkerProcess,
    Workers,
    broker_url,
    lines,
    pyrula_command,
    wait_until,
)

pytestmark = pytest.mark.slow
T = 30.0
TICK = "proj_beat.tick"


class Beats:
    """``pyrula beat`` processes; the ones still alive are killed by PID at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[WorkerProcess] = []

    def start(self, *args: str, cwd: Path = HERE, env: dict[str, str] | None = None) -> Beat:
        n = len(self.started)
        out, err = self.tmp / f"beat{n}.out", self.tmp / f"beat{n}.err"
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])}
        for name in ("PYRULA_STORE_URL", "CELERY_BROKER_URL"):
            environment.pop(name, None)
        environment.update(env or {})
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                [*pyrula_command(), *args],
                cwd=cwd, env=environment, stdout=stdout, stderr=stderr,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        beat = Beat(proc, out, err)
        self.started.append(beat)
        wait_until(lambda: "pyrula beat" in beat.stdout or proc.poll() is not None, T, "beat")
        assert proc.poll() is None, f"beat exited {proc.returncode}:\n{beat.stderr}"
        return beat

    def kill_all(self) -> None:
        for beat in self.started:
            beat.kill()


class Beat(WorkerProcess):
    @property
    def beat_id(self) -> str:
        """From the banner: ``pyrula beat <id> (pid ...``."""
        return self.stdout.split()[2]

    def signal_stop(self, signum: int) -> int:
        os.kill(self.proc.pid, signum)
        return self.proc.wait(T)


@pytest.fixture
def beats(tmp_path: Path) -> Iterator[Beats]:
    group = Beats(tmp_path)
    try:
        yield group
    finally:
        group.kill_all()


def stored_runs(url: str, workflow: str | None = None) -> list[RunRecord]:
    async def read() -> list[RunRecord]:
        store = open_store(url)
        try:
            return await store.list_runs(workflow=workflow, limit=1000)
        finally:
            await store.close()

    return asyncio.run(read())


def status(url: str, cwd: Path, *store: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYRULA_STORE_URL"}
    return subprocess.run(
        [*pyrula_command(), "status", *store],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=T, check=False,
    )  # fmt: skip


def test_beat_fires_the_apps_schedule_and_a_worker_runs_it(beats: Beats, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'beat.db'}"
    ticks, recorded = tmp_path / "ticks", tmp_path / "signals"
    env = {"CELERY_BROKER_URL": url, "BEAT_TICKS": str(ticks), "BEAT_SIGNALS": str(recorded)}
    schedule_file = str(tmp_path / "celerybeat-schedule")
    beat = beats.start(
        "beat", "-A", "proj_beat", "-l", "info", "--max-interval", "5",
        "-S", "django_celery_beat.schedulers:DatabaseScheduler", "-s", schedule_file, env=env,
    )  # fmt: skip
    workers = Workers(tmp_path, url)
    try:
        worker = workers.start(app="proj_beat", env=env)
        wait_until(lambda: len(lines(str(ticks))) >= 2, T, "two ticks run by the worker")
        assert {line.split()[1] for line in lines(str(ticks))} == {"tick-every-1s"}

        listed = status(url, tmp_path, "--store", url)
        assert listed.returncode == 0, listed.stderr
        assert "1 node online" in listed.stdout
        assert beat.beat_id not in listed.stdout  # the beat is not a worker
        assert beat.stop() == 0  # SIGTERM
        assert worker.stop() == 0
    finally:
        workers.kill_all()

    assert "serving no runs" in beat.stdout
    assert "note: -S accepted, no effect" in beat.stderr
    assert "note: -s accepted, no effect" in beat.stderr
    assert "beat: Starting..." in beat.stderr and "stopped" in beat.stderr
    sent = [json.loads(line) for line in lines(str(recorded))]
    beat_pid = beat.proc.pid
    assert [s for s in sent if s["signal"] == "beat_init"] == [
        {
            "signal": "beat_init",
            "pid": beat_pid,
            "sender": "BeatService",
            "app": "proj_beat",
            "max_interval": 5.0,
            "scheduler_cls": "django_celery_beat.schedulers:DatabaseScheduler",
            "schedule_filename": schedule_file,
        }
    ]
    # Celery's beat sends no worker signal; the worker does.
    assert [s["pid"] for s in sent if s["signal"] == "worker_init"] == [worker.proc.pid]
    assert not Path(schedule_file).exists()


@pytest.mark.parametrize("kind", ["sqlite", "valkey"])
def test_two_beats_fire_each_slot_once(
    beats: Beats, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    url = broker_url(kind, tmp_path, request)
    env = {"CELERY_BROKER_URL": url}
    first = beats.start("beat", "-A", "proj_beat", env=env)
    second = beats.start("-A", "proj_beat", "beat", env=env)  # Celery's order
    wait_until(lambda: len(stored_runs(url, TICK)) >= 3, T, "three slots fired")
    assert first.signal_stop(signal.SIGTERM) == 0
    assert second.signal_stop(signal.SIGINT) == 0

    runs = stored_runs(url, TICK)  # no worker: every fired run is still queued
    keys = [run.idempotency_key or "" for run in runs]
    assert all(key.startswith("schedule:tick-every-1s:") for key in keys), keys
    slots = sorted(float(key.rsplit(":", 1)[1]) for key in keys)
    assert len(set(slots)) == len(slots), slots  # one run per slot
    assert all(b - a > 0.9 for a, b in itertools.pairwise(slots)), slots
    fired = (first.stderr + second.stderr).count("schedule tick-every-1s fired slot")
    # Each logged fire made its own run (a fire cut off by its beat's stop has made its
    # run but logs nothing: at most one per beat).
    assert len(runs) - 2 <= fired <= len(runs), (fired, len(runs))
    assert "firing the schedules" in first.stderr and "firing the schedules" in second.stderr


def test_without_an_app_it_fires_the_default_stores_schedules(beats: Beats, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pyrula.db'}"  # the default store, in the cwd

    async def create() -> None:
        store = open_store(url)
        try:
            every = Schedule.create("reports.nightly", schedule_id="every-second", every=1)
            await store.create_schedule(every.to_record(await store.now()))
        finally:
            await store.close()

    asyncio.run(create())
    beat = beats.start("beat", cwd=tmp_path)
    assert "pyrula.db" in beat.stdout
    wait_until(lambda: stored_runs(url, "reports.nightly"), T, "a fired run")
    listed = status(url, tmp_path)  # the default store too
    assert listed.returncode == 69 and "No nodes replied" in listed.stderr
    assert beat.signal_stop(signal.SIGINT) == 0


def test_a_django_projects_beat_service_starts_and_stops(beats: Beats, tmp_path: Path) -> None:
    pytest.importorskip("django")
    broker = f"sqlite:///{tmp_path / 'dj.db'}"
    env = {"DJPROJ_BROKER": broker, "DJPROJ_DB": str(tmp_path / "django.sqlite3")}
    scheduler = "django_celery_beat.schedulers:DatabaseScheduler"  # docs/django.md's line
    beat = beats.start("beat", "-A", "djproj", "-l", "info", "--scheduler", scheduler, env=env)
    assert "dj.db" in beat.stdout
    assert beat.stop() == 0
    assert "beat_scheduler=" in beat.stderr and "ignored" in beat.stderr  # the setting's note
    assert "note: -S accepted, no effect" in beat.stderr  # the flag's
    assert "beat: Starting..." in beat.stderr


def test_a_detached_beat_with_celerys_daemon_and_broker_flags(tmp_path: Path) -> None:
    """``celery -A proj beat --detach -b URL --pidfile F --logfile L`` as a deployment
    script gives it: the foreground returns 0, the background beat fires until SIGTERM
    (sent to the pid in the pid file), then removes the pid file."""
    url = f"sqlite:///{tmp_path / 'detached.db'}"
    pidfile, logfile = tmp_path / "beat.pid", tmp_path / "beat.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PYRULA_STORE_URL",)}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO_ROOT)])
    env["CELERY_BROKER_URL"] = "sqlite:///not-this-one.db"  # -b wins, as in Celery
    foreground = subprocess.run(
        [*pyrula_command(), "-A", "proj_beat", "beat", "-b", url, "--detach",
         "--pidfile", str(pidfile), "--logfile", str(logfile), "--workdir", str(HERE)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=T, check=False,
    )  # fmt: skip
    assert foreground.returncode == 0, foreground.stderr
    assert "started in the background" in foreground.stdout
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), T, "the pid file")
    pid = int(pidfile.read_text())
    try:
        wait_until(lambda: stored_runs(url, TICK), T, "a slot fired by the detached beat")
    finally:
        os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not pidfile.exists(), T, "the pid file removed at exit")
    log = logfile.read_text()
    assert "beat: Starting..." in log and "stopped" in log
    assert not (HERE / "not-this-one.db").exists()
