"""``pyrula worker -A proj``: find a Celery app (``pyrula_compat``) and serve it.

``-A`` takes what ``celery -A`` takes: ``proj`` (its ``app`` or ``celery`` attribute,
else its ``proj.celery`` module's app, else any app in the module), ``proj.module``,
``proj.module:attr`` or ``proj.module.attr``. The worker then serves every task of the
app on the app's store (its broker URL, ``PYRULA_STORE_URL`` only when the app names no
broker: where its clients send tasks) unless ``--store`` on the command line names
another, which the app in the worker then uses too. Celery-only
flags are accepted so deployment scripts keep working, each with a one-line note of
what pyrula does instead.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

import click

from pyrula.cli.daemon import node_name
from pyrula.cli.render import CliError, CliUsageError, mask_url
from pyrula.cli.supervisor import stop_signal

log = logging.getLogger("pyrula.cli.worker")

F = TypeVar("F", bound=Callable[..., Any])

CELERY_ONLY_FLAGS: tuple[tuple[tuple[str, ...], str, bool, str], ...] = (
    (("-Q", "--queues"), "celery_queues", False,
     "-Q: pyrula has one queue per store; every worker serves every task it imports"),
    (("-X", "--exclude-queues"), "celery_exclude_queues", False,
     "-X: pyrula has no queues to exclude"),
    (("-B", "--beat"), "celery_beat", True,
     "-B: not needed; every pyrula worker fires the beat_schedule entries, each slot once"),
    (("-P", "--pool"), "celery_pool", False, ""),  # pyrula/cli/prefork.py
    (("-E", "--task-events"), "celery_events", True,
     "-E: no event stream; use `pyrula runs list` to see tasks"),
    (("-O",), "celery_optimization", False, "-O: pyrula never prefetches; it claims one "
     "task per free slot"),
    (("-n", "--hostname"), "celery_hostname", False, ""),
    (("--autoscale",), "celery_autoscale", False, ""),  # pyrula/cli/prefork.py
    (("--prefetch-multiplier",), "celery_prefetch", False,
     "--prefetch-multiplier: pyrula never prefetches"),
    (("--without-gossip",), "celery_without_gossip", True, ""),
    (("--without-mingle",), "celery_without_mingle", True, ""),
    (("--without-heartbeat",), "celery_without_heartbeat", True, ""),
    (("--time-limit",), "celery_time_limit", False,
     "--time-limit: set task_time_limit in the app's settings"),
    (("--soft-time-limit",), "celery_soft_time_limit", False,
     "--soft-time-limit: set task_soft_time_limit in the app's settings"),
    (("--scheduler",), "celery_scheduler", False,
     "--scheduler: schedules live in the store (`pyrula schedules`)"),
    (("-s", "--schedule-filename", "--schedule"), "celery_schedule_filename", False,
     "--schedule-filename: no schedule file; the last slot of each schedule is stored"),
    (("-S", "--statedb"), "celery_statedb", False,
     "--statedb: not needed; revoked tasks are kept in the store, across restarts"),
    (("--heartbeat-interval",), "celery_heartbeat_interval", False,
     "--heartbeat-interval: workers report to the store every third of --lock-ttl"),
    # Given effect in load() (and the worker command), so no note:
    (("-I", "--include"), "celery_include", False, ""),
    (("--purge", "--discard"), "celery_purge", True, ""),
)  # fmt: skip

GROUP_VALUES = "pyrula.celery_globals"
"""``ctx.meta`` key of Celery's global options given before the subcommand (``pyrula -A
proj -b URL worker``): a dict of dest to value."""
APP_COMMANDS = (
    "worker", "beat", "multi", "status", "inspect", "purge", "call", "result", "control",
    "flower",
)  # fmt: skip
"""The subcommands that take an app."""
SERVING_COMMANDS = ("worker", "beat", "multi")
"""The subcommands that take all of Celery's global options: worker and beat after the
subcommand too, multi for every node's worker."""


