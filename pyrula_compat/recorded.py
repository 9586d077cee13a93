"""Recording an outcome under a task id without a worker running it: the eager result
``task_store_eager_result`` keeps, and ``app.backend.store_result``.

The outcome becomes a real ended run, so every reader (``AsyncResult(id)`` in any
process, ``get()``, ``result_expires``, ``forget()``) sees it as any task's: a run of
``celery.stored:<task name>`` is queued with the outcome in its params, claimed at once
and finished with that outcome (``completed`` with the value, ``failed`` with the
exception and its traceback, ``cancelled`` for ``REVOKED``). No worker serves that name,
so only such a claim takes it, and whoever claims one (two processes recording at
once) finishes it with its own params: every recorded run ends with its own outcome.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
from typing import TYPE_CHECKING, Any

from pyrula.workflows import InvalidRunState, RunNotFound, RunStatus
from pyrula.workflows.records import Outcome
from pyrula.workflows.serialization import ErrorInfo
from pyrula_compat import codec, states

if TYPE_CHECKING:
    from pyrula.workflows.sync import WorkflowClient
    from pyrula_compat.app.base import Celery

PREFIX = "celery.stored:"
"""Workflow name prefix of a recorded outcome; the rest is the task's name."""
CLAIMER = f"celery-stored@{socket.gethostname()}:{os.getpid()}"
LEASE_TTL = 30.0
ROUNDS = 20


def task_name(workflow: str) -> str | None:
    """The task name of a recorded outcome's run (None for any other run)."""
    return workflow[len(PREFIX) :] or None if workflow.startswith(PREFIX) else None


def outcome_json(state: str, value: Any, traceback: str | None = None) -> dict[str, Any]:
    """A Celery state and its result as the JSON a recorded run carries."""
    if state == states.SUCCESS:
        data = codec.to_json(value)
        try:
            json.dumps(data, allow_nan=False)
        except (TypeError, ValueError) as exc:
            error = TypeError(f"the result is not JSON serializable: {exc}")
            return outcome_json(states.FAILURE, error)
        return {"status": "completed", "result": data}
    if state == states.FAILURE:
        if not isinstance(value, BaseException):
            value = Exception(value)
        info = ErrorInfo.from_exception(value)
        if traceback:
            info = dataclasses.replace(info, traceback=traceback)
        return {"status": "failed", "error": info.to_json()}
    if state == states.REVOKED:
        return {"status": "cancelled"}
    raise ValueError(f"state {state!r}: only SUCCESS, FAILURE and REVOKED can be recorded")


def record(
    app: Celery,
    task_id: str,
    name: str | None,
    outcome: dict[str, Any],
    args: Any = (),
    kwargs: Any = None,
    replace: bool = False,
) -> None:
    """Record ``outcome`` (:func:`outcome_json`) as the ended run ``task_id``.

    An id whose run has ended is replaced when ``replace`` (Celery's store overwrites),
    else left as it is; an id whose run has not ended raises InvalidRunState."""
    client = app.client()
    workflow = f"{PREFIX}{name or ''}"
    params = {
        "args": codec.to_json(list(args or ())),
        "kwargs": codec.to_json(dict(kwargs or {})),
        "outcome": outcome,
    }
    for _ in range(3):
        existing = client.get_run(task_id)
        if existing is None:
            client.submit(workflow, params, run_id=task_id)
        elif existing.workflow == workflow and existing.status is RunStatus.QUEUED:
            pass  # submitted, not yet finished (by us, or by another recorder)
        elif not existing.is_terminal:
            raise InvalidRunState(f"task {task_id} has not ended: its worker records it")
        elif replace:
            with contextlib.suppress(RunNotFound, InvalidRunState):
                client.handle(existing.workflow, task_id).forget()
            continue
        else:
            return
        _finish_queued(client, workflow, task_id)
        return
    raise InvalidRunState(f"task {task_id}: its result changed meanwhile, record it again")


def _finish_queued(client: WorkflowClient, workflow: str, task_id: str) -> None:
    """Claim queued runs of ``workflow`` and finish each with its own outcome, until
    ``task_id`` has ended (another recorder may have claimed it: it finishes it)."""
    store = client.store
    for _ in range(ROUNDS):
        leases = client._call(store.claim_runs(CLAIMER, [workflow], 10, LEASE_TTL))
        for lease in leases:
            data = json.loads(lease.run.params).get("outcome") or {}
            outcome = Outcome(
                status=RunStatus(data.get("status", "cancelled")),
                result=json.dumps(data["result"]) if "result" in data else None,
                error=data.get("error"),
            )
            client._call(store.finish_run(lease.run_id, lease.token, outcome))
        if any(lease.run_id == task_id for lease in leases):
            return
        if not leases:
            client.wait_run(task_id, 5.0)
            return
