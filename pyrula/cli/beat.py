"""``pyrula beat``: a scheduler-only process, for deployments that run Celery's beat.

Every ``pyrula worker`` already fires the store's schedules (each slot once, however
many processes look), so this command is optional. It runs the schedule loop alone
(:meth:`~pyrula.workflows.WorkflowWorker.run_schedules`): it serves no runs, sends no
heartbeat (``pyrula status`` does not list it) and is safe to run more than once.

With ``-A APP`` (or ``pyrula -A APP beat``) it loads the Celery app as ``pyrula worker
-A`` does, without the worker signals, syncs the app's ``beat_schedule`` to the app's
store, sends ``beat_init`` and fires; without an app it fires whatever schedules the
store (``--store``, ``PYRULA_STORE_URL``) holds. Celery's ``-S/--scheduler`` and
``-s/--schedule`` are accepted with a one-line note; ``--max-interval`` is
``--schedule-poll-interval``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import click

from pyrula.cli import app_loader
from pyrula.cli.daemon import Daemon, daemon_options, node_name
from pyrula.cli.logging_setup import configure_logging, loglevel_option
from pyrula.cli.render import CliError, CliUsageError, mask_url
from pyrula.cli.worker import (
    broker_as_store,
    given_on_command_line,
    import_workflow_modules,
    options_from_params,
    serve_worker,
)
from pyrula.workflows import ConfigurationError, PyrulaError, WorkflowWorker, open_store
from pyrula.workflows.options import WorkerOptions
from pyrula.workflows.stores import DEFAULT_STORE_URL

SCHEDULE_FILE_NOTE = "no schedule file; each schedule's next slot is kept in the store"


def beat_notes(values: dict[str, Any]) -> list[str]:
    """One line per Celery beat flag given that pyrula has no use for."""
    notes = []
    if values.get("celery_scheduler"):
        from pyrula_compat.beat import SCHEDULER_NOTE

        notes.append(f"note: -S accepted, no effect. --scheduler: {SCHEDULER_NOTE}")
    if values.get("celery_schedule_filename"):
        notes.append(f"note: -s accepted, no effect. --schedule: {SCHEDULE_FILE_NOTE}")
    return notes


def load_app(
    values: dict[str, Any], loglevel: str, logfile: str | None, max_interval: float
) -> app_loader.LoadedApp:
    """The app ``-A`` names, prepared as ``celery beat`` prepares it (a
    :class:`pyrula_compat.worker.BeatService`: no worker signals); logging set up."""
    from pyrula_compat.worker import BeatService

    def service(app: Any) -> BeatService:
        return BeatService(
            app,
            max_interval=max_interval,
            schedule_filename=values.get("celery_schedule_filename"),
            scheduler_cls=values.get("celery_scheduler"),
        )

    return app_loader.load(values, loglevel, logfile, make_setup=service)


@click.command("beat")
@click.option(
    "--app",
    "-A",
    "celery_app",
    metavar="APP",
    default=None,
    help="A Celery app built with pyrula_compat, found as `celery -A` finds it: its "
    "beat_schedule is synced to its store (its broker URL) at start, then fired.",
)
@click.option(
    "--workflow",
    "-w",
    "modules",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE so the runs fired for its @workflow functions carry their flow "
    "control (rate_limit, owner_concurrency). Optional; repeat for more modules.",
)
@click.option(
    "--store",
    "store_url",
    envvar="PYRULA_STORE_URL",
    show_envvar=True,
    metavar="URL",
    help=f"Store whose schedules to fire (with -A: the app's store unless given here) "
    f"[default: {DEFAULT_STORE_URL}]",
)
@loglevel_option(logfile=True)
@click.option(
    "--schedule-poll-interval",
    "--max-interval",
    "schedule_poll_interval",
    type=float,
    metavar="SECONDS",
    default=None,
    help="Longest the loop sleeps between two looks at the store's schedules (slots fire "
    "on time regardless; this bounds how late a change the store could not signal is "
    f"seen). Celery's --max-interval.  [default: {WorkerOptions.schedule_poll_interval}]",
)
@click.option(
    "--scheduler",
    "-S",
    "celery_scheduler",
    metavar="CLASS",
    default=None,
    help="Celery's scheduler class: accepted, no effect (schedules live in the store).",
)
@click.option(
    "--schedule",
    "-s",
    "celery_schedule_filename",
    metavar="FILE",
    default=None,
    help=f"Celery's schedule file: accepted, no effect ({SCHEDULE_FILE_NOTE}).",
)
@click.option(
    "--celery-alias",
    "celery_alias",
    is_flag=True,
    default=False,
    help="Make `import celery` load pyrula_compat in this process (only when Celery "
    "itself is not installed), as `pyrula worker --celery-alias` does.",
)
@daemon_options
@app_loader.hidden_flags(app_loader.CELERY_GLOBAL_FLAGS)
def beat_command(
    modules: tuple[str, ...], store_url: str | None, loglevel: str, **values: Any
) -> None:
    """Fire the store's schedules until SIGTERM or SIGINT; serve no runs.

    Optional: every worker fires the schedules too, and each slot fires once however
    many processes look, so running this next to workers, or twice, is safe. It is for
    deployments that keep a beat service (`celery -A proj beat` becomes `pyrula beat -A
    proj`). A signal stops it at once (exit 0).
    """
    options = options_from_params({"schedule_poll_interval": values["schedule_poll_interval"]})
    daemon = Daemon.from_values(values)
    daemon.enter_workdir()
    node = node_name(None)
    logfile = daemon.log_path(node)
    spec = app_loader.app_spec(values)
    loaded = load_app(values, loglevel, logfile, options.schedule_poll_interval) if spec else None
    if loaded is None:
        store_url = broker_as_store(store_url, values)
        configure_logging(loglevel, logfile)
    else:  # the app's store, unless --store itself names one
        store_url = loaded.serve_store(store_url, explicit=given_on_command_line("store_url"))
    try:
        store = open_store(store_url)
    except ConfigurationError as exc:
        raise CliUsageError(str(exc)) from None
    import_workflow_modules(modules)
    if loaded is not None:
        app_loader.merge_default_registry(loaded.app)
    for note in beat_notes(values) + app_loader.celery_notes(
        values, app_loader.CELERY_GLOBAL_FLAGS
    ):
        click.echo(note, err=True)
    worker = WorkflowWorker(
        store=store, options=options, registry=loaded.registry if loaded else None
    )
    banner = (
        f"pyrula beat {worker.worker_id} (pid {os.getpid()}): firing the schedules of "
        f"{mask_url(store.url)}, looking at least every {options.schedule_poll_interval:g}s; "
        "serving no runs"
    )
    if daemon.detach:
        daemon.start_detached(node)
        click.echo("pyrula beat: started in the background")
        return
    with daemon.running(node):
        serve_beat(worker, banner, loaded)


def serve_beat(worker: WorkflowWorker, banner: str, loaded: Any | None) -> None:
    """Run ``worker``'s schedule loop until a stop signal, with the app's start-up
    (``beat_schedule`` synced, ``beat_init``) once the store is open."""
    if loaded is not None:
        loaded.setup.on_stop_request = worker.stop  # BeatService.stop(), as in Celery
    try:
        asyncio.run(
            serve_worker(worker, banner, loaded.on_start if loaded else None, schedules_only=True)
        )
    except PyrulaError as exc:
        raise CliError(f"beat {worker.worker_id} failed: {exc}") from None
    finally:
        if loaded is not None:
            loaded.on_stop()
