"""Schedules: a workflow submitted on a cron expression or a fixed interval.

A schedule lives in the store, so every worker sees it. Each worker's schedule loop
fires due schedules; the fire and the run it creates are one atomic store operation
keyed by schedule and slot, so with any number of workers each slot fires once.

Rules:

* **No backfill.** After downtime a schedule fires once, for the latest slot that
  passed, then moves to the next slot after now.
* **DST.** Cron fields are read in the schedule's ``timezone``. When clocks go back, a
  wall-clock time that happens twice fires only the first time; when they go forward,
  a time that does not exist fires once, at the first moment after the gap.
* An expression is checked completely at :meth:`Schedule.create`, including that it
  fires at all (``0 0 30 2 *`` never does): a bad one never reaches the store. A range
  runs from low to high, as in cron: ``5-1`` is refused (write ``5-59,0-1`` for a range
  that wraps), and so is ``5-5`` (write ``5``); a day-of-week range may end on Sunday
  (``fri-sun``, ``5-0``).
* **Day of month and day of week.** As in POSIX cron, when both are restricted a day
  matching either fires (OR). A day-of-week field written with a leading ``&``
  (``0 9 1-7 * &mon``, or ``Schedule.create(..., day_and=True)``) requires both (AND:
  the first Monday of the month), as Celery's ``crontab`` does. The ``&`` is part of the
  stored expression, so every store and worker reads it the same way.
* **Overlap.** ``overlap="allow_all"`` (the default) fires every slot, whatever the
  schedule's earlier runs are doing. ``overlap="skip"`` skips a slot that comes due
  while the run of the last fired slot has not ended (queued, running, sleeping or
  waiting): no run, the schedule moves on to its next slot. The worker checks that run
  as it fires (``loops.fire``); a run that no longer exists counts as ended.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

from pyrula.workflows.errors import InvalidSchedule
from pyrula.workflows.records import DEFAULT_OWNER, ScheduleRecord
from pyrula.workflows.registry import WorkflowDefinition
from pyrula.workflows.serialization import decode, encode

_FIELD = re.compile(r"^[0-9A-Za-z*/,\-?LW#]+$")
_DAY_AND = "&"
"""A leading ``&`` on the day-of-week field: day of month AND day of week."""
_SLOT_SEARCH_LIMIT = 1000

OVERLAP_ALLOW_ALL = "allow_all"
"""Every slot starts a run, whatever the schedule's earlier runs are doing (the default)."""
OVERLAP_SKIP = "skip"
"""A slot that comes due while the schedule's last run has not ended starts no run."""
OVERLAP_POLICIES = (OVERLAP_ALLOW_ALL, OVERLAP_SKIP)
"""The values ``Schedule.create(overlap=...)`` accepts."""


