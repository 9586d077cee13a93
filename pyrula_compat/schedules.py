"""``crontab`` and ``schedule`` (``celery.schedules``), as stored pyrula schedules.

``crontab`` keeps Celery's fields and rules: every field defaults to ``*`` (a bare
``crontab()`` fires every minute); a field is an int, a string (``"*/15"``, ``"9-17"``,
``"1,15"``, ``"mon-fri"``) or an iterable of ints; day of week runs 0-6 with 0 =
Sunday (7 is refused); out-of-range values fail when the crontab is built; and when
both day of week and day of month are restricted a day must match both (AND), unlike
POSIX cron. Times are read in ``app.conf.timezone``; the engine fires a wall-clock time
that a DST change repeats only once.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from pyrula.workflows import Schedule

WEEKDAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
MONTHS = {
    name: i + 1
    for i, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
    )
}


class ParseException(ValueError):
    """A crontab field that cannot be read."""


def _number(token: str, names: dict[str, int]) -> int:
    token = token.strip().lower()
    if token.isdigit():
        return int(token)
    key = token[:3]
    if token.isalpha() and key in names:
        return names[key]
    raise ParseException(f"invalid crontab value {token!r}")


def parse_field(value: Any, low: int, high: int, names: dict[str, int] | None = None) -> set[int]:
    """The set of ints a crontab field stands for (:class:`crontab_parser` is Celery's
    class around it)."""
    names = names or {}
    if isinstance(value, bool):
        raise ParseException(f"invalid crontab value {value!r}")
    if isinstance(value, int):
        values = {value}
    elif isinstance(value, str):
        values = set()
        for part in value.split(","):
            values |= _parse_part(part.strip(), low, high, names)
    elif isinstance(value, Iterable):
        values = set()
        for item in value:
            values |= parse_field(item, low, high, names)
    else:
        raise ParseException(f"invalid crontab value {value!r}")
    for number in values:
        if number < low:
            raise ValueError(f"Invalid beginning range: {number} < {low}.")
        if number > high:
            raise ValueError(f"Invalid end range: {number} > {high}.")
    return values


def _parse_part(part: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    if not part:
        raise ParseException("empty crontab field")
    step = 1
    if "/" in part:
        part, step_text = part.split("/", 1)
        if not step_text.isdigit() or int(step_text) == 0:
            raise ParseException(f"invalid crontab step {step_text!r}")
        step = int(step_text)
    if part == "*":
        start, end = low, high
    elif "-" in part:
        first, last = part.split("-", 1)
        start, end = _number(first, names), _number(last, names)
    else:
        start = _number(part, names)
        end = high if step > 1 else start
    if end < start:  # a range that wraps (Celery: "fri-mon", "22-2")
        if end < low or start > high:
            raise ValueError(f"Invalid end range: {max(start, end)} > {high}.")
        span = list(range(start, high + 1)) + list(range(low, end + 1))
    else:
        if start < low:
            raise ValueError(f"Invalid beginning range: {start} < {low}.")
        if end > high:
            raise ValueError(f"Invalid end range: {end} > {high}.")
        span = list(range(start, end + 1))
    return set(span[::step])


class crontab_parser:
    """Celery's field parser: ``crontab_parser(60).parse("*/15")`` is
    ``{0, 15, 30, 45}``; values run from ``min_`` to ``max_ - 1`` (hours
    ``crontab_parser(24)``, days of the month ``crontab_parser(31, 1)``, months
    ``crontab_parser(12, 1)``, days of the week ``crontab_parser(7)``); day and month
    names (``"mon-fri"``, ``"jan"``) read as their numbers."""

    ParseException = ParseException

    def __init__(self, max_: int = 60, min_: int = 0) -> None:
        self.max_ = max_
        self.min_ = min_

    def parse(self, spec: str) -> set[int]:
        """The set of numbers ``spec`` stands for; ``ParseException`` (or
        ``ValueError`` for a value out of range) if it cannot be read."""
        return parse_field(spec, self.min_, self.max_ - 1, {**WEEKDAYS, **MONTHS})


class BaseSchedule:
    """Base of Celery's schedule kinds."""

    def __init__(self, nowfun: Any = None, app: Any = None) -> None:
        self.nowfun = nowfun
        self.app = app

    def now(self) -> datetime:
        return self.nowfun() if self.nowfun else datetime.now(UTC)


