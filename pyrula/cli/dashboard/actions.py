"""What an operator does to a store from the dashboard, its JSON API or the CLI.

Each action checks what it acts on first and refuses with an :class:`ActionError` (a
message a person can act on, and the HTTP status to answer with) before anything
changes: an unknown run, a retry of a run that has not ended, a cancel of one that has,
params or a payload that is not JSON.

Each action that happens is recorded in the history of what it acted on, through the
store protocol's named cursors (``get_cursor`` / ``swap_cursor``, the compare-and-set
every store keeps atomically): the cursor ``pyrula.audit:run:<run id>`` (or
``...:schedule:<schedule id>``, ``...:queue:<name>`` for a purge) holds a JSON list of
the last :data:`AUDIT_KEEP` actions, each ``{"at", "action", "by", "detail"}``. The
run's page shows them next to its journal. A record is written after the action
succeeded; two operators acting at once both get recorded (the swap retries).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from pyrula.workflows import (
    InvalidParams,
    PayloadError,
    RunHandle,
    WorkflowClient,
)
from pyrula.workflows.engine.rerun import retry_run
from pyrula.workflows.errors import InvalidRunState, PyrulaError
from pyrula.workflows.purging import purge_queued
from pyrula.workflows.records import RETRYABLE_STATUSES, RunRecord, ScheduleRecord
from pyrula.workflows.registry import Registry, WorkflowDefinition
from pyrula.workflows.schedules import Schedule
from pyrula.workflows.stores.base import Store, events_of

AUDIT_KEEP = 200
"""Operator actions a run's (or a schedule's) history keeps, the newest."""
AUDIT_PREFIX = "pyrula.audit:"
SWAP_TRIES = 20
RUN_ACTIONS = ("retry", "cancel", "terminate")
BULK_ACTIONS = ("retry", "cancel")
SCHEDULE_ACTIONS = ("pause", "resume", "run-now", "delete")


class ActionError(Exception):
    """An action refused before it changed anything."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.CONFLICT) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def parse_json_text(text: str, what: str) -> Any:
    """``text`` as JSON; NaN and Infinity refused (the store would refuse them)."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not allowed")

    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError as exc:
        raise ActionError(f"{what} is not valid JSON: {exc}", HTTPStatus.BAD_REQUEST) from None


# -- history -----------------------------------------------------------------------------
def audit_cursor(kind: str, key: str) -> str:
    return f"{AUDIT_PREFIX}{kind}:{key}"


async def record_action(
    store: Store, kind: str, key: str, action: str, by: str, detail: Mapping[str, Any]
) -> None:
    """Append one action to ``kind:key``'s history (compare-and-set, retried)."""
    name = audit_cursor(kind, key)
    at = await store.now()
    cursors = events_of(store, "the dashboard's action history")
    for _ in range(SWAP_TRIES):
        current = await cursors.get_cursor(name)
        history = history_of(current)
        history.append({"at": at, "action": action, "by": by, "detail": dict(detail)})
        value = json.dumps(history[-AUDIT_KEEP:], separators=(",", ":"), allow_nan=False)
        if await cursors.swap_cursor(name, current, value):
            return
    raise PyrulaError(f"could not record {action} in {name}: it kept changing under us")


def history_of(text: str | None) -> list[dict[str, Any]]:
    """A history cursor's actions, oldest first (a value that is not one: none)."""
    if text is None:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return [a for a in value if isinstance(a, dict)] if isinstance(value, list) else []


async def history(store: Store, kind: str, key: str) -> list[dict[str, Any]]:
    cursors = events_of(store, "the dashboard's action history")
    return history_of(await cursors.get_cursor(audit_cursor(kind, key)))


# -- runs --------------------------------------------------------------------------------
async def existing_run(store: Store, run_id: str) -> RunRecord:
    run = await store.get_run(run_id)
    if run is None:
        raise ActionError(f"no run with id {run_id!r}", HTTPStatus.NOT_FOUND)
    return run


async def run_action(store: Store, run_id: str, action: str, by: str) -> RunRecord:
    """Retry, cancel or terminate one run."""
    if action not in RUN_ACTIONS:
        raise ActionError(
            f"unknown action {action!r}: use one of {', '.join(RUN_ACTIONS)}",
            HTTPStatus.BAD_REQUEST,
        )
    run = await existing_run(store, run_id)
    if action == "retry" and run.status not in RETRYABLE_STATUSES:
        raise ActionError(
            f"run {run_id} is {run.status.value}: only a run that ended failed, cancelled, "
            "terminated or dead can be retried; nothing changed"
        )
    if action != "retry" and run.is_terminal:
        raise ActionError(
            f"run {run_id} already ended ({run.status.value}): there is nothing to {action}; "
            "nothing changed"
        )
    try:
        if action == "retry":
            changed = await retry_run(store, run_id)
        elif action == "cancel":
            changed = await store.cancel_run(run_id)
        else:
            changed = await store.terminate_run(run_id)
    except InvalidRunState as exc:  # it moved between the look and the act
        raise ActionError(f"{exc}; nothing changed") from None
    await record_action(
        store, "run", run_id, action, by, {"from": run.status.value, "to": changed.status.value}
    )
    return changed