@dataclass(frozen=True)
class Schedule:
    """A schedule definition. Build one with :meth:`create`."""

    schedule_id: str
    workflow: str
    params: Mapping[str, Any]
    cron: str | None = None
    every: float | None = None
    """Seconds between slots, for the interval form."""
    timezone: str = "UTC"
    owner: str = DEFAULT_OWNER
    enabled: bool = True
    overlap: str = OVERLAP_ALLOW_ALL
    """What a slot does while the last run is still going: one of ``OVERLAP_POLICIES``."""

    @classmethod
    def create(
        cls,
        workflow: str | WorkflowDefinition,
        cron: str | None = None,
        params: Mapping[str, Any] | None = None,
        schedule_id: str | None = None,
        *,
        every: timedelta | float | None = None,
        timezone: str = "UTC",
        owner: str | None = None,
        enabled: bool = True,
        day_and: bool = False,
        overlap: str = OVERLAP_ALLOW_ALL,
    ) -> Schedule:
        """A schedule running ``workflow`` with ``params`` on ``cron`` or ``every``.

        ``cron`` has five fields (minute hour day-of-month month day-of-week), read in
        ``timezone``. ``day_and=True`` makes a day match only when both its day of month
        and its day of week do (cron's default is either); it is stored as a ``&``
        before the day-of-week field. ``every`` (a timedelta or seconds) fires at fixed
        periods from the time the schedule is stored. Keep ``schedule_id`` fixed across deploys; by
        default it is derived from the workflow, timing and params.
        ``overlap`` (one of ``OVERLAP_POLICIES``): ``"allow_all"`` starts a run at every
        slot; ``"skip"`` skips a slot while the run of the last fired slot has not ended.
        Raises :class:`InvalidSchedule` for anything that cannot work.
        """
        name = workflow.name if isinstance(workflow, WorkflowDefinition) else workflow
        if not isinstance(name, str) or not name:
            raise InvalidSchedule("a schedule needs a workflow name")
        if (cron is None) == (every is None):
            raise InvalidSchedule("give a schedule exactly one of cron='...' or every=timedelta")
        _check_timezone(timezone)
        check_overlap(overlap)
        interval = None
        if every is not None:
            interval = _check_every(every)
        else:
            if day_and and isinstance(cron, str) and len(cron.split()) == 5:
                fields = cron.split()
                if not fields[4].startswith(_DAY_AND):
                    fields[4] = _DAY_AND + fields[4]
                cron = " ".join(fields)
            _check_cron(cron)
        params = dict(params or {})
        params_text = encode(params, what="schedule params")
        if schedule_id is None:
            digest = hashlib.sha1(
                f"{name}|{cron}|{interval}|{timezone}|{params_text}".encode()
            ).hexdigest()[:12]
            schedule_id = f"{name}:{digest}"
        if not isinstance(schedule_id, str) or not schedule_id.strip():
            raise InvalidSchedule("schedule_id must be a non-empty string")
        schedule = cls(
            schedule_id=schedule_id,
            workflow=name,
            params=params,
            cron=cron,
            every=interval,
            timezone=timezone,
            owner=owner if owner is not None else DEFAULT_OWNER,
            enabled=enabled,
            overlap=overlap,
        )
        if cron is not None:
            schedule.next_slot_after(datetime.now(ZoneInfo("UTC")).timestamp())  # fires at all?
        return schedule

    # -- slots -----------------------------------------------------------------------
    def next_slot_after(self, after: float) -> float:
        """The first slot strictly after ``after`` (epoch seconds), by the DST rules."""
        if self.every is not None:
            return after + self.every
        assert self.cron is not None
        tz = ZoneInfo(self.timezone)
        base = datetime.fromtimestamp(after, tz)
        try:
            it = _croniter(self.cron, base)
            for _ in range(_SLOT_SEARCH_LIMIT):
                candidate: datetime = it.get_next(datetime)
                if candidate.timestamp() <= after:
                    continue
                if _wall(candidate) == _wall(base) and candidate.timestamp() - after < 7200:
                    continue  # the repeated wall-clock hour after clocks went back
                if (
                    candidate.fold
                    and candidate.utcoffset() != candidate.replace(fold=0).utcoffset()
                ):
                    continue  # the second occurrence of a wall-clock time (clocks went back)
                return candidate.timestamp()
        except (CroniterBadDateError, CroniterBadCronError) as exc:
            raise InvalidSchedule(f"cron {self.cron!r} never fires: {exc}") from None
        raise InvalidSchedule(f"cron {self.cron!r} found no slot after {base.isoformat()}")

    def slots_due(self, next_fire_at: float, now: float) -> tuple[float, float]:
        """For a due schedule: (the latest slot <= now to fire, the next slot after it).

        Missed slots between ``next_fire_at`` and ``now`` are skipped, not backfilled.
        """
        if self.every is not None:
            periods = math.floor((now - next_fire_at) / self.every)
            latest = next_fire_at + max(0, periods) * self.every
            return latest, latest + self.every
        latest = next_fire_at
        following = self.next_slot_after(latest)
        if following <= now:
            # Jump near ``now`` instead of walking every missed slot.
            latest = self._slot_at_or_before(now, floor=next_fire_at)
            following = self.next_slot_after(max(latest, now))
        return latest, following

    def _slot_at_or_before(self, now: float, floor: float) -> float:
        assert self.cron is not None
        tz = ZoneInfo(self.timezone)
        it = _croniter(self.cron, datetime.fromtimestamp(now + 1e-3, tz))
        previous: datetime = it.get_prev(datetime)
        return max(floor, previous.timestamp())

    # -- records -----------------------------------------------------------------------
    def to_record(self, now: float) -> ScheduleRecord:
        """The stored form, its first slot the first one after ``now`` (store time)."""
        return ScheduleRecord(
            schedule_id=self.schedule_id,
            workflow=self.workflow,
            params=encode(dict(self.params), what="schedule params"),
            cron=self.cron,
            every=self.every,
            timezone=self.timezone,
            enabled=self.enabled,
            next_fire_at=self.next_slot_after(now),
            owner=self.owner,
            overlap=self.overlap,
        )

    @classmethod
    def from_record(cls, record: ScheduleRecord) -> Schedule:
        return cls(
            schedule_id=record.schedule_id,
            workflow=record.workflow,
            params=decode(record.params),
            cron=record.cron,
            every=record.every,
            timezone=record.timezone,
            owner=record.owner,
            enabled=record.enabled,
            overlap=record.overlap,
        )


def _croniter(cron: str, base: datetime | None = None) -> Any:
    """A croniter for ``cron``, reading a leading ``&`` on day of week as AND."""
    fields = cron.split()
    day_or = not (len(fields) == 5 and fields[4].startswith(_DAY_AND))
    if not day_or:
        fields[4] = fields[4][len(_DAY_AND) :]
    return croniter(" ".join(fields), base, day_or=day_or)


def _wall(moment: datetime) -> tuple[int, int, int, int, int, int]:
    return (moment.year, moment.month, moment.day, moment.hour, moment.minute, moment.second)


