"""The worker's pools: ``prefork`` (N processes, one run each), ``threads``, ``solo``.

``pyrula worker -A proj -c N`` runs N pool processes, as Celery's default pool does;
natively ``pyrula worker --workflow M --processes N``. Each pool process is a whole
worker (its own event loop, claims, leases, journal writes) serving one run at a time,
so a CPU-bound body has a core and a GIL to itself. The main process serves nothing: it
supervises (:mod:`pyrula.cli.supervisor`). Each pool process tells it, on the socket
pair they share, which run and lease token it holds and when a hard time limit is armed
(:class:`PoolChild`); with that the parent

* hands a run back at once when its process dies (SIGKILL, OOM, a segfault): it expires
  the lease, fenced by the token, and recovers it, which counts a recovery toward
  dead-lettering as a lease that ran out would (:class:`RunKeeper`);
* kills the process whose body passes its hard limit, fails the run with the limit's
  error (``TimeLimitExceeded``), fenced by the token, and starts a fresh process.

Why processes that each claim (and not a parent that claims and sends bodies to
children): every durable guarantee stays where it is tested, in the worker (fenced
leases renewed by the process that runs the body, one terminal outcome, recovery), a
task costs no extra hop (payloads never cross a pipe), and the parent needs the store
only when a process died.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from pyrula.cli.render import CliUsageError
from pyrula.workflows import hard_limits
from pyrula.workflows.errors import LeaseLost, PyrulaError, RunNotFound
from pyrula.workflows.records import Outcome, RunStatus
from pyrula.workflows.serialization import ErrorInfo
from pyrula.workflows.stores.base import Store

log = logging.getLogger("pyrula.cli.recycle")

F = TypeVar("F", bound=Callable[..., Any])

POOLS = ("prefork", "threads", "solo")
ALIASES = {"processes": "prefork"}
"""Celery's other name of its prefork pool."""
INSTEAD = {"eventlet": "threads", "gevent": "threads", "custom": "threads"}
"""Celery pools pyrula has not, and the one that runs instead (green threads serve
many I/O-bound bodies at once in one process: so do threads)."""
STORE_CALL_TIMEOUT = 10.0
"""Longest the parent waits for one store call of a hand-back."""
RECOVER_BATCH = 100
STORE_WAIT_FIRST = 0.5
STORE_WAIT_MAX = 30.0


def cpu_count() -> int:
    """The CPUs this process may use (Celery's default ``-c``)."""
    counter = getattr(os, "process_cpu_count", None) or os.cpu_count
    return counter() or 1


def pool_options(command: F) -> F:
    """Add ``--processes N`` (the native prefork pool)."""
    return click.option(
        "--processes",
        "pool_processes",
        type=int,
        metavar="N",
        default=None,
        help="Serve through N pool processes, each executing one run at a time "
        "(the prefork pool; with -A, -c N). See docs/worker.md.",
    )(command)


@dataclass(frozen=True)
class Pool:
    """The pool a ``pyrula worker`` command serves with."""

    kind: str
    """``prefork``, ``threads`` or ``solo``."""
    processes: int = 0
    """prefork: the pool processes to start (autoscale: the fewest)."""
    most: int = 0
    """prefork with ``--autoscale``: the most; else ``processes``."""
    note: str | None = None
    """A line to print: what runs instead of the pool asked for."""


def check_concurrency(values: Mapping[str, Any]) -> None:
    """``-c 0`` (or less) and ``--processes 0`` are usage errors, raised before anything
    is imported, stored or started."""
    for key, flag in (
        ("max_concurrent_runs", "-c/--concurrency"),
        ("pool_processes", "--processes"),
    ):
        value = values.get(key)
        if value is not None and value < 1:
            raise CliUsageError(
                f"{flag} {value}: give 1 or more (the runs, or pool processes, serving at once)"
            )


def choose_pool(values: Mapping[str, Any], *, app: bool, store_url: str | None) -> Pool:
    """The pool of this command: ``--pool`` (Celery's ``-P``), else prefork with ``-A``
    (Celery's default) or ``--processes``, else threads. A prefork pool's size is
    ``--processes``, else ``-c`` with ``-A`` (or the app's ``worker_concurrency``), else
    the CPU count; ``--autoscale MAX,MIN`` makes it grow from MIN to MAX."""
    asked = (values.get("celery_pool") or "").strip().lower()
    note = None
    kind = ALIASES.get(asked, asked)
    if kind in INSTEAD:
        kind = INSTEAD[kind]
        note = f"note: --pool {asked}: not available in pyrula; the {kind} pool runs instead"
    elif kind and kind not in POOLS:
        raise CliUsageError(
            f"--pool {asked}: unknown pool; give one of prefork, threads, solo "
            "(eventlet and gevent run the threads pool)"
        )
    processes = values.get("pool_processes")
    if not kind:
        kind = "prefork" if (app or processes) else "threads"
    if kind == "prefork" and store_url is not None and store_url.startswith("memory:"):
        note = "note: a memory:// store lives in one process: the threads pool serves it"
        kind = "threads"
    if kind != "prefork":
        if values.get("celery_autoscale") and note is None:
            note = f"note: --autoscale: only the prefork pool scales; the {kind} pool keeps -c"
        return Pool(kind, note=note)
    concurrency = values.get("max_concurrent_runs")
    size = processes or (concurrency if app else None) or cpu_count()
    most, fewest = size, size
    scale = values.get("celery_autoscale")
    if scale:
        most, fewest = parse_autoscale(str(scale))
    return Pool("prefork", fewest, most, note)


