"""``pyrula worker --max-tasks-per-child N`` / ``--max-memory-per-child KIB``: a worker
process replaced after N runs, or once its resident memory passes KIB kilobytes.

The threads pool runs task bodies on threads of one worker process, so recycling
replaces that whole process; the prefork pool (:mod:`pyrula.cli.prefork`) replaces each
pool process on its own, under the same supervisor. With either limit set (the flag,
or with ``-A`` the app's ``worker_max_tasks_per_child`` /
``worker_max_memory_per_child``; the flag wins), ``pyrula worker`` becomes a small
supervisor: the process the pid file names. It checks the command as a worker would
(imports the modules or the app, so a usage error is its own, exit 2), then serves
nothing itself: it runs the worker as a child process (its own command line again,
marked by ``PYRULA_WORKER_CHILD``) and keeps one serving (or each pool process;
:mod:`pyrula.cli.supervisor`):

* The child counts every run execution that ends on it (completed, failed, cancelled,
  suspended: ``WorkflowWorker.on_run_end``) and reads its resident memory after each
  (:func:`resident_kib`). At a limit it tells the supervisor (a line on a socket pair the
  two share), which starts the replacement at once, and stops as on SIGTERM: no more
  claims, its runs in flight finish (up to ``--shutdown-grace``, then are requeued) and
  it exits 0. Old and new overlap briefly, which is safe: claims are per run and fenced.
* SIGTERM/SIGINT to the supervisor go to its children (a stop signal they also received
  directly, from a terminal or ``kill -- -PGID``, is the same stop: they ignore a repeat
  within half a second); it exits 0 once they exited cleanly. A second signal exits at
  once with 1, as ``pyrula worker`` does.
* A child that dies otherwise (a crash, SIGKILL, an exit nobody asked for) is replaced;
  repeated quick deaths back off (0.5 s, doubling, up to 30 s). The runs it held (it
  reports each run and lease token as the run starts) are handed back at once: the
  supervisor expires their leases, fenced by the token, and recovers them, which counts
  a recovery as for any dead worker (without a report, they are recovered once their
  lease expires). A child that exits with a usage error before it served (a module
  that no longer imports), or the first child failing before any served, is not
  restarted: the supervisor stops the others and exits with its code. A child that
  cannot reach its store waits for it with backoff.
* A child whose supervisor is gone (its end of the socket closed) stops gracefully.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from pyrula.cli.health import HealthState
from pyrula.cli.prefork import Pool, PoolChild, RunKeeper
from pyrula.cli.render import CliUsageError, mask_url
from pyrula.cli.supervisor import CHILD_ENV, READY, RECYCLING, PoolSize, Supervisor

log = logging.getLogger("pyrula.cli.recycle")

F = TypeVar("F", bound=Callable[..., Any])
Start = Callable[[Any], Awaitable[None]]


def recycle_options(command: F) -> F:
    """Add ``--max-tasks-per-child`` and ``--max-memory-per-child`` (Celery's flags)."""
    for names, dest, metavar, text in reversed(
        (
            ("--max-tasks-per-child", "max_tasks_per_child", "N",
             "Replace the worker process after N runs ended on it (a supervisor process "
             "runs it; see docs/worker.md). With -A: worker_max_tasks_per_child."),
            ("--max-memory-per-child", "max_memory_per_child", "KIB",
             "Replace the worker process once its resident memory passes KIB kilobytes "
             "(checked as each run ends). With -A: worker_max_memory_per_child."),
        )
    ):  # fmt: skip
        command = click.option(
            names, dest, type=click.IntRange(min=1), metavar=metavar, default=None, help=text
        )(command)
    return command


# -- limits ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    max_tasks: int | None
    max_memory_kib: int | None

    def describe(self) -> str:
        parts = []
        if self.max_tasks is not None:
            parts.append(f"after {self.max_tasks} runs")
        if self.max_memory_kib is not None:
            parts.append(f"once above {self.max_memory_kib} KiB resident")
        return " or ".join(parts)

    def reached(self, finished: int) -> str | None:
        """Why the worker must be replaced now that ``finished`` runs ended on it."""
        if self.max_tasks is not None and finished >= self.max_tasks:
            return f"{finished} runs ended here (the limit: {self.max_tasks})"
        if self.max_memory_kib is not None:
            resident = resident_kib()
            if resident > self.max_memory_kib:
                return f"{resident} KiB resident (the limit: {self.max_memory_kib} KiB)"
        return None


def limits_of(values: Mapping[str, Any], app: Any, store_url: str | None) -> Limits | None:
    """The limits the command line (or, for those it does not give, the app's settings)
    sets; None without any. A bad setting, or a limit on a ``memory://`` store (which
    lives and dies with the worker process), is a usage error."""
    found: dict[str, int | None] = {}
    named: list[str] = []
    for key, setting in (
        ("max_tasks_per_child", "worker_max_tasks_per_child"),
        ("max_memory_per_child", "worker_max_memory_per_child"),
    ):
        value = values.get(key)
        if value is not None:
            named.append("--" + key.replace("_", "-"))
        elif app is not None:
            value = _setting(app, setting)
            named.extend([setting] if value is not None else [])
        found[key] = value
    if not named:
        return None
    if store_url is not None and store_url.startswith("memory:"):
        raise CliUsageError(
            f"{named[0]}: recycling replaces the worker process, and a memory:// store "
            "lives inside it: serve a durable store (sqlite:///..., redis://...)"
        )
    return Limits(found["max_tasks_per_child"], found["max_memory_per_child"])


def _setting(app: Any, name: str) -> int | None:
    value = app.conf.get(name)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CliUsageError(
            f"-A: the app's {name} must be a whole number, 1 or more (or None), got {value!r}"
        )
    return value


def resident_kib() -> int:
    """This process's resident memory, in KiB. On Linux the current figure, from
    ``/proc/self/statm`` (what psutil, and so Celery, reads); elsewhere the peak from
    ``getrusage`` (``ru_maxrss``), which never goes down: the limit then applies to the
    largest the process has been."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            pages = int(handle.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak // 1024 if sys.platform == "darwin" else peak  # bytes on macOS


# -- the child -------------------------------------------------------------------------
class ChildLink:
    """This process is a worker run by a supervisor: its end of their socket pair."""

    def __init__(self, number: int, channel: socket.socket) -> None:
        self.number = number
        self.channel = channel
        self.finished = 0
        self.recycling = False
        self.limits: Limits | None = None
        self.worker: Any = None
        self.prefork = False
        self._sending = threading.Lock()
        self.reports: PoolChild | None = None

    def observer(self) -> PoolChild:
        """The worker's execution observer: reports the run and token this process
        holds, and (a prefork pool process) arms its hard time limits."""
        self.reports = PoolChild(self._send, enforce=self.prefork)
        return self.reports

    @classmethod
    def from_environment(cls, values: dict[str, Any]) -> ChildLink | None:
        """The link when a supervisor started this process (None otherwise), the
        variable removed so processes it starts are not taken for children. The
        supervisor already did the daemon part (pid file, user, umask, folder, detach);
        only the first child honours ``--purge``; an explicit ``--worker-id`` gets the
        pid appended, since old and new children serve side by side for a while."""
        text = os.environ.pop(CHILD_ENV, None)
        if not text:
            return None
        number, fd, pool = text.split(":")
        channel = socket.socket(fileno=int(fd))
        channel.set_inheritable(False)
        for key in ("pidfile", "workdir", "uid", "gid", "umask"):
            values[key] = None
        values["detach"] = False
        if int(number) > 1:
            values["celery_purge"] = False
        if values.get("worker_id"):
            values["worker_id"] = f"{values['worker_id']}-{os.getpid()}"
        link = cls(int(number), channel)
        if pool == "prefork":  # a pool process: one run at a time
            values["max_concurrent_runs"] = 1
            link.prefork = True
        return link

    def attach(self, worker: Any, limits: Limits | None, on_start: Start | None) -> Start:
        """Count ``worker``'s runs against ``limits`` and watch the supervisor; returns
        the start hook to serve with (``on_start``, then a line saying it serves)."""
        self.worker, self.limits = worker, limits
        worker.on_run_end = self._run_ended
        threading.Thread(target=self._watch, name="pyrula-supervisor", daemon=True).start()

        async def start(store: Any) -> None:
            if on_start is not None:
                await on_start(store)
            self._send(READY + b" " + str(worker.worker_id).encode())

        return start

    def _run_ended(self, run_id: str) -> None:
        if self.reports is not None:
            self.reports.run_ended(run_id)
        self.finished += 1
        if self.recycling or self.limits is None:
            return
        reason = self.limits.reached(self.finished)
        if reason is None:
            return
        self.recycling = True
        log.info(
            "worker %s recycles: %s; it claims no more, its runs in flight get %.1fs to "
            "finish, and a new worker process takes over",
            self.worker.worker_id,
            reason,
            self.worker.options.shutdown_grace,
        )
        self._send(RECYCLING + b" " + reason.encode())
        self.worker.stop()

    def _send(self, line: bytes) -> None:
        with self._sending, suppress(OSError):  # the supervisor is gone (_watch stops it)
            self.channel.sendall(line + b"\n")

    def _watch(self) -> None:
        """The supervisor never writes: the socket is readable once it has exited."""
        try:
            while self.channel.recv(64):
                pass
        except OSError:
            pass
        log.warning("the supervisor is gone: stopping this worker process")
        self.worker.stop()


def supervise(
    limits: Limits | None,
    on_first_ready: Callable[[], None] | None = None,
    *,
    pool: Pool | None = None,
    keeper: RunKeeper | None = None,
    health: HealthState | None = None,
) -> None:
    """Serve through worker children until stopped (see the module docstring, and
    :mod:`pyrula.cli.prefork` for a prefork ``pool``); return on a clean stop, else raise
    ``SystemExit`` with the exit code. ``on_first_ready`` is called once, when the first
    child serves (with ``-A``: Celery's ``worker_ready``)."""
    from pyrula.cli.worker import EXIT_FORCED, REPEAT_SIGNAL_WINDOW, _hard_exit

    if pool is not None and pool.kind == "prefork":
        size = PoolSize(pool.processes, pool.most, prefork=True)
        scale = f"{pool.processes} to {pool.most}" if pool.most > pool.processes else str(pool.most)
        what = f"{scale} pool processes, one run at a time each"
    else:
        size = PoolSize()
        what = "a worker process"
    replaced = f", replaced {limits.describe()}" if limits is not None else ""
    where = f" on {mask_url(keeper.store.url)}" if keeper is not None else ""
    click.echo(f"pyrula supervisor (pid {os.getpid()}): serves{where} through {what}{replaced}")
    argv = [sys.executable, "-m", "pyrula.cli.main", *sys.argv[1:]]
    supervisor = Supervisor(
        argv,
        lambda: _hard_exit(EXIT_FORCED),
        REPEAT_SIGNAL_WINDOW,
        on_first_ready,
        size=size,
        keeper=keeper,
    )
    if health is not None:  # /readyz: a worker process serves
        health.serving = lambda: any(
            c.ready_at is not None and not c.recycling for c in list(supervisor.children.values())
        )
    code = supervisor.run()
    log.info("supervisor %d stopped", os.getpid())
    if code:
        raise SystemExit(code)
