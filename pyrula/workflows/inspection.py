"""Worker inspection from the store: which workers are alive, and what they run.

There is no broadcast in pyrula. Each worker heartbeats into the store
(``Store.heartbeat``, every lease-renewal round: a third of its ``lock_ttl``) and
deregisters when it stops cleanly (``Store.remove_worker``); what it runs is in the run
records. This module answers Celery's inspect questions (``ping``, ``stats``,
``registered``, ``active``, ``scheduled``, ``reserved``, ``revoked``, ``query_task``)
from one read of the store, for ``pyrula status`` / ``pyrula inspect`` and for
``pyrula_compat``'s ``app.control.inspect()``.

Liveness: ``Store.list_workers`` returns every worker that heartbeated and has not
deregistered, on every store. A killed worker (SIGKILL, OOM, a lost machine) never
deregisters, so it stays there with its last heartbeat. Here a worker is alive while
that heartbeat is at most its own ``lock_ttl`` old by the store's clock (each heartbeat
carries it: by then the worker has missed two heartbeats, and its runs' leases have
lapsed and other workers take them back), or ``stale_after`` seconds when one is given.

Destinations are matched as Celery users write them: a worker id, a hostname, or a
Celery node name ``NAME@HOSTNAME`` (the node a worker was started as with ``-n``, else
``celery@HOSTNAME``, Celery's default).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyrula.workflows.records import RunRecord, RunStatus, WorkerInfo
from pyrula.workflows.stores.base import Store

DEAD_WORKER_KEPT = 86_400.0
"""Seconds a killed worker stays in ``list_workers`` (the dashboard shows it, as dead)
before the orphan scan forgets it."""
LIST_LIMIT = 1000
"""Most runs one answer reads from the store (newest first)."""
DEFAULT_NODE = "celery"
"""The name part of a worker's Celery node name when it was started without ``-n``."""
STORE_NODE = "store"
"""The node under which delayed runs, which no worker holds, are filed."""
COMMANDS = (
    "active",
    "ping",
    "query_task",
    "registered",
    "reserved",
    "revoked",
    "scheduled",
    "stats",
)
"""The inspect commands :func:`inspect` answers."""

Arguments = Callable[[Any], tuple[list[Any], dict[str, Any]]]
"""A run's decoded params -> the ``args`` and ``kwargs`` shown for it."""


