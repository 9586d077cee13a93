"""``pyrula multi``: Celery's ``celery multi``, for init scripts and systemd units.

``pyrula -A proj multi start w1 w2 --pidfile=/var/run/celery/%n.pid
--logfile=/var/log/celery/%n%I.log -c 8`` starts one background ``pyrula worker -D`` per
node; ``stop``, ``stopwait``, ``restart`` and ``kill`` find each node's process by its pid
file. The arguments are parsed as Celery parses them (:mod:`pyrula.cli.multi_nodes`).

Exit codes: 0 done; 1 a node could not be started (already running, or its worker
exited or wrote no pid file in time), a signal could not be sent, ``get`` of a node not
in the list; 2 usage errors (unknown sub-command, bad node selector, missing value).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import IO

import click

from pyrula.cli import app_loader
from pyrula.cli.daemon import DETACHED_ENV, pid_running, read_pid
from pyrula.cli.multi_nodes import MultiArgs, Node, Opt, build_nodes, parse_args, worker_options
from pyrula.cli.render import CliError, CliUsageError

START_TIMEOUT = 60.0
"""Longest ``start`` waits for a node's worker to write its pid file."""
POLL = 0.05
USAGE = """\
usage: pyrula multi start <node1 node2 nodeN|range> [worker options]
       pyrula multi stop <n1 n2 nN|range> [-SIG (default: -TERM)] [--pidfile=...]
       pyrula multi stopwait <n1 n2 nN|range> [-SIG (default: -TERM)] [--pidfile=...]
       pyrula multi restart <n1 n2 nN|range> [-SIG] [worker options]
       pyrula multi kill <n1 n2 nN|range> [--pidfile=...]

       pyrula multi show <n1 n2 nN|range> [worker options]
       pyrula multi get <node name> <n1 n2 nN|range> [worker options]
       pyrula multi names <n1 n2 nN|range>
       pyrula multi expand <template> <n1 n2 nN|range>
       pyrula multi help

options for a few nodes: -c:w1 4, -Q:1-3 images, --loglevel:w1,w2=DEBUG
multi's own options: --nosplash, --quiet/-q, --verbose, --no-color, --hostname/-n HOST,
--prefix, --suffix, --range-prefix NAME, --append ARGS
"""
EXAMPLES = """
examples:
  pyrula -A proj multi start w1 w2 --pidfile=/var/run/celery/%n.pid \\
      --logfile=/var/log/celery/%n%I.log -c 8 -c:w2 4
  pyrula multi stopwait w1 w2 --pidfile=/var/run/celery/%n.pid
  pyrula multi show 3 -c 3 -c:1 10 --workflow app.flows
"""
COMMANDS = ("start", "stop", "stopwait", "restart", "kill", "show", "get", "names",
            "expand", "help")  # fmt: skip
SIGNAL_COMMANDS = ("stop", "stopwait", "stop_verify", "restart")
MULTI_FLAGS = {"celery_quiet": "quiet", "celery_no_color": "no_color"}
"""Celery's global flags that, before ``multi``, are multi's own (not its workers')."""


@dataclass
class Out:
    """Celery's multi output: notes on stdout (none with ``--quiet``), reasons on
    stderr."""

    quiet: bool = False
    verbose: bool = False

    def note(self, text: str, newline: bool = True) -> None:
        if not self.quiet:
            click.echo(text, nl=newline)

    def info(self, text: str) -> None:
        if self.verbose:
            self.note(text)

    def reason(self, text: str) -> None:
        click.echo(f"\t  {text}", err=True)


