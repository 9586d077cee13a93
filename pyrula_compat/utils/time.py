"""``celery.utils.time``: dates, intervals and time zones, as Celery 5.7 has them.

Built on the standard library: ``zoneinfo`` zones, ``datetime.fromisoformat`` for
``maybe_iso8601`` (Python 3.11's, which reads the ISO 8601 forms Celery writes), and
the shim's own :class:`LocalTimezone` / local zone lookup where Celery uses
``tzlocal``. A wall time that a daylight-saving change makes ambiguous takes its
earlier instant and one that it skips moves forward past the gap, as in Celery.
"""

from __future__ import annotations

import numbers
import random
import time as _time
from calendar import monthrange
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta, tzinfo
from functools import cached_property
from types import ModuleType
from typing import Any
from zoneinfo import ZoneInfo

from pyrula_compat.app.localtz import LocalTimezone, local_zone
from pyrula_compat.utils.functional import dictfilter

__all__ = [
    "LocalTimezone",
    "add_seconds_to_datetime",
    "adjust_timestamp",
    "delta_resolution",
    "ffwd",
    "get_exponential_backoff_interval",
    "humanize_seconds",
    "is_naive",
    "localize",
    "make_aware",
    "maybe_iso8601",
    "maybe_make_aware",
    "maybe_timedelta",
    "rate",
    "remaining",
    "subtract_datetimes",
    "timezone",
    "to_utc",
    "utcoffset",
    "weekday",
]

DAYNAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
WEEKDAYS = dict(zip(DAYNAMES, range(7), strict=True))
RATE_MODIFIER_MAP: dict[str, Callable[[float], float]] = {
    "s": lambda n: n,
    "m": lambda n: n / 60.0,
    "h": lambda n: n / 3600.0,
}
TIME_UNITS = (("day", 86400.0), ("hour", 3600.0), ("minute", 60.0), ("second", 1.0))


class _Zone:
    """``timezone``: the app-independent time zone helpers (``timezone.utc``,
    ``timezone.local``, ``to_local``, ``get_timezone``...)."""

    def tz_or_local(self, tzinfo: tzinfo | str | None = None) -> tzinfo:
        """``tzinfo`` (a name is looked up), or the local zone when it is ``None``."""
        return self.local if tzinfo is None else self.get_timezone(tzinfo)

    def to_local(
        self, dt: datetime, local: tzinfo | str | None = None, orig: tzinfo | None = None
    ) -> datetime:
        """``dt`` in ``local`` (default: the local zone); a naive ``dt`` is read in
        ``orig`` (default UTC)."""
        if is_naive(dt):
            dt = make_aware(dt, orig or self.utc)
        return localize(dt, self.tz_or_local(local))

    def to_system(self, dt: datetime) -> datetime:
        """``dt`` in the system's zone."""
        return dt.astimezone(tz=None)

    def to_local_fallback(self, dt: datetime) -> datetime:
        """``dt`` in the local zone (a naive ``dt`` is read as local time)."""
        if is_naive(dt):
            return make_aware(dt, self.local)
        return localize(dt, self.local)

    def get_timezone(self, zone: str | tzinfo) -> tzinfo:
        """The ``ZoneInfo`` of a zone name; a ``tzinfo`` as it is."""
        return ZoneInfo(zone) if isinstance(zone, str) else zone

    @cached_property
    def local(self) -> tzinfo:
        """The machine's local zone."""
        return local_zone()

    @cached_property
    def utc(self) -> tzinfo:
        return ZoneInfo("UTC")


timezone = _Zone()


def maybe_timedelta(delta: Any) -> Any:
    """A number of seconds as a ``timedelta``; anything else as it is."""
    if isinstance(delta, numbers.Real):
        return timedelta(seconds=float(delta))
    return delta


def delta_resolution(dt: datetime, delta: timedelta) -> datetime:
    """``dt`` cut to the resolution of ``delta``: to the day for a delta of a day or
    more, to the hour for an hour or more, to the minute for a minute or more."""
    seconds = max(delta.total_seconds(), 0)
    if seconds >= 86400:
        return dt.replace(hour=0, minute=0, second=0, microsecond=0)
    if seconds >= 3600:
        return dt.replace(minute=0, second=0, microsecond=0)
    if seconds >= 60:
        return dt.replace(second=0, microsecond=0)
    return dt


