"""Serving a Celery app with a pyrula worker: what ``pyrula worker -A proj`` does.

Before the worker starts it does what Celery's worker does at start-up: set Django up
and run its system checks when ``DJANGO_SETTINGS_MODULE`` is set (which imports the
URLconf and whatever it reaches), import the ``include``/``imports`` modules and the
autodiscovered task modules, refuse non-JSON serializers, and send the worker signals.
Which process sends which follows Celery's prefork worker, whose main process is our
``pyrula worker`` and whose pool children are the processes that serve: one process
without recycling sends them all; with ``--max-tasks-per-child`` /
``--max-memory-per-child`` the supervisor sends the main process's (``celeryd_init``,
``celeryd_after_setup``, ``worker_init``, ``worker_ready`` once its first worker child
serves, ``worker_shutting_down``, ``worker_shutdown``) and each worker child
(``pool_child``) only ``worker_process_init`` and ``worker_process_shutdown``. Both
import the app, so both send the app's own (``import_modules``, ``on_after_configure``,
the logging signals).
Once the store is open it syncs ``beat_schedule`` and says which queued tasks no worker
here knows (they stay queued, never dropped; a client sending one while no running
worker serves it says so too: :func:`pyrula_compat.result.served`).
The main process also makes, starts and stops the app's bootsteps (``app.steps``,
:mod:`pyrula_compat.bootsteps`) and calls the app loader's ``init_worker`` and
``shutdown_worker``.

``pyrula beat -A proj`` (:class:`BeatService`) does what ``celery beat`` does instead: no
worker signals; the task modules imported, ``beat_schedule`` synced, ``beat_init`` sent.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pyrula.workflows import RunStatus, Store, WorkflowDefinition
from pyrula.workflows.log_context import LOG_FORMAT_ENV, JsonFormatter
from pyrula_compat import beat, bootsteps, recorded, signals, worker_signals
from pyrula_compat.exceptions import ImproperlyConfigured
from pyrula_compat.runstate import REVOKED_TASK, SAVED_GROUP

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery

log = logging.getLogger("pyrula_compat.worker")

WARM_EXIT_CODES = {"SIGTERM": 0, "SIGINT": 1}
"""The ``exitcode`` of ``worker_shutting_down`` for a warm stop by each signal, as
Celery's handlers send it (``EX_OK``; ``EX_FAILURE`` for Ctrl-C)."""


