"""The supervisor of ``pyrula worker``'s pool processes (the prefork pool,
:mod:`pyrula.cli.prefork`) and of a worker process recycled by ``--max-tasks-per-child``
/ ``--max-memory-per-child`` (:mod:`pyrula.cli.recycle`): keeps its worker children
serving, replaces one that recycles or dies (handing back the runs it held), kills one
past its hard time limit, scales the pool with ``--autoscale``, passes stop signals on."""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field

from pyrula.cli.daemon import DETACHED_ENV
from pyrula.cli.prefork import RunKeeper

log = logging.getLogger("pyrula.cli.recycle")

CHILD_ENV = "PYRULA_WORKER_CHILD"
"""Set to ``NUMBER:FD:POOL`` in a child's environment: its number (1 for the first), the
descriptor of its end of the socket pair shared with the supervisor, and ``prefork``
for a pool process (one run at a time) or ``threads``."""
READY, RECYCLING = b"ready", b"recycling"
"""The child's lines to the supervisor: ``ready WORKER_ID``, it serves; ``recycling
REASON``, it reached a limit and drains. Also ``run RUN_ID TOKEN`` (it holds the run
under that lease token), ``idle RUN_ID`` (the run ended there), ``limit SECONDS ERROR``
(kill it SECONDS from now, failing its run with ERROR, ErrorInfo JSON) and ``unlimit``."""
AUTOSCALE_KEEPALIVE = 30.0
"""An autoscaled pool stops a process idle this long while above its fewest (Celery's
``AUTOSCALE_KEEPALIVE``)."""
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
STABLE_AFTER = 10.0
"""A child that served this long before it died is replaced at once, without backoff."""
EXIT_USAGE = 2
"""A child's exit code for a usage error (click's)."""
POLL = 1.0
"""Longest the supervisor sleeps between two looks at its children."""

_stop_signal: str | None = None


def record_stop_signal(signum: int | None) -> None:
    """Record the first stop signal (SIGTERM, SIGINT) of this process's serving, where
    it is handled: :meth:`Supervisor.on_signals` and ``serve_worker``'s handler
    (:mod:`pyrula.cli.worker`). None forgets it (a worker about to serve)."""
    global _stop_signal
    _stop_signal = None if signum is None else signal.Signals(signum).name


def stop_signal() -> str | None:
    """The name of the signal that stopped this process's worker (``"SIGINT"``), None if
    none did: with ``-A``, the ``sig`` of Celery's ``worker_shutting_down``."""
    return _stop_signal


@dataclass
class Child:
    number: int
    proc: subprocess.Popen[bytes]
    channel: socket.socket
    ready_at: float | None = None
    recycling: bool = False
    buffer: bytes = b""
    closed: bool = False
    worker_id: str = ""
    runs: dict[str, int] = field(default_factory=dict)
    """The runs it holds: run id -> lease token."""
    deadline: float | None = None
    """Monotonic time of its armed hard limit."""
    limit: tuple[float, str] | None = None
    """The armed limit: seconds, error (ErrorInfo JSON)."""
    killed_at_limit: bool = False
    idle_since: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class PoolSize:
    """How many children serve: ``fewest`` to ``most`` (equal without autoscale)."""

    fewest: int = 1
    most: int = 1
    prefork: bool = False
    """Children are pool processes, one run at a time (``CHILD_ENV``'s POOL)."""


