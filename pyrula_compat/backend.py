"""``app.backend``: Celery's result-backend calls, answered by the app's store.

The store is the result backend, so each call reads (or, for ``store_result`` and
``forget``, writes) the task's run. ``get_task_meta`` gives Celery's meta dict:
``status``, ``result`` (the value, the exception, or a custom state's meta),
``traceback``, ``children`` (result tuples), ``date_done`` (ISO 8601, as Celery's
key-value backends store it) and ``task_id``; an unknown or queued id gives
``{"status": "PENDING", "result": None}``, as in Celery. With ``result_extended`` it
also has ``name``, ``args``, ``kwargs``, ``worker``, ``retries`` and ``queue``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyrula.workflows.serialization import ErrorInfo
from pyrula_compat import codec, recorded, states, trail
from pyrula_compat._state import get_current_worker_task
from pyrula_compat.exceptions import TimeoutError
from pyrula_compat.runstate import info_of, state_of

if TYPE_CHECKING:
    from pyrula.workflows import RunRecord
    from pyrula_compat.app.base import Celery
    from pyrula_compat.result import AsyncResult, GroupResult


class Backend:
    """The result backend of ``app``: its store (no separate result server)."""

    supports_native_join = True
    supports_autoexpire = True
    persistent = True

    def __init__(self, app: Celery) -> None:
        self.app = app

    def __repr__(self) -> str:
        return f"<pyrula_compat.backend.Backend: {self.as_uri()}>"

    @property
    def url(self) -> str:
        return self.app.store_url() or self.app.client().store.url

    def as_uri(self, include_password: bool = False) -> str:
        """The store's URL (the password hidden unless ``include_password``)."""
        url = self.url
        if include_password or "@" not in url:
            return url
        scheme, rest = url.split("://", 1)
        return f"{scheme}://**@{rest.rsplit('@', 1)[1]}"

    @property
    def expires(self) -> Any:
        """``result_expires`` in seconds, as Celery's ``prepare_expires`` gives it (a
        timedelta setting included); None when results do not expire."""
        value = self.app.conf.result_expires
        return value.total_seconds() if isinstance(value, timedelta) else value

    def _result(self, task_id: str) -> AsyncResult:
        from pyrula_compat.result import AsyncResult

        return AsyncResult(str(task_id), app=self.app, backend=self)

    # -- reading -------------------------------------------------------------------------
    def get_task_meta(self, task_id: str, cache: bool = True) -> dict[str, Any]:
        """Celery's meta dict for the task (see the module doc)."""
        result = self._result(task_id)
        return self._meta(result, result._record())

    def _meta(self, result: AsyncResult, record: RunRecord | None) -> dict[str, Any]:
        state = state_of(record)
        if record is None or state == states.PENDING:
            return {"status": states.PENDING, "result": None}
        done = record.finished_at if record.is_terminal else None
        traceback = None
        if state == states.FAILURE and record.error:
            traceback = ErrorInfo.from_json(record.error).traceback
        meta: dict[str, Any] = {
            "status": state,
            "result": info_of(record),
            "traceback": traceback,
            "children": trail.children_json(self.app, result.id) if record.is_terminal else [],
            "date_done": (None if done is None else datetime.fromtimestamp(done, UTC).isoformat()),
            "task_id": result.id,
        }
        if self.app.conf.result_extended:
            result._cache = record if record.is_terminal else None  # no second read
            meta.update(
                name=result.name, args=result.args, kwargs=result.kwargs,
                worker=record.worker_id, retries=None, queue=None,
            )  # fmt: skip
        return meta

    def get_state(self, task_id: str) -> str:
        return self._result(task_id).state

    get_status = get_state

    def get_result(self, task_id: str) -> Any:
        """The task's result: its value, its exception, or a custom state's meta."""
        return self._result(task_id).result

    def get_traceback(self, task_id: str) -> str | None:
        return self._result(task_id).traceback

    def get_children(self, task_id: str) -> list[Any] | None:
        """The children's result tuples (None before the task ended)."""
        record = self._result(task_id)._record()
        if record is None or not record.is_terminal:
            return None
        return trail.children_json(self.app, str(task_id))

    def reload_task_result(self, task_id: str) -> None:
        """Nothing is cached between calls here."""

    # -- waiting -------------------------------------------------------------------------
    def wait_for(
        self,
        task_id: str,
        timeout: float | None = None,
        interval: float = 0.5,
        no_ack: bool = True,
        on_interval: Any = None,
    ) -> dict[str, Any]:
        """The task's meta once it is ready (waits on the store, no polling);
        :class:`TimeoutError` after ``timeout`` seconds."""
        result = self._result(task_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        record = result._wait(deadline, interval)
        if record is None:
            raise TimeoutError("The operation timed out.")
        return self._meta(result, record)

    def wait_for_pending(
        self,
        result: AsyncResult,
        timeout: float | None = None,
        interval: float = 0.5,
        no_ack: bool = True,
        on_message: Any = None,
        on_interval: Any = None,
        callback: Any = None,
        propagate: bool = True,
    ) -> Any:
        """``result``'s value once ready (its exception raised, if ``propagate``)."""
        value = result.get(
            timeout=timeout, propagate=propagate, interval=interval, on_message=on_message
        )
        if callback is not None:
            callback(result.id, value)
        return value

    # -- writing -------------------------------------------------------------------------
    def store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: str | None = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Store ``result`` with ``state`` for ``task_id``.

        From inside the running task, for its own id, a state that is not final is its
        progress (as ``update_state``). ``SUCCESS``, ``FAILURE`` (``result`` the
        exception) and ``REVOKED`` are recorded as the ended run of that id, replacing
        an ended one (as Celery overwrites); an id whose task is queued or running
        raises InvalidRunState: its worker records its outcome."""
        task_id = str(task_id)
        current = get_current_worker_task()
        if state not in states.READY_STATES:
            if current is None or current.request.id != task_id:
                raise ValueError(
                    f"store_result(state={state!r}): a state that is not final is stored "
                    "by the running task for its own id (as update_state), nowhere else"
                )
            current.update_state(task_id, state, result)
            return result
        if current is not None and current.request.id == task_id:
            raise ValueError("a running task's outcome is what its body returns or raises")
        name = getattr(request, "task", None) if request is not None else None
        args = getattr(request, "args", None) if request is not None else None
        kw = getattr(request, "kwargs", None) if request is not None else None
        outcome = recorded.outcome_json(state, result, traceback)
        recorded.record(self.app, task_id, name, outcome, args or (), kw or {}, replace=True)
        return result

    def mark_as_done(self, task_id: str, result: Any, request: Any = None, **kwargs: Any) -> Any:
        return self.store_result(task_id, result, states.SUCCESS, request=request)

    def mark_as_failure(
        self, task_id: str, exc: BaseException, traceback: str | None = None,
        request: Any = None, **kwargs: Any,
    ) -> Any:  # fmt: skip
        return self.store_result(task_id, exc, states.FAILURE, traceback, request=request)

    def mark_as_revoked(
        self, task_id: str, reason: str = "", request: Any = None, **kw: Any
    ) -> Any:
        """Revoke the task (a queued or running one as ``revoke()``; an unknown id is
        remembered, so the task sent later with it never runs)."""
        self.app.control.revoke(str(task_id))

    def forget(self, task_id: str) -> None:
        """Delete the ended task's result; its state reads PENDING again."""
        self._result(task_id).forget()

    # -- groups ------------------------------------------------------------------------
    def save_group(self, group_id: str, result: GroupResult) -> GroupResult:
        result.id = group_id
        return result.save()

    def restore_group(self, group_id: str, cache: bool = True) -> GroupResult | None:
        from pyrula_compat.result import GroupResult

        return GroupResult.restore(group_id, app=self.app)

    def delete_group(self, group_id: str) -> None:
        from pyrula_compat.result import GroupResult

        GroupResult(group_id, [], app=self.app).delete()

    def cleanup(self) -> None:
        """Workers delete results older than ``result_expires`` themselves."""

    def encode(self, data: Any) -> Any:
        return codec.to_json(data)

    def decode(self, payload: Any) -> Any:
        return codec.from_json(payload)
