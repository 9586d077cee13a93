"""The machine's local time zone, for ``enable_utc=False`` without a ``timezone``.

Celery asks ``tzlocal`` then; this does what it does without the dependency, and never
raises for a ``TZ`` the C library takes:

1. ``$TZ`` naming a zone (``Asia/Tokyo``, ``:Asia/Tokyo``) or a zone file
   (``/usr/share/zoneinfo/Asia/Tokyo``, ``:/etc/localtime``): that zone;
2. any other ``$TZ`` (a POSIX rule such as ``JST-9`` or ``CET-1CEST,M3.5.0,M10.5.0/3``)
   and no ``$TZ`` with an ``/etc/localtime`` that is no link into a zoneinfo tree:
   :class:`LocalTimezone`, the offsets the C library applies (``time.localtime()``),
   daylight saving time included, as Celery's own fallback;
3. no ``$TZ``: the zone ``/etc/localtime`` links to (``Europe/Paris``).
"""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

log = logging.getLogger("pyrula_compat")

LOCALTIME = "/etc/localtime"
"""The system's zone file (a link into a zoneinfo tree on most systems)."""


class LocalTimezone(tzinfo):
    """The C library's local time (``$TZ`` or ``/etc/localtime`` as it read them at
    start-up, or at the last ``time.tzset()``), with its daylight saving time."""

    def utcoffset(self, dt: datetime | None) -> timedelta:
        return timedelta(seconds=self._local(dt).tm_gmtoff)

    def dst(self, dt: datetime | None) -> timedelta:
        local = self._local(dt)
        if local.tm_isdst <= 0:
            return timedelta(0)
        return timedelta(seconds=local.tm_gmtoff + time.timezone)

    def tzname(self, dt: datetime | None) -> str:
        return self._local(dt).tm_zone

    def fromutc(self, dt: datetime) -> datetime:
        if dt.tzinfo is not self:
            raise ValueError("fromutc: dt.tzinfo is not self")
        seconds = dt.replace(tzinfo=UTC).timestamp()
        offset = time.localtime(seconds).tm_gmtoff
        return (dt + timedelta(seconds=offset)).replace(tzinfo=self)

    def _local(self, dt: datetime | None) -> time.struct_time:
        if dt is None:
            return time.localtime()
        naive = dt.replace(tzinfo=None)
        stamp = time.mktime((*naive.timetuple()[:8], -1))  # the C library decides DST
        return time.localtime(stamp)

    def __repr__(self) -> str:
        hours = time.localtime().tm_gmtoff / 3600
        return f"<LocalTimezone: UTC{hours:+g}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalTimezone)

    def __hash__(self) -> int:
        return hash(LocalTimezone)


def _zone(key: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(key)
    except (KeyError, ValueError, OSError):  # not found (a KeyError), a bad key, a folder
        return None


def _zone_of_path(path: str) -> ZoneInfo | None:
    """The zone a zone file is, named by its place in a zoneinfo tree (following links
    until one is)."""
    seen: set[str] = set()
    while path not in seen:
        seen.add(path)
        _, found, key = path.partition("/zoneinfo/")
        zone = _zone(key) if found and key else None
        if zone is not None:
            return zone
        if not os.path.islink(path):
            break
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    return None


def local_zone() -> tzinfo:
    """The machine's local time zone (see the module's doc); never raises."""
    value = os.environ.get("TZ")
    if value is not None:
        name = value[1:] if value.startswith(":") else value
        if not name:
            return ZoneInfo("UTC")  # an empty TZ is UTC to the C library
        zone = _zone_of_path(name) if os.path.isabs(name) else _zone(name)
        return zone if zone is not None else LocalTimezone()
    zone = _zone_of_path(LOCALTIME) if os.path.islink(LOCALTIME) else None
    return zone if zone is not None else LocalTimezone()


def zone_name(zone: tzinfo) -> str:
    """A name ``zoneinfo`` takes for ``zone`` (the crontab schedules' time zone): its key,
    else the ``Etc/GMT`` zone of its current offset (no daylight saving time), else
    ``UTC`` for an offset of no whole hours (logged)."""
    key = getattr(zone, "key", None)
    if isinstance(key, str) and key:
        return key
    offset = zone.utcoffset(datetime.now())
    hours, rest = divmod(int(offset.total_seconds()) if offset else 0, 3600)
    if rest:
        log.warning("local time zone %r: no zone name for its offset; crontabs read UTC", zone)
        return "UTC"
    return f"Etc/GMT{-hours:+d}" if hours else "UTC"  # Etc/GMT-9 is nine hours ahead


__all__ = ["LOCALTIME", "LocalTimezone", "local_zone", "zone_name"]
