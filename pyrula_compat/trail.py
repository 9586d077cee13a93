"""``AsyncResult.children``: the tasks a task sent while it ran, kept with its outcome.

As Celery's ``Task.add_trail``: a task sent from inside a task body on a worker
(``delay``, ``apply_async``, ``send_task``, a signature, a chain's first task, a group as
its ``GroupResult``, a chord as its header's) is appended to ``request.children``
(unless the task has ``trail=False`` or the call passed ``add_to_parent=False``). The
worker adds the tasks it sends for the attempt after the body returned (the ``link``
callbacks and the next step of the chain, which Celery also sends before it stores
the result) and journals their result tuples with the attempt's outcome; the last
attempt's list is the run's ``children``, read back from the store's journal.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyrula_compat import _state

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery
    from pyrula_compat.result import AsyncResult, GroupResult

_local = threading.local()
ATTEMPT = "attempt-"
"""The journal name prefix of a task's attempt steps (``flows``)."""


@contextlib.contextmanager
def suppressed() -> Iterator[None]:
    """Inside it, sending a task adds nothing to the running task's children (a group
    adds itself, not each member)."""
    before = getattr(_local, "off", False)
    _local.off = True
    try:
        yield
    finally:
        _local.off = before


def add(result: Any, add_to_parent: bool = True) -> None:
    """Append ``result`` to the children of the task running on a worker in this thread."""
    if not add_to_parent or getattr(_local, "off", False):
        return
    task = _state.get_current_worker_task()
    if task is None or not getattr(task, "trail", True):
        return
    request = task.request
    children = request.__dict__.get("children")
    if children is None:
        children = request.__dict__["children"] = []
    children.append(result)


def tuple_of(data: dict[str, Any]) -> Any:
    """The result tuple (``as_tuple()``) of a frozen signature's JSON dict: a task's
    id, a group's members, a chord's header, a chain's first step."""
    kind = data.get("subtask_type")
    kw = data.get("kwargs") or {}
    task_id = (data.get("options") or {}).get("task_id")
    if kind == "chain":
        steps = kw.get("tasks") or []
        return tuple_of(steps[0]) if steps else None
    if kind == "group":
        members = [tuple_of(m) for m in kw.get("tasks") or []]
        return [[task_id, None], [m for m in members if m is not None]]
    if kind == "chord":
        header = (kw.get("header") or {}).get("kwargs", {}).get("tasks", [])
        return [[task_id, None], [[[f"{task_id}.{2 * i}", None], None] for i in range(len(header))]]
    return [[task_id, None], None] if task_id else None


def outcome_children(
    request: Any, link: list[dict[str, Any]] | None, rest: list[dict[str, Any]] | None
) -> list[Any]:
    """The JSON children of an attempt: what its body sent, then its follow-ups."""
    children = [r.as_tuple() for r in request.__dict__.get("children") or ()]
    for data in [*(link or ()), *(rest or [])[:1]]:
        value = tuple_of(data)
        if value is not None:
            children.append(value)
    return children


def children_json(app: Celery, run_id: str) -> list[Any]:
    """The result tuples journaled with the run's last attempt ([] when none were)."""
    client = app.client()
    entries = client._call(client.store.load_journal(run_id))
    last = None
    for entry in entries:
        if entry.name.startswith(ATTEMPT) and entry.ok:
            last = entry
    if last is None:
        return []
    outcome = json.loads(last.value)
    children = outcome.get("children") if isinstance(outcome, dict) else None
    return list(children or ())


def children_of(app: Celery, run_id: str) -> list[AsyncResult | GroupResult]:
    """The run's children as results (``AsyncResult.children``)."""
    from pyrula_compat.result import result_from_tuple

    return [result_from_tuple(value, app) for value in children_json(app, run_id)]