def parse_autoscale(text: str) -> tuple[int, int]:
    """``--autoscale MAX,MIN`` (Celery's order; MIN defaults to 0, here at least 1)."""
    try:
        parts = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 2 or parts[0] < 1 or min(parts) < 0:
        raise CliUsageError(f"--autoscale {text}: give MAX,MIN, such as 10,3")
    most = parts[0]
    fewest = max(1, parts[1] if len(parts) == 2 else 0)
    if fewest > most:
        most, fewest = fewest, most
    return most, fewest


async def open_patiently(store: Store, retries: int | None = None) -> None:
    """Open ``store``, waiting for it with backoff (0.5 s doubling to 30 s) while it
    cannot be reached, logging each attempt: a pool process that starts while its store
    restarts waits. ``retries``: how many more attempts after the first (None: forever);
    past them the last error is raised."""
    delay = STORE_WAIT_FIRST
    attempt = 0
    while True:
        attempt += 1
        try:
            await store.open()
            return
        except PyrulaError as exc:
            if retries is not None and attempt > retries:
                raise
            of = "" if retries is None else f" of {retries}"
            log.warning("store unreachable (%s); retry %d%s in %.1fs", exc, attempt, of, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, STORE_WAIT_MAX)


# -- the pool process ------------------------------------------------------------------
class PoolChild:
    """A pool process's reports to its parent: the run and token it holds (the
    worker's execution observer sees each step start), the run's end, and its hard
    time limits (this process's :mod:`pyrula.workflows.hard_limits` enforcer).
    ``send`` writes one line to the parent."""

    def __init__(self, send: Callable[[bytes], None], *, enforce: bool) -> None:
        self._send = send
        self._held: tuple[str, int] | None = None
        if enforce:
            hard_limits.set_enforcer(self)

    # ExecutionObserver
    def step_started(self, execution: Any, name: str, attempt: int) -> None:
        held = (execution.run_id, execution.token)
        if held != self._held:
            self._held = held
            self._send(f"run {held[0]} {held[1]}".encode())

    async def checkpoint(self, execution: Any, point: str) -> None:
        return None

    def run_ended(self, run_id: str) -> None:
        if self._held is not None and self._held[0] == run_id:
            self._held = None
        self._send(f"idle {run_id}".encode())

    # HardLimitEnforcer
    def arm(self, seconds: float, error: ErrorInfo) -> None:
        self._send(f"limit {seconds!r} {error.to_json()}".encode())

    def disarm(self) -> None:
        self._send(b"unlimit")


# -- the parent ------------------------------------------------------------------------
class RunKeeper:
    """The parent's store calls, each fenced by the token a pool process reported: hand
    back the runs of a process that died, fail the run of one killed at its hard limit.
    The store is opened on first use, on a private event loop."""

    def __init__(self, store: Store, max_recoveries: int) -> None:
        self.store = store
        self.max_recoveries = max_recoveries
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opened = False

    def hand_back(self, worker_id: str, runs: Mapping[str, int]) -> None:
        """The process ``worker_id`` died holding ``runs`` (run id -> token): expire
        their leases now and recover them (each counts a recovery; past
        ``max_recoveries`` the run is dead-lettered)."""
        for run_id, token in runs.items():
            how = self._call(self._hand_back(worker_id, run_id, token), run_id)
            if how is not None:
                log.warning("run %s of a dead pool process: %s", run_id, how)

    def fail(self, run_id: str, token: int, error: str, seconds: float) -> None:
        """End the run whose process was killed at its hard limit with ``error``."""
        how = self._call(self._fail(run_id, token, error), run_id)
        if how is not None:
            log.error("run %s: hard time limit (%ss) exceeded; %s", run_id, seconds, how)

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._opened:
            try:
                loop.run_until_complete(asyncio.wait_for(self.store.close(), STORE_CALL_TIMEOUT))
            except (PyrulaError, TimeoutError) as exc:
                log.debug("closing the store: %s", exc)
        loop.close()

    def _call(self, work: Coroutine[Any, Any, str], run_id: str) -> str | None:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        try:
            return self._loop.run_until_complete(asyncio.wait_for(work, STORE_CALL_TIMEOUT))
        except (PyrulaError, TimeoutError) as exc:
            log.warning("run %s: the store did not answer (%s); its lease will lapse", run_id, exc)
            return None

    async def _open(self) -> None:
        if not self._opened:
            await self.store.open()
            self._opened = True

    async def _hand_back(self, worker_id: str, run_id: str, token: int) -> str:
        await self._open()
        renewed = await self.store.renew_leases(worker_id, [(run_id, token)], 0.0)
        if run_id in renewed.lost:
            return "already ended or taken over"
        for _ in range(10):  # more expired runs than a batch: ours may be in the next
            report = await self.store.recover_expired(self.max_recoveries, RECOVER_BATCH)
            if run_id in report.requeued:
                return "requeued (a recovery)"
            if run_id in report.dead:
                return f"dead-lettered (recovered more than {self.max_recoveries} times)"
            if len(report.requeued) + len(report.dead) < RECOVER_BATCH:
                break
        return "already ended or taken over"

    async def _fail(self, run_id: str, token: int, error: str) -> str:
        await self._open()
        try:
            await self.store.finish_run(run_id, token, Outcome(RunStatus.FAILED, error=error))
        except (LeaseLost, RunNotFound):
            return "its run had already ended or was taken over"
        return "the run failed"