@dataclass(frozen=True)
class GlobalOption:
    """One of Celery's global options (``celery -b URL worker``), which ``pyrula`` takes
    before the subcommand as it does after it."""

    names: tuple[str, ...]
    dest: str
    """The parameter it sets: the same for the group and the commands that take it."""
    is_flag: bool = False
    metavar: str | None = None
    help: str = ""
    note: str = ""
    """A note printed when given (an option with no effect)."""
    commands: tuple[str, ...] = APP_COMMANDS
    """The subcommands it may come before."""
    declared: bool = False
    """The subcommands declare it themselves (``-A``, ``--workdir``); else it is one of
    the hidden :data:`CELERY_GLOBAL_FLAGS` of worker and beat."""

    @property
    def label(self) -> str:
        return "/".join(self.names)


GLOBAL_OPTIONS: tuple[GlobalOption, ...] = (
    GlobalOption(("-A", "--app"), "celery_app", metavar="APP", declared=True,
                 help="A Celery app, as `celery -A proj worker` takes it: `pyrula -A proj "
                 "worker` is `pyrula worker -A proj`."),
    GlobalOption(("-b", "--broker"), "celery_broker", metavar="URL",
                 help="Celery's broker URL: the store worker, beat and multi's workers "
                 "serve (as `pyrula worker -b URL`), and the store status, inspect, purge, "
                 "call, result and control use (as their --store URL), mapped to a store "
                 "as the app maps its broker URL."),
    GlobalOption(("--result-backend",), "celery_result_backend", metavar="URL",
                 help="Celery's result backend, checked as the app's result_backend is: "
                 "it must name the store's server (results live with the runs)."),
    GlobalOption(("--config",), "celery_config", metavar="MODULE", commands=SERVING_COMMANDS,
                 help="A settings module for the app, as `celery --config` loads it "
                 "(worker, beat, multi)."),
    GlobalOption(("--workdir",), "workdir", metavar="DIR", commands=SERVING_COMMANDS,
                 declared=True, help="Change to DIR first, as `pyrula worker --workdir` "
                 "does (worker, beat, multi)."),
    GlobalOption(("--loader",), "celery_loader", metavar="LOADER",
                 note="--loader: pyrula loads the app itself",
                 help="Accepted, no effect: pyrula loads the app itself."),
    GlobalOption(("--skip-checks",), "celery_skip_checks", is_flag=True,
                 help="Skip Django's system checks, as Celery does (worker, beat, multi)."),
    GlobalOption(("-q", "--quiet"), "celery_quiet", is_flag=True,
                 help="Accepted: `multi` prints less (its own -q); no effect elsewhere."),
    GlobalOption(("-C", "--no-color"), "celery_no_color", is_flag=True,
                 help="Accepted, no effect."),
)  # fmt: skip
"""Celery's global options: the one list of them. ``pyrula`` takes each before the
subcommands of its ``commands`` (main.py adds them to the group); worker and beat take
them after the subcommand too. Before the app commands that serve nothing (status,
inspect, purge, call, result, control), ``-b/--broker URL`` is their ``--store URL``,
mapped as the app maps a broker URL, and ``--result-backend`` must name that store's
server (:func:`pyrula.cli.celery_commands.client_store`)."""

CELERY_GLOBAL_FLAGS: tuple[tuple[tuple[str, ...], str, bool, str], ...] = tuple(
    (option.names, option.dest, option.is_flag, option.note)
    for option in GLOBAL_OPTIONS
    if not option.declared
)
"""Celery's options of every command (``celery --broker URL worker ...``), hidden
options of the worker and beat (``-b``, ``--result-backend`` and ``--config`` are given
effect in load(), ``--skip-checks`` there too)."""


