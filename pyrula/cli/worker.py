"""``pyrula worker``: import workflow modules and serve their runs until SIGTERM or SIGINT.

Every :class:`~pyrula.workflows.WorkerOptions` field gets a flag, derived from the
dataclass itself (name, type, default, and the field's docstring as help), so a new field
shows up here without anyone remembering to add it. The flag is the field name in
kebab case, with a trailing ``_s`` (a unit suffix) dropped: ``timer_poll_interval_s`` is
``--timer-poll-interval``.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import importlib
import inspect
import itertools
import logging
import os
import re
import signal
import sys
import textwrap
import time
import typing
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from pyrula.cli import app_loader, health, prefork, recycle, supervisor
from pyrula.cli.daemon import Daemon, daemon_options, node_name
from pyrula.cli.logging_setup import configure_logging, log_format_option, loglevel_option
from pyrula.cli.render import CliError, CliUsageError, mask_url
from pyrula.workflows import (
    ConfigurationError,
    PyrulaError,
    WorkerOptions,
    WorkflowWorker,
    open_store,
    telemetry,
)
from pyrula.workflows.log_context import LOG_FORMAT_ENV
from pyrula.workflows.stores import DEFAULT_STORE_URL
from pyrula.workflows.stores.archive.wrapping import POSTGRES_DSN_ENV, with_archive

log = logging.getLogger("pyrula.cli.worker")

F = TypeVar("F", bound=Callable[..., Any])

FLAG_ALIASES: dict[str, tuple[str, ...]] = {"max_concurrent_runs": ("-c", "--concurrency")}
"""Short forms of some option flags."""
EXIT_FORCED = 1
"""Exit code after a second SIGTERM/SIGINT cut the graceful stop short."""
REPEAT_SIGNAL_WINDOW = 0.5
"""A second stop signal this soon after the first is the same stop delivered twice (a
wrapper such as ``timeout`` signals both its child and the process group), not a
request to exit at once."""


@dataclass(frozen=True)
class OptionFlag:
    """The command-line flag of one WorkerOptions field."""

    field: str
    flag: str
    aliases: tuple[str, ...]
    type: click.ParamType[Any]
    metavar: str
    default: Any
    help: str


def flag_name(field: str) -> str:
    """``timer_poll_interval_s`` -> ``--timer-poll-interval``."""
    return "--" + field.removesuffix("_s").replace("_", "-")


def _field_docs(cls: type) -> dict[str, str]:
    """The docstrings written under each field of a dataclass (empty if no source)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _click_type(field: str, hint: Any) -> tuple[click.ParamType[Any], str]:
    members = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    base = members[0] if len(members) == 1 else hint
    if base is bool:
        return click.BOOL, "BOOL"
    if base is int:
        return click.INT, "N"
    if base is float:
        return click.FLOAT, "SECONDS"
    if base is str:
        return click.STRING, "TEXT"
    raise TypeError(
        f"WorkerOptions.{field} has type {hint!r}, which pyrula.cli.worker cannot parse "
        "from a flag; teach _click_type about it"
    )


def _worker_flags() -> tuple[OptionFlag, ...]:
    hints = typing.get_type_hints(WorkerOptions)
    docs = _field_docs(WorkerOptions)
    flags = []
    for field in dataclasses.fields(WorkerOptions):
        param_type, metavar = _click_type(field.name, hints[field.name])
        flags.append(
            OptionFlag(
                field=field.name,
                flag=flag_name(field.name),
                aliases=FLAG_ALIASES.get(field.name, ()),
                type=param_type,
                metavar=metavar,
                default=field.default,
                help=docs.get(field.name, f"WorkerOptions.{field.name}."),
            )
        )
    return tuple(flags)


WORKER_FLAGS = _worker_flags()
"""One flag per WorkerOptions field, in field order."""


def worker_option_flags(command: F) -> F:
    """Add every WORKER_FLAGS option to a click command; unset flags pass None."""
    for spec in reversed(WORKER_FLAGS):
        shown = spec.default is not None and spec.default is not dataclasses.MISSING
        command = click.option(
            spec.flag,
            *spec.aliases,
            spec.field,
            type=spec.type,
            metavar=spec.metavar,
            default=None,
            help=spec.help + (f"  [default: {spec.default}]" if shown else ""),
        )(command)
    return command


def options_from_params(params: Mapping[str, Any]) -> WorkerOptions:
    """WorkerOptions from parsed flags: flags not given keep the dataclass defaults."""
    given = {s.field: params[s.field] for s in WORKER_FLAGS if params.get(s.field) is not None}
    try:
        return WorkerOptions(**given)
    except ConfigurationError as exc:
        match = re.search(r"WorkerOptions\.(\w+)", str(exc))
        where = f"{flag_name(match.group(1))}: " if match else ""
        raise CliUsageError(f"{where}{exc}") from None


