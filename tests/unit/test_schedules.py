"""Schedule maths and validation: cron and interval slots, DST, no backfill, bad input."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from pyrula.workflows.errors import ConfigurationError, InvalidSchedule, PayloadError
from pyrula.workflows.records import ScheduleRecord
from pyrula.workflows.schedules import Schedule

NY = ZoneInfo("America/New_York")
UTC = ZoneInfo("UTC")


def slots(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """Every slot of ``schedule`` in (start, end], as New York wall-clock datetimes."""
    out: list[datetime] = []
    t = start.timestamp()
    while True:
        t = schedule.next_slot_after(t)
        if t > end.timestamp():
            return out
        out.append(datetime.fromtimestamp(t, NY))


def wall(moments: list[datetime]) -> list[str]:
    return [m.strftime("%m-%d %H:%M %Z") for m in moments]


# -- DST -------------------------------------------------------------------------------
def test_fall_back_fires_a_repeated_wall_clock_time_once() -> None:
    daily = Schedule.create("report", "30 1 * * *", timezone="America/New_York")
    fired = slots(
        daily, datetime(2026, 10, 31, 12, tzinfo=NY), datetime(2026, 11, 2, 12, tzinfo=NY)
    )
    assert wall(fired) == ["11-01 01:30 EDT", "11-02 01:30 EST"]


def test_fall_back_fires_each_repeated_minute_of_a_fixed_hour_once() -> None:
    """The documented rule: a wall-clock time that happens twice fires only the first time."""
    quarter = Schedule.create("report", "*/15 1 * * *", timezone="America/New_York")
    fired = slots(
        quarter, datetime(2026, 11, 1, 0, tzinfo=NY), datetime(2026, 11, 1, 12, tzinfo=NY)
    )
    assert wall(fired) == [
        "11-01 01:00 EDT",
        "11-01 01:15 EDT",
        "11-01 01:30 EDT",
        "11-01 01:45 EDT",
    ]


def test_spring_forward_fires_a_missing_time_once_at_the_end_of_the_gap() -> None:
    daily = Schedule.create("report", "30 2 * * *", timezone="America/New_York")
    fired = slots(daily, datetime(2026, 3, 7, 12, tzinfo=NY), datetime(2026, 3, 9, 12, tzinfo=NY))
    assert wall(fired) == ["03-08 03:00 EDT", "03-09 02:30 EDT"]


def test_spring_forward_hourly_skips_nothing_and_repeats_nothing() -> None:
    hourly = Schedule.create("report", "0 * * * *", timezone="America/New_York")
    fired = slots(
        hourly, datetime(2026, 3, 8, 0, 30, tzinfo=NY), datetime(2026, 3, 8, 4, tzinfo=NY)
    )
    assert wall(fired) == ["03-08 01:00 EST", "03-08 03:00 EDT", "03-08 04:00 EDT"]
    assert len({m.timestamp() for m in fired}) == len(fired)


def test_cron_fields_are_read_in_the_schedule_timezone() -> None:
    nine = Schedule.create("report", "0 9 * * *", timezone="Europe/Paris")
    after = datetime(2026, 6, 1, 12, tzinfo=UTC).timestamp()
    slot = datetime.fromtimestamp(nine.next_slot_after(after), ZoneInfo("Europe/Paris"))
    assert (slot.month, slot.day, slot.hour, slot.minute) == (6, 2, 9, 0)


# -- no backfill -----------------------------------------------------------------------
def test_an_interval_an_hour_behind_fires_once_for_the_latest_slot() -> None:
    every = Schedule.create("tick", every=timedelta(minutes=1))
    next_fire_at = 1_800_000_000.0
    now = next_fire_at + 3600 + 25
    slot, following = every.slots_due(next_fire_at, now)
    assert slot == next_fire_at + 3600  # the latest slot that passed, on the same grid
    assert following == slot + 60
    assert following > now


def test_a_due_interval_on_time_fires_its_own_slot() -> None:
    every = Schedule.create("tick", every=2.0)
    assert every.slots_due(100.0, 100.5) == (100.0, 102.0)


def test_a_cron_an_hour_behind_fires_once_then_the_next_slot_after_now() -> None:
    minutely = Schedule.create("tick", "* * * * *")
    start = datetime(2026, 5, 4, 10, 0, tzinfo=UTC).timestamp()
    now = start + 3600 + 30  # 11:00:30
    slot, following = minutely.slots_due(start, now)
    assert slot == start + 3600  # 11:00
    assert following == start + 3660  # 11:01, after now
    assert following > now


def test_a_cron_due_on_time_fires_its_own_slot() -> None:
    hourly = Schedule.create("tick", "0 * * * *")
    start = datetime(2026, 5, 4, 10, 0, tzinfo=UTC).timestamp()
    assert hourly.slots_due(start, start + 5) == (start, start + 3600)


def test_day_of_month_and_day_of_week_match_either_as_cron_does_or_both_with_day_and() -> None:
    """cron: with both day fields restricted a day matches if EITHER does; ``day_and``
    (``&mon``, Celery's crontab semantics) requires both."""
    start = datetime(2026, 6, 1, 0, 0, tzinfo=NY)  # a Monday
    end = datetime(2026, 6, 30, 23, 59, tzinfo=NY)
    either = Schedule.create("tick", "0 9 1-7 * mon", timezone="America/New_York")
    days = [m.day for m in slots(either, start - timedelta(minutes=1), end)]
    assert days == [1, 2, 3, 4, 5, 6, 7, 8, 15, 22, 29]  # the first week, and every Monday
    both = Schedule.create("tick", "0 9 1-7 * mon", timezone="America/New_York", day_and=True)
    assert [m.day for m in slots(both, start - timedelta(minutes=1), end)] == [1]
    assert Schedule.create("tick", "0 9 1-7 * &mon", timezone="America/New_York") == both


def test_first_slot_of_a_stored_schedule_is_after_now() -> None:
    every = Schedule.create("tick", every=timedelta(seconds=30), schedule_id="t")
    record = every.to_record(1_000.0)
    assert record.next_fire_at == 1_030.0
    assert Schedule.from_record(record) == every


# -- validation ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cron",
    [
        "",
        "   ",
        "* * * *",  # 4 fields
        "* * * * * *",  # 6 fields (seconds are not accepted)
        "61 * * * *",
        "* 24 * * *",
        "* * 32 * *",
        "* * * 13 *",
        "*/0 * * * *",
        "0-59/0 * * * *",
        "\u0663 * * * *",  # ARABIC-INDIC DIGIT THREE
        "\uff11 * * * *",  # FULLWIDTH DIGIT ONE
        "0 0 30 2 *",  # never fires
        "0 0 31 4 *",  # never fires
        "every minute",
        "* * * * MON;",
        "5-1 * * * *",  # a range that runs backwards (croniter would wrap it)
        "5-1/2 * * * *",
        "* 22-2 * * *",
        "* * 31-1 * *",
        "* * * dec-jan *",
        "* * * * fri-mon",
        "* * * * 7-1",
        "5-5 * * * *",  # one value as a range (croniter would read every minute)
        "* * * * sun-sun",
    ],
)
def test_a_malformed_cron_is_refused_at_create(cron: str) -> None:
    with pytest.raises(InvalidSchedule):
        Schedule.create("tick", cron)


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        (
            "5-1 * * * *",
            "the minute range '5-1' starts after it ends; write 5-59,0-1 for a "
            "range that wraps, or 1-5 for 1 to 5",
        ),
        ("5-1/2 * * * *", "the minute range '5-1/2' starts after it ends; write 5-59/2,0-1/2"),
        ("0 22-2 * * *", "the hour range '22-2' starts after it ends; write 22-23,0-2"),
        ("0 0 31-1 * *", "the day-of-month range '31-1' starts after it ends; write 31,1"),
        (
            "0 0 1 nov-feb *",
            "the month range 'nov-feb' starts after it ends; write nov-dec,jan-feb",
        ),
        (
            "0 9 * * fri-mon",
            "the day-of-week range 'fri-mon' starts after it ends; "
            "write fri-sat,sun-mon for a range that wraps",
        ),
        (
            "0 9 1-7 * &FRI-MON",
            "the day-of-week range 'FRI-MON' starts after it ends; write FRI-SAT,SUN-MON",
        ),
        ("0 9 * * 7-2", "write 0-2: Sunday is 0 at the start of a range"),
        ("5-5 * * * *", "the minute range '5-5' starts and ends on the same value"),
        ("0 0 * * sun-sun", "the day-of-week range 'sun-sun' starts and ends on the same value"),
    ],
)
def test_a_range_that_runs_backwards_or_has_one_value_names_the_field_and_the_fix(
    cron: str, message: str
) -> None:
    with pytest.raises(InvalidSchedule, match=re.escape(message)):
        Schedule.create("tick", cron)


