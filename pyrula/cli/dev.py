"""``pyrula dev APP``: a worker and the dashboard in one process, for development.

APP is a Python file (``app.py``) or a module name (``proj.flows``). It is imported so
its ``@workflow`` functions register; if it defines a ``pyrula_compat`` Celery app, its
tasks are served as ``pyrula worker -A`` serves them. A WorkflowWorker then serves them
on the store (the worker's default store unless ``--store``), and the same event loop
serves the dashboard (:mod:`pyrula.cli.dashboard.server`) over that worker's Store
object. SIGTERM/SIGINT stop both, as they stop ``pyrula worker``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import webbrowser
from pathlib import Path
from types import ModuleType
from typing import Any

import click

from pyrula.cli import app_loader
from pyrula.cli.dashboard import server
from pyrula.cli.logging_setup import configure_logging, loglevel_option
from pyrula.cli.render import CliError, CliUsageError, mask_url
from pyrula.cli.runs import store_option
from pyrula.cli.worker import (
    given_on_command_line,
    import_workflow_modules,
    options_from_params,
    serve_worker,
)
from pyrula.workflows import ConfigurationError, PyrulaError, WorkflowWorker, open_store
from pyrula.workflows.registry import default_registry

log = logging.getLogger("pyrula.cli.dev")

DEFAULT_PORT = 8008
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def module_name(app: str) -> str:
    """The module to import for APP: a file's stem (its directory goes first on
    ``sys.path``), else APP itself as a dotted module name."""
    path = Path(app)
    if app.endswith(".py") or path.is_file():
        if not path.is_file():
            raise CliUsageError(f"no such file: {app}")
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        return path.stem
    return app


def find_celery_app(module: ModuleType) -> bool:
    """Whether ``module`` defines a ``pyrula_compat`` Celery app (only looked for when
    pyrula_compat is already imported: a module that builds one imports it)."""
    compat = sys.modules.get("pyrula_compat")
    celery = getattr(compat, "Celery", None)
    if not isinstance(celery, type):
        return False
    return any(isinstance(value, celery) for value in vars(module).values())


def listen_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


@click.command("dev")
@click.argument("app", metavar="APP")
@store_option
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    metavar="N",
    default=DEFAULT_PORT,
    show_default=True,
    help="Dashboard port; 0 picks a free one (the first output line says which).",
)
@click.option(
    "--host",
    metavar="HOST",
    default="127.0.0.1",
    show_default=True,
    help="Dashboard address. Anything but loopback shows your runs' params and results "
    "to the network, without authentication.",
)
@click.option("--open", "open_browser", is_flag=True, help="Open the dashboard in a browser.")
@click.option(
    "-c",
    "--max-concurrent-runs",
    "max_concurrent_runs",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Runs the worker executes at once [default: WorkerOptions' default].",
)
@loglevel_option()
def dev_command(
    app: str,
    store_url: str | None,
    port: int,
    host: str,
    open_browser: bool,
    max_concurrent_runs: int | None,
    loglevel: str,
) -> None:
    """Run APP's workflows in a worker and serve the dashboard of the store.

    APP is a Python file (app.py) or an importable module name. The dashboard is the one
    `pyrula dashboard` serves (runs, workers, queues, schedules, owners, an overview,
    actions; JSON under /api), on the worker's event loop. It is for development: no
    authentication, loopback unless --host says otherwise.
    SIGTERM or SIGINT stops the worker gracefully and exits 0.
    """
    name = module_name(app)
    import_workflow_modules([name])
    values: dict[str, Any] = {"max_concurrent_runs": max_concurrent_runs}
    loaded = None
    if find_celery_app(sys.modules[name]):
        values["celery_app"] = name
        loaded = app_loader.load(values, loglevel)
        store_url = loaded.serve_store(store_url, explicit=given_on_command_line("store_url"))
        app_loader.merge_default_registry(loaded.app)
    else:
        configure_logging(loglevel)
    options = options_from_params(values)
    try:
        store = open_store(store_url)
    except ConfigurationError as exc:
        raise CliUsageError(str(exc)) from None
    worker = WorkflowWorker(
        store=store, options=options, registry=loaded.registry if loaded else None
    )
    names = sorted(d.name for d in worker.workflows)
    if not names:
        raise CliUsageError(f"no @workflow functions are registered after importing {app}")
    if host not in LOOPBACK_HOSTS:
        log.warning(
            "the dashboard listens on %s: anyone who can reach it sees and acts on every run", host
        )
    dashboard = server.Dashboard(
        store,
        names,
        mask_url(store.url),
        registry=loaded.registry if loaded else default_registry,
    )
    banner = (
        f"pyrula worker {worker.worker_id} (pid {os.getpid()}): serving {', '.join(names)} "
        f"on {mask_url(store.url)}, up to {options.max_concurrent_runs} runs at once"
    )
    try:
        asyncio.run(_run(worker, banner, dashboard, host, port, open_browser, loaded))
    except PyrulaError as exc:
        raise CliError(f"worker {worker.worker_id} failed: {exc}") from None
    finally:
        if loaded is not None:
            loaded.on_stop()


async def _run(
    worker: WorkflowWorker,
    banner: str,
    dashboard: server.Dashboard,
    host: str,
    port: int,
    open_browser: bool,
    loaded: app_loader.LoadedApp | None,
) -> None:
    """``pyrula worker``'s serve loop, with the dashboard listening once the store is
    open (before the worker's banner, so its address is the first line) and closed
    after the worker stops."""
    listening: list[asyncio.Server] = []

    async def on_start(store: Any) -> None:
        if loaded is not None:
            await loaded.on_start(store)
        try:
            http = await server.start(dashboard, host, port)
        except OSError as exc:  # the port is taken, the address is not this host's
            raise CliError(f"cannot serve the dashboard on {host}:{port}: {exc}") from None
        listening.append(http)
        bound = http.sockets[0].getsockname()[1]
        url = listen_url(host, bound)
        click.echo(f"pyrula dev: dashboard on {url} (store {dashboard.store_label})")
        if open_browser:
            # webbrowser may start a program and wait for it: keep it off the loop
            asyncio.get_running_loop().run_in_executor(None, webbrowser.open, url)

    try:
        await serve_worker(worker, banner, on_start)
    finally:
        for http in listening:
            await server.stop(dashboard, http)
