"""``pyrula migrate beat``: django-celery-beat's tables (a real SQLite database, written by
real django-celery-beat on Celery 5.7) and celery-redbeat's keys (on a real
valkey-server, written by real redbeat) imported as stored schedules; a second import
changes nothing; ``pyrula worker -A`` fires them; the shelve file is refused."""

from __future__ import annotations

import asyncio
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import open_store
from pyrula.workflows.records import ScheduleRecord
from tests.archive.postgres import empty_dsn, postgres_dsn  # noqa: F401  (fixtures)
from tests.compat.conftest import pyrula_command, wait_until
from tests.compat.migrating.move import APP, Move

pytestmark = pytest.mark.slow

SETTINGS = "tests.compat.migrating.beat_settings"


@pytest.fixture
def move(tmp_path: Path, valkey_server: Any) -> Iterator[Move]:
    moving = Move(tmp_path, valkey_server.url)
    try:
        yield moving
    finally:
        moving.close()


def beat(move: Move, *flags: str, pg: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**move.env("pyrula"), "MIGRATE_DB": str(move.tmp / "beat.db")}
    if pg is not None:
        env["MIGRATE_PG_DSN"] = pg
    return subprocess.run(
        [*pyrula_command(), "migrate", "beat", "-A", APP, *flags],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def schedules(move: Move) -> dict[str, ScheduleRecord]:
    async def read() -> dict[str, ScheduleRecord]:
        store = open_store(move.store)
        await store.open()
        try:
            return {record.schedule_id: record for record in await store.list_schedules()}
        finally:
            await store.close()

    return asyncio.run(read())


DJANGO_BEAT = """
import json, os
import django
from django.core.management import call_command
from django.utils import timezone
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.compat.migrating.beat_settings"
django.setup()
call_command("migrate", verbosity=0)
from django_celery_beat.models import (
    ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask, SolarSchedule)
every_second = IntervalSchedule.objects.create(every=1, period="seconds")
hourly = IntervalSchedule.objects.create(every=1, period="hours")
PeriodicTask.objects.create(name="tick", task="migrating.record", interval=every_second,
                            args=json.dumps(["tick"]), kwargs=json.dumps({"n": 1}),
                            expire_seconds=30)
cron = CrontabSchedule.objects.create(minute="*/5", hour="3", day_of_week="1-5",
                                      timezone="Europe/Paris")
PeriodicTask.objects.create(name="weekday-night", task="migrating.add", crontab=cron,
                            args=json.dumps([2, 3]))
PeriodicTask.objects.create(name="paused", task="migrating.record", interval=hourly,
                            args=json.dumps(["paused"]), enabled=False)
clocked = ClockedSchedule.objects.create(clocked_time=timezone.now() + timedelta(seconds=2))
PeriodicTask.objects.create(name="once", task="migrating.record", clocked=clocked,
                            one_off=True, args=json.dumps(["once"]))
PeriodicTask.objects.create(name="done-once", task="migrating.record", interval=hourly,
                            one_off=True, last_run_at=timezone.now() - timedelta(hours=1))
sun = SolarSchedule.objects.create(event="sunrise", latitude=48.85, longitude=2.35)
PeriodicTask.objects.create(name="sun", task="migrating.record", solar=sun)
PeriodicTask.objects.create(name="ghost", task="migrating.nope", interval=hourly)
PeriodicTask.objects.create(name="over", task="migrating.record", interval=hourly,
                            expires=timezone.now() - timedelta(days=1))
PeriodicTask.objects.create(name="ending", task="migrating.record", interval=hourly,
                            expires=timezone.now() + timedelta(days=1))
"""


@pytest.fixture(params=["sqlite", "postgres"])
def beat_db(request: pytest.FixtureRequest) -> str | None:
    """Where django-celery-beat's tables are: None for a SQLite file, else a Postgres DSN
    (a schema of the test's own)."""
    if request.param == "sqlite":
        return None
    dsn: str = request.getfixturevalue("empty_dsn")
    return dsn


def test_django_celery_beat_tasks_become_schedules_and_fire(
    move: Move, beat_db: str | None
) -> None:
    setup = f"import os\nos.environ['MIGRATE_DB'] = {str(move.tmp / 'beat.db')!r}\n"
    if beat_db is not None:
        setup += f"os.environ['MIGRATE_PG_DSN'] = {beat_db!r}\n"
    move.publish(setup + DJANGO_BEAT)
    first = beat(move, "--django-settings", SETTINGS, pg=beat_db)
    assert first.returncode == 0, first.stderr
    out = first.stdout
    assert "schedules written: 4, unchanged: 0, one-off runs: 1" in out, out
    assert "over: expired at" in out
    assert "note: ending: expires at" in out
    assert "one-off run queued: beat-once:once" in out
    assert "sun: solar schedules cannot be expressed" in out
    assert "ghost: the app has no task named 'migrating.nope'" in out
    assert "done-once: a one-off task that ran already" in out

    stored = schedules(move)
    assert set(stored) == {"tick", "weekday-night", "paused", "ending"}
    assert stored["tick"].every == 1.0 and stored["tick"].enabled
    assert stored["paused"].every == 3600.0 and not stored["paused"].enabled
    assert stored["weekday-night"].cron is not None
    minute, hour, _dom, _month, dow = stored["weekday-night"].cron.split()
    assert minute == ",".join(str(m) for m in range(0, 60, 5)) and hour == "3"
    assert dow == "1,2,3,4,5"
    assert stored["weekday-night"].timezone == "Europe/Paris"

    again = beat(move, "--django-settings", SETTINGS, pg=beat_db)
    assert again.returncode == 0, again.stderr
    assert "schedules written: 0, unchanged: 5, one-off runs: 0" in again.stdout, again.stdout
    assert schedules(move) == stored  # nothing moved, not even a phase

    worker = move.pyrula_worker()
    wait_until(
        lambda: Counter(r["value"]["tag"] for r in move.ran() if r["task"] == "record")["tick"] >= 2
        and any(r["id"] == "beat-once:once" for r in move.ran()),
        60, "the imported schedule and the one-off task ran",
    )  # fmt: skip
    move.stop(worker)
    ran = move.ran()
    assert [r["value"] for r in ran if r["id"] == "beat-once:once"] == [{"tag": "once"}]
    assert all(r["value"] == {"tag": "tick", "n": 1} for r in ran if r["id"] != "beat-once:once")


REDBEAT = """
from celery.schedules import crontab, schedule
from redbeat import RedBeatSchedulerEntry
app.conf.redbeat_redis_url = MIGRATE_URL
app.conf.redbeat_key_prefix = MIGRATE_REDBEAT_PREFIX
RedBeatSchedulerEntry("rb-tick", "migrating.record", schedule(timedelta(seconds=1)),
                      args=["rb"], app=app).save()
RedBeatSchedulerEntry("rb-cron", "migrating.add", crontab(minute="0", hour="*/2"),
                      args=[1, 2], app=app).save()
RedBeatSchedulerEntry("rb-off", "migrating.record", schedule(timedelta(minutes=5)),
                      args=["off"], enabled=False, app=app).save()
"""


def test_redbeat_entries_become_schedules(move: Move) -> None:
    prefix = move.prefix + "redbeat:"
    move.publish(f"MIGRATE_URL = {move.old!r}\nMIGRATE_REDBEAT_PREFIX = {prefix!r}\n" + REDBEAT)
    first = beat(move, "--redbeat-url", move.old, "--redbeat-key-prefix", prefix)
    assert first.returncode == 0, first.stderr
    assert "schedules written: 3, unchanged: 0" in first.stdout, first.stdout
    stored = schedules(move)
    assert set(stored) == {"rb-tick", "rb-cron", "rb-off"}
    assert stored["rb-tick"].every == 1.0 and not stored["rb-off"].enabled
    assert stored["rb-cron"].cron is not None
    assert stored["rb-cron"].cron.split()[:2] == ["0", ",".join(str(h) for h in range(0, 24, 2))]

    again = beat(move, "--redbeat-url", move.old, "--redbeat-key-prefix", prefix)
    assert "schedules written: 0, unchanged: 3" in again.stdout, again.stdout
    worker = move.pyrula_worker()
    wait_until(lambda: sum(r["value"] == {"tag": "rb"} for r in move.ran()) >= 2, 60, "rb-tick")
    move.stop(worker)


def test_the_shelve_file_is_refused(move: Move) -> None:
    done = beat(move, "--from-file", "celerybeat-schedule")
    assert done.returncode == 2
    assert "is Celery beat's shelve file (pickle): pyrula never unpickles it" in done.stderr
    assert "beat_schedule" in done.stderr
