"""Celery's operational commands on the pyrula CLI: ``purge`` here, ``call`` and
``result`` in :mod:`pyrula.cli.celery_calls`, ``control`` in
:mod:`pyrula.cli.celery_control`.

Each takes a Celery app built with ``pyrula_compat`` (``-A proj``, before or after the
command, as ``celery -A proj purge`` takes it) and works on the store the app's worker
serves: its broker URL, unless ``--store URL`` is given on the command line, or Celery's
``-b URL`` before the command (:func:`client_store`). The app is
loaded as a client loads it: its task modules (``include``, ``imports``,
``autodiscover_tasks``) are imported, and no worker signal is sent.

``purge`` revokes every task of the app that is waiting to start (queued, or held back
by a countdown or eta, and never started): each becomes a cancelled run, so its result
reads ``REVOKED`` (in Celery a purged task's id reads ``PENDING`` forever). Tasks that
have started are left alone (:func:`pyrula.workflows.purging.purge_queued`, which
``pyrula worker --purge`` and ``app.control.purge()`` use too).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from pyrula.cli import app_loader
from pyrula.cli.render import CliUsageError, mask_url
from pyrula.cli.runs import store_option, with_store
from pyrula.cli.worker import given_on_command_line
from pyrula.workflows.purging import purge_queued
from pyrula.workflows.stores import DEFAULT_STORE_URL

F = TypeVar("F", bound=Callable[..., Any])

PLAIN_COMMANDS = {"call": "runs submit", "result": "runs show", "control": "runs cancel"}
"""What a plain pyrula user runs instead of each Celery command."""


# -- which tasks a queue holds ---------------------------------------------------------
def _matches(pattern: Any, name: str) -> bool:
    """A ``task_routes`` key against a task name, as Celery's MapRoute: a compiled regex
    or a glob (``*``) matches from the start of the name; any other key is exact."""
    if isinstance(pattern, re.Pattern):
        return pattern.match(name) is not None
    if isinstance(pattern, str) and "*" in pattern:
        return re.match(re.escape(pattern).replace(r"\*", ".*?"), name) is not None
    return bool(pattern == name)


def _queue_name(queue: Any) -> str | None:
    return None if queue is None else str(getattr(queue, "name", queue))


def routed_queue(routes: Any, name: str) -> str | None:
    """The queue ``task_routes`` sends task ``name`` to (None: no route names one).

    Reads what can be read without running code: a mapping, or a list of mappings and
    lists of ``(pattern, route)`` pairs; exact names first, then globs and regexes; a
    route is a queue name or a dict with ``queue``. A router function or class (or its
    import path) raises TypeError."""
    routers = routes if isinstance(routes, (list, tuple)) else [routes]
    for router in routers:
        if isinstance(router, Mapping):
            items = list(router.items())
        elif isinstance(router, (list, tuple)) and all(
            isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in router
        ):
            items = [(pair[0], pair[1]) for pair in router]
        else:
            raise TypeError(f"a router pyrula cannot read: {router!r}")
        found = [route for key, route in items if key == name]
        found = found or [route for key, route in items if _matches(key, name)]
        if found:
            route = found[0]
            return _queue_name(route.get("queue") if isinstance(route, Mapping) else route)
    return None


def purge_targets(app: Any, queues: set[str], excluded: set[str]) -> list[str]:
    """The workflows ``pyrula purge -A`` purges: every task of the app and its canvas
    runs, or with ``-Q``/``-X`` those whose queue (the task's ``queue=``, else its
    ``task_routes`` entry, else ``task_default_queue``) is named and not excluded."""
    from pyrula_compat.app.control import purgeable

    names = purgeable(app)
    if not queues and not excluded:
        return names
    default = app.conf.task_default_queue or "celery"
    routes = app.conf.task_routes
    chosen = []
    for name in names:
        task = app.tasks.get(name)
        queue = _queue_name(getattr(task, "queue", None))
        if queue is None and routes:
            try:
                queue = routed_queue(routes, name)
            except TypeError:
                raise CliUsageError(
                    "-Q/-X: task_routes holds a router pyrula cannot read without calling "
                    "it, so which tasks a queue holds is unknown; drop -Q/-X to purge every "
                    "task of the app"
                ) from None
        queue = queue or default
        if (not queues or queue in queues) and queue not in excluded:
            chosen.append(name)
    return chosen


# -- loading the app (shared by the Celery commands) ------------------------------------
def app_options(command: F) -> F:
    """``-A/--app`` and ``--store``, as ``pyrula status`` takes them."""
    command = store_option(command)
    return click.option(
        "--app",
        "-A",
        "celery_app",
        metavar="APP",
        default=None,
        help="The Celery app (pyrula_compat), found as `celery -A` finds it. Its store is "
        "the one `pyrula -A APP worker` serves: its broker URL unless --store (or -b "
        "before the command) is given.",
    )(command)


def load_app(celery_app: str | None, store_url: str | None, command: str) -> tuple[Any, Any]:
    """The app ``-A`` names (given before or after the command) with its task modules
    imported, and the store URL it serves (None: pyrula's default), which the app in
    this process then uses too."""
    from pyrula_compat import signals
    from pyrula_compat.exceptions import ImproperlyConfigured
    from pyrula_compat.worker import setup_django

    spec = app_loader.app_spec({"celery_app": celery_app})
    if spec is None:
        plain = PLAIN_COMMANDS.get(command)
        hint = f" (for a plain workflow's runs: `pyrula {plain}`)" if plain else ""
        raise CliUsageError(f"`pyrula {command}` needs a Celery app: give -A APP{hint}")
    app = app_loader.import_app(spec)
    try:
        app.check_serializers()
        setup_django()
        app.import_default_modules()
        signals.import_modules.send(sender=app)
        app.finalize()
        app.on_after_configure.send(sender=app, source=app.conf)
    except ImproperlyConfigured as exc:
        raise CliUsageError(f"-A {spec}: {exc}") from None
    except ImportError as exc:
        raise CliUsageError(f"-A {spec}: cannot import a task module: {exc}") from None
    return app, client_store(store_url, app, spec)


def client_store(store_url: str | None, app: Any = None, spec: str | None = None) -> str | None:
    """The store an app command that serves nothing (status, inspect, purge, call,
    result, control) works on; None: pyrula's default.

    ``--store URL``, or Celery's ``-b/--broker URL`` given before the command (``pyrula
    -b redis://h:6379/0 status``), mapped to a store as the app maps its broker URL
    (``sqla+sqlite://`` is ``sqlite://``, ``amqp://`` a usage error: the one mapping,
    :func:`pyrula_compat.store.store_url`); the two naming different stores is a usage
    error. With ``app`` (``-A spec``), either wins over the app's own store and the app
    in this process uses it too; without them, the app's own store, as ``pyrula -A APP
    worker`` serves it (:meth:`~pyrula.cli.app_loader.LoadedApp.serve_store`). A
    ``--result-backend URL`` before the command must name the server of the store used,
    as the app's ``result_backend`` must name its broker's."""
    from pyrula_compat.exceptions import ImproperlyConfigured
    from pyrula_compat.worker import AppWorker

    url, explicit = store_url, bool(store_url) and given_on_command_line("store_url")
    ctx = click.get_current_context(silent=True)
    given = {option.dest: str(value) for option, value in app_loader.group_values(ctx)}
    broker, backend = given.get("celery_broker"), given.get("celery_result_backend")
    if broker:
        mapped = app_loader.as_store_url("-b/--broker", broker, None)
        if explicit and url != mapped:
            raise CliUsageError(
                f"-b/--broker {mask_url(broker)!r} before the command and --store "
                f"{mask_url(str(url))!r} after it name different stores: give one of them"
            )
        url, explicit = mapped, True
    if app is not None:
        if url and explicit:  # the app's own broker URL need not be one pyrula takes
            own = None
        else:
            try:
                own = app.store_url()
            except ImproperlyConfigured as exc:
                raise CliUsageError(f"-A {spec}: {exc}") from None
        loaded = app_loader.LoadedApp(app=app, setup=AppWorker(app), store_url=own)
        url = loaded.serve_store(url, explicit=explicit)
    if backend:
        app_loader.as_store_url("--result-backend", url or DEFAULT_STORE_URL, backend)
    return url


def note(text: str) -> None:
    """One ``note: ...`` line on stderr."""
    click.echo(f"note: {text}", err=True)


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _names(values: tuple[str, ...]) -> set[str]:
    return {name.strip() for value in values for name in value.split(",") if name.strip()}


# -- pyrula purge ----------------------------------------------------------------------
@click.command("purge")
@click.option("-f", "--force", is_flag=True, help="Don't prompt for verification.")
@click.option(
    "-Q",
    "--queues",
    multiple=True,
    metavar="QUEUES",
    help="Comma-separated queue names: purge only the tasks routed to them, by their "
    "queue= option or task_routes (pyrula itself has no queues).",
)
@click.option(
    "-X",
    "--exclude-queues",
    multiple=True,
    metavar="QUEUES",
    help="Comma-separated queue names whose tasks are not purged.",
)
@click.option(
    "--workflow",
    "workflows",
    multiple=True,
    metavar="NAME",
    help="Instead of -A: purge the runs of workflow NAME (repeatable).",
)
@app_options
def purge_command(
    force: bool,
    queues: tuple[str, ...],
    exclude_queues: tuple[str, ...],
    workflows: tuple[str, ...],
    store_url: str | None,
    celery_app: str | None,
) -> None:
    """Revoke every task waiting to start, as `celery purge` empties the queues.

    The app's tasks that are queued, or held back by a countdown or eta, become REVOKED
    (cancelled runs; Celery's purged ids read PENDING instead). Tasks that have started
    (running, retrying, requeued after their worker died) are left alone. Asks first
    unless -f.
    """
    spec = app_loader.app_spec({"celery_app": celery_app})
    wanted, excluded = _names(queues), _names(exclude_queues)
    if spec is not None and workflows:
        raise CliUsageError("give -A APP or --workflow NAME, not both")
    if spec is not None:
        app, url = load_app(spec, store_url, "purge")
        targets = purge_targets(app, wanted, excluded)
        what = f"the tasks of app {spec}"
        if wanted:
            what += f" routed to {', '.join(sorted(wanted))}"
        if excluded:
            what += f" except those routed to {', '.join(sorted(excluded))}"
    elif workflows:
        if wanted or excluded:
            raise CliUsageError("-Q/-X pick a Celery app's tasks by queue: give -A APP")
        url, targets = client_store(store_url), list(dict.fromkeys(workflows))
        what = f"the runs of {', '.join(targets)}"
    else:
        raise CliUsageError("give -A APP (a Celery app's tasks) or --workflow NAME (repeatable)")
    if not targets:
        click.echo("No messages purged from 1 queue.")
        return
    if not force:
        where = mask_url(url or os.environ.get("PYRULA_STORE_URL") or DEFAULT_STORE_URL)
        click.echo(
            f"{click.style('WARNING', fg='red')}: This will revoke every task waiting to "
            f"start in {where}: {what} ({plural(len(targets), 'task name')}), queued or "
            "held back by a countdown or eta.\n"
            "         There is no undo for this operation!\n\n"
            "(to skip this prompt use the -f option)"
        )
        click.confirm("Are you sure you want to delete all tasks", abort=True)
    purged = with_store(url, lambda store: purge_queued(store, targets))
    if purged:
        click.echo(f"Purged {plural(purged, 'message')} from 1 known task queue.")
    else:
        click.echo("No messages purged from 1 queue.")
