"""pyrula_compat: Celery's API on pyrula's durable engine.

Rewrite ``celery`` to ``pyrula_compat`` in a project's imports, replace ``celery
worker`` with ``pyrula worker -A proj``, and retire the broker, the result backend and
the beat process: one store is queue, results and schedules, each task is a durable
workflow, and a worker that dies mid-task hands it to another. See
``docs/coming-from-celery.md`` for what maps to what, and what differs on purpose.
"""

from __future__ import annotations

from typing import NamedTuple

from pyrula_compat import local, states
from pyrula_compat._state import current_app, current_task
from pyrula_compat.app import Celery, bugreport, shared_task
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


class version_info_t(NamedTuple):
    major: int
    minor: int
    micro: int
    releaselevel: str
    serial: str


SERIES = "collider"
__version__ = "5.7.0"
"""The Celery version whose API this mirrors."""
VERSION = version_info = version_info_t(5, 7, 0, "", "")
VERSION_BANNER = f"{__version__} ({SERIES})"


__all__ = [
    "SERIES",
    "VERSION",
    "VERSION_BANNER",
    "Celery",
    "Signature",
    "Task",
    "__version__",
    "bugreport",
    "chain",
    "chord",
    "chunks",
    "current_app",
    "current_task",
    "group",
    "local",
    "maybe_signature",
    "shared_task",
    "signature",
    "states",
    "subtask",
    "uuid",
    "version_info",
    "version_info_t",
    "xmap",
    "xstarmap",
]