def setup_django() -> bool:
    """``django.setup()`` and the system checks, as Celery's Django fix-up does."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return False
    try:
        import django
    except ImportError:
        return False
    django.setup()
    if not os.environ.get("CELERY_SKIP_CHECKS"):
        from django.core.checks import run_checks

        run_checks()
    return True


class AppWorker:
    """Prepares a process to serve ``app`` and hooks the worker's start and stop.

    ``pool_child``: this process is a worker child of a recycling supervisor (Celery's
    pool process), so it sends only ``worker_process_init`` and
    ``worker_process_shutdown``; the supervisor, which prepares the app but never
    serves (no :meth:`on_start`), sends the others, ``worker_ready`` through
    :meth:`ready`."""

    def __init__(
        self,
        app: Celery,
        hostname: str | None = None,
        *,
        pool_child: bool = False,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.app = app
        self.hostname = hostname
        self.pool_child = pool_child
        self.options: dict[str, Any] = dict(options or {})
        """What the bootsteps get as keyword arguments: ``hostname``, ``loglevel``,
        ``logfile``, ``concurrency`` and the values of the app's worker user options."""
        self.steps: list[Any] = []
        """The started :class:`~pyrula_compat.bootsteps.StartStopStep` s (Celery's
        ``worker.steps``)."""
        self.bootsteps: bootsteps.WorkerSteps | None = None
        self.steps_started = False
        self.process_started = False
        """Whether :meth:`on_start` sent ``worker_process_init`` (so :meth:`on_stop`
        sends ``worker_process_shutdown``)."""

    def prepare(self) -> list[str]:
        """Everything that happens before the store opens; returns the modules imported."""
        app = self.app
        main = not self.pool_child
        if main:
            signals.celeryd_init.send(
                sender=self.hostname, instance=self, conf=app.conf, options={}
            )
        app.check_serializers()
        setup_django()
        imported = app.import_default_modules()
        signals.import_modules.send(sender=app)
        if main:
            signals.celeryd_after_setup.send(sender=self.hostname, instance=self, conf=app.conf)
        app.finalize()
        app.on_after_configure.send(sender=app, source=app.conf)
        beat.schedules_of(app)  # a bad entry fails here, before serving
        if main:
            signals.worker_init.send(sender=self)
            app.loader.init_worker()
            options = {"hostname": self.hostname, **self.options}
            self.bootsteps = bootsteps.WorkerSteps(self, app.steps, **options)
        return imported

    @property
    def definitions(self) -> list[WorkflowDefinition]:
        return self.app.registry.all()

    def concurrency(self) -> int | None:
        value = self.app.conf.worker_concurrency
        return int(value) if value else None

    def retention(self) -> float | None:
        """``result_expires`` (seconds or a timedelta; default one day) as the worker's
        ``run_retention``: a task's run, its result with it, is deleted that long after it
        ended, and its id reads ``PENDING`` again, as in Celery. None or 0 keeps them."""
        value = self.app.conf.result_expires
        if isinstance(value, timedelta):
            value = value.total_seconds()
        if value is None or value == 0:
            return None
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = -1.0
        if not seconds > 0:
            raise ImproperlyConfigured(
                f"result_expires must be a number of seconds or a timedelta, got {value!r}"
            )
        return seconds

    def use_store(self, url: str) -> None:
        """Make the app in this process use the store ``url`` (``pyrula worker -A proj
        --store URL``): the chains, callbacks and tasks its tasks queue go where the
        worker serves. The environment's ``CELERY_BROKER_URL`` would win over the
        setting, so it is set too; a result backend naming another server is dropped."""
        os.environ["CELERY_BROKER_URL"] = url
        self.app.conf.broker_url = url
        try:
            self.app.store_url()
        except ImproperlyConfigured:
            os.environ.pop("CELERY_RESULT_BACKEND", None)
            self.app.conf.result_backend = None

    async def on_start(self, store: Store) -> None:
        """This process serves: send ``worker_process_init``, sync the beat schedule,
        report queued tasks nobody here serves (each run also as ``task_unknown``), then
        send ``worker_ready`` (not in a ``pool_child``: its supervisor does, once)."""
        self.process_started = True
        signals.worker_process_init.send(sender=None)
        worker_signals.consumer = self
        await beat.sync_schedules(self.app, store)
        known = {d.name for d in self.definitions} | {REVOKED_TASK, SAVED_GROUP}
        queued = await store.list_runs(status=RunStatus.QUEUED, limit=1000)
        unknown = [
            r
            for r in queued
            if r.workflow not in known and not r.workflow.startswith(recorded.PREFIX)
        ]
        for name, count in sorted(Counter(r.workflow for r in unknown).items()):
            log.warning(
                "%d queued run(s) of unregistered task %r wait for a worker that knows it "
                "(check the task's module is imported: include=, autodiscover_tasks())",
                count,
                name,
            )
        for record in unknown:
            worker_signals.unknown(record.workflow, record.run_id)
        if not self.pool_child:
            self.ready()

    def start_steps(self) -> None:
        """Start the bootsteps (once): a step that fails to start raises BootstepError
        (naming it). A supervisor (prefork pool, recycling) calls it before its first
        child claims anything, as Celery's worker starts its blueprint first."""
        if self.bootsteps is not None and not self.steps_started:
            self.bootsteps.start()
            self.steps_started = True

    def ready(self) -> None:
        """Start the bootsteps if not started yet, then send ``worker_ready``: at the end
        of :meth:`on_start`, or in a supervisor once its first worker child serves."""
        self.start_steps()
        signals.worker_ready.send(sender=self)

    def on_stop(self, sig: str | None = None) -> None:
        """The process stops: the main process's shutdown signals (not in a
        ``pool_child``) around ``worker_process_shutdown`` (only where
        :meth:`on_start` ran: not in a supervisor).

        ``sig`` is the name of the signal that stopped the worker (``"SIGTERM"``,
        ``"SIGINT"``), sent as ``worker_shutting_down``'s ``sig`` with ``how="Warm"`` and
        the ``exitcode`` Celery's handler for it gives (0 for SIGTERM, 1 for SIGINT; the
        pyrula process itself exits 0 after either). ``"SIGTERM"`` only when the stop
        did not come from a signal (None: the worker failed, or a supervisor's first
        child could not start). A second signal exits at once, sending none of these."""
        if worker_signals.consumer is self:
            worker_signals.consumer = None
        main = not self.pool_child
        if main:
            sig = sig or "SIGTERM"
            signals.worker_shutting_down.send(
                sender=self.hostname, sig=sig, how="Warm", exitcode=WARM_EXIT_CODES.get(sig, 0)
            )
            if self.bootsteps is not None and self.steps_started:
                self.steps_started = False
                self.bootsteps.stop()
            if self.app.loader.worker_initialized:
                self.app.loader.shutdown_worker()
        if self.process_started:
            self.process_started = False
            signals.worker_process_shutdown.send(sender=None, pid=os.getpid(), exitcode=0)
        if main:
            signals.worker_shutdown.send(sender=self)

    def setup_logging(self, loglevel: str, logfile: str | None = None) -> None:
        """Set up this process's logging as Celery's worker does: ``app.log.setup``
        (a ``setup_logging`` receiver, else ``worker_log_format`` on the root logger and
        ``worker_task_log_format`` on the task loggers, each followed by its signal),
        then ``worker_redirect_stdouts``. ``PYRULA_LOG_FORMAT=json`` (``--log-format
        json``) formats every record as one JSON object instead. Each command sets it
        up for its process (again when a test invokes several in one process)."""
        conf = self.app.conf
        json_lines = os.environ.get(LOG_FORMAT_ENV, "").lower() == "json"
        self.app.log.already_setup = False
        handled = self.app.log.setup(
            loglevel, logfile, hostname=self.hostname,
            formatter=JsonFormatter() if json_lines else None,
        )  # fmt: skip
        if not handled and conf.worker_redirect_stdouts:
            self.app.log.redirect_task_output(conf.worker_redirect_stdouts_level)

    def describe(self) -> dict[str, Any]:
        return {"app": repr(self.app), "tasks": sorted(self.app.tasks.regular())}


