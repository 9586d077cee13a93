"""``app.control.inspect()``: Celery's worker inspection, answered from the store.

There is no broadcast: workers report through their heartbeats, and what they run is
in the store. The reading is :class:`pyrula.workflows.inspection.Inspector`'s (shared
with ``pyrula inspect``); this class gives it Celery's signature and return values:
``{node: reply}``, or None when no live worker matches. A worker counts while its last
heartbeat is fresh (at most its ``lock_ttl`` old, or ``stale_after`` seconds), so a killed
one drops out.
``active()`` lists each worker's running tasks, as Celery's request dicts;
``scheduled()`` lists the tasks waiting for their countdown or eta, which no worker
holds (a pyrula worker prefetches nothing), under the node name ``store``, with the
tasks waiting for a retry (Celery's retry is a message with an eta: a run sleeping on
its ``retry-N`` timer here), with the retry's time and arguments;
``reserved()`` and ``revoked()`` are empty lists per worker for the same reason (a
revoke is a state in the store: ``AsyncResult(id).state``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pyrula.workflows import RunRecord, Store, inspection, open_store
from pyrula.workflows.inspection import STORE_NODE, Answer, Inspector
from pyrula.workflows.records import JournalEntry, RunStatus, WorkerInfo
from pyrula.workflows.stores.schedule_admin import run_blocking
from pyrula_compat import codec
from pyrula_compat._state import get_current_app
from pyrula_compat.outcomes import retry_decision

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from pyrula_compat.app.base import Celery

LIST_LIMIT = inspection.LIST_LIMIT


def task_arguments(params: Any) -> tuple[list[Any], dict[str, Any]]:
    """A task run's ``args`` and ``kwargs``, decoded as the task receives them (the
    params of a plain ``@workflow`` run in the same store are its kwargs)."""
    if not isinstance(params, dict) or not ("args" in params or "kwargs" in params):
        return inspection.workflow_arguments(params)
    return codec.from_json(params.get("args")) or [], codec.from_json(params.get("kwargs")) or {}


class TaskInspector(Inspector):
    """The engine's :class:`Inspector` reading task runs as Celery's inspect does: the
    arguments as the task receives them, and a task waiting for its retry scheduled too.
    ``app.control.inspect()`` and ``pyrula -A APP inspect`` both use it."""

    def __init__(self, destination: Any = None, stale_after: float | None = None) -> None:
        super().__init__(destination, stale_after, task_arguments)

    async def scheduled(self, store: Store) -> Answer:
        """Tasks waiting for their countdown or eta, or for a retry, under the node
        ``store``, soonest first."""
        answer = await super().scheduled(store)
        if answer.store is None and inspection.destinations(self.destination):
            return answer
        runs = await store.list_runs(status=RunStatus.SLEEPING, limit=LIST_LIMIT)
        waits = [w for w in [await retry_wait(store, r) for r in runs] if w is not None]
        if waits:
            found = [*(answer.store or []), *waits]
            answer.store = sorted(found, key=lambda entry: str(entry["eta"]))
        return answer

    async def query_task(self, store: Store, ids: Iterable[str]) -> Answer:
        """Where each id is: ``{worker: {id: ["active", request]}}`` for a running one,
        under ``store`` as ``"scheduled"`` for one waiting for its eta or its retry."""
        wanted = list(dict.fromkeys(ids))
        answer = await super().query_task(store, wanted)
        if answer.store is None:  # a destination: workers only
            return answer
        for run_id in wanted:
            record = await store.get_run(run_id)
            wait = await retry_wait(store, record) if record is not None else None
            if wait is not None:
                answer.store[run_id] = ["scheduled", wait["request"]]
        return answer


class Inspect:
    """``app.control.inspect()`` (Celery's signature; ``app`` defaults to the current)."""

    def __init__(
        self,
        destination: Any = None,
        timeout: float = 1.0,
        callback: Any = None,
        connection: Any = None,
        app: Celery | None = None,
        limit: Any = None,
        pattern: Any = None,
        matcher: Any = None,
        stale_after: float | None = None,
    ) -> None:
        self.app = app if app is not None else get_current_app()
        self.destination = destination
        self.timeout = timeout
        self.stale_after = stale_after

    def _ask(
        self, question: Callable[[TaskInspector, Store], Awaitable[Answer]]
    ) -> dict[str, Any] | None:
        """``question`` on the app's store, opened for it (on a helper thread when this
        thread runs an event loop); Celery's reply dict, or None when it is empty."""
        url = self.app.store_url()
        inspector = TaskInspector(self.destination, self.stale_after)

        async def read() -> Answer:
            store = open_store(url)
            await store.open()
            try:
                return await question(inspector, store)
            finally:
                await store.close()

        return run_blocking(read).replies() or None

    def ping(self) -> dict[str, Any] | None:
        return self._ask(Inspector.ping)

    def stats(self) -> dict[str, Any] | None:
        return self._ask(Inspector.stats)

    def registered(self) -> dict[str, Any] | None:
        return self._ask(Inspector.registered)

    registered_tasks = registered

    def active(self) -> dict[str, Any] | None:
        """Each worker's running tasks: ``{worker: [request dict, ...]}``."""
        return self._ask(Inspector.active)

    def scheduled(self) -> dict[str, Any] | None:
        """Tasks waiting for their countdown or eta, or for a retry, under the node
        ``store``, soonest first."""
        return self._ask(TaskInspector.scheduled)

    def reserved(self) -> dict[str, Any] | None:
        """Nothing: a pyrula worker holds no task it does not run."""
        return self._ask(Inspector.reserved)

    def revoked(self) -> dict[str, Any] | None:
        """Nothing: a revoke is the task's state in the store, not a worker's memory."""
        return self._ask(Inspector.revoked)

    def query_task(self, *ids: Any) -> dict[str, Any] | None:
        """Where each of ``ids`` is: ``{worker: {id: ["active", request]}}`` for a running
        one, under ``store`` as ``"scheduled"`` for one waiting for its eta."""
        wanted = [str(i) for group in ids for i in _flat(group)]
        return self._ask(lambda inspector, store: inspector.query_task(store, wanted))


def _flat(group: Any) -> Iterable[Any]:
    return [group] if isinstance(group, str) else group


async def retry_wait(store: Store, record: RunRecord) -> dict[str, Any] | None:
    """``scheduled()``'s entry for a task run waiting for its retry (sleeping on the
    ``retry-N`` timer that follows its ``attempt-N`` step), else None: the retry's time
    as ``eta`` and, in ``request``, the arguments it runs with (``retry(args=...)``'s)."""
    if record.status is not RunStatus.SLEEPING:
        return None
    journal = await store.load_journal(record.run_id)
    if len(journal) < 2 or journal[-1].kind != "sleep":
        return None
    sleep, attempt = journal[-1], journal[-2]
    number = sleep.name.removeprefix("retry-")
    if number == sleep.name or attempt.name != f"attempt-{number}":
        return None
    request = request_of(record, None)
    request["args"], request["kwargs"] = _retried_arguments(journal, request)
    request["time_start"] = None  # the retry has not started
    at = record.wake_at if record.wake_at is not None else _number(sleep.value)
    eta = datetime.fromtimestamp(at, UTC).isoformat() if at is not None else None
    return {"eta": eta, "priority": 0, "request": request}


def _retried_arguments(journal: list[JournalEntry], request: dict[str, Any]) -> tuple[Any, Any]:
    """The arguments of the next attempt: the run's, as each retry replaced them."""
    args, kwargs = request["args"], request["kwargs"]
    for entry in journal:
        if entry.kind != "step" or not entry.name.startswith("attempt-"):
            continue
        outcome = retry_decision(entry)
        if outcome is not None:
            if "args" in outcome:
                args = codec.from_json(outcome["args"]) or []
            if "kwargs" in outcome:
                kwargs = codec.from_json(outcome["kwargs"]) or {}
    return args, kwargs


def _number(text: str) -> float | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return float(value) if isinstance(value, (int, float)) else None


def request_of(record: RunRecord, worker: WorkerInfo | None) -> dict[str, Any]:
    """Celery's request dict of an inspected task."""
    return inspection.request_of(record, worker, task_arguments)


__all__ = ["STORE_NODE", "Inspect", "request_of", "retry_wait", "task_arguments"]