def hidden_flags(flags: tuple[tuple[tuple[str, ...], str, bool, str], ...]) -> Callable[[F], F]:
    """A decorator adding ``flags`` (names, dest, is_flag, note) as hidden options."""

    def add(command: F) -> F:
        for names, dest, is_flag, _note in reversed(flags):
            if is_flag:
                option = click.option(*names, dest, is_flag=True, default=False, hidden=True)
            else:
                option = click.option(*names, dest, default=None, hidden=True)
            command = option(command)
        return command

    return add


def celery_worker_flags(command: F) -> F:
    """Add ``-A/--app`` and the accepted Celery-only flags to the worker command."""
    command = hidden_flags(CELERY_ONLY_FLAGS + CELERY_GLOBAL_FLAGS)(command)
    command = click.option(
        "--celery-alias",
        "celery_alias",
        is_flag=True,
        default=False,
        help="Make `import celery` load pyrula_compat in this process (only when Celery "
        "itself is not installed), so third-party code that imports celery sees the app.",
    )(command)
    return click.option(
        "--app",
        "-A",
        "celery_app",
        metavar="APP",
        default=None,
        help="Serve a Celery app built with pyrula_compat, found as `celery -A` finds it "
        "(proj, proj.celery, proj.celery:app); its broker URL picks the store.",
    )(command)


def group_options(command: F) -> F:
    """Add :data:`GLOBAL_OPTIONS` to the ``pyrula`` group."""
    for option in reversed(GLOBAL_OPTIONS):
        if option.is_flag:
            decorator = click.option(
                *option.names, option.dest, is_flag=True, default=False, help=option.help
            )
        else:
            decorator = click.option(
                *option.names, option.dest, metavar=option.metavar, default=None,
                help=option.help,
            )  # fmt: skip
        command = decorator(command)
    return command


def remember_group_options(ctx: click.Context, values: Mapping[str, Any]) -> None:
    """Keep Celery's global options given before the subcommand (``pyrula -A APP -b URL
    worker``) for it: in ``ctx.meta`` (multi reads them there) and as the defaults of the
    subcommand's own options of the same name (so worker and beat see them as if given
    after it). An option before a subcommand that does not take it is a usage error; a
    no-effect one before a command that does not take it after is noted here."""
    command = ctx.invoked_subcommand
    given = [(o, values[o.dest]) for o in GLOBAL_OPTIONS if values.get(o.dest) not in (None, False)]
    if not given or command is None:
        return
    for option, value in given:
        if command not in option.commands:
            raise CliUsageError(_not_taken(option, value, command))
    ctx.meta[GROUP_VALUES] = {option.dest: value for option, value in given}
    ctx.default_map = {**(ctx.default_map or {}), command: dict(ctx.meta[GROUP_VALUES])}
    if command not in SERVING_COMMANDS:
        for note in celery_notes(ctx.meta[GROUP_VALUES], CELERY_GLOBAL_FLAGS):
            click.echo(note, err=True)


def _not_taken(option: GlobalOption, value: Any, command: str) -> str:
    takers = ", ".join(f"`pyrula {name}`" for name in option.commands)
    if option.dest == "celery_app":
        return f"-A/--app {value}: `pyrula {command}` takes no app; only {takers} take one"
    return f"{option.label} before `pyrula {command}`: only {takers} take it"


def as_store_url(flag: str, broker: str, backend: str | None) -> str:
    """Celery's broker URL as a store URL: ``pyrula_compat.store.store_url(broker,
    backend)`` (``sqla+sqlite://`` is ``sqlite://``, ...); its refusal (``amqp://``, a
    backend on another server) a usage error naming ``flag`` (passwords masked)."""
    from pyrula_compat import store
    from pyrula_compat.exceptions import ImproperlyConfigured

    try:
        return store.store_url(broker, backend) or broker
    except ImproperlyConfigured as exc:
        text = str(exc)
        for url in (broker, backend, store.normalize(broker)):
            if url:
                text = text.replace(url, mask_url(url))
        given = backend if flag == "--result-backend" and backend else broker
        raise CliUsageError(f"{flag} {mask_url(given)}: {text}") from None