def test_a_day_of_week_range_may_end_on_sunday_as_cron_allows() -> None:
    """``fri-sun`` and ``5-0`` are Friday to Sunday (cron reads a closing 0 as 7)."""
    start = datetime(2026, 6, 1, 0, 0, tzinfo=NY)  # a Monday
    end = datetime(2026, 6, 7, 23, 59, tzinfo=NY)
    for cron in ("0 9 * * fri-sun", "0 9 * * 5-0", "0 9 * * 5-7", "0 9 * * FRI-SUN"):
        weekend = Schedule.create("tick", cron, timezone="America/New_York")
        assert [m.strftime("%a") for m in slots(weekend, start, end)] == ["Fri", "Sat", "Sun"]


@pytest.mark.parametrize(
    ("cron", "fields"),
    [("@daily", "0 0 * * *"), ("@HOURLY", "0 * * * *"), (" @weekly ", "0 0 * * 0")],
)
def test_a_cron_nickname_is_refused_with_the_fields_to_write(cron: str, fields: str) -> None:
    with pytest.raises(
        InvalidSchedule,
        match=re.escape(f"nicknames are not accepted; write its 5 fields, '{fields}'"),
    ):
        Schedule.create("tick", cron)
    with pytest.raises(InvalidSchedule, match="start-up code"):
        Schedule.create("tick", "@reboot")


