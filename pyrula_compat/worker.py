"""Serving a Celery app with a pyrula worker: what ``pyrula worker -A proj`` does.

Before the worker starts it does what Celery's worker does at start-up: set Django up
and run its system checks when ``DJANGO_SETTINGS_MODULE`` is set (which imports the
URLconf and whatever it reaches), import the ``include``/``imports`` modules and the
autodiscovered task modules, refuse non-JSON serializers, and send the worker signals.
Once the store is open it syncs ``beat_schedule`` and says which queued tasks no worker
here knows (they stay queued, never dropped).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from typing import TYPE_CHECKING, Any

from pyrula.workflows import RunStatus, Store, WorkflowDefinition
from pyrula_compat import beat, signals

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery

log = logging.getLogger("pyrula_compat.worker")


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
    """Prepares a process to serve ``app`` and hooks the worker's start and stop."""

    def __init__(self, app: Celery, hostname: str | None = None) -> None:
        self.app = app
        self.hostname = hostname

    def prepare(self) -> list[str]:
        """Everything that happens before the store opens; returns the modules imported."""
        app = self.app
        signals.celeryd_init.send(sender=self.hostname, instance=self, conf=app.conf, options={})
        app.check_serializers()
        setup_django()
        imported = app.import_default_modules()
        signals.import_modules.send(sender=app)
        app.finalize()
        app.on_after_configure.send(sender=app, source=app.conf)
        beat.schedules_of(app)  # a bad entry fails here, before serving
        signals.worker_init.send(sender=self)
        signals.worker_process_init.send(sender=None)
        return imported

    @property
    def definitions(self) -> list[WorkflowDefinition]:
        return self.app.registry.all()

    def concurrency(self) -> int | None:
        value = self.app.conf.worker_concurrency
        return int(value) if value else None

    async def on_start(self, store: Store) -> None:
        """Sync the beat schedule and report queued tasks nobody here serves."""
        await beat.sync_schedules(self.app, store)
        known = {d.name for d in self.definitions}
        queued = await store.list_runs(status=RunStatus.QUEUED, limit=1000)
        unknown = Counter(r.workflow for r in queued if r.workflow not in known)
        for name, count in sorted(unknown.items()):
            log.warning(
                "%d queued run(s) of unregistered task %r wait for a worker that knows it "
                "(check the task's module is imported: include=, autodiscover_tasks())",
                count,
                name,
            )
        signals.worker_ready.send(sender=self)

    def on_stop(self) -> None:
        signals.worker_shutting_down.send(
            sender=self.hostname, sig="SIGTERM", how="warm", exitcode=0
        )
        signals.worker_process_shutdown.send(sender=None, pid=os.getpid(), exitcode=0)
        signals.worker_shutdown.send(sender=self)

    def setup_logging(self, loglevel: str) -> bool:
        """Let a ``setup_logging`` receiver configure logging (True if one did)."""
        if not signals.setup_logging.receivers:
            return False
        signals.setup_logging.send(
            sender=None, loglevel=loglevel, logfile=None, format=None, colorize=False
        )
        return True

    def describe(self) -> dict[str, Any]:
        return {"app": repr(self.app), "tasks": sorted(self.app.tasks.regular())}
