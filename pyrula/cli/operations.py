"""``pyrula runs bulk retry|cancel`` and ``pyrula schedules run-now``: the dashboard's
actions that no other command has, done by the same code
(:mod:`pyrula.cli.dashboard.actions`) and recorded in the same histories."""

from __future__ import annotations

import getpass
from typing import Any

import click

from pyrula.cli import render
from pyrula.cli.dashboard import actions, queries
from pyrula.cli.dashboard.filters import run_filter
from pyrula.cli.render import CliError, CliUsageError
from pyrula.cli.runs import json_option, store_option, with_store
from pyrula.cli.schedules import schedule_dict
from pyrula.workflows import RunStatus, Store
from pyrula.workflows.registry import default_registry


def operator() -> str:
    """Who the history records: ``cli:<login name>``."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no login name for this uid
        return "cli"


@click.command("bulk")
@click.argument("action", type=click.Choice(actions.BULK_ACTIONS))
@click.option("--workflow", metavar="NAME", help="Only runs of this workflow.")
@click.option("--status", type=click.Choice([s.value for s in RunStatus]), help="Only this status.")
@click.option("--owner", metavar="OWNER", help="Only runs of this owner ('' is the default).")
@click.option("--worker", metavar="ID", help="Only runs this worker last held.")
@click.option("--since", metavar="TIME", help="Only runs created at or after TIME (ISO, UTC).")
@click.option("--until", metavar="TIME", help="Only runs created before TIME (ISO, UTC).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@store_option
@json_option
def bulk_command(
    action: str,
    store_url: str | None,
    as_json: bool,
    yes: bool,
    **given: str | None,
) -> None:
    """Retry or cancel every run a filter selects (up to 20,000, newest first), as the
    dashboard's "Retry all" / "Cancel all" do.

    A run the action does not fit (a retry of a run that has not ended, a cancel of one
    that has) is skipped and counted. Each run acted on records the action in its
    history. A filter is required: give at least one of the options.
    """
    if not any(v is not None for v in given.values()):
        raise CliUsageError("give a filter (--workflow, --status, --owner, ...): bulk acts on it")

    async def act(store: Store) -> actions.BulkProgress:
        try:
            selected = run_filter(given, await store.now())
        except queries.QueryError as exc:
            raise CliUsageError(str(exc)) from None
        runs = await queries.matching_runs(store, selected, queries.SCAN_LIMIT)
        if not yes and not as_json:
            click.confirm(f"{action} {len(runs)} runs?", abort=True, err=True)
        progress = actions.BulkProgress(action)
        return await actions.bulk_action(store, runs, action, operator(), progress)

    progress = with_store(store_url, act)
    if as_json:
        render.echo_json(progress.as_dict())
    else:
        click.echo(
            f"{action}: {progress.done} done, {progress.skipped} skipped (not in a state to "
            f"{action}), {progress.failed} failed, of {progress.selected} selected"
        )
    if progress.failed:
        raise CliError(f"{progress.failed} runs failed: {progress.last_error}")


@click.command("run-now")
@click.argument("schedule_id")
@store_option
@json_option
def run_now_command(schedule_id: str, store_url: str | None, as_json: bool) -> None:
    """Start a run of the schedule's workflow with its params and owner now, outside its
    timing (its next slot does not move)."""

    async def act(store: Store) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            record, run = await actions.schedule_action(
                store, default_registry, schedule_id, "run-now", operator()
            )
        except actions.ActionError as exc:
            raise CliError(exc.message) from None
        assert record is not None and run is not None  # run-now keeps the schedule
        return schedule_dict(record), render.run_dict(run, await store.now())

    schedule, run = with_store(store_url, act)
    if as_json:
        render.echo_json({"schedule": schedule, "run": run})
    else:
        click.echo(f"started run {run['run_id']} ({run['workflow']}) of schedule {schedule_id}")