@click.command(
    "multi",
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def multi_command(ctx: click.Context, args: tuple[str, ...]) -> None:
    """Start and stop several background workers, as `celery multi` does.

    `pyrula multi help` lists the sub-commands and options.
    """
    words = list(args)
    if not words or words[0] == "help" or {"-h", "--help"} & set(words):
        click.echo(USAGE + EXAMPLES)
        ctx.exit(0 if words else 2)
    command, rest = words[0], words[1:]
    if command not in (*COMMANDS, "stop_verify"):
        raise CliUsageError(f"unknown multi command {command!r}; one of: {', '.join(COMMANDS)}")
    target = None
    if command in ("get", "expand"):
        if not rest:
            raise CliUsageError(f"multi {command}: give the {_first_word(command)} first")
        target, rest = rest[0], rest[1:]
    parsed = parse_args(rest, worker_options())
    if parsed.signal is not None and command not in SIGNAL_COMMANDS:
        raise CliUsageError(f"multi {command}: takes no signal; only stop, stopwait, restart")
    nodes = build_nodes(parsed)
    _group_options(ctx, parsed, nodes)
    out = Out(quiet="quiet" in parsed.flags, verbose="verbose" in parsed.flags)
    if command not in ("show", "get", "names", "expand") and "nosplash" not in parsed.flags:
        out.note(f"pyrula multi v{_version()}")
    sig = parsed.signal or signal.SIGTERM
    code = 0
    if command == "start":
        out.note("> Starting nodes...")
        code = start_nodes(nodes, out)
    elif command in ("stop", "stopwait", "stop_verify"):
        code = stop_nodes(nodes, sig, out, wait=command != "stop")
    elif command == "restart":
        code = restart_nodes(nodes, sig, out)
    elif command == "kill":
        code = kill_nodes(nodes, out)
    elif command == "show":
        for node in nodes:
            click.echo(shlex.join(node.argv()))
    elif command == "names":
        for node in nodes:
            click.echo(node.name)
    elif command == "expand":
        for node in nodes:
            click.echo(node.expand(str(target)))
    elif command == "get":
        found = [n for n in nodes if target in (n.name, n.short)]
        if not found:
            raise CliError(f"multi get: no node {target} among {', '.join(n.name for n in nodes)}")
        click.echo(shlex.join(found[0].argv()))
    ctx.exit(code)


def _first_word(command: str) -> str:
    return "node name" if command == "get" else "template"


def _version() -> str:
    try:
        return version("pyrula")
    except PackageNotFoundError:  # a source tree that is not installed
        return "unknown"


def _group_options(ctx: click.Context, parsed: MultiArgs, nodes: Sequence[Node]) -> None:
    """``pyrula -A proj -b URL multi ...``: Celery's global options before ``multi``, as
    Celery's multi takes them. ``-q`` and ``-C`` are multi's own flags; every other goes
    to each node's worker that does not give it itself (one giving another value is a
    usage error)."""
    given = app_loader.group_values(ctx)
    parsed.flags.update(MULTI_FLAGS[o.dest] for o, _ in given if o.dest in MULTI_FLAGS)
    passed = [(o, v) for o, v in given if o.dest not in MULTI_FLAGS]
    for node in nodes:
        missing = []
        for option, value in passed:
            if option.is_flag:
                if not any(opt.key == option.dest for opt in node.options):
                    missing.append(Opt(option.names[0], option.dest, None))
                continue
            own = node.value(option.dest)
            if own is None:
                missing.append(Opt(option.names[0], option.dest, str(value)))
            elif own != value:
                raise CliUsageError(
                    f"{option.label} given twice with different values: "
                    f"{app_loader.shown(option, value)} before `multi` and "
                    f"{app_loader.shown(option, own)} for {node.name}"
                )
        node.options[:0] = missing


# -- pid files ---------------------------------------------------------------------------
def _remove_if(path: str, pid: int) -> None:
    """Remove a pid file that still names ``pid`` (its process is gone)."""
    if read_pid(path) == pid:
        with suppress(FileNotFoundError):
            os.unlink(path)


# -- start ---------------------------------------------------------------------------------
@dataclass
class Launch:
    node: Node
    proc: subprocess.Popen[bytes] | None = None
    log_offset: int = 0
    problem: str | None = None


def start_nodes(nodes: Sequence[Node], out: Out, *, restart: bool = False) -> int:
    """Start every node's worker in the background, then wait until each has written its
    pid file (or exited, or :data:`START_TIMEOUT` passed). 1 if any failed."""
    launches = [_launch(node, out) for node in nodes]
    deadline = time.monotonic() + START_TIMEOUT
    failed = 0
    for launch in launches:
        if launch.problem is None:
            launch.problem = _wait_ready(launch, deadline)
        prefix = (
            f"> Restarting node {launch.node.name}: " if restart else f"\t> {launch.node.name}: "
        )
        out.note(prefix + ("OK" if launch.problem is None else "FAILED"))
        if launch.problem is not None:
            failed = 1
            for line in launch.problem.splitlines():
                out.reason(line)
    return failed


def _launch(node: Node, out: Out) -> Launch:
    """Spawn the node's ``pyrula worker -D`` as its ``--detach`` would spawn the
    background process: in a new session, streams on the log file, with
    :data:`~pyrula.cli.daemon.DETACHED_ENV` set (so it serves in place), from here."""
    launch = Launch(node)
    pidfile, logfile = node.pidfile, node.logfile
    pid = read_pid(pidfile)
    if pid is not None and pid_running(pid):
        launch.problem = f"already running: {pidfile} names the live process {pid}"
        return launch
    for what, path in (("pid file", pidfile), ("log file", logfile)):
        if not os.path.isdir(os.path.dirname(path)):
            launch.problem = f"no folder {os.path.dirname(path)} for the {what} {path}"
            return launch
    argv = node.argv()
    out.info(f"  {shlex.join(argv)}")
    try:
        log: IO[bytes] = open(logfile, "ab")  # noqa: SIM115  (closed below, kept by the child)
    except OSError as exc:
        launch.problem = f"cannot open the log file {logfile}: {exc.strerror}"
        return launch
    try:
        launch.log_offset = log.tell()
        launch.proc = subprocess.Popen(  # the command `show` prints
            argv,
            env=dict(os.environ, **{DETACHED_ENV: "1"}),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        launch.problem = f"cannot start {argv[0]}: {exc}"
    finally:
        log.close()
    return launch


def _wait_ready(launch: Launch, deadline: float) -> str | None:
    """None once the node's pid file names its process; else what went wrong."""
    proc, node = launch.proc, launch.node
    assert proc is not None
    while True:
        if read_pid(node.pidfile) == proc.pid and proc.poll() is None:
            return None
        code = proc.poll()
        if code is not None:
            return f"its worker exited with code {code}:\n" + _log_tail(node.logfile, launch)
        if time.monotonic() > deadline:
            proc.terminate()
            return (
                f"its worker (pid {proc.pid}) wrote no pid file {node.pidfile} within "
                f"{START_TIMEOUT:.0f}s; stopped it. See {node.logfile}"
            )
        time.sleep(POLL)


def _log_tail(path: str, launch: Launch, lines: int = 5) -> str:
    """What the node's worker wrote to its log file: its ``Error:`` lines, else the last
    few."""
    try:
        with open(path, "rb") as handle:
            handle.seek(launch.log_offset)
            text = handle.read().decode(errors="replace")
    except OSError:
        text = ""
    written = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in written if line.startswith("Error:")]
    shown = errors or written[-lines:]
    return "\n".join(shown) if shown else f"(nothing in {path})"


# -- stop, kill ----------------------------------------------------------------------------
def _live_nodes(nodes: Sequence[Node], out: Out) -> list[tuple[Node, int]]:
    """The nodes whose pid file names a live process; the others are reported DOWN (a
    stale pid file is removed)."""
    live = []
    for node in nodes:
        pid = read_pid(node.pidfile)
        if pid is None:
            out.note(f"> {node.name}: DOWN")
        elif not pid_running(pid):
            _remove_if(node.pidfile, pid)
            out.note(f"> {node.name}: DOWN (stale pid file {node.pidfile} removed)")
        else:
            live.append((node, pid))
    return live


def _send(node: Node, pid: int, sig: int, out: Out) -> bool | None:
    """True if signalled; False if the process is gone already; None if not allowed."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        out.note(f"Could not signal {node.name} ({pid}): No such process")
        _remove_if(node.pidfile, pid)
        return False
    except PermissionError as exc:
        out.note(f"Could not signal {node.name} ({pid}): {exc.strerror}")
        return None
    return True


def restart_nodes(nodes: Sequence[Node], sig: int, out: Out) -> int:
    """Celery's ``multi restart``: start the nodes that are down at once, signal the
    others, and start each again as soon as it has exited (so the nodes are not all down
    together). 1 if a signal could not be sent or a node did not start."""
    failed = 0

    def start(node: Node) -> None:
        nonlocal failed
        failed = max(failed, start_nodes([node], out, restart=True))

    code = stop_nodes(nodes, sig, out, wait=True, on_down=start)
    return max(code, failed)


def stop_nodes(
    nodes: Sequence[Node],
    sig: int,
    out: Out,
    *,
    wait: bool,
    on_down: Callable[[Node], None] | None = None,
) -> int:
    """Signal each live node (``stop``); with ``wait`` (``stopwait``, ``restart``) also
    wait until each has exited. 1 if a signal could not be sent. ``on_down(node)`` is
    called for each node that was down already, and for each as it exits."""
    live = _live_nodes(nodes, out)
    if on_down is not None:
        running = {node.name for node, _ in live}
        for node in nodes:
            if node.name not in running:
                on_down(node)
    if not live:
        return 0
    out.note("> Stopping nodes...")
    try:
        name = signal.Signals(sig).name.removeprefix("SIG")
    except ValueError:  # a number without a name (a real-time signal)
        name = str(sig)
    code, waiting = 0, []
    for node, pid in live:
        out.note(f"\t> {node.name}: {name} -> {pid}")
        sent = _send(node, pid, sig, out)
        if sent is None:
            code = 1
        elif sent:
            waiting.append((node, pid))
        elif on_down is not None:  # gone before the signal
            on_down(node)
    if wait and waiting:
        _wait_down(waiting, out, on_down)
    return code


def _wait_down(
    waiting: list[tuple[Node, int]], out: Out, on_down: Callable[[Node], None] | None = None
) -> None:
    """Wait until every process has exited, printing a dot a second (as Celery does, but
    polling more often); ``on_down(node)`` as each one has."""

    def preamble() -> None:
        pids = ", ".join(str(pid) for _, pid in waiting)
        plural = "node" if len(waiting) == 1 else "nodes"
        out.note(f"> Waiting for {len(waiting)} {plural} -> {pids}...", newline=False)

    preamble()
    last_dot = time.monotonic()
    while waiting:
        gone = [(node, pid) for node, pid in waiting if not pid_running(pid)]
        for node, pid in gone:
            _remove_if(node.pidfile, pid)  # a worker that could not remove it itself
            waiting.remove((node, pid))
            out.note(f"\n\t> {node.name}: OK")
            if on_down is not None:
                on_down(node)
            if waiting:
                preamble()
        if waiting:
            time.sleep(POLL)
            if time.monotonic() - last_dot >= 1.0:
                out.note(".", newline=False)
                last_dot = time.monotonic()
    out.note("")


def kill_nodes(nodes: Sequence[Node], out: Out) -> int:
    """SIGKILL each live node and remove its pid file."""
    code = 0
    for node, pid in _live_nodes(nodes, out):
        out.note(f"Sending KILL to node {node.name} ({pid})")
        sent = _send(node, pid, signal.SIGKILL, out)
        if sent is None:
            code = 1
        elif sent:
            _wait_gone(pid, 5.0)
            _remove_if(node.pidfile, pid)
    return code


def _wait_gone(pid: int, timeout: float, check: Callable[[int], bool] = pid_running) -> None:
    deadline = time.monotonic() + timeout
    while check(pid) and time.monotonic() < deadline:
        time.sleep(POLL)