def group_values(ctx: click.Context | None) -> list[tuple[GlobalOption, Any]]:
    """Celery's global options given before the subcommand, in :data:`GLOBAL_OPTIONS`
    order."""
    given = ctx.meta.get(GROUP_VALUES, {}) if ctx is not None else {}
    return [(option, given[option.dest]) for option in GLOBAL_OPTIONS if option.dest in given]


def shown(option: GlobalOption, value: Any) -> str:
    """``value`` for a message (a URL's password masked)."""
    return repr(mask_url(str(value)) if option.metavar == "URL" else value)


def app_spec(values: dict[str, Any]) -> str | None:
    """The app to serve: ``-A`` after the subcommand or before it (as in ``celery -A
    proj worker``), stored back into ``values``. The Celery global options given before
    the subcommand reach ``values`` as defaults (:func:`remember_group_options`); one
    given in both places with different values is a usage error."""
    ctx = click.get_current_context(silent=True)
    for option, before in group_values(ctx):
        if option.dest not in values:
            continue
        after = values[option.dest]
        if after in (None, False):
            if option.dest == "celery_app":
                values[option.dest] = before
        elif after != before and _on_command_line(ctx, option.dest):
            raise CliUsageError(
                f"{option.label} given twice with different values: {shown(option, before)} "
                f"before the command and {shown(option, after)} after it"
            )
    spec: str | None = values.get("celery_app") or None
    return spec


def _on_command_line(ctx: click.Context | None, param: str) -> bool:
    source = ctx.get_parameter_source(param) if ctx is not None else None
    return source is None or source is click.core.ParameterSource.COMMANDLINE


def celery_notes(
    values: Mapping[str, Any],
    flags: tuple[tuple[tuple[str, ...], str, bool, str], ...] = CELERY_ONLY_FLAGS
    + CELERY_GLOBAL_FLAGS,
) -> list[str]:
    """One line per Celery-only flag of ``flags`` (default: the worker's) that was given."""
    notes = []
    for names, dest, _is_flag, note in flags:
        if values.get(dest) and note:
            notes.append(f"note: {names[0]} accepted, no effect. {note}")
    return notes


def _import(name: str) -> ModuleType:
    return importlib.import_module(name)


def find_app(spec: str) -> Any:
    """The Celery app ``spec`` names, found the way ``celery -A`` finds it."""
    from pyrula_compat import Celery

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    module_name, _, attr = spec.partition(":")
    try:
        symbol: Any = _import(module_name)
    except ModuleNotFoundError as exc:
        parent, _, last = module_name.rpartition(".")
        if not parent or exc.name != module_name:
            raise
        symbol = getattr(_import(parent), last)
    if attr:
        symbol = getattr(symbol, attr)
    if isinstance(symbol, Celery):
        return symbol
    if not isinstance(symbol, ModuleType):
        raise CliUsageError(f"-A {spec}: {symbol!r} is not a Celery app")
    for name in ("app", "celery"):
        found = getattr(symbol, name, None)
        if isinstance(found, Celery):
            return found
    if getattr(symbol, "__path__", None) and not attr:
        try:
            return find_app(f"{module_name}.celery")
        except ModuleNotFoundError as exc:
            if exc.name != f"{module_name}.celery":
                raise
    for suspect in vars(symbol).values():
        if isinstance(suspect, Celery):
            return suspect
    raise CliUsageError(f"-A {spec}: no Celery app found in module {symbol.__name__}")