def test_invalid_schedule_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        Schedule.create("tick", "61 * * * *")


@pytest.mark.parametrize("every", [0, 0.5, timedelta(milliseconds=999), -1, float("nan"), True])
def test_an_interval_under_a_second_or_not_a_number_is_refused(every: object) -> None:
    with pytest.raises(InvalidSchedule):
        Schedule.create("tick", every=every)  # type: ignore[arg-type]


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", "../../etc/passwd"])
def test_an_unknown_timezone_is_refused(tz: str) -> None:
    with pytest.raises(InvalidSchedule):
        Schedule.create("tick", "0 * * * *", timezone=tz)


def test_exactly_one_of_cron_and_every() -> None:
    with pytest.raises(InvalidSchedule):
        Schedule.create("tick")
    with pytest.raises(InvalidSchedule):
        Schedule.create("tick", "* * * * *", every=60)


def test_params_must_be_json_and_a_workflow_named() -> None:
    with pytest.raises(PayloadError):
        Schedule.create("tick", "* * * * *", {"when": datetime.now()})
    with pytest.raises(InvalidSchedule):
        Schedule.create("", "* * * * *")


def test_the_default_id_is_stable_and_depends_on_timing_and_params() -> None:
    a = Schedule.create("tick", "0 * * * *", {"n": 1})
    assert a.schedule_id == Schedule.create("tick", "0 * * * *", {"n": 1}).schedule_id
    assert a.schedule_id.startswith("tick:")
    assert a.schedule_id != Schedule.create("tick", "0 * * * *", {"n": 2}).schedule_id
    assert a.schedule_id != Schedule.create("tick", "5 * * * *", {"n": 1}).schedule_id
    assert Schedule.create("tick", "0 * * * *", schedule_id="mine").schedule_id == "mine"


def test_valid_expressions_are_accepted() -> None:
    for cron in ("*/5 * * * *", "0 2 * * 1-5", "0 0 29 2 *", "15,45 8-18 * * MON-FRI", "0 0 L * *"):
        assert Schedule.create("tick", cron).cron == cron


def test_a_record_round_trips() -> None:
    record = ScheduleRecord(
        schedule_id="s",
        workflow="tick",
        params='{"n":1}',
        cron="0 * * * *",
        every=None,
        timezone="Asia/Tokyo",
        enabled=False,
        next_fire_at=5.0,
    )
    schedule = Schedule.from_record(record)
    assert (schedule.params, schedule.timezone, schedule.enabled) == ({"n": 1}, "Asia/Tokyo", False)
