"""``task_annotations``: attributes set on tasks by name (or on every task, ``"*"``), as
Celery applies them when a task is bound to its app. The setting is a dict, an object
with ``annotate(task)`` (and ``annotate_any()`` for every task) returning a dict or
None, a dotted path to one, or a list of those; for each task the first that names it
applies, then the first ``"*"`` one. They win over the task's decorator options."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pyrula_compat.config import load_object

log = logging.getLogger("pyrula_compat")


def annotate(task: Any, setting: Any) -> None:
    """Set ``setting``'s annotations for ``task`` on it."""
    if not setting:
        return
    items = list(setting) if isinstance(setting, (list, tuple)) else [setting]
    items = [load_object(item) if isinstance(item, str) else item for item in items]
    for found in (_first(items, task, any_task=False), _first(items, task, any_task=True)):
        for key, value in (found or {}).items():
            if key.startswith("@"):
                log.warning("task annotation %r on %s ignored: no method wrapping", key, task.name)
                continue
            setattr(task, key, value)


def _first(items: list[Any], task: Any, *, any_task: bool) -> dict[str, Any] | None:
    for item in items:
        if isinstance(item, Mapping):
            found = item.get("*" if any_task else task.name)
        elif any_task:
            found = item.annotate_any() if hasattr(item, "annotate_any") else None
        else:
            found = item.annotate(task) if hasattr(item, "annotate") else None
        if found:
            return dict(found)
    return None
