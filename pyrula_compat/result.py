"""``AsyncResult``, ``GroupResult`` and ``EagerResult`` (``celery.result``) on pyrula runs.

A task id is a run id. States map from the run's status: queued (or no such run)
``PENDING``; running ``PENDING`` as in Celery, ``STARTED`` with ``task_track_started``
(or the custom state ``update_state`` reported); sleeping between attempts ``RETRY``;
completed ``SUCCESS``; failed or dead ``FAILURE``; cancelled, terminated or expired
``REVOKED``. ``get()`` waits on the store (no polling) and re-raises the task's own
exception class with its message.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pyrula.workflows import (
    InvalidRunState,
    RunNotFound,
    RunRecord,
    RunStatus,
)
from pyrula.workflows.serialization import ErrorInfo
from pyrula_compat import codec, recorded, states, store, trail
from pyrula_compat._state import get_current_app, get_current_worker_task
from pyrula_compat.exceptions import IncompleteStream, TimeoutError
from pyrula_compat.migrate.results import legacy_record
from pyrula_compat.runstate import REVOKED_TASK, decode, info_of, state_of

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery

_joins = threading.local()


@contextlib.contextmanager
def _joins_allowed(allowed: bool) -> Iterator[None]:
    before = getattr(_joins, "allowed", False)
    _joins.allowed = allowed
    try:
        yield
    finally:
        _joins.allowed = before


def allow_join_result() -> contextlib.AbstractContextManager[None]:
    """Inside it, ``get()`` may wait from within a task (in this thread), as Celery's
    ``allow_join_result`` allows: the task keeps its worker slot while it waits."""
    return _joins_allowed(True)


def denied_join_result() -> contextlib.AbstractContextManager[None]:
    """The opposite of :func:`allow_join_result`, for a block inside one."""
    return _joins_allowed(False)


class Unsupported:
    """A Celery result attribute pyrula does not provide: reading it raises
    AttributeError naming the Celery feature and what to use instead (so ``hasattr`` is
    False, as for any missing attribute, and the message says why)."""

    def __init__(self, feature: str, instead: str) -> None:
        self.feature = feature
        self.instead = instead
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        cls = type(obj) if obj is not None else owner
        where = f"{cls.__name__ if cls is not None else 'result'}.{self.name}"
        raise AttributeError(
            f"{where} ({self.feature}) is not provided by pyrula_compat: {self.instead}"
        )


class ResultBase:
    """Base of the result classes."""

    parent: Any = None
    TimeoutError = TimeoutError
    """Celery's: the error ``get(timeout=...)`` raises."""

    @property
    def supports_native_join(self) -> bool:
        """True: waiting sleeps until the store says a run ended (no polling)."""
        return True

    then = Unsupported(
        "a vine promise fired while Celery's result consumer drains events",
        "pass link= (or link_error=) when calling the task: the callback then runs on a "
        "worker, durably; or call get() in a thread of your own",
    )