def remaining(
    start: datetime,
    ends_in: timedelta | ffwd,
    now: datetime | None = None,
    relative: bool = False,
) -> timedelta:
    """How long from ``now`` (default: the current UTC time) until ``start + ends_in``;
    with ``relative``, the end is cut to ``ends_in``'s resolution (``delta_resolution``)
    but never to or before ``start``."""
    now = now or datetime.now(UTC)
    if isinstance(ends_in, timedelta):
        end = add_seconds_to_datetime(start, ends_in.total_seconds())
    else:
        end = start + ends_in
    if relative and isinstance(ends_in, timedelta):
        rounded = delta_resolution(end, ends_in).replace(microsecond=0)
        end = rounded if maybe_make_aware(rounded) > maybe_make_aware(start) else end
    return subtract_datetimes(end, now)


def rate(r: Any) -> float:
    """A rate string (``"100/m"``, ``"2/h"``, ``"0.5/s"``, ``"10"``) as tasks per
    second; a number as it is; empty as 0."""
    if not r:
        return 0
    if isinstance(r, str):
        count, _, unit = r.partition("/")
        return RATE_MODIFIER_MAP[unit or "s"](float(count)) or 0
    return float(r)


def weekday(name: str) -> int:
    """A day's number, Sunday 0 (``"sunday"``, ``"sun"``, ``"Mon"``); ``KeyError`` else."""
    try:
        return WEEKDAYS[name[:3].lower()]
    except KeyError:
        raise KeyError(name) from None


def humanize_seconds(
    secs: float, prefix: str = "", sep: str = "", now: str = "now", microseconds: bool = False
) -> str:
    """Seconds for a person: ``"1.00 minute"``, ``"in 2.00 hours"`` (with
    ``prefix="in"``, ``sep=" "``), ``now`` under a second (unless ``microseconds``)."""
    secs = float(format(float(secs), ".2f"))
    for unit, divider in TIME_UNITS:
        if secs >= divider:
            amount = secs / divider
            plural = "" if amount == 1 else "s"
            return f"{prefix}{sep}{amount:.2f} {unit}{plural}"
    if microseconds and secs > 0.0:
        return f"{prefix}{sep}{secs:.2f} seconds"
    return now


def maybe_iso8601(dt: datetime | str | None) -> datetime | None:
    """An ISO 8601 string as a ``datetime``; a ``datetime`` as it is; empty as ``None``."""
    if not dt:
        return None
    if isinstance(dt, datetime):
        return dt
    return datetime.fromisoformat(dt)


def is_naive(dt: datetime) -> bool:
    """Whether ``dt`` has no time zone."""
    return dt.tzinfo is None or dt.tzinfo.utcoffset(dt) is None


def add_seconds_to_datetime(dt: datetime, seconds: float) -> datetime:
    """``dt`` plus ``seconds`` of elapsed time (across a daylight-saving change, the
    wall clock moves by more or less); a naive ``dt`` stays naive."""
    delta = timedelta(seconds=seconds)
    if is_naive(dt):
        return dt + delta
    return (dt.astimezone(UTC) + delta).astimezone(dt.tzinfo)


def subtract_datetimes(end: datetime, start: datetime) -> timedelta:
    """The time elapsed from ``start`` to ``end``; naive datetimes are read as UTC."""
    return maybe_make_aware(end).astimezone(UTC) - maybe_make_aware(start).astimezone(UTC)


def _is_ambiguous(dt: datetime) -> bool:
    return dt.replace(fold=0).utcoffset() != dt.replace(fold=1).utcoffset()


def _is_imaginary(dt: datetime) -> bool:
    # a wall time in a gap does not survive the round trip through UTC
    return dt.astimezone(UTC).astimezone(dt.tzinfo).replace(tzinfo=None) != dt.replace(tzinfo=None)