async def signal_run(store: Store, run_id: str, name: str, payload_text: str, by: str) -> RunRecord:
    """Send signal ``name`` with the JSON ``payload_text`` (empty: null)."""
    if not name.strip():
        raise ActionError("a signal needs a name", HTTPStatus.BAD_REQUEST)
    payload = (
        parse_json_text(payload_text, "the signal's payload") if payload_text.strip() else None
    )
    run = await existing_run(store, run_id)
    if run.is_terminal:
        raise ActionError(
            f"run {run_id} already ended ({run.status.value}): it takes no signals; nothing sent"
        )
    try:
        await RunHandle(store, run.workflow, run_id).signal(name, payload)
    except (InvalidRunState, PayloadError, InvalidParams) as exc:
        raise ActionError(f"{exc}; nothing sent") from None
    await record_action(store, "run", run_id, "signal", by, {"name": name, "payload": payload})
    return await existing_run(store, run_id)


def param_names(definition: WorkflowDefinition) -> list[str]:
    """The names a workflow function takes after its context."""
    taken = list(definition.signature.parameters.values())[1:]
    return [p.name for p in taken if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


async def submit_run(
    store: Store,
    registry: Registry,
    workflow: str,
    params_text: str,
    *,
    owner: str | None,
    idempotency_key: str | None,
    by: str,
) -> tuple[RunRecord, bool]:
    """Queue a run of ``workflow`` with the JSON object ``params_text``; checked against
    the workflow's signature and stamped with its flow control when its definition is
    imported, submitted by name alone otherwise."""
    if not workflow.strip():
        raise ActionError("give the workflow to run", HTTPStatus.BAD_REQUEST)
    params = parse_json_text(params_text or "{}", "params")
    if not isinstance(params, dict):
        raise ActionError("params must be a JSON object", HTTPStatus.BAD_REQUEST)
    client = WorkflowClient(store, registry=registry, require_registered=False)
    try:
        new = client.new_run(
            workflow, params, owner=owner or None, idempotency_key=idempotency_key or None
        )
    except (InvalidParams, PayloadError) as exc:
        raise ActionError(str(exc), HTTPStatus.BAD_REQUEST) from None
    run, created = await store.create_run(new)
    if created:
        await record_action(store, "run", run.run_id, "submit", by, {"params": params})
    return run, created


# -- schedules ---------------------------------------------------------------------------
async def schedule_action(
    store: Store, registry: Registry, schedule_id: str, action: str, by: str
) -> tuple[ScheduleRecord | None, RunRecord | None]:
    """Pause, resume, run now or delete a schedule; returns it (None once deleted) and
    the run ``run-now`` started."""
    if action not in SCHEDULE_ACTIONS:
        raise ActionError(
            f"unknown schedule action {action!r}: use one of {', '.join(SCHEDULE_ACTIONS)}",
            HTTPStatus.BAD_REQUEST,
        )
    current = await store.get_schedule(schedule_id)
    if current is None:
        raise ActionError(f"no schedule with id {schedule_id!r}", HTTPStatus.NOT_FOUND)
    started: RunRecord | None = None
    result: ScheduleRecord | None
    if action == "pause":
        result = await store.update_schedule(schedule_id, enabled=False)
    elif action == "resume":
        # no backfill of the paused time: fire from the next slot, as `schedules resume`
        upcoming = Schedule.from_record(current).next_slot_after(await store.now())
        result = await store.update_schedule(schedule_id, enabled=True, next_fire_at=upcoming)
    elif action == "delete":
        await store.delete_schedule(schedule_id)
        result = None
    else:
        client = WorkflowClient(store, registry=registry, require_registered=False)
        params = json.loads(current.params)
        new = client.new_run(current.workflow, params, owner=current.owner)
        started, _ = await store.create_run(new)
        result = current
        await record_action(
            store, "run", started.run_id, "run-now", by, {"schedule_id": schedule_id}
        )
    detail: dict[str, Any] = {"run_id": started.run_id} if started else {}
    await record_action(store, "schedule", schedule_id, action, by, detail)
    return result, started


# -- queues ----------------------------------------------------------------------------
async def purge_queue(store: Store, queue: str, by: str) -> int:
    """Cancel every run of ``queue`` (a workflow) that waits to start, as ``pyrula purge``
    does; returns how many. Recorded in the queue's history."""
    if not queue:
        raise ActionError("give the queue to purge", HTTPStatus.BAD_REQUEST)
    purged = await purge_queued(store, [queue])
    await record_action(store, "queue", queue, "purge", by, {"cancelled": purged})
    return purged


# -- bulk --------------------------------------------------------------------------------
@dataclass
class BulkProgress:
    """A bulk action's progress: how many it selected, did, skipped and why."""

    action: str
    selected: int = 0
    done: int = 0
    skipped: int = 0
    failed: int = 0
    finished: bool = False
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "selected": self.selected,
            "done": self.done,
            "skipped": self.skipped,
            "failed": self.failed,
            "finished": self.finished,
            "last_error": self.last_error,
            "percent": (
                100.0
                if self.selected == 0
                else math.floor(100 * (self.done + self.skipped + self.failed) / self.selected)
            ),
        }


async def bulk_action(
    store: Store, runs: list[RunRecord], action: str, by: str, progress: BulkProgress
) -> BulkProgress:
    """Retry or cancel each of ``runs``; a run the action does not fit (a retry of a
    run that has not ended, a cancel of one that has) is skipped, not an error."""
    if action not in BULK_ACTIONS:
        raise ActionError(
            f"bulk action {action!r}: use one of {', '.join(BULK_ACTIONS)}",
            HTTPStatus.BAD_REQUEST,
        )
    progress.selected = len(runs)
    for run in runs:
        try:
            await run_action(store, run.run_id, action, by)
            progress.done += 1
        except ActionError:
            progress.skipped += 1
        except PyrulaError as exc:
            progress.failed += 1
            progress.last_error = str(exc)
    progress.finished = True
    return progress
