"""``pyrula call`` and ``pyrula result``: Celery's ``celery call`` and ``celery result``
on a ``pyrula_compat`` app (see :mod:`pyrula.cli.celery_commands` for how the app and
its store are found).

``call`` queues a task by name as ``app.send_task`` does and prints its id; a task the
app registers has its arguments checked against its signature first. ``result`` waits
for a task to end and prints its value as Celery prints it (a string as it is, a list
one ``* item`` a line, a dict as indented JSON, anything else ``pprint``-ed), or its
stored traceback with ``--traceback``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from pyrula.cli import render
from pyrula.cli.celery_commands import app_options, load_app, note
from pyrula.cli.inspect import pretty
from pyrula.cli.render import CliError, CliUsageError
from pyrula.workflows import PyrulaError

NO_QUEUES = "pyrula has no queues; any worker of the app runs the task"


def _moment(text: str, flag: str) -> datetime:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise CliUsageError(
            f"{flag}: {render.clip(text)!r} is not an ISO 8601 time (2030-01-01T09:00:00Z)"
        ) from None


def _expiry(text: str) -> float | datetime:
    """``--expires``: seconds from now, or an ISO 8601 time, as ``celery call`` reads it."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise CliUsageError(
            f"--expires: {render.clip(text)!r} is neither seconds nor an ISO 8601 time"
        ) from None


def call_arguments(args_text: str | None, kwargs_text: str | None) -> tuple[list[Any], Any]:
    """``-a``/``-k`` as a list and a dict; anything else is a usage error."""
    return (
        render.parse_json_array(args_text, "-a/--args"),
        render.parse_json_object(kwargs_text, "-k/--kwargs"),
    )


def _app_name(app: Any) -> str:
    return str(app.main or app)


@click.command("call")
@click.argument("name")
@click.option(
    "-a", "--args", "args_text", metavar="JSON", help="Positional arguments, a JSON array."
)
@click.option(
    "-k", "--kwargs", "kwargs_text", metavar="JSON", help="Keyword arguments, a JSON object."
)
@click.option("--eta", metavar="ISO-8601", help="Start no sooner than this time (naive: UTC).")
@click.option(
    "--countdown",
    type=float,
    metavar="SECONDS",
    help="Start no sooner than this many seconds from now (wins over --eta, as in Celery).",
)
@click.option(
    "--expires",
    metavar="ISO-8601|SECONDS",
    help="Revoke the task if it has not started by then (seconds count from now).",
)
@click.option(
    "--serializer", default="json", show_default=True, help="Only json: pyrula stores JSON."
)
@click.option("--queue", metavar="NAME", help="Accepted, no effect: pyrula has no queues.")
@click.option("--exchange", metavar="NAME", help="Accepted, no effect.")
@click.option("--routing-key", metavar="KEY", help="Accepted, no effect.")
@app_options
def call_command(
    name: str,
    args_text: str | None,
    kwargs_text: str | None,
    eta: str | None,
    countdown: float | None,
    expires: str | None,
    serializer: str,
    queue: str | None,
    exchange: str | None,
    routing_key: str | None,
    store_url: str | None,
    celery_app: str | None,
) -> None:
    """Send task NAME, as app.send_task does, and print its id.

    A task the app registers has its arguments checked first (exit 2 when they do not
    fit, and nothing is sent). A name the app does not register is sent all the same,
    as send_task sends it: it waits, PENDING, for a worker that knows it.
    """
    args, kwargs = call_arguments(args_text, kwargs_text)
    if serializer.lower() not in ("json", "application/json"):
        raise CliUsageError(f"--serializer {serializer}: pyrula stores task arguments as JSON")
    moment = None if eta is None else _moment(eta, "--eta")
    expiry = None if expires is None else _expiry(expires)
    routing = (("--queue", queue), ("--exchange", exchange), ("--routing-key", routing_key))
    for flag, given in routing:
        if given is not None:
            note(f"{flag} accepted, no effect: {NO_QUEUES}")
    app, _url = load_app(celery_app, store_url, "call")
    task = app.tasks.get(name)  # an unknown name: send_task warns if no worker serves it
    if task is not None and task._typing():
        try:
            task.check_arguments(*args, **kwargs)
        except TypeError as exc:
            raise CliUsageError(f"{name}: the arguments do not fit its signature: {exc}") from None
    from pyrula_compat.store import close_clients

    try:
        sent = app.send_task(
            name, args=args, kwargs=kwargs, countdown=countdown, eta=moment, expires=expiry,
            queue=queue, exchange=exchange, routing_key=routing_key,
        )  # fmt: skip
    except PyrulaError as exc:  # the store is unreachable or refused it
        raise CliError(f"{name} not sent: {exc}") from None
    finally:
        close_clients()
    click.echo(sent.id)


@click.command("result")
@click.argument("task_id")
@click.option(
    "-t", "--task", "task_name", metavar="NAME", help="The task's name: its own result class."
)
@click.option(
    "--traceback",
    "show_traceback",
    is_flag=True,
    help="Print the stored traceback instead (at once: no waiting; None when there is none).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Wait at most this long for the task to end [default: no limit, as Celery].",
)
@app_options
def result_command(
    task_id: str,
    task_name: str | None,
    show_traceback: bool,
    timeout: float | None,
    store_url: str | None,
    celery_app: str | None,
) -> None:
    """Print the result of task TASK_ID, as `celery result` does.

    Waits for the task to end, as Celery's result.get() does; an id no task has yet
    reads PENDING and is waited for too (a note says so). --timeout bounds the wait
    (exit 1 when it passes). A task that failed or was revoked prints its error, exit 1.
    """
    app, _url = load_app(celery_app, store_url, "result")
    if task_name is not None:
        task = app.tasks.get(task_name)
        if task is None:
            raise CliUsageError(f"-t {task_name}: app {_app_name(app)} registers no such task")
        result = task.AsyncResult(task_id)
    else:
        result = app.AsyncResult(task_id)
    from pyrula_compat.store import close_clients

    try:
        value = _traceback(result) if show_traceback else _wait(result, task_id, timeout)
    except PyrulaError as exc:  # the store is unreachable
        raise CliError(str(exc)) from None
    finally:
        close_clients()
    click.echo(pretty(value)[1])


def _traceback(result: Any) -> Any:
    value = result.traceback
    return value.rstrip("\n") if isinstance(value, str) else value


def _wait(result: Any, task_id: str, timeout: float | None) -> Any:
    from pyrula_compat import states
    from pyrula_compat.exceptions import TimeoutError as ResultTimeout

    if timeout is None and not result.exists():
        note(
            f"no task with id {task_id} in the store yet: waiting for it, as Celery waits "
            "on a PENDING id (Ctrl-C stops; --timeout bounds the wait)"
        )
    try:
        return result.get(timeout=timeout)
    except Exception as exc:  # the task's own exception, TaskRevokedError, or time up
        state = result.state
        if state in states.READY_STATES:  # failed or revoked
            raise CliError(f"task {task_id} {state}: {type(exc).__name__}: {exc}") from None
        if isinstance(exc, ResultTimeout):
            raise CliError(
                f"task {task_id} is still {state} after {timeout or 0:g} s. {exc}".rstrip()
            ) from None
        raise
