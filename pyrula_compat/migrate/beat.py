"""Importing Celery beat schedules kept outside ``beat_schedule`` (``pyrula migrate beat``):
django-celery-beat's tables and celery-redbeat's keys, into stored schedules.

Each periodic task becomes a schedule whose fixed id is the entry's name, so a second
import changes nothing (an unchanged schedule is left alone: its phase does not move);
a one-off task (django-celery-beat's ``one_off`` or a clocked schedule) becomes one run at
its time, with a fixed id (``beat-once:<name>``), unless it ran already. Disabled entries
stay disabled (paused). An interval that ran before keeps its phase: its next slot is one
period after its last run. Imported schedules are not the app's ``beat_schedule``, so the
worker's beat sync never deletes them; they are managed with ``pyrula schedules``.

Reported, not imported: solar schedules (pyrula has none), tasks the app does not have,
entries that do not parse, and one-off tasks that ran already. Nothing here imports
django-celery-beat or redbeat (both need Celery): django-celery-beat's tables are read with
SQL through the Django project's database connection, redbeat's JSON from its keys.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pyrula.workflows import Schedule, Store
from pyrula_compat import codec
from pyrula_compat.schedules import crontab, schedule

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery

IMPORTED_HEADER = "pyrula_imported_from"
"""The header naming where an imported schedule came from (django-celery-beat, redbeat)."""
ONCE_PREFIX = "beat-once:"
PERIODS = {"days": 86400.0, "hours": 3600.0, "minutes": 60.0, "seconds": 1.0,
           "microseconds": 1e-6}  # fmt: skip
"""django-celery-beat's IntervalSchedule.period, in seconds."""


@dataclass(frozen=True)
class Solar:
    event: str
    latitude: float
    longitude: float


@dataclass(frozen=True)
class BeatEntry:
    """A periodic task as the old scheduler stored it."""

    name: str
    task: str
    source: str
    when: crontab | schedule | Solar | datetime
    """A crontab, an interval, a solar event, or a clocked time (one run)."""
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    timezone: str | None = None
    enabled: bool = True
    one_off: bool = False
    expire_seconds: float | None = None
    last_run_at: datetime | None = None
    until: datetime | None = None
    """django-celery-beat's ``expires``: no run after this time."""


@dataclass
class BeatReport:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    once: list[str] = field(default_factory=list)
    """One-off tasks queued as runs (their run ids)."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(entry name, why it was not imported)."""
    notes: list[tuple[str, str]] = field(default_factory=list)
    """(entry name, what was imported differently from the old scheduler)."""


# -- reading django-celery-beat ---------------------------------------------------------
DJANGO_QUERY = """
SELECT t.name, t.task, t.args, t.kwargs, t.expire_seconds, t.one_off, t.enabled,
       t.last_run_at, i.every, i.period, c.minute, c.hour, c.day_of_week, c.day_of_month,
       c.month_of_year, c.timezone, s.event, s.latitude, s.longitude, k.clocked_time,
       t.expires
FROM django_celery_beat_periodictask t
LEFT JOIN django_celery_beat_intervalschedule i ON t.interval_id = i.id
LEFT JOIN django_celery_beat_crontabschedule c ON t.crontab_id = c.id
LEFT JOIN django_celery_beat_solarschedule s ON t.solar_id = s.id
LEFT JOIN django_celery_beat_clockedschedule k ON t.clocked_id = k.id
ORDER BY t.name
"""


