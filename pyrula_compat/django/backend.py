"""``PyrulaTaskBackend``: Django's task framework on pyrula's durable engine.

Each task (a module-level function decorated with ``@task``) is a pyrula workflow named
after its module path (``myapp.tasks.send_welcome``), registered when the task is
defined; each ``enqueue`` is one run of it, whose id is the ``TaskResult.id``. The
function runs as the run's one journaled step, on a worker thread, with Django's
database connections closed before and after it as a request's are; a task that fails
records its exception (class path and traceback) in ``TaskResult.errors``. A worker
that dies mid-task hands the run to another, which calls the function again (at least
once, as every step). Tasks are not retried after they raise: Django's framework has no
retry policy.

What the backend supports: ``run_after`` (the run starts then), async task functions,
``takes_context`` (``context.attempt`` counts claims), ``get_result``/``aget_result``
from any process, ``TaskResult.refresh()``. ``queue_name`` must be one of the backend's
``QUEUES`` (Django's default: ``["default"]``) and is kept with the run; every worker that
serves the backend runs every queue. ``priority`` other than the default is refused
(``supports_priority`` is False): pyrula's claim order is fair turns across owners, then
first in, first out.

OPTIONS: ``store`` (a pyrula store URL; default: ``PYRULA_STORE_URL``, else the embedded
SQLite file), ``owner`` (the tenant runs are submitted under).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from pyrula.workflows import RunRecord, RunStatus, WorkflowContext, open_store, workflow
from pyrula.workflows.errors import RunNotFound
from pyrula.workflows.registry import default_registry
from pyrula.workflows.retry import RetryPolicy
from pyrula.workflows.serialization import ErrorInfo
from pyrula.workflows.sync import WorkflowClient
from pyrula_compat.django.framework import (
    BaseTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)

ONE_ATTEMPT = RetryPolicy(max_attempts=1)
STATUS = {
    RunStatus.QUEUED: TaskResultStatus.READY,
    RunStatus.SLEEPING: TaskResultStatus.READY,
    RunStatus.WAITING: TaskResultStatus.READY,
    RunStatus.RUNNING: TaskResultStatus.RUNNING,
    RunStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
}
"""Run status → Django's task status; every other (failed, dead, cancelled, terminated)
is FAILED."""

TASKS: dict[str, Task] = {}
"""Module path → the task as defined, for the workflows and for ``get_result``."""
_tasks_lock = threading.Lock()


class PyrulaTask(Task):  # type: ignore[misc]
    """Django's Task, also registered as the pyrula workflow that runs it."""

    __slots__ = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        register(self)


def register(task: Task) -> None:
    path = str(task.module_path)
    with _tasks_lock:
        first = path not in TASKS
        TASKS.setdefault(path, task)
    if first and default_registry.find(path) is None:
        workflow(name=path)(_workflow_for(path))


def _workflow_for(path: str) -> Any:
    async def django_task(
        ctx: WorkflowContext,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        queue_name: str | None = None,
        backend: str | None = None,
    ) -> Any:
        return await ctx.step("call", _call, path, ctx.run_id, args or [], kwargs or {},
                              retry=ONE_ATTEMPT)  # fmt: skip

    django_task.__qualname__ = django_task.__name__ = path.rsplit(".", 1)[-1]
    return django_task


def _call(path: str, run_id: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The task's function, in a worker thread, as Django runs request code: database
    connections that are stale closed first, and this thread's closed afterwards."""
    from django.db import close_old_connections, connections

    task = TASKS[path]
    close_old_connections()
    try:
        if task.takes_context:
            backend = task.get_backend()
            result = backend.get_result(run_id)
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        return value  # journaled as JSON: tuples become lists, as Django's normalize_json
    finally:
        connections.close_all()


class PyrulaTaskBackend(BaseTaskBackend):  # type: ignore[misc]
    task_class = PyrulaTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.store_url: str | None = self.options.get("store")
        self.owner: str | None = self.options.get("owner")
        self._client: WorkflowClient | None = None
        self._lock = threading.Lock()

    @property
    def client(self) -> WorkflowClient:
        """This process's client of the backend's store, made on first use."""
        with self._lock:
            if self._client is None:
                self._client = WorkflowClient(open_store(self.store_url))
            return self._client

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        register(task)
        params = {"args": list(args), "kwargs": dict(kwargs), "queue_name": task.queue_name,
                  "backend": self.alias}  # fmt: skip
        handle = self.client.submit(
            str(task.module_path), params, start_at=task.run_after, owner=self.owner
        )
        # As enqueued (READY): a worker may take it before this returns.
        return TaskResult(
            task=task, id=handle.run_id, status=TaskResultStatus.READY,
            enqueued_at=datetime.now(UTC), started_at=None, finished_at=None,
            last_attempted_at=None, args=list(args), kwargs=dict(kwargs), backend=self.alias,
            errors=[], worker_ids=[],
        )  # fmt: skip

    def get_result(self, result_id: str) -> TaskResult:
        try:
            record = self.client.get_run(result_id)
        except RunNotFound:
            record = None
        if record is None:
            raise TaskResultDoesNotExist(result_id)
        task = _task_named(record.workflow)
        if task is None:
            raise TaskResultDoesNotExist(
                f"{result_id}: its task {record.workflow!r} is not defined in this process "
                "(import the module that defines it)"
            )
        import json

        params = json.loads(record.params)
        return self._result(task, record, params.get("args") or [], params.get("kwargs") or {})

    def _result(self, task: Task, record: RunRecord | None, args: Any, kwargs: Any) -> TaskResult:
        if record is None:
            raise TaskResultDoesNotExist("the run was not stored")
        status = STATUS.get(record.status, TaskResultStatus.FAILED)
        errors = []
        if status == TaskResultStatus.FAILED and record.error:
            info = ErrorInfo.from_json(record.error)
            errors.append(TaskError(exception_class_path=info.qualified_type,
                                    traceback=info.traceback))  # fmt: skip
        result = TaskResult(
            task=task, id=record.run_id, status=status, enqueued_at=_time(record.created_at),
            started_at=_time(record.started_at),
            finished_at=_time(record.finished_at) if record.is_terminal else None,
            last_attempted_at=_time(record.started_at if record.claims <= 1 else record.updated_at),
            args=list(args), kwargs=dict(kwargs), backend=self.alias, errors=errors,
            worker_ids=[record.worker_id or ""] * record.claims,
        )  # fmt: skip
        if status == TaskResultStatus.SUCCESSFUL and record.result is not None:
            import json

            object.__setattr__(result, "_return_value", json.loads(record.result))
        return result


def _task_named(path: str) -> Task | None:
    task = TASKS.get(path)
    if task is not None:
        return task
    # A process that reads results without having imported the task: import it when its
    # module belongs to one of the project's installed apps (never a path from elsewhere).
    from django.apps import apps
    from django.utils.module_loading import import_string

    module = path.rsplit(".", 1)[0]
    if not any(module == c.name or module.startswith(c.name + ".") for c in apps.get_app_configs()):
        return None
    try:
        found = import_string(path)
    except ImportError:
        return None
    return found if isinstance(found, Task) else None


def _time(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)