def import_workflow_modules(names: Iterable[str]) -> None:
    """Import each module so its ``@workflow`` functions register; the cwd is importable."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # whatever the module raises, it is the module's error
            hint = " (give a module name such as app or pkg.flows, not a file)"
            raise CliUsageError(
                f"cannot import workflow module {name!r}: {type(exc).__name__}: {exc}"
                + (hint if name.endswith(".py") else ""),
            ) from None


@click.command("worker", cls=app_loader.AppCommand)  # with the app's user_options
@click.option(
    "--workflow",
    "-w",
    "modules",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE (dotted name, importable from the current directory) so its "
    "@workflow functions register. Repeat for more modules. The worker serves every "
    "workflow registered in the process. Required unless -A/--app is given.",
)
@click.option(
    "--store",
    "store_url",
    envvar="PYRULA_STORE_URL",
    show_envvar=True,
    metavar="URL",
    help="Store URL: sqlite:///relative.db, sqlite:////abs/path.db, "
    "redis://host:6379/0?namespace=NAME (also rediss://, valkey://, valkeys://, unix://; "
    f"add cluster=true for a cluster) or memory:// [default: {DEFAULT_STORE_URL}]",
)
@click.option(
    "--postgres-dsn",
    "postgres_dsn",
    envvar="PYRULA_POSTGRES_DSN",
    show_envvar=True,
    metavar="DSN",
    help="Keep ended runs in this Postgres archive: the store becomes an ArchivingStore "
    "over it (see `pyrula db migrate`).",
)
@loglevel_option(logfile=True)
@log_format_option
@worker_option_flags
@daemon_options
@recycle.recycle_options
@prefork.pool_options
@health.health_options
@app_loader.celery_worker_flags
def worker_command(
    modules: tuple[str, ...], store_url: str | None, loglevel: str, log_format: str, **values: Any
) -> None:
    """Serve workflow runs until SIGTERM or SIGINT, then stop gracefully.

    On the first signal the worker stops claiming, lets in-flight runs finish for up to
    --shutdown-grace seconds, requeues the rest and exits 0. A second signal exits at
    once (code 1); runs still in flight then wait for their lease to expire.
    """
    os.environ[LOG_FORMAT_ENV] = log_format.lower()  # for -A's app.log, and child processes
    prefork.check_concurrency(values)  # -c 0: before anything is imported or started
    child = recycle.ChildLink.from_environment(values)  # run by a supervisor (recycle.py)
    daemon = Daemon.from_values(values)
    daemon.enter_workdir()
    node = node_name(values.get("celery_hostname"))
    logfile = daemon.log_path(node)
    loaded = None
    if app_loader.app_spec(values):
        # A child sends only a pool process's signals; a --detach launcher, which only
        # checks the app before starting the worker in the background, none of the
        # worker's (Celery detaches before it makes the worker).
        quiet = child is not None or daemon.detach
        loaded = app_loader.load(values, loglevel, logfile, pool_child=quiet)
    if loaded is None:
        # Celery's -I and -b mean the same without an app: more modules, the store.
        modules += tuple(m.strip() for m in (values.get("celery_include") or "").split(","))
        modules = tuple(m for m in modules if m)
        store_url = broker_as_store(store_url, values)
        if not modules:
            raise CliUsageError("give --workflow MODULE (or -A APP for a Celery app)")
        configure_logging(loglevel, logfile, log_format.lower())
    if values.get("celery_hostname") and not values.get("worker_id"):
        # Celery's node name leads the id, which stays unique per process (two workers
        # under one id would take each other's leases for their own).
        values["worker_id"] = f"{node}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    options = options_from_params(values)
    if loaded is not None:  # the app's store, unless --store itself names one
        store_url = loaded.serve_store(store_url, explicit=given_on_command_line("store_url"))
    dsn = values.get("postgres_dsn")
    if dsn:  # the Celery drop-in's clients in this process (and its children) read it
        os.environ[POSTGRES_DSN_ENV] = dsn
    try:
        store = with_archive(open_store(store_url), dsn)
    except ConfigurationError as exc:
        raise CliUsageError(str(exc)) from None
    limits = recycle.limits_of(values, loaded.app if loaded else None, store.url)
    pool, options = pool_of(values, options, loaded is not None, store.url, child)
    import_workflow_modules(modules)
    if loaded is not None:
        app_loader.merge_default_registry(loaded.app)
    if child is None:  # a child's supervisor said them
        for note in app_loader.celery_notes(values) + ([pool.note] if pool.note else []):
            click.echo(note, err=True)
    worker = WorkflowWorker(
        store=store,
        options=options,
        registry=loaded.registry if loaded else None,
        observer=child.observer() if child is not None else None,
    )
    names = sorted(d.name for d in worker.workflows)
    if not names:
        raise CliUsageError(
            f"no @workflow functions are registered after importing {', '.join(modules)}",
        )
    if daemon.detach:
        daemon.start_detached(node)
        click.echo(f"pyrula worker {node}: started in the background")
        return
    banner = (
        f"pyrula worker {worker.worker_id} (pid {os.getpid()}): serving {', '.join(names)} "
        f"on {mask_url(store.url)}, up to {options.max_concurrent_runs} runs at once"
    )
    purge = None
    if values.get("celery_purge"):
        from pyrula.cli.celery_commands import purge_targets

        purge = purge_before_serving(
            purge_targets(loaded.app, set(), set()) if loaded is not None else names
        )
    start: Callable[[Any], Awaitable[None]] | None = loaded.on_start if loaded else None
    retries = health.startup_retries(values, loaded.app if loaded else None)
    supervised = child is None and (limits is not None or pool.kind == "prefork")
    probes = None if child is not None else health_of(values, store, supervised, worker)
    if child is not None:
        pool_process_metrics(values)
    supervisor.record_stop_signal(None)  # set by the stop signal, read by loaded.on_stop
    if child is not None:  # counts runs against the limits, reports to the supervisor
        start = child.attach(worker, limits, start)
    try:
        with daemon.running(node):
            if supervised:
                # pool processes (prefork.py), --max-*-per-child (recycle.py)
                keeper = prefork.RunKeeper(store, options.max_recoveries)
                on_ready = loaded.on_ready if loaded is not None else None
                if loaded is not None:  # the app's bootsteps, before any child claims
                    loaded.start_steps()
                recycle.supervise(
                    limits,
                    on_ready,
                    pool=pool,
                    keeper=keeper,
                    health=probes.state if probes else None,
                )
            else:
                serving = serve_worker(
                    worker,
                    banner,
                    start,
                    purge,
                    patient=child is not None and retries != 0,
                    startup_retries=retries,
                    readiness=probes.state if probes else None,
                )
                asyncio.run(serving)
    except PyrulaError as exc:
        raise CliError(f"worker {worker.worker_id} failed: {exc}") from None
    finally:
        if probes is not None:
            probes.close()
        if loaded is not None:
            loaded.on_stop()


def health_of(
    values: Mapping[str, Any], store: Any, supervised: bool, worker: WorkflowWorker
) -> health.HealthServer | None:
    """``--metrics-port``: the HTTP server of ``/healthz``, ``/readyz`` and ``/metrics``,
    started (None without the flag, and in a pool process: its supervisor serves the
    port). A supervisor probes the store on a thread with a store of its own; a single
    worker process on its event loop (:func:`serve_worker`)."""
    port = values.get("metrics_port")
    if port is None:
        return None
    address = values.get("metrics_address") or health.DEFAULT_ADDRESS
    state = health.HealthState(None if supervised else lambda: worker.started_at > 0)
    render, cleanup = prometheus_of(state, supervised, worker)
    server = health.HealthServer(address, int(port), state, render)
    if cleanup is not None:
        server.cleanups.append(cleanup)
    if supervised:
        url = store.url
        health.probe_in_thread(lambda: open_store(url), state)
    server.start()
    return server


def prometheus_of(
    state: health.HealthState, supervised: bool, worker: WorkflowWorker
) -> tuple[health.Metrics | None, Callable[[], None] | None]:
    """``/metrics`` (None without prometheus_client: the port serves the probes alone)
    and what to clean up after. A single worker process records its metrics itself; a
    supervisor sums its pool processes' files (:mod:`pyrula.cli.metrics`)."""
    from pyrula.cli import metrics

    if not metrics.available():
        log.warning("--metrics-port: /metrics needs prometheus_client: pip install "
                    "'pyrula[metrics]'; serving /healthz and /readyz only")  # fmt: skip
        return None, None
    sampler = metrics.QueueSampler(worker.registry)
    state.sample = sampler.sample
    if supervised:
        path = metrics.multiprocess_dir()  # before the pool processes start
        registry = metrics.pool_registry(path, sampler)
        return lambda: metrics.render(registry), lambda: metrics.remove_multiprocess_dir(path)
    instrument = metrics.PrometheusMetrics()
    instrument.registry.register(sampler)
    telemetry.add(instrument)
    return lambda: metrics.render(instrument.registry), lambda: telemetry.remove(instrument)


