"""``pyrula schedules list|show|create|pause|resume|delete``: manage a store's schedules.

Each command calls the store's blocking schedule API (``store.schedule_create``,
``schedule_list``, ``schedule_get``, ``schedule_update``, ``schedule_delete``): the same
calls a deploy script makes, so the CLI and a script can never disagree about what a
command does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, cast

import click

from pyrula.cli import render
from pyrula.cli.render import CliError, CliUsageError
from pyrula.cli.runs import json_option, store_option
from pyrula.workflows import PyrulaError, open_store
from pyrula.workflows.errors import InvalidSchedule, ScheduleExists, ScheduleNotFound
from pyrula.workflows.records import ScheduleRecord
from pyrula.workflows.schedules import OVERLAP_ALLOW_ALL, OVERLAP_POLICIES, Schedule
from pyrula.workflows.stores.schedule_admin import ScheduleAdmin, run_blocking

T = TypeVar("T")


class ScheduleStore(Protocol):
    """The blocking schedule API every store offers (see ``stores/schedule_admin.py``)."""

    url: str

    def schedule_create(self, schedule: Schedule, *, replace: bool = False) -> ScheduleRecord: ...

    def schedule_list(self, *, workflow: str | None = None) -> list[ScheduleRecord]: ...

    def schedule_get(self, schedule_id: str) -> ScheduleRecord | None: ...

    def schedule_update(
        self, schedule_id: str, *, enabled: bool | None = None, params: Any = None
    ) -> ScheduleRecord: ...

    def schedule_delete(self, schedule_id: str) -> bool: ...


def with_schedules(url: str | None, action: Callable[[ScheduleStore], T]) -> T:
    """Open the store, run ``action`` on it, close it; a pyrula error is one line, exit 1."""
    try:
        store = open_store(url)
        if not isinstance(store, ScheduleAdmin):
            raise CliError(f"the store at {store.url} does not keep schedules")
        run_blocking(store.open)
        try:
            return action(cast(ScheduleStore, store))
        finally:
            run_blocking(store.close)
    except InvalidSchedule as exc:
        raise CliUsageError(str(exc)) from None
    except PyrulaError as exc:
        raise CliError(str(exc)) from None  # store messages mask passwords


# -- output ------------------------------------------------------------------------------
def timing_text(record: ScheduleRecord) -> str:
    """``cron 0 2 * * *`` or ``every 30s``."""
    if record.cron is not None:
        return f"cron {record.cron}"
    every = record.every or 0.0
    return f"every {every:g}s"


def schedule_dict(record: ScheduleRecord) -> dict[str, Any]:
    """Every field of a schedule, params decoded, times ISO-8601 UTC."""
    return {
        "schedule_id": record.schedule_id,
        "workflow": record.workflow,
        "cron": record.cron,
        "every_s": record.every,
        "timezone": record.timezone,
        "enabled": record.enabled,
        "owner": record.owner,
        "overlap": record.overlap,
        "last_run_id": record.last_run_id,
        "params": json.loads(record.params),
        "next_fire_at": render.iso(record.next_fire_at, precise=True),
        "last_fire_at": render.iso(record.last_fire_at, precise=True),
        "created_at": render.iso(record.created_at, precise=True),
        "updated_at": render.iso(record.updated_at, precise=True),
    }


def schedules_table(records: Sequence[ScheduleRecord]) -> str:
    if not records:
        return "no schedules"
    headers = (
        "SCHEDULE ID",
        "WORKFLOW",
        "TIMING",
        "TZ",
        "STATE",
        "OVERLAP",
        "NEXT FIRE",
        "LAST FIRE",
    )
    rows = [
        (
            record.schedule_id,
            record.workflow,
            timing_text(record),
            record.timezone,
            "active" if record.enabled else "paused",
            record.overlap,
            (render.iso(record.next_fire_at) or "-") if record.enabled else "-",
            render.iso(record.last_fire_at) or "-",
        )
        for record in records
    ]
    return render.table(headers, rows)


def describe(record: ScheduleRecord) -> str:
    """One line: the schedule, what it runs, when, and its state."""
    line = f"schedule {record.schedule_id}: {record.workflow}, {timing_text(record)}"
    if record.cron is not None:
        line += f" ({record.timezone})"
    if record.owner:
        line += f", owner {record.owner}"
    if record.overlap != OVERLAP_ALLOW_ALL:
        line += f", overlap {record.overlap}"
    if not record.enabled:
        return line + ", paused"
    return line + f", next fire {render.iso(record.next_fire_at)}"


def schedule_detail(record: ScheduleRecord) -> str:
    """``schedules show``: the record as label/value lines."""
    fields = [
        ("Schedule", record.schedule_id),
        ("Workflow", record.workflow),
        ("Timing", timing_text(record)),
        ("Timezone", record.timezone),
        ("Owner", render.owner_text(record.owner)),
        ("State", "active" if record.enabled else "paused"),
        ("Overlap", record.overlap),
        ("Next fire", (render.iso(record.next_fire_at) or "-") if record.enabled else "-"),
        ("Last fire", render.iso(record.last_fire_at) or "-"),
        ("Last run", record.last_run_id or "-"),
        ("Params", render.clip(record.params, render.FIELD_WIDTH)),
        ("Created", render.iso(record.created_at) or "-"),
        ("Updated", render.iso(record.updated_at) or "-"),
    ]
    width = max(len(label) for label, _ in fields)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in fields)


def echo_record(record: ScheduleRecord, as_json: bool, prefix: str) -> None:
    if as_json:
        render.echo_json({"schedule": schedule_dict(record)})
    else:
        click.echo(f"{prefix} {describe(record)}")


# -- commands ----------------------------------------------------------------------------
@click.group("schedules")
def schedules_group() -> None:
    """Create, list, pause, resume and delete schedules.

    A schedule submits a run of a workflow on a cron expression or a fixed interval.
    It lives in the store, so every worker sees a change at its next look.
    """


@schedules_group.command("list")
@store_option
@click.option("--workflow", metavar="NAME", help="Only schedules of this workflow.")
@json_option
def list_command(store_url: str | None, workflow: str | None, as_json: bool) -> None:
    """List schedules, by id."""
    records = with_schedules(store_url, lambda store: store.schedule_list(workflow=workflow))
    if as_json:
        render.echo_json({"schedules": [schedule_dict(record) for record in records]})
    else:
        click.echo(schedules_table(records))


@schedules_group.command("show")
@click.argument("schedule_id", metavar="ID")
@store_option
@json_option
def show_command(schedule_id: str, store_url: str | None, as_json: bool) -> None:
    """Show one schedule: its definition, overlap policy, slots and last run."""

    def get(store: ScheduleStore) -> ScheduleRecord:
        record = store.schedule_get(schedule_id)
        if record is None:
            raise ScheduleNotFound(f"no schedule with id {schedule_id!r} in {store.url}")
        return record

    record = with_schedules(store_url, get)
    if as_json:
        render.echo_json({"schedule": schedule_dict(record)})
    else:
        click.echo(schedule_detail(record))


@schedules_group.command("create")
@click.argument("workflow")
@click.option("--cron", metavar="EXPR", help="Five cron fields, e.g. '0 2 * * *'.")
@click.option("--every", type=float, metavar="SECONDS", help="Fire every SECONDS (>= 1).")
@click.option("--params", "params_text", metavar="JSON", help="The runs' params, a JSON object.")
@click.option(
    "--id",
    "schedule_id",
    metavar="ID",
    help="The schedule's id; keep it fixed across deploys [default: derived from the "
    "workflow, timing and params].",
)
@click.option(
    "--timezone",
    default="UTC",
    show_default=True,
    metavar="TZ",
    help="IANA timezone the cron fields are read in.",
)
@click.option("--owner", metavar="OWNER", help="Tenant the runs belong to [default: none].")
@click.option(
    "--overlap",
    default=OVERLAP_ALLOW_ALL,
    show_default=True,
    metavar="|".join(OVERLAP_POLICIES),
    help="allow_all: every slot starts a run; skip: no run while the last one is going.",
)
@click.option("--replace", is_flag=True, help="Overwrite a schedule with this id.")
@store_option
@json_option
def create_command(
    workflow: str,
    cron: str | None,
    every: float | None,
    params_text: str | None,
    schedule_id: str | None,
    timezone: str,
    owner: str | None,
    overlap: str,
    replace: bool,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Create a schedule that submits WORKFLOW on --cron or --every.

    Its first slot is the first one after now. Missed slots are never backfilled.
    With --overlap skip, a slot that comes due while the schedule's last run has not
    ended starts no run.
    """
    if (cron is None) == (every is None):
        raise CliUsageError("give exactly one of --cron EXPR or --every SECONDS")
    params = render.parse_json_object(params_text, "--params")
    try:
        schedule = Schedule.create(
            workflow,
            cron,
            params,
            schedule_id,
            every=every,
            timezone=timezone,
            owner=owner,
            overlap=overlap,
        )
    except PyrulaError as exc:  # InvalidSchedule, or params that are not JSON-storable
        raise CliUsageError(str(exc)) from None

    def create(store: ScheduleStore) -> ScheduleRecord:
        try:
            return store.schedule_create(schedule, replace=replace)
        except ScheduleExists:
            raise CliError(
                f"schedule {schedule.schedule_id!r} exists already in {store.url}; pass "
                "--replace to overwrite it"
            ) from None

    record = with_schedules(store_url, create)
    echo_record(record, as_json, "created")