def read_django_celery_beat(rows: Iterable[Sequence[Any]]) -> tuple[list[BeatEntry], BeatReport]:
    """Entries from the rows of :data:`DJANGO_QUERY` (run it on the project's
    ``django.db.connection``); entries that do not parse are in the report."""
    report = BeatReport()
    entries = []
    for row in rows:
        (
            name,
            task,
            args,
            kwargs,
            expire_seconds,
            one_off,
            enabled,
            last_run_at,
            every,
            period,
            minute,
            hour,
            dow,
            dom,
            moy,
            tz,
            event,
            lat,
            lon,
            clocked,
            until,
        ) = row
        try:
            when: crontab | schedule | Solar | datetime
            if every is not None:
                when = schedule(timedelta(seconds=float(every) * PERIODS[str(period)]))
            elif minute is not None:
                when = crontab(minute=minute, hour=hour, day_of_week=dow, day_of_month=dom,
                               month_of_year=moy)  # fmt: skip
            elif event is not None:
                when = Solar(str(event), float(Decimal(lat)), float(Decimal(lon)))
            elif clocked is not None:
                when = _datetime(clocked)
            else:
                raise ValueError("no schedule (interval, crontab, solar or clocked)")
            entries.append(BeatEntry(
                name=str(name), task=str(task), source="django-celery-beat", when=when,
                args=_json(args, list), kwargs=_json(kwargs, dict),
                timezone=str(tz) if tz else None, enabled=bool(enabled), one_off=bool(one_off),
                expire_seconds=float(expire_seconds) if expire_seconds else None,
                last_run_at=_datetime(last_run_at) if last_run_at else None,
                until=_datetime(until) if until else None,
            ))  # fmt: skip
        except (ValueError, TypeError, KeyError, ArithmeticError) as exc:
            report.skipped.append((str(name), f"does not parse: {exc}"))
    return entries, report


def _json(text: Any, kind: type) -> Any:
    value = json.loads(text) if isinstance(text, str) and text.strip() else kind()
    if not isinstance(value, kind):
        raise ValueError(f"{text!r} is not a JSON {kind.__name__}")
    return value


def _datetime(value: Any) -> datetime:
    """A database or redbeat time as an aware datetime (a naive one is UTC, as Django
    stores times with ``USE_TZ``)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise TypeError(f"not a time: {value!r}")
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


# -- reading redbeat --------------------------------------------------------------------
def read_redbeat(client: Any, key_prefix: str = "redbeat:") -> tuple[list[BeatEntry], BeatReport]:
    """Entries from celery-redbeat's keys (``<prefix><name>`` hashes holding ``definition``
    and ``meta`` JSON), read with a valkey-py client."""
    report = BeatReport()
    entries = []
    internal = {key_prefix + ":schedule", key_prefix + ":statics", key_prefix + ":lock"}
    for key in sorted(client.scan_iter(match=_glob(key_prefix) + "*")):
        text = key.decode()
        if text in internal or client.type(key) != b"hash":
            continue
        name = text[len(key_prefix) :]
        try:
            definition = json.loads(client.hget(key, "definition") or b"{}")
            meta = json.loads(client.hget(key, "meta") or b"{}")
            entries.append(_redbeat_entry(name, definition, meta))
        except (ValueError, TypeError, KeyError) as exc:
            report.skipped.append((name, f"does not parse: {exc}"))
    return entries, report


def _redbeat_entry(name: str, definition: dict[str, Any], meta: dict[str, Any]) -> BeatEntry:
    when_data = definition["schedule"]
    kind = when_data.get("__type__")
    when: crontab | schedule
    if kind == "interval":
        when = schedule(timedelta(seconds=float(when_data["every"])))
    elif kind == "crontab":
        when = crontab(**{k: v for k, v in when_data.items() if k != "__type__"})
    else:
        raise ValueError(f"a {kind} schedule cannot be expressed as a pyrula schedule")
    last = meta.get("last_run_at")
    options = definition.get("options") or {}
    expires = options.get("expires")
    return BeatEntry(
        name=str(definition.get("name") or name), task=str(definition["task"]),
        source="redbeat", when=when, args=list(definition.get("args") or []),
        kwargs=dict(definition.get("kwargs") or {}),
        enabled=bool(definition.get("enabled", True)),
        expire_seconds=float(expires) if isinstance(expires, (int, float)) else None,
        last_run_at=_redbeat_time(last) if isinstance(last, dict) else None,
    )  # fmt: skip


def _redbeat_time(data: dict[str, Any]) -> datetime:
    """redbeat's time: its fields, and a zone name or a UTC offset in seconds."""
    from zoneinfo import ZoneInfo

    zone = data.get("timezone", "UTC")
    tz = ZoneInfo(zone) if isinstance(zone, str) else timezone(timedelta(seconds=float(zone)))
    fields = {k: int(data[k]) for k in ("year", "month", "day", "hour", "minute", "second")}
    return datetime(**fields, microsecond=int(data.get("microsecond", 0)), tzinfo=tz)


