"""``EagerResult`` (a task run here) and ``GroupResult`` (a group's members, in order)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyrula.workflows import InvalidRunState, RunNotFound
from pyrula.workflows.errors import IdempotencyConflict
from pyrula_compat import codec, states
from pyrula_compat._state import get_current_app
from pyrula_compat.result import AsyncResult, ResultBase
from pyrula_compat.runstate import SAVED_GROUP, saved_group_id

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery


class EagerResult(AsyncResult):
    """The result of a task run in this process (``apply()``, eager mode)."""

    def __init__(
        self,
        id: str,
        ret_value: Any,
        state: str,
        traceback: str | None = None,
        name: str | None = None,
        app: Celery | None = None,
    ) -> None:
        super().__init__(id, task_name=name, app=app)
        self._result = ret_value
        self._state = state
        self._traceback = traceback

    @property
    def state(self) -> str:
        return self._state

    status = state

    @property
    def result(self) -> Any:
        return self._result

    info = result

    @property
    def traceback(self) -> str | None:
        return self._traceback

    def ready(self) -> bool:
        return True

    def exists(self) -> bool:
        return True

    @property
    def children(self) -> list[Any] | None:
        return None  # as Celery's: an eager task's meta has none

    def get(  # type: ignore[override]
        self, timeout: float | None = None, propagate: bool = True, **kwargs: Any
    ) -> Any:
        if self._state == states.SUCCESS:
            return self._result
        if self._state in states.PROPAGATE_STATES and propagate:
            raise self._result
        return self._result

    wait = get

    def maybe_throw(self, propagate: bool = True, callback: Any = None) -> Any:
        """Raise the task's exception if it failed (``propagate``); else its result."""
        if propagate and self._state in states.PROPAGATE_STATES:
            raise self._result
        if callback is not None:
            callback(self.id, self._result)
        return self._result

    maybe_reraise = maybe_throw

    def forget(self) -> None:
        pass

    def revoke(self, *args: Any, **kwargs: Any) -> None:
        self._state = states.REVOKED