class BeatService(AppWorker):
    """What ``pyrula beat -A proj`` does around its scheduler loop: the start-up of
    ``celery beat``. Like Celery's ``beat.Service`` it is the ``sender`` of
    ``beat_init``, with ``app``, ``max_interval``, ``scheduler_cls``,
    ``schedule_filename`` and ``stop()``."""

    def __init__(
        self,
        app: Celery,
        max_interval: float | None = None,
        schedule_filename: str | None = None,
        scheduler_cls: str | None = None,
    ) -> None:
        super().__init__(app)
        self.max_interval = max_interval
        self.schedule_filename = schedule_filename
        self.scheduler_cls = scheduler_cls
        self.on_stop_request: Callable[[], None] | None = None
        """Set by whoever runs the loop: what :meth:`stop` calls."""

    def prepare(self) -> list[str]:
        """Before the store opens, as ``celery beat`` starts: Django set up, the task
        modules imported (the runs fired carry their tasks' limits), the beat entries
        checked. No worker signal is sent."""
        app = self.app
        app.check_serializers()
        setup_django()
        imported = app.import_default_modules()
        signals.import_modules.send(sender=app)
        app.finalize()
        app.on_after_configure.send(sender=app, source=app.conf)
        beat.schedules_of(app)  # a bad entry fails here, before the loop
        return imported

    async def on_start(self, store: Store) -> None:
        """Sync the beat schedule, then send ``beat_init``."""
        await beat.sync_schedules(self.app, store)
        log.info("beat: Starting...")
        signals.beat_init.send(sender=self)

    def on_stop(self, sig: str | None = None) -> None:
        log.info("beat: Shutting down...")

    def stop(self, wait: bool = False) -> None:
        """Stop the scheduler loop (``wait`` is accepted; the loop stops at once)."""
        if self.on_stop_request is not None:
            self.on_stop_request()