@dataclass
class LoadedApp:
    """A Celery app ready to serve: its setup hooks, registry and store URL."""

    app: Any
    setup: Any
    store_url: str | None

    @property
    def registry(self) -> Any:
        return self.app.registry

    def serve_store(self, url: str | None, *, explicit: bool) -> str | None:
        """The store to serve. ``--store`` given on the command line wins, and the app
        in this process uses it too (so the chains and callbacks its tasks queue land
        where it serves). Else the app's own store, as its clients elsewhere use it: its
        broker URL, ``PYRULA_STORE_URL`` (``url`` then) only when the app names none;
        a ``PYRULA_STORE_URL`` naming another store is ignored with a warning."""
        if url and explicit:
            self.setup.use_store(url)
            return url
        if self.store_url is None:
            return url
        if url and url != self.store_url:
            log.warning(
                "PYRULA_STORE_URL=%s ignored: serving the app's store %s (its broker URL), "
                "where its clients send tasks; give --store to serve another",
                mask_url(url),
                mask_url(self.store_url),
            )
        return self.store_url

    async def on_start(self, store: Any) -> None:
        """The app's start-up once the store is open; a bootstep that fails to start
        stops the worker with one line naming it."""
        from pyrula_compat.bootsteps import BootstepError

        try:
            await self.setup.on_start(store)
        except BootstepError as exc:
            raise CliError(str(exc)) from None

    def start_steps(self) -> None:
        """A supervisor's bootsteps start before its children serve; one that fails to
        start stops the worker with one line naming it."""
        from pyrula_compat.bootsteps import BootstepError

        try:
            self.setup.start_steps()
        except BootstepError as exc:
            raise CliError(str(exc)) from None

    def on_ready(self) -> None:
        """A recycling supervisor's first worker child serves: the bootsteps start,
        then ``worker_ready``."""
        from pyrula_compat.bootsteps import BootstepError

        try:
            self.setup.ready()
        except BootstepError as exc:
            raise CliError(str(exc)) from None

    def on_stop(self) -> None:
        """The worker stopped: the app's shutdown hooks, given the name of the signal
        that stopped it (None when none did; :func:`~pyrula.cli.supervisor.stop_signal`)."""
        self.setup.on_stop(stop_signal())


def import_app(spec: str) -> Any:
    """:func:`find_app`; whatever the project raises while importing is a usage error."""
    try:
        return find_app(spec)
    except CliUsageError:
        raise
    except Exception as exc:  # whatever the project raises while importing
        raise CliUsageError(
            f"-A {spec}: cannot load the app: {type(exc).__name__}: {exc}"
        ) from None


def load(
    values: dict[str, Any],
    loglevel: str,
    logfile: str | None = None,
    make_setup: Callable[[Any], Any] | None = None,
    *,
    pool_child: bool = False,
) -> LoadedApp:
    """Find and prepare the app named by ``-A``; set up logging (to ``logfile`` if
    given); apply Celery's ``-b``, ``--result-backend``, ``--config``, ``-I`` and
    ``--skip-checks``; fill defaults (the app's ``worker_concurrency`` for ``-c``) into
    ``values``. ``make_setup(app)`` makes what prepares the app and hooks the start and
    stop (default: a worker's :class:`pyrula_compat.worker.AppWorker`, sending only a
    pool process's signals with ``pool_child``: a recycling supervisor's child)."""
    if values.get("celery_alias"):
        from pyrula_compat.alias import install

        install()
    from pyrula_compat.bootsteps import BootstepError
    from pyrula_compat.exceptions import ImproperlyConfigured
    from pyrula_compat.worker import AppWorker

    spec = values["celery_app"]
    app = import_app(spec)
    if make_setup is None:
        hostname = node_name(values.get("celery_hostname"))
        options = step_options(app, values, loglevel, logfile)
        setup = AppWorker(app, hostname=hostname, pool_child=pool_child, options=options)
    else:
        setup = make_setup(app)
    setup.setup_logging(loglevel, logfile)  # app.log.setup, as Celery's worker
    if values.get("celery_skip_checks"):
        os.environ["CELERY_SKIP_CHECKS"] = "1"  # Django's system checks, as in Celery
    try:
        _apply_celery_settings(app, setup, values)
        setup.prepare()
        url = app.store_url()
        retention = setup.retention()
    except ImproperlyConfigured as exc:
        raise CliUsageError(f"-A {spec}: {exc}") from None
    except ImportError as exc:
        raise CliUsageError(f"-A {spec}: cannot import a task module: {exc}") from None
    except BootstepError as exc:
        raise CliError(f"-A {spec}: {exc}") from None
    if values.get("max_concurrent_runs") is None and setup.concurrency():
        values["max_concurrent_runs"] = setup.concurrency()
    if values.get("run_retention") is None:  # --run-retention wins over result_expires
        values["run_retention"] = retention
    return LoadedApp(app=app, setup=setup, store_url=url)


