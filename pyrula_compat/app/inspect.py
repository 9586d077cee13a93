"""``app.control.inspect()``: Celery's worker inspection, answered from the store.

There is no broadcast: workers report through their heartbeats, and what they run is
in the store. ``active()`` lists each worker's running tasks, as Celery's request dicts;
``scheduled()`` lists the tasks waiting for their countdown or eta, which no worker
holds (a pyrula worker prefetches nothing), under the node name ``store``;
``reserved()`` and ``revoked()`` are empty lists per worker for the same reason (a
revoke is a state in the store: ``AsyncResult(id).state``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

from pyrula.workflows import RunRecord, RunStatus, Store, open_store
from pyrula.workflows.records import WorkerInfo
from pyrula.workflows.stores.schedule_admin import run_blocking
from pyrula_compat import codec
from pyrula_compat._state import get_current_app

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery

T = TypeVar("T")

LIST_LIMIT = 1000
"""Most runs one answer reads from the store (newest first)."""
STORE_NODE = "store"
"""The node name ``scheduled()`` files the delayed tasks under."""


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
    ) -> None:
        self.app = app if app is not None else get_current_app()
        self.destination = destination
        self.timeout = timeout

    def _read(self, fn: Callable[[Store], Awaitable[T]]) -> T:
        """``fn(store)`` on the app's store, opened for it (on a helper thread when this
        thread runs an event loop)."""
        url = self.app.store_url()

        async def read() -> T:
            store = open_store(url)
            await store.open()
            try:
                return await fn(store)
            finally:
                await store.close()

        return run_blocking(read)

    def _workers(self) -> list[WorkerInfo]:
        return self._read(lambda store: store.list_workers())

    def _selected(self, workers: Iterable[WorkerInfo]) -> list[WorkerInfo]:
        wanted = self.destination
        if not wanted:
            return list(workers)
        names = {wanted} if isinstance(wanted, str) else set(wanted)
        return [w for w in workers if w.worker_id in names or w.hostname in names]

    def ping(self) -> dict[str, Any] | None:
        return {w.worker_id: {"ok": "pong"} for w in self._selected(self._workers())} or None

    def stats(self) -> dict[str, Any] | None:
        workers = self._selected(self._workers())
        return {
            w.worker_id: {"pid": w.pid, "hostname": w.hostname, "running": w.running}
            for w in workers
        } or None

    def registered(self) -> dict[str, Any] | None:
        workers = self._selected(self._workers())
        return {w.worker_id: sorted(w.workflows) for w in workers} or None

    registered_tasks = registered

    def active(self) -> dict[str, Any] | None:
        """Each worker's running tasks: ``{worker: [request dict, ...]}``."""

        async def read(store: Store) -> tuple[list[WorkerInfo], list[RunRecord]]:
            running = await store.list_runs(status=RunStatus.RUNNING, limit=LIST_LIMIT)
            return await store.list_workers(), running

        workers, running = self._read(read)
        workers = self._selected(workers)
        out: dict[str, list[dict[str, Any]]] = {w.worker_id: [] for w in workers}
        by_id = {w.worker_id: w for w in workers}
        for record in running:
            worker = by_id.get(record.worker_id or "")
            if worker is not None:
                out[worker.worker_id].append(request_of(record, worker))
        return out or None

    def scheduled(self) -> dict[str, Any] | None:
        """Tasks waiting for their countdown or eta, under the node ``store``."""

        async def read(store: Store) -> tuple[list[WorkerInfo], list[RunRecord], float]:
            queued = await store.list_runs(status=RunStatus.QUEUED, limit=LIST_LIMIT)
            return await store.list_workers(), queued, await store.now()

        workers, queued, now = self._read(read)
        out: dict[str, Any] = {w.worker_id: [] for w in self._selected(workers)}
        waiting = [r for r in queued if r.available_at > now]
        if waiting and not self.destination:
            out[STORE_NODE] = [
                {"eta": _iso(r.available_at), "priority": 0, "request": request_of(r, None)}
                for r in sorted(waiting, key=lambda r: r.available_at)
            ]
        return out or None

    def reserved(self) -> dict[str, Any] | None:
        """Nothing: a pyrula worker holds no task it does not run."""
        return {w.worker_id: [] for w in self._selected(self._workers())} or None

    revoked = reserved

    def query_task(self, *ids: Any) -> dict[str, Any] | None:
        """Where each of ``ids`` is: ``{worker: {id: ["active", request]}}`` for a running
        one, under ``store`` as ``"scheduled"`` for one waiting for its eta."""
        wanted = [i for group in ids for i in ([group] if isinstance(group, str) else group)]

        async def read(store: Store) -> tuple[list[WorkerInfo], list[RunRecord | None], float]:
            records = [await store.get_run(task_id) for task_id in wanted]
            return await store.list_workers(), records, await store.now()

        workers, records, now = self._read(read)
        by_id = {w.worker_id: w for w in self._selected(workers)}
        out: dict[str, dict[str, Any]] = {w: {} for w in by_id}
        for record in records:
            if record is None:
                continue
            if record.status is RunStatus.RUNNING and record.worker_id in by_id:
                worker = by_id[record.worker_id]
                out[worker.worker_id][record.run_id] = ["active", request_of(record, worker)]
            elif record.status is RunStatus.QUEUED and record.available_at > now:
                node = out.setdefault(STORE_NODE, {})
                node[record.run_id] = ["scheduled", request_of(record, None)]
        return out or None


def request_of(record: RunRecord, worker: WorkerInfo | None) -> dict[str, Any]:
    """Celery's request dict of an inspected task."""
    try:
        params = json.loads(record.params)
    except ValueError:
        params = None
    params = params if isinstance(params, dict) else {}
    return {
        "id": record.run_id,
        "name": record.workflow,
        "args": codec.from_json(params.get("args")) or [],
        "kwargs": codec.from_json(params.get("kwargs")) or {},
        "type": record.workflow,
        "hostname": worker.worker_id if worker is not None else None,
        "time_start": record.started_at,
        "acknowledged": True,
        "delivery_info": {"exchange": "", "routing_key": "celery", "priority": None,
                          "redelivered": record.claims > 1},
        "worker_pid": worker.pid if worker is not None else None,
    }  # fmt: skip


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat()


__all__ = ["Inspect", "request_of"]
