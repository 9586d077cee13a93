"""Beat without beat: ``app.conf.beat_schedule`` as stored schedules.

Each entry becomes a pyrula schedule whose fixed id is the entry's key, firing its task
with the entry's ``args`` and ``kwargs``. ``pyrula worker -A proj`` syncs them when it
starts: a new or changed entry is written, an unchanged one left alone (so restarting
workers does not shift an interval's phase), and a schedule an entry of this app made
whose entry is gone is deleted. The runs carry Celery beat's ``periodic_task_name``
header, and the app's name beside it, which is how a sync knows which stored schedules
are its own (a schedule made with ``pyrula schedules`` or by another app is never
touched). Every worker fires schedules and the store lets each slot fire once, so no
separate beat process is needed and nothing fires twice; ``pyrula beat -A proj`` (a
scheduler-only process, for deployments that keep their beat service) syncs them too.
An entry's ``options`` apply where they mean something: ``expires`` (seconds or a
datetime) drops a fired run that has not started in time; routing options are ignored.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyrula.workflows import Schedule, Store
from pyrula.workflows.errors import InvalidSchedule
from pyrula_compat import codec
from pyrula_compat.exceptions import ImproperlyConfigured
from pyrula_compat.schedules import crontab, maybe_schedule, schedule, solar

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery

log = logging.getLogger("pyrula_compat.beat")


BEAT_APP_HEADER = "pyrula_beat_app"
"""The header naming the app whose ``beat_schedule`` made a schedule's runs."""
SCHEDULER_NOTE = (
    "pyrula stores beat_schedule entries as schedules and every worker fires them "
    "(manage them with `pyrula schedules`)"
)
"""Why a Celery beat scheduler class (``beat_scheduler``, ``pyrula beat -S``) is ignored."""
DEFAULT_SCHEDULERS = ("celery.beat:PersistentScheduler", "celery.beat.PersistentScheduler")
"""Celery's default ``beat_scheduler`` (the setting's default): nothing to warn about."""


def _params(app: Celery, key: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {
        "args": codec.to_json(list(entry.get("args") or ())),
        "kwargs": codec.to_json(dict(entry.get("kwargs") or {})),
        "headers": {"periodic_task_name": key, BEAT_APP_HEADER: app.main or ""},
    }
    expires = (entry.get("options") or {}).get("expires")
    if isinstance(expires, timedelta):
        expires = expires.total_seconds()
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        params["expires_in"] = float(expires)
    elif isinstance(expires, datetime):
        params["expires_in"] = None
        log.warning("beat entry expires=%r: an absolute expiry is ignored for a schedule", expires)
    return params


def schedules_of(app: Celery) -> list[Schedule]:
    """The app's beat entries as pyrula schedules. An entry that cannot work (no task, a
    schedule of no known type, every 0 s or a negative or NaN number of seconds) raises
    :class:`ImproperlyConfigured` naming the entry and the setting: one line that
    ``pyrula worker -A`` and ``pyrula beat -A`` show as they stop."""
    tz = app.timezone_name()
    out: list[Schedule] = []
    for key, entry in dict(app.conf.beat_schedule or {}).items():
        where = f"beat_schedule[{key!r}]"
        if not isinstance(entry, Mapping):
            raise ImproperlyConfigured(
                f"{where}: an entry is a dict with 'task' and 'schedule', got {entry!r}"
            )
        task = entry.get("task")
        if not isinstance(task, str) or not task:
            raise ImproperlyConfigured(f"{where} names no task")
        try:
            when = maybe_schedule(entry.get("schedule"))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ImproperlyConfigured(
                f"{where}: schedule {entry.get('schedule')!r}: {exc}"
            ) from None
        params = {k: v for k, v in _params(app, str(key), entry).items() if v is not None}
        if isinstance(when, solar):
            raise ImproperlyConfigured(
                f"{where}: solar schedules are not supported by pyrula; "
                "use a crontab at the local time you want"
            )
        if not isinstance(when, (crontab, schedule)):
            raise ImproperlyConfigured(
                f"{where}: schedule {when!r} is not a crontab, a schedule, "
                "a timedelta or a number of seconds"
            )
        try:
            out.append(when.schedule_for(task, params, str(key), tz))
        except (InvalidSchedule, ValueError, TypeError) as exc:
            raise ImproperlyConfigured(f"{where}: schedule {when!r}: {exc}") from None
    return out


def _same(record: Any, wanted: Schedule) -> bool:
    current = Schedule.from_record(record)
    return (
        current.workflow == wanted.workflow
        and dict(current.params) == dict(wanted.params)
        and current.cron == wanted.cron
        and current.every == wanted.every
        and current.timezone == wanted.timezone
        and current.overlap == wanted.overlap
        and record.enabled
    )


async def sync_schedules(app: Celery, store: Store) -> list[str]:
    """Write the app's beat entries to ``store``; return the ids written."""
    scheduler = app.conf.get("beat_scheduler")
    if scheduler and scheduler not in DEFAULT_SCHEDULERS:
        log.warning("beat_scheduler=%r ignored: %s", scheduler, SCHEDULER_NOTE)
    written: list[str] = []
    wanted_ids: set[str] = set()
    for wanted in schedules_of(app):
        wanted_ids.add(wanted.schedule_id)
        existing = await store.get_schedule(wanted.schedule_id)
        if existing is not None and _same(existing, wanted):
            continue
        now = await store.now()
        await store.create_schedule(wanted.to_record(now), replace=True)
        written.append(wanted.schedule_id)
    if written:
        log.info("beat schedule synced: %s", ", ".join(written))
    removed = []
    for record in await store.list_schedules():
        gone = record.schedule_id not in wanted_ids and _made_by(app, record.params)
        if gone and await store.delete_schedule(record.schedule_id):
            removed.append(record.schedule_id)
    if removed:
        log.info("beat entries gone from beat_schedule, schedules deleted: %s", ", ".join(removed))
    return written


def _made_by(app: Celery, params: str) -> bool:
    """Whether a stored schedule's params are those of an entry of ``app``'s beat_schedule."""
    try:
        headers = json.loads(params).get("headers")
    except (ValueError, AttributeError):
        return False
    return (
        isinstance(headers, dict)
        and "periodic_task_name" in headers
        and headers.get(BEAT_APP_HEADER) == (app.main or "")
    )
