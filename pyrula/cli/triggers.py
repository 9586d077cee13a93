"""``pyrula triggers list|send``: look at batch triggers' buffers, and send them events.

``list`` shows the triggers defined by the modules ``--import`` names (and the buffers
of any trigger named on the command line); ``send`` appends events through the blocking
``WorkflowClient.send_events``, as a script would. See :mod:`pyrula.workflows.triggers`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import IO, Any, TypeVar

import click

from pyrula.cli import render
from pyrula.cli.render import CliError, CliUsageError
from pyrula.cli.runs import json_option, store_option, with_store
from pyrula.cli.worker import import_workflow_modules
from pyrula.workflows import InvalidParams, PayloadError, PyrulaError, Store, open_store
from pyrula.workflows.errors import ConfigurationError
from pyrula.workflows.stores.base import EventStore, events_of
from pyrula.workflows.sync import WorkflowClient
from pyrula.workflows.triggers import BatchTrigger, check_name, default_triggers

F = TypeVar("F", bound=Callable[..., Any])

COUNT_BOUND = 10_000
"""Most events (or runs) a ``list`` counts; past it, ``10000+``."""


def _events(store: Store) -> EventStore:
    """The store's events and cursors part (``pyrula triggers`` reads them)."""
    return events_of(store, "pyrula triggers")


def import_option(command: F) -> F:
    return click.option(
        "--import",
        "modules",
        multiple=True,
        metavar="MODULE",
        help="Import MODULE (dotted name, importable from the current directory) so the "
        "definitions in it register, as `pyrula worker --workflow MODULE` does. Repeatable.",
    )(command)


def checked_names(names: Iterable[str], what: str) -> list[str]:
    """``names`` without repeats, each one a valid trigger/projection name."""
    out: list[str] = []
    for name in names:
        try:
            check_name(name, what)
        except ConfigurationError as exc:
            raise CliUsageError(str(exc)) from None
        if name not in out:
            out.append(name)
    return out


def count_text(count: int) -> str:
    """``12``, or ``10000+`` past the bound."""
    return f"{COUNT_BOUND}+" if count > COUNT_BOUND else str(count)


def count_fields(count: int | None, key: str) -> dict[str, Any]:
    """``{key: n, key_capped: bool}``: n at most COUNT_BOUND; capped means "at least"."""
    if count is None:
        return {key: None, f"{key}_capped": False}
    return {key: min(count, COUNT_BOUND), f"{key}_capped": count > COUNT_BOUND}


# -- list --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TriggerState:
    """A trigger (its definition, if this process has one) and its buffer."""

    name: str
    trigger: BatchTrigger | None
    waiting: int
    """Events waiting, counted up to COUNT_BOUND + 1."""
    oldest_age: float | None
    """Store time minus the oldest waiting event's created_at; None when none wait."""


async def buffer_states(
    store: Store, wanted: Sequence[tuple[str, BatchTrigger | None]]
) -> list[TriggerState]:
    out = []
    for name, trigger in wanted:
        events = await _events(store).read_events(name, COUNT_BOUND + 1)
        now = await store.now()
        age = now - events[0].created_at if events else None
        out.append(TriggerState(name, trigger, len(events), age))
    return out


def trigger_dict(state: TriggerState) -> dict[str, Any]:
    trigger = state.trigger
    return {
        "name": state.name,
        "defined": trigger is not None,
        "workflow": trigger.workflow if trigger else None,
        "max_size": trigger.max_size if trigger else None,
        "max_wait_s": trigger.max_wait if trigger else None,
        "param": trigger.param if trigger else None,
        **count_fields(state.waiting, "waiting"),
        "oldest_age_s": state.oldest_age,
    }


def triggers_table(states: Sequence[TriggerState]) -> str:
    headers = ("TRIGGER", "WORKFLOW", "MAX SIZE", "MAX WAIT", "WAITING", "OLDEST")
    rows = [
        (
            state.name,
            state.trigger.workflow if state.trigger else "(not defined here)",
            str(state.trigger.max_size) if state.trigger else "-",
            render.duration_text(state.trigger.max_wait) if state.trigger else "-",
            count_text(state.waiting),
            render.duration_text(state.oldest_age),
        )
        for state in states
    ]
    return render.table(headers, rows)