def pool_process_metrics(values: Mapping[str, Any]) -> None:
    """In a pool process of a supervisor serving ``--metrics-port``: record this
    process's metrics into the supervisor's directory (its environment names it)."""
    from pyrula.cli import metrics

    if values.get("metrics_port") is not None and os.environ.get(metrics.MULTIPROC_ENV):
        telemetry.add(metrics.PrometheusMetrics())


def pool_of(
    values: Mapping[str, Any],
    options: WorkerOptions,
    app: bool,
    store_url: str,
    child: recycle.ChildLink | None,
) -> tuple[prefork.Pool, WorkerOptions]:
    """The pool this command serves with (:mod:`pyrula.cli.prefork`) and the options of
    the worker it runs here: one run at a time for ``solo`` (a pool process's own
    ``-c 1`` comes from its supervisor, :class:`~pyrula.cli.recycle.ChildLink`)."""
    if child is not None:
        return prefork.Pool("prefork" if child.prefork else "threads"), options
    pool = prefork.choose_pool(values, app=app, store_url=store_url)
    if pool.kind == "solo":
        options = dataclasses.replace(options, max_concurrent_runs=1)
    return pool, options


def purge_before_serving(names: list[str]) -> Callable[[Any], Awaitable[None]]:
    """``--purge``/``--discard``: before serving, discard every run of ``names`` that
    waits to start (as ``pyrula purge`` does), as Celery purges its queues."""

    async def purge(store: Any) -> None:
        from pyrula.workflows.purging import purge_queued

        count = await purge_queued(store, names)
        click.echo(f"--purge: discarded {count} waiting run(s)")

    return purge


