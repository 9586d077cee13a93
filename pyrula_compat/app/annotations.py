"""``task_annotations``: attributes set on tasks by name (or on every task, ``"*"``), as
Celery applies them when a task is bound to its app. The setting is a dict, an object
with ``annotate(task)`` (and ``annotate_any()`` for every task) returning a dict or
None, a dotted path to one, or a list of those; for each task the first that names it
applies, then the first ``"*"`` one. They win over the task's decorator options. A key
``"@method"`` wraps that method of the task's class (``{"@on_failure": wrap}`` sets
``on_failure = wrap(on_failure)``), as Celery's ``Task.add_around``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pyrula_compat.config import load_object

log = logging.getLogger("pyrula_compat")


class MapAnnotation(dict[str, Any]):
    """A ``task_annotations`` dict: task name (or ``"*"``) -> attributes."""

    def annotate_any(self) -> dict[str, Any] | None:
        found = self.get("*")
        return dict(found) if found is not None else None

    def annotate(self, task: Any) -> dict[str, Any] | None:
        found = self.get(task.name)
        return dict(found) if found is not None else None


def prepare(setting: Any) -> list[Any]:
    """``app.annotations``: the setting as a list, each dict a :class:`MapAnnotation`
    and each dotted path the object it names."""
    if not setting:
        return []
    items = list(setting) if isinstance(setting, (list, tuple)) else [setting]
    loaded = [load_object(item) if isinstance(item, str) else item for item in items]
    return [MapAnnotation(item) if isinstance(item, Mapping) else item for item in loaded]


def annotate(task: Any, setting: Any) -> None:
    """Set ``setting``'s annotations for ``task`` (a task, or a task class) on it."""
    if not setting:
        return
    items = prepare(setting)
    owner: Any = task if isinstance(task, type) else type(task)
    for found in (_first(items, task, any_task=False), _first(items, task, any_task=True)):
        for key, value in (found or {}).items():
            if key.startswith("@"):
                owner.add_around(key[1:], value)
            else:
                setattr(task, key, value)


def _first(items: list[Any], task: Any, *, any_task: bool) -> dict[str, Any] | None:
    for item in items:
        if isinstance(item, Mapping) and not isinstance(item, MapAnnotation):
            found = item.get("*" if any_task else task.name)
        elif any_task:
            found = item.annotate_any() if hasattr(item, "annotate_any") else None
        else:
            found = item.annotate(task) if hasattr(item, "annotate") else None
        if found:
            return dict(found)
    return None