class AsyncResult(ResultBase):
    """The result of a task, by id. ``app`` defaults to the current app."""

    def __init__(
        self,
        id: str,
        backend: Any = None,
        task_name: str | None = None,
        app: Celery | None = None,
        parent: Any = None,
    ) -> None:
        self.id = str(id)
        self.task_id = self.id
        self.task_name = task_name
        if app is None and backend is not None:  # AsyncResult(id, backend=app.backend)
            app = getattr(backend, "app", None)
        self._app = app
        self._backend = backend
        self.parent = parent
        self._creator: AsyncResult | None = parent
        """A run that creates this one before it ends (a chain's previous task)."""
        self.ignored = False
        self._cache: RunRecord | None = None

    # -- plumbing ----------------------------------------------------------------------
    @property
    def app(self) -> Celery:
        return self._app if self._app is not None else get_current_app()

    @property
    def backend(self) -> Any:
        """The app's result backend (:class:`~pyrula_compat.backend.Backend`): the store."""
        return self._backend if self._backend is not None else self.app.backend

    @backend.setter
    def backend(self, value: Any) -> None:
        self._backend = value

    def _handle(self) -> Any:
        return self.app.client().handle(self.task_name or "", self.id)

    def _record(self) -> RunRecord | None:
        if self._cache is not None:
            return self._cache
        try:
            record: RunRecord = self._handle().record()
        except RunNotFound:
            self._cache = legacy_record(self.app, self.id)  # the old Celery backend's
            return self._cache
        if record.is_terminal:
            self._cache = record
        return record

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.id}>"

    def __str__(self) -> str:
        return self.id

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AsyncResult):
            return other.id == self.id
        if isinstance(other, str):
            return other == self.id
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.id)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.id, None, self.task_name, None, self.parent))

    # -- state -------------------------------------------------------------------------
    @property
    def state(self) -> str:
        return state_of(self._record())

    status = state

    @property
    def result(self) -> Any:
        return info_of(self._record())

    info = result

    @property
    def traceback(self) -> str | None:
        record = self._record()
        if record is None or state_of(record) != states.FAILURE or not record.error:
            return None
        return ErrorInfo.from_json(record.error).traceback

    @property
    def date_done(self) -> datetime | None:
        record = self._record()
        if record is None or record.finished_at is None:
            return None
        return datetime.fromtimestamp(record.finished_at, UTC)

    @property
    def name(self) -> str | None:
        record = self._record()
        if record is None or record.workflow == REVOKED_TASK:  # revoked before it was sent
            return self.task_name
        return recorded.task_name(record.workflow) or record.workflow

    def _params(self) -> dict[str, Any]:
        record = self._record()
        if record is None:
            return {}
        value = decode(record.params)
        return value if isinstance(value, dict) else {}

    @property
    def args(self) -> list[Any] | None:
        params = self._params()
        return codec.from_json(params.get("args") or []) if params else None

    @property
    def kwargs(self) -> dict[str, Any] | None:
        params = self._params()
        return codec.from_json(params.get("kwargs") or {}) if params else None

    @property
    def worker(self) -> str | None:
        record = self._record()
        return record.worker_id if record is not None else None

    queue = None
    retries = None

    @property
    def children(self) -> list[Any] | None:
        """The results of the tasks it sent while it ran (its body's ``delay``s and
        groups, its ``link`` callbacks, its chain's next step), once it has ended, as
        Celery stores them with the result; None before that."""
        if not self._is_terminal():
            return None
        return trail.children_of(self.app, self.id)

    def iterdeps(self, intermediate: bool = False) -> Iterator[tuple[Any, Any]]:
        """``(parent, node)`` over this result and its children, breadth first; a node
        not ready raises IncompleteStream unless ``intermediate``."""
        queue: deque[tuple[Any, Any]] = deque([(None, self)])
        while queue:
            parent, node = queue.popleft()
            yield parent, node
            if node.ready():
                queue.extend((node, child) for child in node.children or ())
            elif not intermediate:
                raise IncompleteStream()

    def collect(self, intermediate: bool = False, **kwargs: Any) -> Iterator[tuple[Any, Any]]:
        """``(result, value)`` for this result and, recursively, its children (Celery's
        ``collect``: ``get(**kwargs)`` of each, in breadth-first order)."""
        for _, node in self.iterdeps(intermediate=intermediate):
            yield node, node.get(**kwargs)

    def ready(self) -> bool:
        return self.state in states.READY_STATES

    def successful(self) -> bool:
        return self.state == states.SUCCESS

    def failed(self) -> bool:
        return self.state == states.FAILURE

    def exists(self) -> bool:
        """Whether a run with this id exists (Celery 5.7: a result, not an unknown id)."""
        return self._record() is not None

    # -- waiting -----------------------------------------------------------------------
    def get(
        self,
        timeout: float | None = None,
        propagate: bool = True,
        interval: float = 0.5,
        no_ack: bool = True,
        follow_parents: bool = True,
        callback: Any = None,
        on_message: Any = None,
        on_interval: Any = None,
        disable_sync_subtasks: bool = True,
        **kwargs: Any,
    ) -> Any:
        """Wait for the task and return its value; re-raise its exception if it failed.

        ``timeout`` (seconds) raises :class:`TimeoutError`; ``propagate=False`` returns
        the exception instead of raising it. A revoked or expired task raises
        :class:`TaskRevokedError`. Waiting sleeps until the store says the run ended.
        ``callback(task_id, value)`` is called with what is returned, as Celery's
        ``maybe_throw`` calls it: not when it raises, and (as in Celery) not when the
        result had already been read and ``propagate`` is false.
        """
        if self.ignored:
            return None
        if (
            disable_sync_subtasks
            and not getattr(_joins, "allowed", False)
            and get_current_worker_task() is not None
        ):
            raise RuntimeError(
                "Never call result.get() within a task! Pass disable_sync_subtasks=False "
                "or wrap it in allow_join_result() if you must (it holds a worker slot "
                "while it waits)."
            )
        if not propagate and self._cache is not None:
            callback = None  # Celery's cached path returns .result without calling it
        deadline = None if timeout is None else time.monotonic() + timeout
        record = self._wait(deadline, interval)
        if record is None:
            raise TimeoutError("The operation timed out." + self._unserved_note())
        state = state_of(record)
        if on_message is not None:
            on_message({"status": state, "result": info_of(record), "task_id": self.id})
        if state == states.SUCCESS:
            value = codec.from_json(decode(record.result))
        else:
            failure = self._parent_failure() if follow_parents else None
            value = failure if failure is not None else info_of(record)
            if propagate:
                raise value
        if callback is not None:
            callback(self.id, value)
        return value

    wait = get

    def maybe_throw(self, propagate: bool = True, callback: Any = None) -> Any:
        """Raise the task's exception if it failed or was revoked (``propagate``); else
        its result (``callback(id, value)`` first, if given). Does not wait."""
        record = self._record()
        value = info_of(record)
        if propagate and state_of(record) in states.PROPAGATE_STATES:
            raise value
        if callback is not None:
            callback(self.id, value)
        return value

    maybe_reraise = maybe_throw

    def _parent_failure(self) -> BaseException | None:
        node = self.parent
        chain: list[AsyncResult] = []
        while isinstance(node, AsyncResult):
            chain.append(node)
            node = node.parent
        for ancestor in reversed(chain):  # the first task that failed
            record = ancestor._record()
            if record is not None and state_of(record) == states.FAILURE:
                return info_of(record)  # type: ignore[no-any-return]
        if isinstance(node, GroupResult):
            for member in node.results:
                record = member._record()
                if record is not None and state_of(record) == states.FAILURE:
                    return info_of(record)  # type: ignore[no-any-return]
        return None

    def _wait(self, deadline: float | None, interval: float) -> RunRecord | None:
        """The run once terminal, or None at the deadline. One store call when the run
        has ended already: the record the wait returns is the one kept."""
        if self._cache is not None:
            return self._cache
        client = self.app.client()
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                record = store.wait_record(client, self.id, remaining)
            except RunNotFound:
                legacy = legacy_record(self.app, self.id)  # ended on the old Celery side
                if legacy is not None:
                    self._cache = legacy
                    return legacy
                if remaining is not None and remaining <= 0:
                    return None
                self._wait_until_created(deadline, interval)
                continue
            if not record.is_terminal:
                return None  # the deadline passed (or the client is closing)
            self._cache = record
            return record

    def _wait_until_created(self, deadline: float | None, interval: float) -> None:
        creator = self._creator
        if creator is not None and not creator._is_terminal():
            creator._wait(deadline, interval)
            return
        pause = interval if deadline is None else min(interval, deadline - time.monotonic())
        if pause > 0:
            time.sleep(pause)

    def _unserved_note(self) -> str:
        """Why a timed-out task may not have run: it is queued and no running worker
        serves its name (it runs once one that knows it starts)."""
        try:
            record = self.app.client().get_run(self.id)
            if record is None or record.status is not RunStatus.QUEUED:
                return ""
            if served(self.app, record.workflow) is not False:
                return ""
        except Exception:  # only a hint: never hide the timeout behind another error
            return ""
        return (
            f" Task {record.workflow!r} is still queued and no running worker has it "
            "registered: it runs once a worker that knows it starts."
        )

    def _is_terminal(self) -> bool:
        record = self._record()
        return record is not None and record.is_terminal

    # -- control -----------------------------------------------------------------------
    def revoke(
        self,
        connection: Any = None,
        terminate: bool = False,
        signal: Any = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Cancel the task durably (it never starts, or stops at its next step
        boundary); ``terminate=True`` ends it at once, and its worker stops the body
        once it hears of it (see ``Control.revoke``)."""
        self.app.control.revoke(self.id, terminate=terminate, signal=signal)
        if wait:
            self._wait(None if timeout is None else time.monotonic() + timeout, 0.5)

    def forget(self) -> None:
        """Delete the ended run and its result; its state reads PENDING again."""
        self._cache = None
        with contextlib.suppress(RunNotFound, InvalidRunState):
            self._handle().forget()

    def throw(self, exc: BaseException | None = None, tb: Any = None, **kwargs: Any) -> None:
        """Raise ``exc`` (with traceback ``tb``), as Celery's ``throw`` rejects the result's
        promise and re-raises; without ``exc``, the task's own exception if it failed."""
        if exc is None:
            self.maybe_throw()
            return
        raise exc.with_traceback(tb) if tb is not None else exc

    def as_list(self) -> list[str]:
        """This task's id, then its parents' ids (a chain's earlier steps), as Celery's."""
        ids = [self.id]
        if self.parent is not None:
            ids.extend(self.parent.as_list())
        return ids

    def get_leaf(self) -> Any:
        """The value of the last result :meth:`iterdeps` reaches (each waited for)."""
        value = None
        for _, node in self.iterdeps():
            value = node.get()
        return value

    build_graph = Unsupported(
        "celery.utils.graph.DependencyGraph of a result and its children",
        "walk them with iterdeps() (parent, node pairs) or collect()",
    )
    graph = Unsupported(
        "celery.utils.graph.DependencyGraph of a result and its children",
        "walk them with iterdeps() (parent, node pairs) or collect()",
    )
    revoke_by_stamped_headers = Unsupported(
        "revoking the tasks whose stamped headers match, by broadcast to the workers",
        "revoke by id: result.revoke() or app.control.revoke(task_id)",
    )

    def as_tuple(self) -> tuple[Any, ...]:
        parent = self.parent
        return ((self.id, parent.as_tuple() if parent is not None else None), None)


def served(app: Celery, name: str) -> bool | None:
    """Whether a running worker (one with a live heartbeat in the app's store) serves
    task ``name``; None if the store could not say. One read of the workers' heartbeats."""
    client = app.client()
    try:
        workers = client.list_workers(timeout=5.0)
    except Exception:
        return None
    return any(name in worker.workflows for worker in workers)


# Defined after AsyncResult, which EagerResult extends.
from pyrula_compat.result_types import (  # noqa: E402
    EagerResult,
    GroupResult,
    ResultSet,
    result_from_tuple,
)

__all__ = [
    "AsyncResult",
    "EagerResult",
    "GroupResult",
    "ResultBase",
    "ResultSet",
    "allow_join_result",
    "denied_join_result",
    "result_from_tuple",
    "served",
    "state_of",
]