@click.group("triggers")
def triggers_group() -> None:
    """Look at batch triggers' buffers; send them events.

    A batch trigger buffers events in the store; the workers that serve its workflow
    start one run per batch (see pyrula.workflows.batch_trigger).
    """


@triggers_group.command("list")
@click.argument("names", nargs=-1, metavar="[NAME]...")
@import_option
@store_option
@json_option
def list_command(
    names: tuple[str, ...], modules: tuple[str, ...], store_url: str | None, as_json: bool
) -> None:
    """List batch triggers: their definition, the events waiting and the oldest's age.

    Shows the triggers the --import modules define, or with NAMEs only those (a NAME no
    module defines shows its buffer alone). WAITING counts up to 10000.
    """
    import_workflow_modules(modules)
    asked = checked_names(names, "trigger name")
    if asked:
        wanted = [(name, default_triggers.find(name)) for name in asked]
    else:
        wanted = [(trigger.name, trigger) for trigger in default_triggers.all()]
    states = with_store(store_url, lambda store: buffer_states(store, wanted)) if wanted else []
    if as_json:
        render.echo_json({"triggers": [trigger_dict(state) for state in states]})
    elif not states:
        click.echo("no batch triggers (give --import MODULE, or the NAME of a trigger)")
    else:
        click.echo(triggers_table(states))


# -- send --------------------------------------------------------------------------------
def read_values(values: Sequence[str], file: IO[str] | None) -> list[Any]:
    """Every event, parsed, before anything is sent: a bad one is a usage error naming
    where it came from."""
    if values and file is not None:
        raise CliUsageError("give the events as JSON arguments or with --file, not both")
    if file is not None:
        where = "stdin" if file.name == "<stdin>" else file.name
        events = [
            render.parse_json(line, f"--file {where} line {number}")
            for number, line in enumerate(file, start=1)
            if line.strip()
        ]
        if not events:
            raise CliUsageError(f"--file {where} holds no JSON value")
        return events
    if not values:
        raise CliUsageError("give at least one event: JSON arguments, or --file FILE")
    return [render.parse_json(text, f"JSON argument {i}") for i, text in enumerate(values, 1)]


def seqs_text(seqs: Sequence[int]) -> str:
    """``5``, ``5-9`` for a contiguous run, else the seqs comma-separated."""
    if len(seqs) == 1:
        return str(seqs[0])
    if list(seqs) == list(range(seqs[0], seqs[0] + len(seqs))):
        return f"{seqs[0]}-{seqs[-1]}"
    return ", ".join(str(seq) for seq in seqs)


@triggers_group.command("send")
@click.argument("name")
@click.argument("values", nargs=-1, metavar="[JSON]...")
@click.option(
    "--file",
    "file",
    type=click.File("r", encoding="utf-8"),
    metavar="FILE",
    help="Read the events from FILE, one JSON value per line (blank lines skipped); - reads stdin.",
)
@store_option
@json_option
def send_command(
    name: str,
    values: tuple[str, ...],
    file: IO[str] | None,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Append events (JSON values) to the buffer of batch trigger NAME; print their seqs.

    Every value is checked before any is sent, and all are appended as one write. Put
    `--` before values that start with a dash (`-- -1`).
    """
    events = read_values(values, file)
    try:
        store = open_store(store_url)
    except PyrulaError as exc:
        raise CliError(str(exc)) from None
    try:
        with WorkflowClient(store, require_registered=False) as client:
            seqs = client.send_events(name, events)
    except (InvalidParams, PayloadError) as exc:  # a bad name, a value too large
        raise CliUsageError(str(exc)) from None
    except PyrulaError as exc:
        raise CliError(str(exc)) from None  # store messages mask passwords
    if as_json:
        render.echo_json({"trigger": name, "seqs": seqs})
    else:
        click.echo(f"sent {len(seqs)} event(s) to trigger {name}: seq {seqs_text(seqs)}")