class ResultSet(ResultBase):
    """Results waited on together, in order (Celery's ``ResultSet(results)``)."""

    def __init__(
        self, results: Sequence[AsyncResult] | None = None, app: Celery | None = None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        self.results = list(results or [])
        self._app = app

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: [{', '.join(r.id for r in self.results)}]>"

    @property
    def app(self) -> Celery:
        return self._app if self._app is not None else get_current_app()

    @app.setter
    def app(self, value: Celery) -> None:
        self._app = value

    @property
    def backend(self) -> Any:
        """The app's result backend (:class:`~pyrula_compat.backend.Backend`): the store."""
        return self.app.backend

    def __iter__(self) -> Iterator[AsyncResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, index: int) -> AsyncResult:
        return self.results[index]

    def add(self, result: AsyncResult) -> None:
        """Add ``result`` unless it is in the set already."""
        if result not in self.results:
            self.results.append(result)

    def remove(self, result: AsyncResult | str) -> None:
        """Remove ``result`` (or the result of that id); KeyError if it is not there."""
        if isinstance(result, str):
            result = AsyncResult(result, app=self.app)
        try:
            self.results.remove(result)
        except ValueError:
            raise KeyError(result) from None

    def discard(self, result: AsyncResult | str) -> None:
        """Remove ``result`` if it is there."""
        with contextlib.suppress(KeyError):
            self.remove(result)

    def update(self, results: Sequence[AsyncResult]) -> None:
        """Add each of ``results`` not in the set already."""
        self.results.extend(r for r in results if r not in self.results)

    def clear(self) -> None:
        self.results.clear()

    @property
    def children(self) -> list[AsyncResult]:
        return self.results

    def ready(self) -> bool:
        return all(r.ready() for r in self.results)

    def successful(self) -> bool:
        return all(r.successful() for r in self.results)

    def failed(self) -> bool:
        return any(r.failed() for r in self.results)

    def waiting(self) -> bool:
        return not self.ready()

    def completed_count(self) -> int:
        """How many members succeeded."""
        return sum(1 for r in self.results if r.successful())

    def get(
        self,
        timeout: float | None = None,
        propagate: bool = True,
        interval: float = 0.5,
        callback: Any = None,
        disable_sync_subtasks: bool = True,
        **kwargs: Any,
    ) -> list[Any]:
        """The members' values in order; the first failure is raised (``propagate``),
        or left in the list as its exception (``propagate=False``). With ``callback``,
        each member's ``callback(task_id, value)`` is called instead, in order, and the
        list is empty (Celery's ``join``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        values: list[Any] = []
        for member in self.results:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            value = member.get(
                timeout=remaining,
                propagate=propagate,
                interval=interval,
                disable_sync_subtasks=disable_sync_subtasks,
                follow_parents=False,
            )
            if callback is not None:
                callback(member.id, value)
            else:
                values.append(value)
        return values

    join = get
    join_native = get

    def iter_native(
        self, timeout: float | None = None, interval: float = 0.5, no_ack: bool = True,
        on_message: Any = None, on_interval: Any = None,
    ) -> Iterator[tuple[str, dict[str, Any]]]:  # fmt: skip
        """``(task_id, meta)`` for each member as it is waited for, in order, where meta
        is Celery's ``{"task_id", "status", "result", "traceback", "children"}``; a
        failure is in it, not raised. ``timeout`` covers them all (TimeoutError)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for member in self.results:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            value = member.get(timeout=remaining, propagate=False, follow_parents=False)
            meta = {
                "task_id": member.id, "status": member.state, "result": value,
                "traceback": member.traceback, "children": member.children,
            }  # fmt: skip
            if on_message is not None:
                on_message(meta)
            yield member.id, meta

    def maybe_throw(self, callback: Any = None, propagate: bool = True) -> None:
        """Each member's :meth:`AsyncResult.maybe_throw`, in order (does not wait)."""
        for member in self.results:
            member.maybe_throw(callback=callback, propagate=propagate)

    maybe_reraise = maybe_throw

    def revoke(self, connection: Any = None, terminate: bool = False, **kwargs: Any) -> None:
        for member in self.results:
            member.revoke(terminate=terminate)

    def forget(self) -> None:
        for member in self.results:
            member.forget()


class GroupResult(ResultSet):
    """The results of a group, in the group's order."""

    def __init__(
        self,
        id: str | None = None,
        results: Sequence[AsyncResult] | None = None,
        parent: Any = None,
        app: Celery | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(results, app=app)
        self.id = id
        self.parent = parent

    def __repr__(self) -> str:
        return f"<GroupResult: {self.id} [{', '.join(r.id for r in self.results)}]>"

    def save(self, backend: Any = None) -> GroupResult:
        """Keep the group's results in the store under its id, for :meth:`restore` in
        any process (until ``result_expires``, as a result). Saving again replaces them."""
        client = self._client()
        key = saved_group_id(self.id or "")
        params = {"group": codec.to_json(self.as_tuple())}
        for _ in range(3):
            try:
                created = client.submit(SAVED_GROUP, params, run_id=key, idempotency_key=key)
            except (IdempotencyConflict, InvalidRunState):
                with contextlib.suppress(RunNotFound, InvalidRunState):
                    client.handle(SAVED_GROUP, key).forget()  # replaced, as Celery's
                continue
            with contextlib.suppress(InvalidRunState):  # nothing runs it
                created.cancel()
            return self
        raise InvalidRunState(f"GroupResult {self.id}: could not save it, retry")

    def delete(self, backend: Any = None) -> None:
        """Forget what :meth:`save` kept."""
        with contextlib.suppress(RunNotFound, InvalidRunState):
            self._client().handle(SAVED_GROUP, saved_group_id(self.id or "")).forget()

    @classmethod
    def restore(cls, id: str, backend: Any = None, app: Celery | None = None) -> GroupResult | None:
        """The group :meth:`save` kept under ``id`` (None if none was, or it expired)."""
        app = app if app is not None else get_current_app()
        record = app.client().get_run(saved_group_id(id))
        if record is None or record.workflow != SAVED_GROUP:
            return None
        restored = result_from_tuple(codec.from_json(json.loads(record.params)["group"]), app)
        return restored if isinstance(restored, GroupResult) else None

    def _client(self) -> Any:
        return self.app.client()

    def as_tuple(self) -> tuple[Any, ...]:
        return ((self.id, None), [r.as_tuple() for r in self.results])


def result_from_tuple(value: Any, app: Celery | None = None) -> AsyncResult | GroupResult:
    """Rebuild a result from :meth:`AsyncResult.as_tuple`."""
    (task_id, parent), nodes = value
    if nodes is not None:
        return GroupResult(task_id, [result_from_tuple(n, app) for n in nodes], app=app)  # type: ignore[misc]
    parent_result = result_from_tuple(parent, app) if parent is not None else None
    return AsyncResult(task_id, app=app, parent=parent_result)
