"""Small rules every store applies the same way, kept here so no backend spells them twice."""

from __future__ import annotations

from pyrula.workflows.errors import IdempotencyConflict
from pyrula.workflows.records import JournalEntry, NewRun, Outcome, RunRecord, RunStatus
from pyrula.workflows.serialization import ErrorInfo

FINISH_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


def idempotency_matches(existing: RunRecord, new: NewRun) -> bool:
    """A repeated key is the same request when workflow and params are equal.

    Params are compared as text (stores never parse payloads); clients encode params
    canonically (sorted keys), so equal params are equal text.
    """
    return existing.workflow == new.workflow and existing.params == new.params


def idempotency_conflict(key: str, existing: RunRecord, new: NewRun) -> IdempotencyConflict:
    taken = f"idempotency key {key!r} is taken by run {existing.run_id!r} of workflow "
    if existing.workflow != new.workflow:
        return IdempotencyConflict(
            f"{taken}{existing.workflow!r}; this submit is for workflow {new.workflow!r}: "
            "use a new key for a different request"
        )
    return IdempotencyConflict(
        f"{taken}{existing.workflow!r}, submitted with other params (params are compared "
        "as given, before the workflow's defaults fill in): resubmit the same params, or "
        "use a new key for a different request"
    )


def same_entry(a: JournalEntry, b: JournalEntry) -> bool:
    """Whether a repeated journal write is the one already recorded."""
    return (a.kind, a.name, a.ok, a.value) == (b.kind, b.name, b.ok, b.value)


MAX_TRACKED_ATTEMPTS = 1024
"""Backoff entries of the step at position ``p`` live at ``-(p * 1024 + attempt) - 1``."""


def backoff_position(position: int, attempt: int) -> int:
    """Where the backoff after ``attempt`` of the step at ``position`` is journaled."""
    return -(position * MAX_TRACKED_ATTEMPTS + min(attempt, MAX_TRACKED_ATTEMPTS - 1)) - 1


def backoff_range(position: int) -> tuple[int, int]:
    """The inclusive (low, high) journal positions of the step's backoff entries."""
    return backoff_position(position, MAX_TRACKED_ATTEMPTS - 1), backoff_position(position, 1)


def check_finish_outcome(outcome: Outcome, run_id: str, entry: JournalEntry | None) -> None:
    if outcome.status not in FINISH_STATUSES:
        raise ValueError(f"finish_run takes completed, failed or cancelled, not {outcome.status}")
    if entry is not None and entry.run_id != run_id:
        raise ValueError(f"finish_run of {run_id!r} got a journal entry of {entry.run_id!r}")


def dead_letter_error(run: RunRecord, max_recoveries: int) -> str:
    """The stored error of a run dead-lettered after too many recoveries."""
    return ErrorInfo(
        type_module="pyrula.workflows.errors",
        type_name="RunDeadLettered",
        message=(
            f"run {run.run_id!r} lost its worker {max_recoveries + 1} times "
            f"(max_recoveries={max_recoveries}); it was dead-lettered so the fleet does not "
            "crash-loop. Fix the cause, then `pyrula runs retry` it."
        ),
        traceback="",
    ).to_json()


def expired_error(run: RunRecord) -> str:
    """The stored error of a run that was still queued when it expired."""
    return ErrorInfo(
        type_module="pyrula.workflows.errors",
        type_name="RunExpired",
        message=f"run {run.run_id!r} expired before a worker started it",
        traceback="",
    ).to_json()


def is_expired(run: RunRecord, now: float) -> bool:
    return run.expires_at is not None and run.expires_at <= now