def destinations(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """Node names from what Celery takes as a destination: one string (comma-separated
    names) or a list of them. None or empty means every worker; a blank name (``-d ""``,
    an unset ``$HOSTNAME``) matches none, as with Celery's ``-d``."""
    if not value:
        return ()
    parts = [value] if isinstance(value, str) else list(value)
    return tuple(name.strip() for part in parts for name in part.split(","))


def matches(worker: WorkerInfo, names: Sequence[str]) -> bool:
    """Whether ``worker`` is one of ``names``: its worker id, its hostname, or a Celery
    node name ``NAME@HOSTNAME``. A worker started with a node name (``pyrula worker -n
    w1@%h``: its id is ``w1@HOST-PID-RANDOM``) is matched by that node name; one without
    (the default id, ``HOST-PID-RANDOM``) by Celery's default node name, ``celery@HOST``.
    No names match every worker."""
    if not names:
        return True
    has_node = "@" in worker.worker_id
    for name in names:
        if name and name in (worker.worker_id, worker.hostname):
            return True
        node, at, host = name.partition("@")
        if not (at and host):
            continue
        if has_node:
            if worker.worker_id.startswith(f"{name}-"):
                return True
        elif node == DEFAULT_NODE and host == worker.hostname:
            return True
    return False


def is_alive(worker: WorkerInfo, now: float, stale_after: float | None = None) -> bool:
    """Whether the worker's last heartbeat is at most ``stale_after`` seconds old (None:
    the worker's own ``lock_ttl``, three of its heartbeat intervals)."""
    limit = worker.lock_ttl if stale_after is None else stale_after
    return now - worker.last_seen <= limit


async def _workers_now(store: Store) -> tuple[list[WorkerInfo], float]:
    """Every worker the store lists, and the store's time to judge them by."""
    workers = await store.list_workers()
    return workers, await store.now()


async def live_workers(store: Store, stale_after: float | None = None) -> list[WorkerInfo]:
    """The workers whose heartbeat is fresh (see :func:`is_alive`), most recently seen
    first."""
    workers, now = await _workers_now(store)
    return [w for w in workers if is_alive(w, now, stale_after)]


async def forget_dead_workers(store: Store, kept: float = DEAD_WORKER_KEPT) -> list[str]:
    """Remove the workers whose last heartbeat is over ``kept`` seconds old (killed ones,
    which never deregistered); return their ids. The orphan scan calls it."""
    workers, now = await _workers_now(store)
    gone = [w.worker_id for w in workers if not is_alive(w, now, kept)]
    for worker_id in gone:
        await store.remove_worker(worker_id)
    return gone


def workflow_arguments(params: Any) -> tuple[list[Any], dict[str, Any]]:
    """A workflow's params are its keyword arguments."""
    return [], dict(params) if isinstance(params, dict) else {}


def request_of(
    record: RunRecord, worker: WorkerInfo | None, arguments: Arguments = workflow_arguments
) -> dict[str, Any]:
    """Celery's request dict of an inspected run (``arguments`` decodes its params)."""
    try:
        params = json.loads(record.params)
    except ValueError:
        params = None
    args, kwargs = arguments(params)
    return {
        "id": record.run_id,
        "name": record.workflow,
        "args": args,
        "kwargs": kwargs,
        "type": record.workflow,
        "hostname": worker.worker_id if worker is not None else None,
        "time_start": record.started_at,
        "acknowledged": True,
        "delivery_info": {"exchange": "", "routing_key": "celery", "priority": None,
                          "redelivered": record.claims > 1},
        "worker_pid": worker.pid if worker is not None else None,
    }  # fmt: skip


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat()


@dataclass
class Answer:
    """One inspect command's replies: ``nodes`` per live worker matching the destination
    (most recently seen first), and ``store``: the delayed runs no worker holds (for
    ``scheduled`` and ``query_task`` without a destination; else None)."""

    nodes: dict[str, Any] = field(default_factory=dict)
    store: Any = None

    def replies(self) -> dict[str, Any]:
        """Celery's reply dict: the nodes, then the store's entry under ``store``."""
        out = dict(self.nodes)
        if self.store:
            out[STORE_NODE] = self.store
        return out


@dataclass(frozen=True)
class Inspector:
    """Answers the inspect commands from a store. ``destination`` as Celery takes it
    (see :func:`destinations`); ``stale_after`` as in :func:`is_alive`."""

    destination: str | Iterable[str] | None = None
    stale_after: float | None = None
    arguments: Arguments = workflow_arguments
    limit: int = LIST_LIMIT

    async def workers(self, store: Store) -> tuple[list[WorkerInfo], float]:
        """The live workers the destination names, and the store's time."""
        names = destinations(self.destination)
        workers, now = await _workers_now(store)
        found = [w for w in workers if is_alive(w, now, self.stale_after) and matches(w, names)]
        return found, now

    def _request(self, record: RunRecord, worker: WorkerInfo | None) -> dict[str, Any]:
        return request_of(record, worker, self.arguments)

    async def ping(self, store: Store) -> Answer:
        workers, _ = await self.workers(store)
        return Answer({w.worker_id: {"ok": "pong"} for w in workers})

    async def stats(self, store: Store) -> Answer:
        workers, now = await self.workers(store)
        return Answer(
            {
                w.worker_id: {
                    "pid": w.pid,
                    "hostname": w.hostname,
                    "running": w.running,
                    "uptime": round(max(0.0, now - w.started_at), 3),
                    "heartbeat_age": round(max(0.0, now - w.last_seen), 3),
                }
                for w in workers
            }
        )

    async def registered(self, store: Store) -> Answer:
        workers, _ = await self.workers(store)
        return Answer({w.worker_id: sorted(w.workflows) for w in workers})

    async def reserved(self, store: Store) -> Answer:
        """Nothing per worker: a pyrula worker holds no run it does not run."""
        workers, _ = await self.workers(store)
        return Answer({w.worker_id: [] for w in workers})

    async def revoked(self, store: Store) -> Answer:
        """Nothing per worker: a revoke is a run's state in the store, not worker memory."""
        return await self.reserved(store)

    async def active(self, store: Store) -> Answer:
        """Each worker's running runs, as request dicts."""
        workers, _ = await self.workers(store)
        running = await store.list_runs(status=RunStatus.RUNNING, limit=self.limit)
        by_id = {w.worker_id: w for w in workers}
        nodes: dict[str, list[dict[str, Any]]] = {w.worker_id: [] for w in workers}
        for record in running:
            worker = by_id.get(record.worker_id or "")
            if worker is not None:
                nodes[worker.worker_id].append(self._request(record, worker))
        return Answer(dict(nodes))

    async def scheduled(self, store: Store) -> Answer:
        """Runs waiting for their countdown or eta (held by no worker: under ``store``)."""
        workers, now = await self.workers(store)
        answer = Answer({w.worker_id: [] for w in workers})
        if destinations(self.destination):
            return answer
        queued = await store.list_runs(status=RunStatus.QUEUED, limit=self.limit)
        waiting = sorted((r for r in queued if r.available_at > now), key=lambda r: r.available_at)
        answer.store = [
            {
                "eta": _iso(r.available_at),
                "priority": 0,
                "request": self._request(r, None),
            }
            for r in waiting
        ]
        return answer

    async def query_task(self, store: Store, ids: Iterable[str]) -> Answer:
        """Where each id is: ``{worker: {id: ["active", request]}}`` for a running run,
        ``{id: ["scheduled", request]}`` under ``store`` for one waiting for its eta."""
        workers, now = await self.workers(store)
        by_id = {w.worker_id: w for w in workers}
        answer = Answer({w.worker_id: {} for w in workers})
        waiting: dict[str, Any] = {}
        for run_id in dict.fromkeys(ids):
            record = await store.get_run(run_id)
            if record is None:
                continue
            worker = by_id.get(record.worker_id or "")
            if record.status is RunStatus.RUNNING and worker is not None:
                entry = ["active", self._request(record, worker)]
                answer.nodes[worker.worker_id][record.run_id] = entry
            elif record.status is RunStatus.QUEUED and record.available_at > now:
                waiting[record.run_id] = ["scheduled", self._request(record, None)]
        if not destinations(self.destination):
            answer.store = waiting
        return answer

    async def inspect(self, store: Store, command: str, args: Sequence[str] = ()) -> Answer:
        """The answer to ``command`` (one of :data:`COMMANDS`; ``args`` are the ids of
        ``query_task``)."""
        if command == "query_task":
            return await self.query_task(store, args)
        if command not in COMMANDS:
            raise ValueError(f"unknown inspect command {command!r}; one of {', '.join(COMMANDS)}")
        answer: Answer = await getattr(self, command)(store)
        return answer


__all__ = [
    "COMMANDS",
    "STORE_NODE",
    "Answer",
    "Inspector",
    "destinations",
    "is_alive",
    "live_workers",
    "matches",
    "request_of",
    "workflow_arguments",
]
