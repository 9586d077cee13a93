"""pyrula_compat: Celery's API on pyrula's durable engine.

Rewrite ``celery`` to ``pyrula_compat`` in a project's imports, replace ``celery
worker`` with ``pyrula worker -A proj``, and retire the broker, the result backend and
the beat process: one store is queue, results and schedules, each task is a durable
workflow, and a worker that dies mid-task hands it to another. See
``docs/coming-from-celery.md`` for what maps to what, and what differs on purpose.
"""

from __future__ import annotations

from pyrula_compat import states
from pyrula_compat._state import current_app, current_task
from pyrula_compat.app import Celery, shared_task
from pyrula_compat.app.task import Task
from pyrula_compat.canvas import (
    Signature,
    chain,
    chord,
    chunks,
    group,
    maybe_signature,
    signature,
    subtask,
    xmap,
    xstarmap,
)
from pyrula_compat.utils import uuid

VERSION = (5, 7, 0)
__version__ = "5.7.0"
"""The Celery version whose API this mirrors."""


__all__ = [
    "VERSION",
    "Celery",
    "Signature",
    "Task",
    "__version__",
    "chain",
    "chord",
    "chunks",
    "current_app",
    "current_task",
    "group",
    "maybe_signature",
    "shared_task",
    "signature",
    "states",
    "subtask",
    "uuid",
    "xmap",
    "xstarmap",
]
