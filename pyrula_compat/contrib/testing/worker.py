"""``start_worker(app)``: a pyrula worker on a thread of this process, for tests and
one-file scripts (as ``celery.contrib.testing.worker.start_worker``)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyrula.workflows import WorkerOptions, WorkflowWorker, open_store
from pyrula_compat.utils.dispatch import Signal
from pyrula_compat.worker import AppWorker

WORKER_LOGLEVEL = os.environ.get("WORKER_LOGLEVEL", "error")
"""The test worker's log level, as Celery's (``WORKER_LOGLEVEL`` in the environment)."""

test_worker_starting = Signal(name="test_worker_starting", providing_args={})
"""Sent by :func:`start_worker` before the worker starts (``sender``: the app)."""
test_worker_started = Signal(name="test_worker_started", providing_args={"worker", "consumer"})
"""Sent once the worker serves (``worker``: the :class:`TestWorker`)."""
test_worker_stopped = Signal(name="test_worker_stopped", providing_args={"worker"})
"""Sent after the worker stopped."""

FAST = {"claim_poll_interval": 0.05, "timer_poll_interval_s": 0.2, "schedule_poll_interval": 1.0}


class TestWorker:
    """The worker ``start_worker`` runs: the running ``WorkflowWorker``'s attributes, and
    :meth:`reload` (as Celery's test worker) to serve tasks registered since it started."""

    __test__ = False  # not a test class, for pytest

    def __init__(self, app: Any, options: WorkerOptions, startup_timeout: float) -> None:
        self.app = app
        self._options = options
        self._startup_timeout = startup_timeout
        self._thread: threading.Thread | None = None
        self._setup: AppWorker | None = None
        self.worker: WorkflowWorker | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "worker":  # copy/pickle: no __init__ ran
            raise AttributeError(name)
        return getattr(self.worker, name)

    def start(self) -> None:
        app = self.app
        setup = self._setup = AppWorker(app, hostname=f"celery@{socket.gethostname()}")
        setup.prepare()
        url = app.store_url()
        store = app.client().store if (url or "").startswith("memory") else open_store(url)
        worker = self.worker = WorkflowWorker(
            store=store, registry=app.registry, options=self._options
        )
        ready = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            await store.open()
            try:
                await setup.on_start(store)  # the app's bootsteps start here
                ready.set()
                await worker.run()
            finally:
                if store is not app.client().store:
                    await store.close()

        def target() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:  # handed to the caller below
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=target, name="pyrula-compat-worker", daemon=True)
        self._thread.start()
        ready.wait(self._startup_timeout)
        if failure:  # a bootstep that failed to start: BootstepError naming it
            self._thread.join(self._startup_timeout)
            self.worker = self._thread = self._setup = None
            raise failure[0]
        test_worker_started.send(sender=app, worker=self, consumer=None)

    def ensure_started(self) -> None:
        """Return once the worker serves (:meth:`start` returns only then)."""

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the worker; whether its thread ended within ``timeout`` seconds (a task
        still running keeps it: the thread is a daemon thread)."""
        thread = self._thread
        if self.worker is not None:
            self.worker.stop()
        if thread is not None:
            thread.join(timeout)
        if self._setup is not None:
            self._setup.on_stop()
        self.worker = self._thread = self._setup = None
        return thread is None or not thread.is_alive()

    def reload(self, timeout: float = 10.0) -> None:
        """Stop and start again, serving every task the app has now."""
        if not self.stop(timeout):
            raise RuntimeError(f"the test worker did not stop within {timeout} s: not reloaded")
        self.start()


@contextmanager
def start_worker(
    app: Any,
    concurrency: int = 1,
    pool: str = "threads",
    loglevel: Any = None,
    logfile: Any = None,
    perform_ping_check: bool = True,
    ping_task_timeout: float = 10.0,
    shutdown_timeout: float = 10.0,
    **options: Any,
) -> Iterator[TestWorker]:
    """Serve ``app``'s tasks on a background thread until the block ends.

    ``options`` may be :class:`WorkerOptions` fields; anything else is a Celery worker
    option (``without_heartbeat``, ``queues``, ...), accepted and ignored as Celery's
    test worker accepts them."""
    test_worker_starting.send(sender=app)
    fields = {f.name for f in dataclasses.fields(WorkerOptions)}
    ours = {name: value for name, value in options.items() if name in fields}
    settings = {**FAST, "max_concurrent_runs": max(1, concurrency) * 4, **ours}
    worker = TestWorker(app, WorkerOptions(**settings), ping_task_timeout)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(shutdown_timeout)
        test_worker_stopped.send(sender=app, worker=worker)


TestWorkController = TestWorker
"""Celery's name for the test worker's class."""


def setup_app_for_worker(app: Any, loglevel: str | int, logfile: str | None) -> None:
    """Make ``app`` ready for an embedded worker, as Celery does: finalized, current and
    default, its logging set up."""
    app.finalize()
    app.set_current()
    app.set_default()
    app.log.setup(loglevel=loglevel, logfile=logfile)


__all__ = [
    "WORKER_LOGLEVEL",
    "TestWorkController",
    "TestWorker",
    "setup_app_for_worker",
    "start_worker",
    "test_worker_started",
    "test_worker_starting",
    "test_worker_stopped",
]
