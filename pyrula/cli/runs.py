"""``pyrula runs submit|list|show|retry|cancel|signal|purge``: start runs, look at them and
act on them in a store."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from pyrula.cli import render
from pyrula.cli.render import CliError, CliUsageError
from pyrula.cli.worker import import_workflow_modules
from pyrula.workflows import (
    InvalidParams,
    PayloadError,
    PyrulaError,
    RunHandle,
    RunNotFound,
    RunStatus,
    Store,
    WorkflowClient,
    open_store,
)
from pyrula.workflows.engine.rerun import retry_run
from pyrula.workflows.loops import purge_ended
from pyrula.workflows.records import JournalEntry, RunRecord
from pyrula.workflows.registry import default_registry
from pyrula.workflows.stores import DEFAULT_STORE_URL
from pyrula.workflows.stores.archive.wrapping import postgres_dsn_from_env, with_archive

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def store_option(command: F) -> F:
    return click.option(
        "--store",
        "store_url",
        envvar="PYRULA_STORE_URL",
        show_envvar=True,
        metavar="URL",
        help=f"Store URL [default: {DEFAULT_STORE_URL}]",
    )(command)


def json_option(command: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON document instead of a table."
    )(command)


def with_store(url: str | None, action: Callable[[Store], Awaitable[T]]) -> T:
    """Open the store, run ``action`` on it, close it; a pyrula error is one line, exit 1.

    With ``PYRULA_POSTGRES_DSN`` set, the store is wrapped as ``pyrula worker`` wraps its
    own (:func:`~pyrula.workflows.stores.archive.wrapping.with_archive`): archived runs
    are listed and shown, and ``runs purge`` deletes only what the archive holds."""

    async def main() -> T:
        store = with_archive(open_store(url), postgres_dsn_from_env())
        await store.open()
        try:
            return await action(store)
        finally:
            await store.close()

    try:
        return asyncio.run(main())
    except PyrulaError as exc:
        raise CliError(str(exc)) from None  # store messages mask passwords


async def _get(store: Store, run_id: str) -> RunRecord:
    run = await store.get_run(run_id)
    if run is None:
        raise RunNotFound(f"no run with id {run_id!r} in {store.url}")
    return run


@click.group("runs")
def runs_group() -> None:
    """Submit runs, look at them; retry, cancel or signal them; delete old ones."""


@runs_group.command("submit")
@click.argument("name")
@click.option("--params", "params_text", metavar="JSON", help="The run's params, a JSON object.")
@click.option(
    "-w",
    "--workflow",
    "modules",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE first (repeatable), so NAME's params are checked here and its rate "
    "limit and owner cap apply, as for any client that imports the workflow.",
)
@click.option(
    "--unchecked",
    is_flag=True,
    help="Submit NAME without importing it: no params check here, and no rate limit or "
    "owner cap for this run.",
)
@click.option("--delay", type=float, metavar="SECONDS", help="Start it no sooner than this.")
@click.option("--idempotency-key", metavar="KEY", help="A repeat with KEY returns the first run.")
@click.option("--run-id", metavar="ID", help="The run's id [default: a random one].")
@click.option("--owner", metavar="OWNER", help="The tenant the run belongs to.")
@click.option(
    "--wait",
    is_flag=True,
    help="Wait for the run to end and print its result; exit 1 if it did not complete.",
)
@click.option("--timeout", type=float, metavar="SECONDS", help="With --wait: wait this long.")
@store_option
@json_option
def submit_command(
    name: str,
    params_text: str | None,
    modules: tuple[str, ...],
    unchecked: bool,
    delay: float | None,
    idempotency_key: str | None,
    run_id: str | None,
    owner: str | None,
    wait: bool,
    timeout: float | None,
    store_url: str | None,
    as_json: bool,
) -> None:
    """Queue a run of workflow NAME, as WorkflowClient.submit does.

    The process submitting a run checks its params and stamps its flow control from the
    workflow's definition, so give the module that defines NAME with --workflow (as for
    `pyrula worker`), or pass --unchecked to submit by name alone.
    """
    params = render.parse_json_object(params_text, "--params")
    if timeout is not None and not wait:
        raise CliUsageError("--timeout goes with --wait")
    if modules and unchecked:
        raise CliUsageError("give --workflow MODULE or --unchecked, not both")
    if modules:
        import_workflow_modules(modules)
        if default_registry.find(name) is None:
            raise CliUsageError(
                f"no workflow named {name!r} in {', '.join(modules)} (registered: "
                f"{', '.join(sorted(d.name for d in default_registry.all())) or 'none'})"
            )
    elif not unchecked:
        raise CliUsageError(
            f"give --workflow MODULE, the module that defines {name!r} (its params are then "
            "checked and its flow control applies), or --unchecked to submit it by name alone"
        )

    async def act(store: Store) -> tuple[RunRecord, bool, float]:
        client = WorkflowClient(store, require_registered=not unchecked)
        try:
            new = client.new_run(
                name,
                params,
                owner=owner,
                delay=delay,
                idempotency_key=idempotency_key,
                run_id=run_id,
            )
        except (InvalidParams, PayloadError) as exc:  # the command line's values
            raise CliUsageError(str(exc)) from None
        run, created = await store.create_run(new)
        if wait:
            run = await store.wait_run(run.run_id, timeout)  # as it is when time is up
        return run, created, await store.now()

    run, created, now = with_store(store_url, act)
    ended = run.is_terminal
    if as_json:
        render.echo_json({"created": created, "run": render.run_dict(run, now)})
    else:
        verb = "submitted" if created else "found (same idempotency key)"
        click.echo(f"{verb} run {run.run_id} ({run.workflow}), {run.status.value}")
        if wait and ended:
            if run.status is RunStatus.COMPLETED:
                click.echo(run.result)
            elif run.error is not None:
                click.echo(render.error_line(run.error))
    if wait and not (ended and run.status is RunStatus.COMPLETED):
        why = "did not end in time" if not ended else f"ended {run.status.value}"
        raise CliError(f"run {run.run_id} {why}")


@runs_group.command("list")
@store_option
@click.option("--workflow", metavar="NAME", help="Only runs of this workflow.")
@click.option(
    "--status",
    type=click.Choice([s.value for s in RunStatus]),
    help="Only runs in this status.",
)
@click.option("--owner", metavar="OWNER", help="Only runs of this owner ('' is the default).")
@click.option(
    "--limit", type=click.IntRange(min=1), default=50, show_default=True, help="At most N runs."
)
@json_option
def list_command(
    store_url: str | None,
    workflow: str | None,
    status: str | None,
    owner: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List runs, newest first."""

    async def query(store: Store) -> tuple[list[RunRecord], float]:
        runs = await store.list_runs(
            workflow=workflow,
            status=RunStatus(status) if status is not None else None,
            owner=owner,
            limit=limit,
        )
        return runs, await store.now()

    runs, now = with_store(store_url, query)
    if as_json:
        render.echo_json({"runs": [render.run_dict(run, now) for run in runs]})
    else:
        click.echo(render.runs_table(runs, now))