def make_aware(dt: datetime, tz: tzinfo) -> datetime:
    """``dt``'s wall time in ``tz``: ambiguous, its earlier instant; in a gap, moved
    forward by the gap."""
    dt = dt.replace(tzinfo=tz)
    if _is_ambiguous(dt):
        if _is_imaginary(dt):
            before, after = dt.replace(fold=0).utcoffset(), dt.replace(fold=1).utcoffset()
            gap = abs((before or timedelta(0)) - (after or timedelta(0)))
            return dt.replace(fold=0) + gap
        return min(dt.replace(fold=0), dt.replace(fold=1))
    return dt


def localize(dt: datetime, tz: tzinfo) -> datetime:
    """An aware ``dt`` in UTC converted to ``tz``; a naive one made aware in ``tz``."""
    if is_naive(dt):
        dt = make_aware(dt, tz)
    if dt.tzinfo == ZoneInfo("UTC"):
        dt = dt.astimezone(tz)
    return dt


def to_utc(dt: datetime) -> datetime:
    """A naive ``dt`` read as UTC."""
    return make_aware(dt, timezone.utc)


def maybe_make_aware(
    dt: datetime, tz: tzinfo | str | None = None, naive_as_utc: bool = True
) -> datetime:
    """An aware ``dt`` as it is; a naive one read as UTC (``naive_as_utc``) and put in
    ``tz`` (default UTC)."""
    if not is_naive(dt):
        return dt
    if naive_as_utc:
        dt = to_utc(dt)
    return localize(dt, timezone.utc if tz is None else timezone.tz_or_local(tz))


class ffwd:
    """A ``relativedelta`` that only adds: the fields given replace the date's, then
    ``weekday`` (Monday 0) moves forward to that day, then ``weeks`` are added."""

    def __init__(
        self,
        year: int | None = None,
        month: int | None = None,
        weeks: int = 0,
        weekday: int | None = None,
        day: int | None = None,
        hour: int | None = None,
        minute: int | None = None,
        second: int | None = None,
        microsecond: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.year = year
        self.month = month
        self.weeks = weeks
        self.weekday = weekday
        self.day = day
        self.hour = hour
        self.minute = minute
        self.second = second
        self.microsecond = microsecond
        self.days = weeks * 7
        self._has_time = hour is not None or minute is not None

    def __repr__(self) -> str:
        fields = self._fields(weeks=self.weeks, weekday=self.weekday)
        return "ffwd(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"

    def __radd__(self, other: Any) -> Any:
        if not isinstance(other, date):
            return NotImplemented
        year = self.year or other.year
        month = self.month or other.month
        day = min(monthrange(year, month)[1], self.day or other.day)
        moved = other.replace(**{**self._fields(), "year": year, "month": month, "day": day})
        if self.weekday is not None:
            moved += timedelta(days=(7 - moved.weekday() + self.weekday) % 7)
        return moved + timedelta(days=self.days)

    def _fields(self, **extra: Any) -> dict[str, Any]:
        return dictfilter(
            {
                "year": self.year,
                "month": self.month,
                "day": self.day,
                "hour": self.hour,
                "minute": self.minute,
                "second": self.second,
                "microsecond": self.microsecond,
            },
            **extra,
        )


def utcoffset(
    time: ModuleType = _time, localtime: Callable[..., _time.struct_time] = _time.localtime
) -> float:
    """The local offset to UTC in hours, west positive (``time.timezone / 3600``)."""
    if localtime().tm_isdst:
        return float(time.altzone) / 3600
    return float(time.timezone) / 3600


def adjust_timestamp(ts: float, offset: float, here: Callable[[], float] = utcoffset) -> float:
    """A timestamp taken at UTC offset ``offset`` (hours, as ``utcoffset``) moved to
    this machine's offset."""
    return ts - (offset - here()) * 3600


def get_exponential_backoff_interval(
    factor: float, retries: int, maximum: float, full_jitter: bool = False
) -> Any:
    """``min(maximum, factor * 2**retries)``; with ``full_jitter``, a uniform integer in
    ``[0, that]`` instead (what ``retry_backoff`` waits before retry ``retries``)."""
    countdown = min(maximum, factor * (2**retries))
    if full_jitter:
        countdown = random.randrange(int(countdown) + 1)
    return max(0, countdown)