def broker_as_store(store_url: str | None, values: Mapping[str, Any]) -> str | None:
    """Without an app, Celery's ``-b/--broker URL`` names the store, mapped as an app maps
    its broker URL (:func:`~pyrula.cli.app_loader.as_store_url`); ``--store`` on the
    command line wins over it."""
    broker = values.get("celery_broker")
    if broker and (store_url is None or not given_on_command_line("store_url")):
        return app_loader.as_store_url("-b/--broker", str(broker), None)
    return store_url


def given_on_command_line(param: str) -> bool:
    """Whether ``param`` came from the command line (not its environment variable)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return True
    return ctx.get_parameter_source(param) is not click.core.ParameterSource.ENVIRONMENT


async def serve_worker(
    worker: WorkflowWorker,
    banner: str,
    on_start: Callable[[Any], Awaitable[None]] | None = None,
    before_run: Callable[[Any], Awaitable[None]] | None = None,
    *,
    schedules_only: bool = False,
    patient: bool = False,
    startup_retries: int | None = 0,
    readiness: health.HealthState | None = None,
) -> None:
    """Open the store (``patient``: waiting for it with backoff while it cannot be
    reached, as a pool process does; else ``startup_retries`` times, None: forever),
    run ``on_start(store)`` (a Celery app's start-up) and
    ``before_run(store)`` (``--purge``), print ``banner``, run ``worker`` (only its
    schedule loop with ``schedules_only``: ``pyrula beat``) with SIGTERM/SIGINT wired to
    a graceful stop, and close the store after."""
    loop = asyncio.get_running_loop()
    received: list[float] = []

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if received and time.monotonic() - received[0] < REPEAT_SIGNAL_WINDOW:
            log.debug("ignoring %s repeated within %.1fs", name, REPEAT_SIGNAL_WINDOW)
            return
        received.append(time.monotonic())
        if len(received) == 1:
            supervisor.record_stop_signal(signum)  # Celery's worker_shutting_down sig
        if len(received) == 1 and schedules_only:
            log.info("received %s: stopping (send it again to exit at once)", name)
            worker.stop()
            return
        if len(received) == 1:
            log.info(
                "received %s: stopping; in-flight runs get %.1fs to finish, then are "
                "requeued (send it again to exit at once)",
                name,
                worker.options.shutdown_grace,
            )
            worker.stop()
            return
        log.warning(
            "received %s again: exiting now; runs still in flight are recovered once "
            "their lease expires (lock_ttl %.1fs)",
            name,
            worker.options.lock_ttl,
        )
        _hard_exit(EXIT_FORCED)

    installed: list[signal.Signals] = []
    probe: asyncio.Task[None] | None = None
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(stop_signal, on_signal, int(stop_signal))
            installed.append(stop_signal)
        except (NotImplementedError, RuntimeError):  # no add_signal_handler (Windows)
            signal.signal(stop_signal, lambda sig, _frame: on_signal(sig))
    try:
        retries = None if patient else startup_retries
        store = worker.store
        await (store.open() if retries == 0 else prefork.open_patiently(store, retries))
        if readiness is not None:  # /readyz: the store answers, this event loop turns
            probe = asyncio.create_task(health.probe_store(store, readiness), name="pyrula-probe")
        if on_start is not None:
            await on_start(worker.store)
        if before_run is not None:
            await before_run(worker.store)
        click.echo(banner)
        await (worker.run_schedules() if schedules_only else worker.run())
    finally:
        if probe is not None:
            probe.cancel()
        for signum in installed:
            loop.remove_signal_handler(signum)
        await worker.store.close()


def _hard_exit(code: int) -> None:
    """Flush output and leave the process at once, skipping interpreter shutdown."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