@runs_group.command("show")
@click.argument("run_id")
@store_option
@json_option
def show_command(run_id: str, store_url: str | None, as_json: bool) -> None:
    """Show one run: its record, its error and its journal."""

    async def query(store: Store) -> tuple[RunRecord, list[JournalEntry], float]:
        run = await _get(store, run_id)
        return run, await store.load_journal(run_id), await store.now()

    run, journal, now = with_store(store_url, query)
    if as_json:
        render.echo_json(
            {"run": render.run_dict(run, now), "journal": [render.entry_dict(e) for e in journal]}
        )
    else:
        click.echo(render.run_detail(run, journal, now))


@runs_group.command("retry")
@click.argument("run_id")
@store_option
@json_option
def retry_command(run_id: str, store_url: str | None, as_json: bool) -> None:
    """Requeue a failed, cancelled, terminated or dead run.

    Its finished steps replay from the journal; the step that failed runs again. A child
    run whose failure ended it is retried first.
    """

    async def act(store: Store) -> tuple[RunRecord, float]:
        return await retry_run(store, run_id), await store.now()

    run, now = with_store(store_url, act)
    if as_json:
        render.echo_json({"run": render.run_dict(run, now)})
    else:
        click.echo(render.change_line("retry", run))


@runs_group.command("cancel")
@click.argument("run_id")
@click.option(
    "--terminate",
    is_flag=True,
    help="End the run now instead of at its next step boundary; a step already running "
    "may finish its effects, but its result is discarded.",
)
@store_option
@json_option
def cancel_command(run_id: str, terminate: bool, store_url: str | None, as_json: bool) -> None:
    """Cancel a run: a queued run at once, a running one at its next step boundary."""

    async def act(store: Store) -> tuple[RunRecord, float]:
        run = await (store.terminate_run(run_id) if terminate else store.cancel_run(run_id))
        return run, await store.now()

    run, now = with_store(store_url, act)
    if as_json:
        render.echo_json({"run": render.run_dict(run, now)})
    else:
        click.echo(render.change_line("cancel", run))


