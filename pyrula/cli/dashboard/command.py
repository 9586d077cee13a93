"""``pyrula dashboard`` and ``pyrula -A proj flower``: the dashboard alone, on any store,
running no worker.

It listens on 127.0.0.1 unless ``--address`` says otherwise. On any other address it
refuses to start without ``--basic-auth`` unless ``--no-auth`` is given, and then warns:
the dashboard shows every run's params and results and can cancel them. ``flower`` takes
Flower's common flags (``--port``, ``--address``, ``--basic-auth user:pass``,
``--url-prefix``) and reads the store and tasks of the Celery app ``-A`` names.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import webbrowser
from collections.abc import Callable
from typing import Any, TypeVar

import click

from pyrula.cli import app_loader
from pyrula.cli.dashboard import server
from pyrula.cli.dashboard.http import BasicAuth
from pyrula.cli.logging_setup import configure_logging, loglevel_option
from pyrula.cli.render import CliError, CliUsageError, mask_url
from pyrula.cli.runs import store_option
from pyrula.cli.worker import import_workflow_modules
from pyrula.workflows import ConfigurationError, PyrulaError, open_store
from pyrula.workflows.registry import Registry, default_registry
from pyrula.workflows.stores.archive.wrapping import postgres_dsn_from_env, with_archive

log = logging.getLogger("pyrula.cli.dashboard")

DEFAULT_PORT = 5555
"""Flower's port."""
F = TypeVar("F", bound=Callable[..., Any])


def listen_url(host: str, port: int, prefix: str = "") -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{prefix}/"


def is_loopback(address: str) -> bool:
    """``localhost``, ``127.0.0.0/8`` or ``::1``."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_exposure(address: str, auth: BasicAuth | None, no_auth: bool) -> None:
    """Refuse a non-loopback address without authentication, unless ``--no-auth``."""
    if is_loopback(address) or auth is not None:
        return
    if not no_auth:
        raise CliUsageError(
            f"--address {address} lets anyone who can reach it see and act on every run: "
            "give --basic-auth user:password, or --no-auth to serve it without"
        )
    log.warning(
        "the dashboard listens on %s without authentication: anyone who can reach it sees "
        "every run and can retry, cancel and submit runs",
        address,
    )


def url_prefix(text: str | None) -> str:
    """``--url-prefix flower`` or ``/flower/``: ``/flower``; none: ``''``."""
    if not text or not text.strip("/"):
        return ""
    cleaned = "/" + text.strip().strip("/")
    if any(c in cleaned for c in "?#% ") or "//" in cleaned:
        raise CliUsageError(f"--url-prefix {text!r}: give a plain path such as /flower")
    return cleaned


def serving_options(command: F) -> F:
    """The options ``dashboard`` and ``flower`` share."""
    options = [
        click.option(
            "--port",
            type=click.IntRange(0, 65535),
            default=DEFAULT_PORT,
            show_default=True,
            metavar="N",
            help="Port; 0 picks a free one (the first output line says which).",
        ),
        click.option(
            "--address",
            default="127.0.0.1",
            show_default=True,
            metavar="HOST",
            help="Address to listen on. Any but loopback needs --basic-auth (or --no-auth).",
        ),
        click.option(
            "--basic-auth",
            "basic_auth",
            multiple=True,
            metavar="USER:PASS",
            help="Require HTTP Basic authentication; repeat (or separate with commas) for "
            "several users. Each action is recorded with the user's name.",
        ),
        click.option(
            "--no-auth",
            is_flag=True,
            help="Serve a non-loopback --address without authentication (warns).",
        ),
        click.option(
            "--url-prefix",
            "prefix_text",
            metavar="PATH",
            help="Serve under PATH (behind a reverse proxy): /flower.",
        ),
        click.option("--open", "open_browser", is_flag=True, help="Open it in a browser."),
        store_option,
        loglevel_option(),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@click.command("dashboard")
@click.option(
    "-w",
    "--workflow",
    "modules",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE (repeatable): its workflows' parameter names are shown, and "
    "runs submitted from the dashboard are checked and get their flow control.",
)
@serving_options
def dashboard_command(modules: tuple[str, ...], **options: Any) -> None:
    """Serve the dashboard of a store: runs, workers, queues, schedules, owners, dead
    letters and an overview, updating live; retry, cancel, signal and submit runs,
    manage schedules. Runs no worker. SIGTERM or SIGINT stops it (exit 0).

    The same actions are a JSON API under /api (docs/dashboard.md)."""
    if modules:
        import_workflow_modules(modules)
    configure_logging(options["loglevel"])
    serve(options, options["store_url"], default_registry, "dashboard")


@click.command("flower")
@click.option(
    "--app",
    "-A",
    "celery_app",
    metavar="APP",
    default=None,
    help="The Celery app (pyrula_compat) whose store and tasks to show.",
)
@click.option("--broker-api", hidden=True, default=None)
@click.option("--persistent", hidden=True, default=None)
@click.option("--db", hidden=True, default=None)
@serving_options
def flower_command(celery_app: str | None, **options: Any) -> None:
    """Flower's command: the dashboard of a Celery app's store (-A before or after).

    Takes Flower's --port, --address, --basic-auth user:pass and --url-prefix; its
    --broker-api, --persistent and --db are accepted and have no effect (the store
    holds everything)."""
    from pyrula.cli.celery_commands import client_store

    spec = app_loader.app_spec({"celery_app": celery_app})
    configure_logging(options["loglevel"])
    if spec is None:
        serve(options, client_store(options["store_url"]), default_registry, "flower")
        return
    app = app_loader.import_app(spec)
    url = client_store(options["store_url"], app, spec)
    serve(options, url, app.registry, "flower")


def serve(options: dict[str, Any], store_url: str | None, registry: Registry, name: str) -> None:
    try:
        auth = BasicAuth.parse(tuple(options["basic_auth"]))
    except ValueError as exc:
        raise CliUsageError(str(exc)) from None
    address: str = options["address"]
    check_exposure(address, auth, options["no_auth"])
    prefix = url_prefix(options["prefix_text"])
    try:
        store = with_archive(open_store(store_url), postgres_dsn_from_env())
    except ConfigurationError as exc:
        raise CliUsageError(str(exc)) from None
    dashboard = server.Dashboard(
        store, [], mask_url(store.url), registry=registry, auth=auth, prefix=prefix
    )
    try:
        asyncio.run(_serve(dashboard, address, options["port"], options["open_browser"], name))
    except PyrulaError as exc:
        raise CliError(f"the dashboard stopped: {exc}") from None


async def _serve(
    dashboard: server.Dashboard, host: str, port: int, open_it: bool, name: str
) -> None:
    store = dashboard.store
    await store.open()
    try:
        try:
            http = await server.start(dashboard, host, port)
        except OSError as exc:
            raise CliError(f"cannot serve the dashboard on {host}:{port}: {exc}") from None
        bound = http.sockets[0].getsockname()[1]
        url = listen_url(host, bound, dashboard.site.prefix)
        click.echo(f"pyrula {name}: dashboard on {url} (store {dashboard.store_label})")
        if open_it:
            asyncio.get_running_loop().run_in_executor(None, webbrowser.open, url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            await stop.wait()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(signum)
            await server.stop(dashboard, http)
            log.info("dashboard stopped")
    finally:
        await store.close()
