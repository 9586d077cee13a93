"""``celery.app``'s helpers for the current app and task: ``app_or_default``, its
tracing switch, and ``push_current_task``/``pop_current_task``.

``app_or_default(app)`` is ``app``, or the current app when ``app`` is ``None``. With
tracing on (``enable_trace()``, or ``CELERY_TRACE_APP`` set in the environment, as in
Celery), each fallback to the current app logs the caller's stack at WARNING on the
``celery.app.trace`` logger, which finds code that forgot to pass its app. Celery's
trace raises in the main process instead; logging keeps a traced program running.
"""

from __future__ import annotations

import logging
import os
import traceback
from typing import TYPE_CHECKING

from pyrula_compat._state import get_current_app, get_current_task, pop_task, push_task

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery
    from pyrula_compat.app.task import Task

log = logging.getLogger("celery.app.trace")

_tracing = {"on": bool(os.environ.get("CELERY_TRACE_APP"))}


def app_or_default(app: Celery | None = None) -> Celery:
    """``app``, or the current app (a default one if none was created)."""
    if app is not None:
        return app
    if _tracing["on"]:
        log.warning("-- RETURNING TO CURRENT APP --\n%s", "".join(traceback.format_stack()[:-1]))
    return get_current_app()


def enable_trace() -> None:
    """Log the stack of every ``app_or_default()`` that falls back to the current app."""
    _tracing["on"] = True


def disable_trace() -> None:
    """Stop logging those fallbacks."""
    _tracing["on"] = False


def push_current_task(task: Task) -> None:
    """Make ``task`` the current task of this thread (``current_task``)."""
    push_task(task)


def pop_current_task() -> Task | None:
    """Remove this thread's current task and return it (``None`` if there was none)."""
    task = get_current_task()
    pop_task()
    return task