def _glob(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


# -- importing --------------------------------------------------------------------------
def params_of(entry: BeatEntry) -> dict[str, Any]:
    """The params each run of the entry's task gets, as a beat_schedule entry's do."""
    params: dict[str, Any] = {
        "args": codec.to_json(list(entry.args)),
        "kwargs": codec.to_json(dict(entry.kwargs)),
        "headers": {"periodic_task_name": entry.name, IMPORTED_HEADER: entry.source},
    }
    if entry.expire_seconds is not None:
        params["expires_in"] = entry.expire_seconds
    return params


def _unchanged(record: Any, wanted: Schedule) -> bool:
    current = Schedule.from_record(record)
    return (
        current.workflow == wanted.workflow and dict(current.params) == dict(wanted.params)
        and current.cron == wanted.cron and current.every == wanted.every
        and current.timezone == wanted.timezone and record.enabled == wanted.enabled
    )  # fmt: skip


async def import_schedules(
    app: Celery, store: Store, entries: Iterable[BeatEntry], report: BeatReport
) -> list[BeatEntry]:
    """Write the periodic entries as schedules; return the one-off entries (runs to
    queue with :func:`queue_once`)."""
    known = set(app.tasks.keys())
    default_tz = app.timezone_name()
    once = []
    for entry in entries:
        if entry.task not in known:
            report.skipped.append((entry.name, f"the app has no task named {entry.task!r}"))
            continue
        if isinstance(entry.when, Solar):
            report.skipped.append((entry.name, "solar schedules cannot be expressed in pyrula; "
                                   "use a crontab at the local time you want"))  # fmt: skip
            continue
        if entry.until is not None and entry.until <= datetime.now(UTC):
            report.skipped.append((entry.name, f"expired at {entry.until.isoformat()}"))
            continue
        if isinstance(entry.when, datetime) or entry.one_off:
            once.append(entry)
            continue
        if entry.until is not None:
            report.notes.append((entry.name, f"expires at {entry.until.isoformat()}: a pyrula "
                                 "schedule has no end date; delete it then"))  # fmt: skip
        wanted = entry.when.schedule_for(entry.task, params_of(entry), entry.name,
                                         entry.timezone or default_tz)  # fmt: skip
        wanted = replace(wanted, enabled=entry.enabled)
        existing = await store.get_schedule(entry.name)
        if existing is not None and _unchanged(existing, wanted):
            report.unchanged.append(entry.name)
            continue
        now = await store.now()
        record = wanted.to_record(now)
        if entry.last_run_at is not None:
            last = entry.last_run_at.timestamp()
            record = replace(record, last_fire_at=last)
            if wanted.every is not None:  # keep the interval's phase
                record = replace(record, next_fire_at=max(now, last + wanted.every))
        await store.create_schedule(record, replace=True)
        report.written.append(entry.name)
    return once


def queue_once(app: Celery, entries: Iterable[BeatEntry], report: BeatReport) -> None:
    """One run for each one-off entry that has not run, at its time (a clocked time, or
    its schedule's next slot), with a fixed id so a second import finds it."""
    from pyrula_compat import calling

    for entry in entries:
        if entry.last_run_at is not None:
            report.skipped.append((entry.name, f"a one-off task that ran already "
                                   f"({entry.last_run_at.isoformat()})"))  # fmt: skip
            continue
        if not entry.enabled:
            report.skipped.append((entry.name, "a disabled one-off task"))
            continue
        when = entry.when
        if not isinstance(when, datetime):
            assert not isinstance(when, Solar)
            tz = entry.timezone or app.timezone_name()
            slot = when.schedule_for(entry.task, {}, entry.name, tz).next_slot_after(
                datetime.now(UTC).timestamp()
            )
            when = datetime.fromtimestamp(slot, UTC)
        params = params_of(entry)
        options: dict[str, Any] = {"eta": when, "headers": params["headers"]}
        if entry.expire_seconds is not None:
            options["expires"] = when + timedelta(seconds=entry.expire_seconds)
        run_id = ONCE_PREFIX + entry.name
        if app.client().get_run(run_id) is not None:
            report.unchanged.append(entry.name)
            continue
        calling.submit(app, entry.task, entry.args, entry.kwargs, task_id=run_id, options=options)
        report.once.append(run_id)