def _set_enabled(schedule_id: str, enabled: bool, store_url: str | None, as_json: bool) -> None:
    record = with_schedules(
        store_url, lambda store: store.schedule_update(schedule_id, enabled=enabled)
    )
    echo_record(record, as_json, "resumed" if enabled else "paused")


@schedules_group.command("pause")
@click.argument("schedule_id", metavar="ID")
@store_option
@json_option
def pause_command(schedule_id: str, store_url: str | None, as_json: bool) -> None:
    """Pause a schedule: it fires nothing until resumed."""
    _set_enabled(schedule_id, False, store_url, as_json)


@schedules_group.command("resume")
@click.argument("schedule_id", metavar="ID")
@store_option
@json_option
def resume_command(schedule_id: str, store_url: str | None, as_json: bool) -> None:
    """Resume a paused schedule from its next slot; the paused time is not backfilled."""
    _set_enabled(schedule_id, True, store_url, as_json)


@schedules_group.command("delete")
@click.argument("schedule_id", metavar="ID")
@store_option
@json_option
def delete_command(schedule_id: str, store_url: str | None, as_json: bool) -> None:
    """Delete a schedule. Runs it already submitted are not touched."""

    def delete(store: ScheduleStore) -> None:
        if not store.schedule_delete(schedule_id):
            raise ScheduleNotFound(f"no schedule with id {schedule_id!r} in {store.url}")

    with_schedules(store_url, delete)
    if as_json:
        render.echo_json({"deleted": schedule_id})
    else:
        click.echo(f"deleted schedule {schedule_id}")
