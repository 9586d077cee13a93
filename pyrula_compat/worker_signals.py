"""The worker-side task signals Celery sends outside an attempt's own run:
``task_received``, ``task_revoked`` and ``task_unknown``.

* ``task_received(sender=consumer, request=Request)``: a worker took the task and is
  about to run an attempt of it (each attempt: a retry is a new message in Celery).
  ``request`` is the worker's view of the task (Celery's ``celery.worker.request.Request``
  fields: ``id``, ``name``, ``task`` the Task, ``args``, ``kwargs``, ``eta``, ...).
* ``task_revoked(sender=task, request=Context, terminated, signum, expired)``: the
  worker running the task noticed it was revoked (at a step boundary), terminated (its
  lease taken away) or, for a beat entry's ``expires``, that it started too late. A task
  revoked while queued, delayed or waiting to retry gets it from the worker that claims
  its notice (:mod:`pyrula_compat.notices`). One that expired while queued gets it,
  with ``expired=True``, from the worker whose claim found it expired and ended it
  (:func:`expired_hook`, the task workflow's ``on_expired``), once, as Celery's worker
  that receives an expired message sends it.
* ``task_unknown(sender=consumer, name, id, message=None, exc=NotRegistered)``: a worker
  found a queued task of a name it does not serve (it stays queued, never discarded).

The consumer (``sender``) is the :class:`~pyrula_compat.worker.AppWorker` serving the
app in this process (``.app``, ``.hostname``), or None outside ``pyrula worker -A``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from pyrula.workflows import RunStatus
from pyrula_compat import codec
from pyrula_compat.app.task import Context
from pyrula_compat.signals import task_received, task_revoked, task_unknown

if TYPE_CHECKING:
    from pyrula.workflows import RunRecord, WorkflowContext
    from pyrula.workflows.registry import ExpiredHook
    from pyrula_compat.app.base import Celery
    from pyrula_compat.app.task import Task

log = logging.getLogger("pyrula_compat.worker")

consumer: Any = None
"""The AppWorker serving in this process (set when ``pyrula worker -A`` starts)."""


class Request:
    """What ``task_received`` gets: the worker's view of a task, with the fields of
    Celery's worker ``Request`` (``task`` is the Task here; ``task_name`` its name)."""

    def __init__(self, task: Task, context: Context) -> None:
        self.task = task
        self.name = self.task_name = task.name
        self.id = self.task_id = context.id
        self._context = context

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._context, name)

    @property
    def request_dict(self) -> dict[str, Any]:
        fields = ("id", "args", "kwargs", "eta", "expires", "retries", "root_id", "parent_id")
        return {"task": self.name, **{key: getattr(self._context, key) for key in fields}}

    def __repr__(self) -> str:
        return f"<Request: {self.name}[{self.id}]>"


def received(task: Task, request: Context) -> None:
    """``task_received`` for an attempt about to run (nothing built without receivers)."""
    if task_received.has_listeners(consumer):
        task_received.send(sender=consumer, request=Request(task, request))


def revoked(
    app: Celery,
    name: str,
    run_id: str,
    meta: dict[str, Any],
    *,
    terminated: bool = False,
    expired: bool = False,
    args: Any = None,
    kwargs: Any = None,
) -> None:
    """``task_revoked`` for the task ``name`` this worker was running (or would have
    run: :mod:`pyrula_compat.notices`)."""
    task = app.tasks.get(name)
    if task is None or not task_revoked.has_listeners(task):
        return
    request = Context(
        id=run_id, task=name, root_id=meta.get("root_id") or run_id,
        parent_id=meta.get("parent_id"), eta=meta.get("eta"), expires=meta.get("expires"),
        called_directly=False, args=args, kwargs=kwargs,
    )  # fmt: skip
    task_revoked.send(
        sender=task, request=request, terminated=terminated, signum=None, expired=expired
    )


def revoked_as_sent(
    app: Celery, name: str, task_id: str, params: dict[str, Any], *, expired: bool = False
) -> None:
    """``task_revoked`` for task ``name`` that no worker ran, from ``params`` as it was
    sent (its workflow's params): the request carries its ids, ``eta``, ``expires``,
    ``args`` and ``kwargs``."""
    headers = codec.from_json(params.get("headers")) or {}
    meta = {
        "root_id": params.get("root_id"), "parent_id": params.get("parent_id"),
        "eta": headers.get("eta"), "expires": headers.get("expires"),
    }  # fmt: skip
    revoked(
        app, name, task_id, meta, expired=expired,
        args=codec.from_json(params.get("args") or []),
        kwargs=codec.from_json(params.get("kwargs") or {}),
    )  # fmt: skip


def expired_hook(app: Celery, name: str) -> ExpiredHook:
    """The ``on_expired`` of task ``name``'s workflow: ``task_revoked(request,
    terminated=False, signum=None, expired=True)`` in the worker whose claim found the
    task still queued past its ``expires`` (and ended it, ``REVOKED``), in a thread of
    its own (receivers may block), once per task."""

    async def on_expired(run: RunRecord) -> None:
        task = app.tasks.get(name)
        if task is None or not task_revoked.has_listeners(task):
            return
        params = json.loads(run.params or "{}")
        await asyncio.to_thread(revoked_as_sent, app, name, run.run_id, params, expired=True)

    return on_expired


def lease_lost(ctx: WorkflowContext) -> bool:
    """Whether this worker lost the run's lease (terminated, or reclaimed after a stall),
    rather than stopping it itself (shutdown)."""
    return ctx.lease_lost


async def revoked_if_terminated(app: Celery, name: str, run_id: str, meta: dict[str, Any]) -> None:
    """``task_revoked(terminated=True)`` if the run was terminated (not merely taken over
    by another worker after this one stalled): one read of the record, on this rare path."""
    task = app.tasks.get(name)
    if task is None or not task_revoked.has_listeners(task):
        return
    try:
        record = await asyncio.to_thread(app.client().get_run, run_id)
    except Exception as exc:  # the store is away: say nothing rather than guess
        log.warning("task %s[%s]: lease lost, state unknown: %r", name, run_id, exc)
        return
    if record is not None and record.status is RunStatus.TERMINATED:
        revoked(app, name, run_id, meta, terminated=True)


def unknown(name: str, run_id: str) -> None:
    """``task_unknown`` for a queued run of a task name this worker does not serve."""
    if not task_unknown.has_listeners(consumer):
        return
    from pyrula_compat.exceptions import NotRegistered

    task_unknown.send(sender=consumer, name=name, id=run_id, message=None, exc=NotRegistered(name))