def step_options(
    app: Any, values: Mapping[str, Any], loglevel: str, logfile: str | None
) -> dict[str, Any]:
    """What the app's bootsteps get as keyword arguments, as Celery passes the worker's
    options: ``loglevel``, ``logfile``, ``concurrency`` and the value of each of the
    app's ``user_options['worker']`` (under its parameter name)."""
    options: dict[str, Any] = {
        "loglevel": loglevel,
        "logfile": logfile,
        "concurrency": values.get("max_concurrent_runs"),
    }
    for option in _user_options(app, "worker"):
        if option.name:
            options[option.name] = values.get(option.name)
    return options


def _user_options(app: Any, command: str) -> list[click.Parameter]:
    return list(getattr(app, "user_options", {}).get(command, ()))


class AppCommand(click.Command):
    """A command that takes the app's ``user_options[<command>]`` (click options a
    project adds, as Celery's ``app.user_options['worker']``): before the command line
    is parsed, the app named by ``-A``/``--app`` (after the command, or before it:
    ``pyrula -A proj worker``) is imported and its options join the command's. An app
    that does not import is reported by the command itself, as without options."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        spec = _app_in(args) or ctx.meta.get(GROUP_VALUES, {}).get("celery_app")
        if spec and self.name:
            try:
                app = find_app(spec)
            except Exception:  # the command's own load() reports it, with its context
                app = None
            known = {param.name for param in self.params}
            for option in _user_options(app, self.name) if app is not None else ():
                if option.name not in known:
                    self.params.append(option)
                    known.add(option.name)
        return super().parse_args(ctx, args)


def _app_in(args: list[str]) -> str | None:
    """The value of ``-A``/``--app`` in ``args`` (``-A x``, ``-Ax``, ``--app=x``)."""
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg in ("-A", "--app") and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--app="):
            return arg.split("=", 1)[1]
        if arg.startswith("-A") and len(arg) > 2 and not arg.startswith("--"):
            return arg[2:]
    return None


def _apply_celery_settings(app: Any, setup: Any, values: Mapping[str, Any]) -> None:
    """Celery's global options, given before the app is prepared: ``--config MODULE``
    (``config_from_object``), ``-b/--broker`` (the store, as the app's broker URL),
    ``--result-backend`` (checked against it as the setting is) and ``-I/--include``
    (more task modules to import, comma-separated)."""
    if values.get("celery_config"):
        app.config_from_object(values["celery_config"], force=True)
    if values.get("celery_broker"):
        setup.use_store(values["celery_broker"])
    if values.get("celery_result_backend"):
        os.environ["CELERY_RESULT_BACKEND"] = values["celery_result_backend"]
        app.conf.result_backend = values["celery_result_backend"]
    include = [m.strip() for m in (values.get("celery_include") or "").split(",") if m.strip()]
    if include:
        app.conf.include = [*(app.conf.include or ()), *include]


def merge_default_registry(app: Any) -> None:
    """Also serve ``@workflow`` functions of ``--workflow`` modules with the app's tasks."""
    from pyrula.workflows.registry import default_registry

    for definition in default_registry.all():
        if app.registry.find(definition.name) is None:
            app.registry.register(definition)
