"""``pyrula projections list|reset``: where each projection is, who delivers it, how far
behind it is; move its cursor.

A projection keeps its place in the cursor ``projection:<name>`` (``[finished_at,
run_id]`` of the last ended run it went past, see
:func:`pyrula.workflows.projections.encode_cursor`) and its lease in
``projection-lease:<name>`` (``{"worker": ..., "until": ...}``). ``reset`` moves the
cursor with ``Store.swap_cursor``, so it never overwrites a batch a worker delivered
meanwhile: it says so and changes nothing. The cursor cannot be deleted, so
``--to-start`` writes :data:`START_CURSOR`, which sorts before every run that ended.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import click

from pyrula.cli import render
from pyrula.cli.render import CliError, CliUsageError
from pyrula.cli.runs import json_option, store_option, with_store
from pyrula.cli.triggers import COUNT_BOUND, checked_names, count_fields, count_text, import_option
from pyrula.cli.worker import import_workflow_modules
from pyrula.workflows import Store
from pyrula.workflows.projections import (
    Projection,
    cursor_name,
    decode_cursor,
    default_projections,
    lease_name,
)
from pyrula.workflows.stores.base import EventStore, events_of

Position = tuple[float, str]

START = (0.0, "")
"""The position before every ended run: store time is epoch seconds, so a run's
``(finished_at, run_id)`` is greater (its run id is not empty)."""
START_CURSOR = json.dumps(list(START))
"""``reset --to-start`` writes this; ``decode_cursor`` reads it as :data:`START`."""
PAGE = 1000
"""Runs read per ``ended_runs`` call when looking for the newest ended run."""
FIRST_WINDOW = 1.0
"""Seconds back the search for the newest ended run looks first; it widens eightfold."""


def _events(store: Store) -> EventStore:
    """The store's events and cursors part (``pyrula projections`` reads them)."""
    return events_of(store, "pyrula projections")


def decoded(text: str | None) -> Position | None:
    """The cursor's position; None when unset or unreadable (shown raw)."""
    try:
        return decode_cursor(text)
    except (ValueError, TypeError):
        return None


def position_text(text: str | None) -> str:
    if text is None:
        return "not started"
    at = decoded(text)
    if at is None:
        return f"unreadable cursor {render.clip(text, 40)}"
    if at == START:
        return "from the start (reset)"
    return f"{render.iso(at[0], precise=True)} {at[1]}"


def position_dict(text: str | None) -> dict[str, Any] | None:
    at = decoded(text)
    if at is None or at == START:
        return None
    return {"finished_at": render.iso(at[0], precise=True), "run_id": at[1]}


@dataclass(frozen=True)
class ProjectionState:
    """A projection (its definition, if this process has one) and its cursors."""

    name: str
    item: Projection | None
    cursor: str | None
    lease: dict[str, Any] | None
    """The lease's holder (``worker``, ``until``), or None when nobody holds it now."""
    behind: int | None
    """Ended runs past the cursor, counted up to COUNT_BOUND + 1 (None: unreadable)."""


def holder(text: str | None, now: float) -> dict[str, Any] | None:
    """The lease's worker and expiry if it is held at ``now``."""
    try:
        lease = json.loads(text) if text is not None else None
        if isinstance(lease, dict) and lease.get("worker") and float(lease["until"]) > now:
            return {"worker": str(lease["worker"]), "until": float(lease["until"])}
    except (ValueError, TypeError, KeyError):
        pass
    return None


async def projection_states(
    store: Store, wanted: Sequence[tuple[str, Projection | None]]
) -> list[ProjectionState]:
    out = []
    for name, item in wanted:
        cursor = await _events(store).get_cursor(cursor_name(name))
        lease = await _events(store).get_cursor(lease_name(name))
        now = await store.now()
        at = decoded(cursor)
        behind = None
        if cursor is None or at is not None:
            behind = len(await _events(store).ended_runs(at, COUNT_BOUND + 1))
        out.append(ProjectionState(name, item, cursor, holder(lease, now), behind))
    return out


def workflows_text(item: Projection | None) -> str:
    if item is None:
        return "(not defined here)"
    return "all" if item.workflows is None else ",".join(sorted(item.workflows))


def projection_dict(state: ProjectionState) -> dict[str, Any]:
    item, lease = state.item, state.lease
    return {
        "name": state.name,
        "defined": item is not None,
        "workflows": None if item is None or item.workflows is None else sorted(item.workflows),
        "batch_size": item.batch_size if item else None,
        "settle_s": item.settle if item else None,
        "cursor": state.cursor,
        "position": position_dict(state.cursor),
        "lease": None
        if lease is None
        else {"worker": lease["worker"], "until": render.iso(lease["until"], precise=True)},
        **count_fields(state.behind, "behind"),
    }


def projections_table(states: Sequence[ProjectionState]) -> str:
    headers = ("PROJECTION", "WORKFLOWS", "BATCH", "SETTLE", "POSITION", "LEASE", "BEHIND")
    rows = [
        (
            state.name,
            workflows_text(state.item),
            str(state.item.batch_size) if state.item else "-",
            render.duration_text(state.item.settle) if state.item else "-",
            position_text(state.cursor),
            "nobody"
            if state.lease is None
            else f"{state.lease['worker']} until {render.iso(state.lease['until'])}",
            "-" if state.behind is None else count_text(state.behind),
        )
        for state in states
    ]
    return render.table(headers, rows)


@click.group("projections")
def projections_group() -> None:
    """Look at projections' positions and leases; move a projection's cursor.

    A projection is fed the runs that end, in order, by one worker at a time (see
    pyrula.workflows.projection).
    """


