"""``task_revoked`` for a task revoked before any worker took it, sent by a worker.

In Celery every worker hears the revoke and the one that receives the task's message
discards it and sends ``task_revoked(request, terminated=False, signum=None,
expired=False)``. In pyrula the revoke ends a queued (or delayed, or waiting to retry)
run in the store at once, so no worker would ever see it: the revoke therefore also
queues a run of ``celery.revoked_notice`` (id ``<task id>:revoked``, once per task),
which a worker of the app claims as it claims tasks, and which sends the signal there,
with the revoked task as sender and a request carrying its id, args and kwargs. The
same happens when a task is sent under an id revoked before it was sent.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from pyrula.workflows import RunRecord, RunStatus, WorkflowContext, WorkflowDefinition, workflow
from pyrula.workflows.errors import IdempotencyConflict, InvalidRunState
from pyrula_compat import recorded, worker_signals
from pyrula_compat.runstate import REVOKED_TASK, SAVED_GROUP

if TYPE_CHECKING:
    from pyrula.workflows.registry import Registry
    from pyrula.workflows.sync import WorkflowClient
    from pyrula_compat.app.base import Celery

log = logging.getLogger("pyrula_compat")

NOTICE = "celery.revoked_notice"
INTERNAL = frozenset(
    {REVOKED_TASK, SAVED_GROUP, NOTICE, "celery.chord", "celery.chain", "celery.replaced"}
)
"""Runs that are not a task a project defined: no notice for them."""


def notice_id(task_id: str) -> str:
    return f"{task_id}:revoked"


def after_revoke(client: WorkflowClient, record: RunRecord) -> None:
    """Queue the notice for ``record``, a run a revoke ended before a worker held it."""
    if record.status is not RunStatus.CANCELLED and record.status is not RunStatus.TERMINATED:
        return
    send(client, record.workflow, record.run_id, json.loads(record.params or "{}"))


def send(client: WorkflowClient, name: str, task_id: str, params: dict[str, Any]) -> None:
    """Queue the notice that task ``name`` (``params`` as it was sent) was revoked."""
    if name in INTERNAL or name.startswith(recorded.PREFIX):
        return
    key = notice_id(task_id)
    data = {"task": name, "id": task_id, "params": params}
    try:
        client.submit(NOTICE, data, run_id=key, idempotency_key=key)
    except (IdempotencyConflict, InvalidRunState):
        pass  # noticed already (revoked twice)
    except Exception as exc:  # the revoke holds all the same: only the signal is lost
        log.warning(
            "task %s[%s]: revoked, but its task_revoked notice failed: %r", name, task_id, exc
        )


def make_notice_workflow(app: Celery, registry: Registry) -> WorkflowDefinition:
    """The workflow that sends ``task_revoked`` in the worker that claims a notice."""

    async def celery_revoked_notice(
        ctx: WorkflowContext, task: str, id: str, params: dict[str, Any] | None = None
    ) -> None:
        await ctx.step("task_revoked", _fire, app, task, id, params or {})

    definition: WorkflowDefinition = workflow(name=NOTICE, registry=registry)(celery_revoked_notice)
    return definition


def _fire(app: Celery, name: str, task_id: str, params: dict[str, Any]) -> None:
    worker_signals.revoked_as_sent(app, name, task_id, params)
