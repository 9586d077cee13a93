"""Celery's states from pyrula run records: what ``AsyncResult.state`` and ``.info`` read.

queued (or no such run) ``PENDING``; running, the state its worker last reported:
``STARTED`` when the task tracks it (``task_track_started``, off by default, as in
Celery), the custom state of ``update_state``, ``RETRY`` while an attempt after a retry
runs, else ``PENDING`` (so Celery's loop ``while result.status == "PENDING": sleep()``
ends when the task does); sleeping between attempts ``RETRY`` (``info`` is the exception
that caused the retry); failed but still calling its errbacks ``FAILURE`` (as Celery
stores it first); waiting (a chord gathering its header) likewise, ``PENDING`` unless a
state was reported; completed ``SUCCESS``; failed or dead ``FAILURE``; cancelled,
terminated or expired ``REVOKED``. The run itself (``pyrula runs``, a native handle)
reads ``running`` all along.
"""

from __future__ import annotations

import json
from typing import Any

from pyrula.workflows import RunRecord, RunStatus
from pyrula_compat import codec, errors, states
from pyrula_compat.exceptions import TaskRevokedError

EXPIRED_ERROR = "RunExpired"
EXPIRED_INFO = {"expired": True}
"""The progress info (with the state ``REVOKED``) of a task its worker revoked because
it expired: a retry due after the task's ``expires``, or a beat entry's run that started
too late. A run the store expired while queued carries a ``RunExpired`` error instead."""
SAVED_GROUP = "celery.group"
"""The name of the run ``GroupResult.save()`` leaves (cancelled at once: it only holds
the group's results, until ``result_expires`` purges it as any result)."""


def saved_group_id(group_id: str) -> str:
    """The run id ``GroupResult.save()`` keeps a group's results under."""
    return f"{group_id}:group"


REVOKED_TASK = "celery.revoked"
"""The name of the revoked run ``app.control.revoke`` leaves under an id no run has yet,
so that the task sent later with that id never runs (it reads REVOKED)."""


def state_of(record: RunRecord | None) -> str:
    """Celery's state for a run (None: an unknown id, which Celery reads as PENDING)."""
    if record is None:
        return states.PENDING
    status = record.status
    if status is RunStatus.QUEUED:
        return states.PENDING
    if status is RunStatus.RUNNING or status is RunStatus.WAITING:
        return record.progress_state or states.PENDING  # what the worker reported
    if status is RunStatus.SLEEPING:
        return states.RETRY
    if status is RunStatus.COMPLETED:
        return states.SUCCESS
    if status in (RunStatus.FAILED, RunStatus.DEAD):
        return states.FAILURE
    return states.REVOKED


def _revoked_error(record: RunRecord) -> TaskRevokedError:
    expired = bool(record.error and EXPIRED_ERROR in record.error) or (
        record.progress_state == states.REVOKED and decode(record.progress_info) == EXPIRED_INFO
    )
    return TaskRevokedError("expired" if expired else "revoked")


def info_of(record: RunRecord | None) -> Any:
    """Celery's ``result``/``info`` for a run."""
    if record is None or record.status is RunStatus.QUEUED:
        return None
    state = state_of(record)
    if state == states.SUCCESS:
        return codec.from_json(decode(record.result))
    if state == states.FAILURE and (record.error is not None or record.progress_info is None):
        return errors.from_json(record.error or "{}")[0]
    if state == states.REVOKED:
        return _revoked_error(record)
    if record.progress_info is not None and record.progress_state not in (None, states.STARTED):
        info = codec.from_json(decode(record.progress_info))
        if (
            record.progress_state in (states.RETRY, states.FAILURE)
            and isinstance(info, dict)
            and "error" in info
        ):  # waiting to retry, or failed and calling its errbacks
            return errors.from_json(info["error"])[0]
        return info
    return None


def decode(text: str | None) -> Any:
    return None if text is None else json.loads(text)