@runs_group.command("signal")
@click.argument("run_id")
@click.argument("name")
@click.option(
    "--payload", metavar="JSON", help="The signal's payload, any JSON value [default: null]."
)
@store_option
@json_option
def signal_command(
    run_id: str, name: str, payload: str | None, store_url: str | None, as_json: bool
) -> None:
    """Send signal NAME to a run, for its ctx.wait_for_signal(NAME).

    A run already waiting for NAME is queued at once; otherwise the signal is kept until
    the run waits for it. Each signal is received once.
    """
    value = None if payload is None else render.parse_json(payload, "--payload")

    async def act(store: Store) -> tuple[RunRecord, float]:
        run = await _get(store, run_id)
        await RunHandle(store, run.workflow, run_id).signal(name, value)
        return await _get(store, run_id), await store.now()

    run, now = with_store(store_url, act)
    if as_json:
        render.echo_json({"signal": name, "run": render.run_dict(run, now)})
    else:
        click.echo(
            f"signal {name!r} sent to run {run.run_id} ({run.workflow}), now {run.status.value}"
        )


AGE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*")
AGE_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_age(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h`` or ``7d`` as seconds (> 0)."""
    match = AGE.fullmatch(text)
    seconds = float(match.group(1)) * AGE_UNITS[match.group(2)] if match else 0.0
    if not seconds > 0:
        raise CliUsageError(
            f"--older-than: {text!r} is not an age: give seconds, or a number with s, m, h "
            "or d (7d), more than 0"
        )
    return seconds


@runs_group.command("purge")
@click.option(
    "--older-than",
    "older_than",
    required=True,
    metavar="AGE",
    help="Delete the runs that ended more than AGE ago: seconds, or a number with s, m, h "
    "or d (7d).",
)
@store_option
@json_option
def purge_command(older_than: str, store_url: str | None, as_json: bool) -> None:
    """Delete the runs that ended more than AGE ago, as a worker with --run-retention does.

    Record, result, journal, pending signals and idempotency key go; runs that have not
    ended, and child runs whose parent is still there, stay.
    """
    seconds = parse_age(older_than)

    async def act(store: Store) -> int:
        return await purge_ended(store, await store.now() - seconds)

    deleted = with_store(store_url, act)
    if as_json:
        render.echo_json({"deleted": deleted, "older_than_s": seconds})
    else:
        click.echo(f"deleted {deleted} runs that ended over {older_than.strip()} ago")