@projections_group.command("list")
@click.argument("names", nargs=-1, metavar="[NAME]...")
@import_option
@store_option
@json_option
def list_command(
    names: tuple[str, ...], modules: tuple[str, ...], store_url: str | None, as_json: bool
) -> None:
    """List projections: position, the worker holding the lease, and how far behind.

    Shows the projections the --import modules define, or with NAMEs only those (a NAME
    no module defines shows its cursors alone). BEHIND counts the ended runs past the
    position, of every workflow, up to 10000.
    """
    import_workflow_modules(modules)
    defined = {item.name: item for item in default_projections.all()}
    asked = checked_names(names, "projection name")
    wanted = [(name, defined.get(name)) for name in asked or sorted(defined)]
    states = with_store(store_url, lambda store: projection_states(store, wanted)) if wanted else []
    if as_json:
        render.echo_json({"projections": [projection_dict(state) for state in states]})
    elif not states:
        click.echo("no projections (give --import MODULE, or the NAME of a projection)")
    else:
        click.echo(projections_table(states))


# -- reset -------------------------------------------------------------------------------
async def last_after(store: Store, after: Position | None) -> Position | None:
    """The position of the last run that ended after ``after``, or None if none did."""
    last = None
    while True:
        page = await _events(store).ended_runs(after, PAGE)
        if page:
            run = page[-1]
            last = after = (run.finished_at or 0.0, run.run_id)
        if len(page) < PAGE:
            return last


async def newest_ended(store: Store, floor: Position | None) -> Position | None:
    """The position of the run that ended last, among those after ``floor``: looked for
    in the last second, then 8 s, 64 s, ... (so it reads about the runs of the window
    it is found in, not the whole history), at last from ``floor``."""
    now = await store.now()
    window = FIRST_WINDOW
    while True:
        after = (now - window, "")
        if after[0] <= 0 or (floor is not None and floor >= after):
            return await last_after(store, floor)
        found = await last_after(store, after)
        if found is not None:
            return found
        window *= 8


def unchanged_text(cursor: str | None, to_start: bool) -> str:
    """Why ``reset`` had nothing to do."""
    if to_start and cursor is None:
        return "not started, so it starts from the first ended run"
    if to_start:
        return "at the start already"
    if cursor is None:
        return "no run has ended"
    return f"no run ended past its position ({position_text(cursor)})"


@dataclass(frozen=True)
class Reset:
    """What ``reset`` did: the cursor before and after (equal: nothing to do)."""

    before: str | None
    after: str | None


@projections_group.command("reset")
@click.argument("name")
@click.option("--to-start", is_flag=True, help="Deliver every ended run the store holds again.")
@click.option("--to-now", is_flag=True, help="Skip every run that has ended until now.")
@click.option("--yes", is_flag=True, help="Do it (the command refuses without it).")
@import_option
@store_option
@json_option
def reset_command(
    name: str,
    to_start: bool,
    to_now: bool,
    yes: bool,
    modules: tuple[str, ...],
    store_url: str | None,
    as_json: bool,
) -> None:
    """Move projection NAME's cursor to the start (--to-start) or past the newest ended
    run (--to-now), for every worker.

    NAME must be defined by an --import module or have a cursor in the store. A worker
    delivering a batch meanwhile keeps the cursor where it put it: the command then
    changes nothing and exits 1 (run it again).
    """
    if to_start == to_now:
        raise CliUsageError("give exactly one of --to-start or --to-now")
    [name] = checked_names([name], "projection name")
    if not yes:
        what = "deliver every ended run again" if to_start else "skip every run ended until now"
        raise CliUsageError(
            f"reset makes projection {name!r} {what}, for every worker; pass --yes to do it"
        )
    import_workflow_modules(modules)
    known = any(item.name == name for item in default_projections.all())

    async def reset(store: Store) -> Reset:
        current = await _events(store).get_cursor(cursor_name(name))
        if current is None and not known:
            where = (
                f"the --import modules ({', '.join(modules)}) do not define it"
                if modules
                else "no --import module defines it"
            )
            raise CliError(
                f"no projection {name!r}: {where}, and {store.url} has no cursor for it "
                "(give --import MODULE, the module that defines it)"
            )
        if to_start:
            if current is None or decoded(current) == START:
                return Reset(current, current)  # it starts from the first already
            target = START_CURSOR
        else:
            floor = decoded(current)
            newest = await newest_ended(store, floor)
            if newest is None:
                return Reset(current, current)  # no run ended past it
            target = json.dumps(list(newest))
        if not await _events(store).swap_cursor(cursor_name(name), current, target):
            raise CliError(
                f"projection {name!r}: its cursor moved while resetting it (a worker "
                "delivered a batch); nothing changed, run the command again"
            )
        return Reset(current, target)

    done = with_store(store_url, reset)
    if as_json:
        render.echo_json(
            {
                "projection": name,
                "changed": done.before != done.after,
                "before": {"cursor": done.before, "position": position_dict(done.before)},
                "after": {"cursor": done.after, "position": position_dict(done.after)},
            }
        )
    elif done.before == done.after:
        click.echo(f"projection {name}: {unchanged_text(done.before, to_start)}; nothing changed")
    elif to_start:
        click.echo(
            f"projection {name}: reset to the start (was: {position_text(done.before)}); "
            "workers deliver every ended run again from their next look"
        )
    else:
        click.echo(
            f"projection {name}: moved past the newest ended run, to "
            f"{position_text(done.after)} (was: {position_text(done.before)}); workers "
            "deliver the runs that end from now on"
        )