class Supervisor:
    """Keeps ``size`` worker children (``argv``) serving; :meth:`run` returns the exit
    code. ``exit_now`` leaves at once (a second stop signal more than ``window`` seconds
    after the first); ``on_first_ready`` is called once, when the first child says it
    serves; ``keeper`` makes the store calls for children that die holding runs."""

    def __init__(
        self,
        argv: list[str],
        exit_now: Callable[[], None],
        window: float,
        on_first_ready: Callable[[], None] | None = None,
        *,
        size: PoolSize | None = None,
        keeper: RunKeeper | None = None,
    ):
        self.argv = argv
        self.exit_now = exit_now
        self.window = window
        self.on_first_ready = on_first_ready
        self.size = size or PoolSize()
        self.wanted = self.size.fewest
        self.keeper = keeper
        self.children: dict[int, Child] = {}
        self.started = 0
        self.served = False
        """Whether a child ever said it serves."""
        self.stopping = False
        self.code = 0
        self.signals: list[int] = []
        self.first_signal: float | None = None
        self.restart_at: float | None = None
        self.quick_deaths = 0
        self.selector = selectors.DefaultSelector()

    def run(self) -> int:
        wake_read, wake_write = socket.socketpair()
        for end in (wake_read, wake_write):
            end.setblocking(False)
        self.selector.register(wake_read, selectors.EVENT_READ)
        previous_fd = signal.set_wakeup_fd(wake_write.fileno())
        stop_signals = (signal.SIGTERM, signal.SIGINT)
        previous = {s: signal.signal(s, lambda n, _f: self.signals.append(n)) for s in stop_signals}
        try:
            self.fill()
            while self.children or (self.missing() and not self.stopping):
                events = self.selector.select(self.timeout())
                self.on_signals()
                for key, _ in events:
                    if key.fileobj is wake_read:
                        while _drain(wake_read):
                            pass
                    else:
                        self.read(key.data)
                self.enforce_limits()
                self.reap()
                self.autoscale()
                self.fill()
            return self.code
        finally:
            signal.set_wakeup_fd(previous_fd)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.selector.close()
            wake_read.close()
            wake_write.close()
            if self.keeper is not None:
                self.keeper.close()

    def serving(self) -> list[Child]:
        """The children that serve and go on serving (not recycling)."""
        return [c for c in self.children.values() if not c.recycling]

    def missing(self) -> int:
        return max(0, self.wanted - len(self.serving()))

    def fill(self) -> None:
        """Start the children missing, unless stopping or backing off."""
        if self.stopping or (self.restart_at is not None and time.monotonic() < self.restart_at):
            return
        self.restart_at = None
        for _ in range(self.missing()):
            self.start_child()
            if self.stopping:  # it could not start
                return

    def timeout(self) -> float:
        if any(c.closed for c in self.children.values()):
            return 0.05  # its socket closed: it is exiting
        now = time.monotonic()
        wake = [c.deadline for c in self.children.values() if c.deadline and not c.killed_at_limit]
        if self.restart_at is not None:
            wake.append(self.restart_at)
        return max(0.0, min([POLL, *(at - now for at in wake)]))

    def start_child(self) -> None:
        self.started += 1
        ours, theirs = socket.socketpair()
        pool = "prefork" if self.size.prefork else "threads"
        env = {
            **os.environ,
            CHILD_ENV: f"{self.started}:{theirs.fileno()}:{pool}",
            DETACHED_ENV: "1",
        }
        try:
            proc = subprocess.Popen(  # our own command line, run again
                self.argv, env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL
            )
        except OSError as exc:
            ours.close()
            log.error("cannot start a worker process (%s): %s", self.argv[0], exc)
            self.stop(1)
            return
        finally:
            theirs.close()
        child = Child(self.started, proc, ours)
        self.children[proc.pid] = child
        self.selector.register(ours, selectors.EVENT_READ, child)
        log.info("worker process %d started (#%d)", proc.pid, child.number)

    def stop(self, code: int = 0) -> None:
        """Stop every child gracefully (SIGTERM); the loop ends once they exited."""
        self.code = self.code or code
        self.stopping = True
        self.restart_at = None
        self.forward(signal.SIGTERM)

    def forward(self, signum: int, *, force: bool = False) -> None:
        """Send ``signum`` to the children; a graceful stop spares those recycling:
        they stop already, and one past its drain has no handler left to catch it."""
        for pid, child in self.children.items():
            if force or not child.recycling:
                with suppress(ProcessLookupError):
                    os.kill(pid, signum)

    def on_signals(self) -> None:
        while self.signals:
            signum = self.signals.pop(0)
            name = signal.Signals(signum).name
            now = time.monotonic()
            if self.first_signal is None:
                self.first_signal = now
                record_stop_signal(signum)
                log.info("received %s: stopping the worker processes (send it again to "
                         "exit at once)", name)  # fmt: skip
                self.stopping, self.restart_at = True, None
                self.forward(signum)
            elif now - self.first_signal >= self.window:
                log.warning("received %s again: exiting now, and so do the worker "
                            "processes", name)  # fmt: skip
                self.forward(signum, force=True)
                self.exit_now()

    def read(self, child: Child) -> None:
        try:
            data = child.channel.recv(65536)
        except OSError:
            data = b""
        if not data:
            child.closed = True
            self.selector.unregister(child.channel)
            return
        child.buffer += data
        while b"\n" in child.buffer:
            line, _, child.buffer = child.buffer.partition(b"\n")
            self.on_line(child, line)

    def on_line(self, child: Child, line: bytes) -> None:
        word, _, rest = line.partition(b" ")
        text = rest.decode(errors="replace")
        if word == b"run":
            run_id, _, token = text.partition(" ")
            child.runs[run_id] = int(token)
        elif word == b"idle":
            child.runs.pop(text, None)
            child.deadline = child.limit = None
            child.idle_since = time.monotonic()
        elif word == b"limit":
            seconds, _, error = text.partition(" ")
            child.limit = (float(seconds), error)
            child.deadline = time.monotonic() + float(seconds)
        elif word == b"unlimit":
            child.deadline = child.limit = None
        elif word == READY:
            child.ready_at = time.monotonic()
            child.worker_id = text
            self.served = True
            first, self.on_first_ready = self.on_first_ready, None
            if first is not None:
                first()
        elif word == RECYCLING and not child.recycling:
            child.recycling = True
            log.info("worker process %d recycles: %s", child.proc.pid, text.strip())

    def enforce_limits(self) -> None:
        """Kill each child whose armed hard time limit passed (its run fails as it is
        reaped)."""
        now = time.monotonic()
        for pid, child in self.children.items():
            if child.deadline is not None and now >= child.deadline and not child.killed_at_limit:
                child.killed_at_limit = True
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def autoscale(self) -> None:
        """Grow by one while every serving child runs something (up to ``most``);
        shrink by one idle child while above ``fewest``."""
        if self.stopping or self.size.most == self.size.fewest:
            return
        serving = self.serving()
        busy = [c for c in serving if c.runs]
        if (
            len(serving) == self.wanted
            and len(busy) == len(serving)
            and self.wanted < self.size.most
        ):
            self.wanted += 1
            log.info("autoscale: every pool process is busy; growing to %d", self.wanted)
            return
        idle = [c for c in serving if not c.runs and c.ready_at is not None]
        now = time.monotonic()
        if self.wanted > self.size.fewest and idle:
            oldest = min(idle, key=lambda c: c.idle_since)
            if now - oldest.idle_since >= AUTOSCALE_KEEPALIVE:
                self.wanted -= 1
                oldest.recycling = True  # it stops, and is not replaced
                log.info("autoscale: pool process %d idle; shrinking to %d",
                         oldest.proc.pid, self.wanted)  # fmt: skip
                with suppress(ProcessLookupError):
                    os.kill(oldest.proc.pid, signal.SIGTERM)

    def reap(self) -> None:
        for pid, child in list(self.children.items()):
            code = child.proc.poll()
            if code is None:
                continue
            if not child.closed:  # lines it wrote before it died
                self.read(child)
                if not child.closed:
                    self.selector.unregister(child.channel)
            del self.children[pid]
            child.channel.close()
            self.exited(child, code)

    def exited(self, child: Child, code: int) -> None:
        pid, how = child.proc.pid, _describe(code)
        if child.killed_at_limit and child.limit is not None and child.runs:
            seconds, error = child.limit
            log.error("worker process %d killed: its run passed its hard time limit (%ss); "
                      "starting another", pid, seconds)  # fmt: skip
            if self.keeper is not None:
                for run_id, token in child.runs.items():
                    self.keeper.fail(run_id, token, error, seconds)
            return
        if child.runs and code != 0 and self.keeper is not None:
            self.keeper.hand_back(child.worker_id, child.runs)
        if self.stopping:
            # Killed by the signal forwarded: it had no handler then, so held no runs.
            if child.ready_at is not None and code not in (0, -signal.SIGTERM, -signal.SIGINT):
                log.warning("worker process %d %s while stopping", pid, how)
                self.code = self.code or (code if code > 0 else 1)
            else:
                log.info("worker process %d %s", pid, how)
        elif child.recycling:
            log.log(logging.INFO if code == 0 else logging.WARNING, "worker process %d "
                    "recycled: %s", pid, how)  # fmt: skip
        elif child.ready_at is None and code > 0 and (code == EXIT_USAGE or not self.served):
            # A usage error (a module that no longer imports) fails every replacement
            # alike; anything else after a child served (a store restarting) is retried.
            log.error("worker process %d %s before it served (see its error above); not "
                      "starting another", pid, how)  # fmt: skip
            self.stop(code)
        else:
            now = time.monotonic()
            quick = child.ready_at is None or now - child.ready_at < STABLE_AFTER
            self.quick_deaths = self.quick_deaths + 1 if quick else 0
            delay = min(BACKOFF_FIRST * 2 ** (self.quick_deaths - 1), BACKOFF_MAX) if quick else 0
            if child.runs and self.keeper is not None:
                held = "were handed back"
            else:
                held = "were requeued" if code == 0 else "are recovered once their lease expires"
            log.warning("worker process %d %s, not asked to; its runs %s; starting another "
                        "in %.1fs", pid, how, held, delay)  # fmt: skip
            if self.restart_at is None:
                self.restart_at = now + delay


def _drain(sock: socket.socket) -> bool:
    try:
        return bool(sock.recv(4096))
    except (BlockingIOError, InterruptedError):
        return False


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
