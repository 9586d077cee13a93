"""The supervisor of ``pyrula worker --max-tasks-per-child`` / ``--max-memory-per-child``:
keeps one worker child process serving, replaces it when it recycles or dies, passes
stop signals on. How and why: :mod:`pyrula.cli.recycle`."""

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
from dataclasses import dataclass

from pyrula.cli.daemon import DETACHED_ENV

log = logging.getLogger("pyrula.cli.recycle")

CHILD_ENV = "PYRULA_WORKER_CHILD"
"""Set to ``NUMBER:FD`` in a child's environment: its number (1 for the first) and the
descriptor of its end of the socket pair shared with the supervisor."""
READY, RECYCLING = b"ready", b"recycling"
"""The child's lines to the supervisor: it serves; it reached a limit and drains."""
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
STABLE_AFTER = 10.0
"""A child that served this long before it died is replaced at once, without backoff."""
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


class Supervisor:
    """Keeps one worker child (``argv``) serving; :meth:`run` returns the exit code.
    ``exit_now`` leaves at once (a second stop signal more than ``window`` seconds after
    the first); ``on_first_ready`` is called once, when the first child says it serves."""

    def __init__(
        self,
        argv: list[str],
        exit_now: Callable[[], None],
        window: float,
        on_first_ready: Callable[[], None] | None = None,
    ):
        self.argv = argv
        self.exit_now = exit_now
        self.window = window
        self.on_first_ready = on_first_ready
        self.children: dict[int, Child] = {}
        self.started = 0
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
            self.start_child()
            while self.children or (self.restart_at is not None and not self.stopping):
                events = self.selector.select(self.timeout())
                self.on_signals()
                for key, _ in events:
                    if key.fileobj is wake_read:
                        while _drain(wake_read):
                            pass
                    else:
                        self.read(key.data)
                self.reap()
                if self.restart_at is not None and time.monotonic() >= self.restart_at:
                    self.restart_at = None
                    if not self.stopping:
                        self.start_child()
            return self.code
        finally:
            signal.set_wakeup_fd(previous_fd)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.selector.close()
            wake_read.close()
            wake_write.close()

    def timeout(self) -> float:
        if any(c.closed for c in self.children.values()):
            return 0.05  # its socket closed: it is exiting
        if self.restart_at is not None:
            return max(0.0, min(POLL, self.restart_at - time.monotonic()))
        return POLL

    def start_child(self) -> None:
        self.started += 1
        ours, theirs = socket.socketpair()
        env = {**os.environ, CHILD_ENV: f"{self.started}:{theirs.fileno()}", DETACHED_ENV: "1"}
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
            data = child.channel.recv(4096)
        except OSError:
            data = b""
        if not data:
            child.closed = True
            self.selector.unregister(child.channel)
            return
        child.buffer += data
        while b"\n" in child.buffer:
            line, _, child.buffer = child.buffer.partition(b"\n")
            if line == READY:
                child.ready_at = time.monotonic()
                first, self.on_first_ready = self.on_first_ready, None
                if first is not None:
                    first()
            elif line.startswith(RECYCLING) and not child.recycling:
                child.recycling = True
                reason = line[len(RECYCLING) :].decode(errors="replace").strip()
                log.info("worker process %d recycles: %s", child.proc.pid, reason)
                if not self.stopping:
                    self.start_child()

    def reap(self) -> None:
        for pid, child in list(self.children.items()):
            code = child.proc.poll()
            if code is None:
                continue
            del self.children[pid]
            if not child.closed:
                self.selector.unregister(child.channel)
            child.channel.close()
            self.exited(child, code)

    def exited(self, child: Child, code: int) -> None:
        pid, how = child.proc.pid, _describe(code)
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
        elif child.ready_at is None and code > 0:
            log.error("worker process %d %s before it served (see its error above); not "
                      "starting another", pid, how)  # fmt: skip
            self.stop(code)
        else:
            now = time.monotonic()
            quick = child.ready_at is None or now - child.ready_at < STABLE_AFTER
            self.quick_deaths = self.quick_deaths + 1 if quick else 0
            delay = min(BACKOFF_FIRST * 2 ** (self.quick_deaths - 1), BACKOFF_MAX) if quick else 0
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