class crontab(BaseSchedule):
    """A cron-like schedule with Celery's semantics (see the module docstring)."""

    def __init__(
        self,
        minute: Any = "*",
        hour: Any = "*",
        day_of_week: Any = "*",
        day_of_month: Any = "*",
        month_of_year: Any = "*",
        **kwargs: Any,
    ) -> None:
        super().__init__(kwargs.get("nowfun"), kwargs.get("app"))
        self._orig = (minute, hour, day_of_week, day_of_month, month_of_year)
        self.minute = parse_field(minute, 0, 59)
        self.hour = parse_field(hour, 0, 23)
        self.day_of_week = parse_field(day_of_week, 0, 6, WEEKDAYS)
        self.day_of_month = parse_field(day_of_month, 1, 31)
        self.month_of_year = parse_field(month_of_year, 1, 12, MONTHS)

    @classmethod
    def from_string(cls, cron: str) -> crontab:
        fields = cron.split()
        if len(fields) != 5:
            raise ValueError(f"crontab {cron!r} needs 5 fields")
        minute, hour, dom, month, dow = fields
        return cls(minute, hour, dow, dom, month)

    @staticmethod
    def _field(values: set[int], low: int, high: int) -> str:
        if values == set(range(low, high + 1)):
            return "*"
        return ",".join(str(v) for v in sorted(values))

    @property
    def day_and(self) -> bool:
        """Whether both day fields are restricted (Celery then requires both)."""
        return self._field(self.day_of_week, 0, 6) != "*" and (
            self._field(self.day_of_month, 1, 31) != "*"
        )

    def cron_expression(self) -> str:
        """Five cron fields (minute hour day-of-month month day-of-week)."""
        return " ".join(
            (
                self._field(self.minute, 0, 59),
                self._field(self.hour, 0, 23),
                self._field(self.day_of_month, 1, 31),
                self._field(self.month_of_year, 1, 12),
                self._field(self.day_of_week, 0, 6),
            )
        )

    def schedule_for(
        self, workflow: str, params: dict[str, Any], schedule_id: str, tz: str
    ) -> Schedule:
        return Schedule.create(
            workflow, cron=self.cron_expression(), params=params, schedule_id=schedule_id,
            timezone=tz, day_and=self.day_and,
        )  # fmt: skip

    def next_after(self, moment: datetime, tz: str = "UTC") -> datetime:
        """The first slot after ``moment`` (an aware datetime)."""
        slot = self.schedule_for("x", {}, "x", tz).next_slot_after(moment.timestamp())
        return datetime.fromtimestamp(slot, UTC)

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return self.next_after(self.now()) - self.now()

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        due = self.next_after(last_run_at) <= self.now()
        return due, self.remaining_estimate(last_run_at).total_seconds()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, crontab):
            return NotImplemented
        return self.cron_expression() == other.cron_expression()

    def __hash__(self) -> int:
        return hash(self.cron_expression())

    def __repr__(self) -> str:
        return f"<crontab: {self.cron_expression()} (m/h/dM/MY/d)>"


class schedule(BaseSchedule):
    """Every ``run_every`` (a timedelta or seconds, at least one second here)."""

    def __init__(
        self, run_every: Any = None, relative: bool = False, nowfun: Any = None, app: Any = None
    ) -> None:
        super().__init__(nowfun, app)
        if isinstance(run_every, (int, float)) and not isinstance(run_every, bool):
            run_every = timedelta(seconds=run_every)
        if not isinstance(run_every, timedelta):
            raise TypeError(f"schedule(run_every=) takes a timedelta or seconds, got {run_every!r}")
        self.run_every = run_every
        self.relative = relative

    @property
    def seconds(self) -> float:
        return self.run_every.total_seconds()

    @property
    def human_seconds(self) -> str:
        return f"{self.seconds:g} seconds"

    def schedule_for(
        self, workflow: str, params: dict[str, Any], schedule_id: str, tz: str
    ) -> Schedule:
        return Schedule.create(
            workflow, every=self.run_every, params=params, schedule_id=schedule_id, timezone=tz
        )

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return last_run_at + self.run_every - self.now()

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        remaining = self.remaining_estimate(last_run_at).total_seconds()
        return remaining <= 0, max(remaining, 0.0) or self.seconds

    def __eq__(self, other: object) -> bool:
        return isinstance(other, schedule) and other.run_every == self.run_every

    def __hash__(self) -> int:
        return hash(self.run_every)

    def __repr__(self) -> str:
        return f"<freq: {self.human_seconds}>"


class solar(BaseSchedule):
    """Celery's sunrise/sunset schedules are not supported: pyrula refuses them when the
    worker syncs the beat schedule."""

    def __init__(self, event: str, lat: float, lon: float, **kwargs: Any) -> None:
        super().__init__(kwargs.get("nowfun"), kwargs.get("app"))
        self.event, self.lat, self.lon = event, lat, lon


def maybe_schedule(value: Any, relative: bool = False, app: Any = None) -> Any:
    """A number or timedelta as a ``schedule``; other schedules as they are."""
    if isinstance(value, (int, float, timedelta)) and not isinstance(value, bool):
        return schedule(value, relative, app=app)
    return value


__all__ = [
    "BaseSchedule",
    "ParseException",
    "crontab",
    "crontab_parser",
    "maybe_schedule",
    "schedule",
    "solar",
]
