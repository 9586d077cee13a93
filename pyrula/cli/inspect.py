"""``pyrula status`` and ``pyrula inspect COMMAND``: Celery's health-check commands.

They print what ``celery status`` and ``celery inspect`` print, and exit as they do: 0
when at least one live worker matches, 69 (``EX_UNAVAILABLE``) with ``Error: No nodes
replied within time constraint`` when none does. There is no broadcast to wait for: the
answer is one read of the store (:mod:`pyrula.workflows.inspection`), where workers
heartbeat; a worker whose heartbeat is older than ``--stale-after`` does not count.
With ``-A APP`` the store is the app's, as ``pyrula -A APP worker`` serves it, unless
``--store URL`` or Celery's ``-b URL`` before the command (``pyrula -b URL status``) names
one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pprint import pformat
from typing import Any, TypeVar

import click

from pyrula.cli import app_loader
from pyrula.cli.celery_commands import client_store
from pyrula.cli.runs import store_option, with_store
from pyrula.workflows.inspection import (
    COMMANDS,
    STORE_NODE,
    Answer,
    Inspector,
    workflow_arguments,
)

F = TypeVar("F", bound=Callable[..., Any])

EX_UNAVAILABLE = 69
"""Exit code when no live worker matches (Celery's, from ``os.EX_UNAVAILABLE``)."""
NO_REPLY = "No nodes replied within time constraint"
"""Celery's message for that case."""
COMMAND_HELP = {
    "active": "List the runs each worker is running.",
    "ping": "Ping the workers (a live heartbeat answers pong).",
    "query_task": "Where each task id is: running on a worker, or waiting for its eta.",
    "registered": "List the workflows (tasks) each worker serves.",
    "reserved": "Tasks held but not started: always empty (pyrula prefetches nothing).",
    "revoked": "Revoked ids held in memory: always empty (a revoke is stored on the run).",
    "scheduled": "Tasks waiting for their countdown or eta, under the node 'store'.",
    "stats": "Each worker's pid, hostname, running count, uptime and heartbeat age.",
}


class NoNodesReplied(click.ClickException):
    """No live worker matches: ``Error: No nodes replied within time constraint``."""

    exit_code = EX_UNAVAILABLE

    def __init__(self) -> None:
        super().__init__(NO_REPLY)


def remote_control_options(command: F) -> F:
    """Celery's -t/-d/-j, and pyrula's --store, -A and --stale-after."""
    for decorator in reversed(
        (
            store_option,
            click.option(
                "--app",
                "-A",
                "celery_app",
                metavar="APP",
                default=None,
                help="A Celery app (pyrula_compat): read its store, as `pyrula -A APP worker` "
                "serves it (its broker URL unless --store, or -b before the command, is "
                "given).",
            ),
            click.option(
                "-d",
                "--destination",
                "destination",
                multiple=True,
                metavar="NAMES",
                help="Comma-separated worker ids, hostnames or Celery node names "
                "(NAME@HOSTNAME: the worker's -n, else celery@HOSTNAME). Default: every worker.",
            ),
            click.option(
                "-t",
                "--timeout",
                type=float,
                default=1.0,
                metavar="SECONDS",
                help="Accepted for Celery compatibility; no effect: the answer comes from "
                "the store at once, no reply is awaited.",
            ),
            click.option(
                "--stale-after",
                type=click.FloatRange(min=0, min_open=True),
                default=None,
                metavar="SECONDS",
                help="A worker whose last heartbeat is older than this is not counted. "
                "Default: each worker's own --lock-ttl (it heartbeats every third of it, "
                "and says which in its heartbeat).",
            ),
            click.option("-j", "--json", "as_json", is_flag=True, help="Print JSON."),
        )
    ):
        command = decorator(command)
    return command


def _app_store(store_url: str | None, spec: str) -> str | None:
    """The store ``pyrula -A spec worker`` would serve (unless ``--store`` or ``-b``
    names one: :func:`~pyrula.cli.celery_commands.client_store`)."""
    app = app_loader.import_app(spec)
    return client_store(store_url, app, spec)


def ask(
    store_url: str | None,
    celery_app: str | None,
    destination: tuple[str, ...],
    stale_after: float | None,
    command: str,
    args: tuple[str, ...] = (),
) -> Answer:
    """Answer ``command`` from the store (exit 69 when no live worker matches); with an
    app, as its ``app.control.inspect()`` answers (task arguments, retries scheduled)."""
    spec = app_loader.app_spec({"celery_app": celery_app})
    if spec is not None:
        from pyrula_compat.app.inspect import TaskInspector

        url = _app_store(store_url, spec)
        inspector: Inspector = TaskInspector(destination, stale_after)
    else:
        url = client_store(store_url)
        inspector = Inspector(destination, stale_after, workflow_arguments)
    answer = with_store(url, lambda store: inspector.inspect(store, command, args))
    if not answer.nodes:
        raise NoNodesReplied()
    return answer


# -- Celery's output -------------------------------------------------------------------


def _ok() -> str:
    return click.style("OK", fg="green", bold=True)


def _indent(text: str, width: int) -> str:
    return "\n".join(" " * width + line for line in text.split("\n"))


def pretty(reply: Any) -> tuple[str, str]:
    """Celery's ``CLIContext.pretty``: the status word and the body of one reply."""
    if isinstance(reply, list):
        if not reply:
            return _ok(), "- empty -"
        star = click.style("*", fg="white")
        return _ok(), "\n".join(f"{star} {item}" for item in reply)
    if isinstance(reply, dict):
        if "ok" in reply:
            return _ok(), _indent(pretty(reply["ok"])[1], 4)
        if "error" in reply:
            error = click.style("ERROR", fg="red", bold=True)
            return error, _indent(pretty(reply["error"])[1], 4)
        return _ok(), json.dumps(reply, sort_keys=True, indent=4, default=str)
    if isinstance(reply, str):
        return _ok(), reply
    return _ok(), pformat(reply)


def say_reply(node: str, reply: Any, show_body: bool) -> None:
    """``->  NODE: OK`` and, with ``show_body``, the reply indented (Celery's
    ``_say_remote_command_reply``)."""
    status, body = pretty(reply)
    arrow = click.style("->", fg="white", bold=True)
    click.echo(f"{arrow}  {click.style(f'{node}: ', fg='cyan', bold=True)}{status}")
    if show_body and body:
        click.echo(_indent(body, 4))


def report(answer: Answer, as_json: bool, show_body: bool) -> None:
    if as_json:
        click.echo(json.dumps(answer.replies(), default=str))
        return
    for node, reply in answer.nodes.items():
        say_reply(node, reply, show_body)
    if answer.store:
        say_reply(STORE_NODE, answer.store, show_body)
    count = len(answer.nodes)
    click.echo(f"\n{count} {'node' if count == 1 else 'nodes'} online.")


# -- the commands ----------------------------------------------------------------------


@click.command("status")
@remote_control_options
def status_command(
    store_url: str | None,
    celery_app: str | None,
    destination: tuple[str, ...],
    timeout: float,
    stale_after: float | None,
    as_json: bool,
) -> None:
    """Show the workers that are online.

    A worker is online while its last heartbeat in the store is fresh (--stale-after).
    Exits 0 when at least one is, else 69 with `Error: No nodes replied within time
    constraint` (as `celery status`), 1 when the store cannot be read.
    """
    report(ask(store_url, celery_app, destination, stale_after, "ping"), as_json, False)


def _list_commands(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    formatter = click.HelpFormatter()
    with formatter.section("Inspect Commands"):
        signatures = {"query_task": "query_task ID [ID ...]"}
        formatter.write_dl([(signatures.get(c, c), COMMAND_HELP[c]) for c in COMMANDS])
    click.echo(formatter.getvalue(), nl=False)
    ctx.exit()


@click.command("inspect")
@click.argument("command", metavar="COMMAND")
@click.argument("ids", nargs=-1, metavar="[IDS]...")
@click.option(
    "--list",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_list_commands,
    help="List the inspect commands and exit.",
)
@remote_control_options
def inspect_command(
    command: str,
    ids: tuple[str, ...],
    store_url: str | None,
    celery_app: str | None,
    destination: tuple[str, ...],
    timeout: float,
    stale_after: float | None,
    as_json: bool,
) -> None:
    """Inspect the workers: ping, active, registered, stats, ...

    COMMAND is one of active, ping, query_task (IDS...), registered, reserved, revoked,
    scheduled, stats (--list says what each answers).

    Answered from the store at once (workers' heartbeats, run records). Exits 0 when at
    least one live worker matches, else 69 with `Error: No nodes replied within time
    constraint` (as `celery inspect`), 1 when the store cannot be read.
    """
    if command not in COMMANDS:
        raise click.UsageError(
            f"Command {command} not recognized. Available inspect commands: " + ", ".join(COMMANDS)
        )
    if command == "query_task" and not ids:
        raise click.UsageError("inspect query_task needs one or more task ids")
    if command != "query_task" and ids:
        raise click.UsageError(f"inspect {command} takes no arguments, got {' '.join(ids)}")
    report(ask(store_url, celery_app, destination, stale_after, command, ids), as_json, True)