def _check_timezone(name: str) -> None:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidSchedule(
            f"unknown timezone {name!r}; use an IANA name such as 'Europe/Paris'"
        ) from None


def check_overlap(overlap: object) -> None:
    """Raise InvalidSchedule unless ``overlap`` is one of ``OVERLAP_POLICIES``."""
    if not isinstance(overlap, str) or overlap not in OVERLAP_POLICIES:
        allowed = ", ".join(repr(value) for value in OVERLAP_POLICIES)
        raise InvalidSchedule(f"unknown overlap policy {overlap!r}; use one of {allowed}")


def _check_every(every: timedelta | float) -> float:
    value = every.total_seconds() if isinstance(every, timedelta) else every
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidSchedule(f"every= takes a timedelta or seconds, got {every!r}")
    if value < 1:
        raise InvalidSchedule(f"every= must be at least one second, got {value!r}")
    return float(value)


_NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""Cron's nicknames, refused with the fields to write instead."""


def _check_cron(cron: str | None) -> None:
    if not isinstance(cron, str) or not cron.strip():
        raise InvalidSchedule("cron expression is empty; expected 5 fields, e.g. '0 2 * * *'")
    if not cron.isascii():
        raise InvalidSchedule(f"cron {cron!r} has non-ASCII characters; use ASCII digits")
    fields = cron.split()
    nickname = _NICKNAMES.get(cron.strip().lower())
    if cron.strip().lower() == "@reboot":
        raise InvalidSchedule("cron '@reboot' is not a time: submit the run from start-up code")
    if nickname is not None:
        raise InvalidSchedule(
            f"cron {cron!r}: nicknames are not accepted; write its 5 fields, {nickname!r}"
        )
    if len(fields) != 5:
        raise InvalidSchedule(
            f"cron {cron!r} has {len(fields)} fields; expected 5 "
            "(minute hour day-of-month month day-of-week)"
        )
    for index, value in enumerate(fields):
        if index == 4 and value.startswith(_DAY_AND):
            value = value[len(_DAY_AND) :]
        if not _FIELD.match(value):
            raise InvalidSchedule(f"cron {cron!r}: field {value!r} is not valid")
        if re.search(r"/0*(?:$|[^0-9])", value):
            raise InvalidSchedule(f"cron {cron!r}: a step of 0 in {value!r} never advances")
    try:
        _croniter(cron)
    except CroniterError as exc:
        raise InvalidSchedule(f"cron {cron!r} is not valid: {exc}") from None
    for index, value in enumerate(fields):
        for part in value.removeprefix(_DAY_AND).split(","):
            _check_range(cron, index, part)


_FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
_FIELD_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))
_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _range_value(index: int, text: str) -> int | None:
    """A range bound's number (names for months and days too), or None for anything else."""
    if text.isdigit():
        return int(text)
    names = {3: _MONTH_NAMES, 4: _DAY_NAMES}.get(index, ())
    if text.lower() in names:
        return names.index(text.lower()) + (1 if index == 3 else 0)
    return None


def _check_range(cron: str, index: int, part: str) -> None:
    """Refuse a range that runs backwards (``5-1``) or has one value (``5-5``).

    croniter wraps the first (``5-1`` is 5..59 and 0..1) and reads the second as the
    whole field (``5-5`` fires every minute); cron refuses the first and reads the second
    as its one value. A day-of-week range may end on Sunday as 0 or ``sun`` (``fri-sun``),
    which cron reads as 7.
    """
    bounds, slash, step = part.partition("/")
    first, dash, last = bounds.partition("-")
    start, end = _range_value(index, first), _range_value(index, last)
    if not dash or start is None or end is None:
        return  # not a range of two values; croniter has judged it
    if index == 4 and end == 0 and start > 0:
        end = 7
    name, step = _FIELD_NAMES[index], slash + step
    if start == end:
        raise InvalidSchedule(
            f"cron {cron!r}: the {name} range {part!r} starts and ends on the same value "
            f"(the cron library would read it as the whole field); write {first} for that value"
        )
    if start > end:
        if index == 4 and start == 7:
            fix = f"write 0-{last}{step}: Sunday is 0 at the start of a range"
        else:
            low, high = _FIELD_BOUNDS[index]
            if first.isalpha():  # keep the names the expression uses
                names = _MONTH_NAMES if index == 3 else _DAY_NAMES
                low_text, high_text = names[0], names[-1]
                if first.isupper():
                    low_text, high_text = low_text.upper(), high_text.upper()
            else:
                low_text, high_text = str(low), str(high)
            upper = first if start == high else f"{first}-{high_text}"
            lower = last if end == low else f"{low_text}-{last}"
            fix = (
                f"write {upper}{step},{lower}{step} for a range that wraps, "
                f"or {last}-{first}{step} for {last} to {first}"
            )
        raise InvalidSchedule(
            f"cron {cron!r}: the {name} range {part!r} starts after it ends; {fix}"
        )
