"""``celery.contrib.abortable``: tasks that stop cooperatively when asked.

``AbortableAsyncResult(id).abort()`` asks the task to stop: a durable cancel request in
the store (``revoke()`` without ``terminate``). The task's body checks
``self.is_aborted()`` now and then and returns early when it is true; what it returns
is its result, as in Celery (which shows ``ABORTED`` only until then). A task queued
when aborted never runs (``REVOKED``).
"""

from __future__ import annotations

from typing import Any

from pyrula.workflows import RunStatus
from pyrula_compat.app.task import Task
from pyrula_compat.result import AsyncResult

ABORTED = "ABORTED"


class AbortableAsyncResult(AsyncResult):
    """An ``AsyncResult`` that can ask its task to stop."""

    def is_aborted(self) -> bool:
        """Whether the task was asked to stop (or stopped, or was revoked)."""
        record = self._record()
        if record is None:
            return False
        return record.cancel_requested or record.status in (
            RunStatus.CANCELLED,
            RunStatus.TERMINATED,
        )

    def abort(self) -> None:
        """Ask the task to stop: it sees ``is_aborted()`` true from now on."""
        self.app.control.revoke(self.id)


class AbortableTask(Task):
    """A task that can check, while it runs, whether it was aborted."""

    abstract = True

    def AsyncResult(self, task_id: str, **kwargs: Any) -> AbortableAsyncResult:
        return AbortableAsyncResult(task_id, task_name=self.name, app=self.app)

    def is_aborted(self, **kwargs: Any) -> bool:
        """Whether this task (``task_id=`` another one) was asked to stop."""
        task_id = kwargs.get("task_id", self.request.id)
        if not task_id or self.request.is_eager:
            return False
        return self.AsyncResult(task_id).is_aborted()


__all__ = ["ABORTED", "AbortableAsyncResult", "AbortableTask"]
