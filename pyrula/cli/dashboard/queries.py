"""What the dashboard reads from a store: pages of runs, counts, rates, queues, owners.

Everything goes through the public :class:`~pyrula.workflows.stores.base.Store` protocol.
``list_runs`` filters by workflow, status and owner in the store and returns the newest
runs first, at most ``limit``: the dashboard pages by asking for the runs up to the end
of the page (``offset + size + 1``) and filters by worker, time range and search key
itself, over at most :data:`SCAN_LIMIT` runs. The charts read ``ended_runs``, the index
of ended runs by end time, from an hour ago on.

Queues: a run's queue today is its workflow (a worker claims by workflow name), so the
queue table has one row per workflow; :func:`queue_of` is where a run's queue and
priority are read, so a queue or priority column and filter is a change there.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from pyrula.cli import render
from pyrula.workflows.engine.rerun import CHILD
from pyrula.workflows.inspection import is_alive
from pyrula.workflows.records import RunRecord, RunStatus
from pyrula.workflows.stores.base import Store, events_of

T = TypeVar("T")
SCAN_LIMIT = 20_000
"""Runs read at most for a filter the store cannot apply (worker, time range, key)."""
COUNT_LIMIT = 100_000
"""Runs read at most to count them per status; past it a count says ``at least``."""
PAGE_SIZES = (25, 50, 100, 200)
DEFAULT_PAGE_SIZE = 50
WINDOW_S = 3600.0
"""The overview's span: the last hour."""
BUCKET_S = 60.0
"""One bar of the overview's charts: a minute."""
ENDED_PAGE = 2_000
ENDED_LIMIT = 200_000
"""Ended runs read at most for the overview's hour."""
FAILED = frozenset({RunStatus.FAILED, RunStatus.DEAD, RunStatus.TERMINATED})
"""Endings the failure rate counts (a cancel is an operator's choice, not a failure)."""
ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SLEEPING, RunStatus.WAITING)


class QueryError(ValueError):
    """A filter value the dashboard cannot use; the message says which and why."""


@dataclass(frozen=True)
class RunFilter:
    """The runs a page (or a bulk action) selects. Times are epoch seconds."""

    workflow: str | None = None
    status: RunStatus | None = None
    owner: str | None = None
    worker: str | None = None
    since: float | None = None
    until: float | None = None
    search: str | None = None
    """A run id, an idempotency key or a Celery task id (the drop-in's run id)."""

    @property
    def scans(self) -> bool:
        """Whether a filter the store does not apply is set."""
        return bool(self.worker or self.since is not None or self.until is not None)

    def keeps(self, run: RunRecord) -> bool:
        if self.worker and run.worker_id != self.worker:
            return False
        if self.since is not None and run.created_at < self.since:
            return False
        if self.until is not None and run.created_at >= self.until:
            return False
        if self.workflow and run.workflow != self.workflow:
            return False
        if self.status and run.status is not self.status:
            return False
        return self.owner is None or run.owner == self.owner

    def query(self) -> dict[str, str]:
        """The filter as URL query fields (times as epoch seconds)."""
        fields = {
            "workflow": self.workflow,
            "status": self.status.value if self.status else None,
            "owner": self.owner,
            "worker": self.worker,
            "since": None if self.since is None else f"{self.since:g}",
            "until": None if self.until is None else f"{self.until:g}",
            "q": self.search,
        }
        return {k: v for k, v in fields.items() if v is not None}


@dataclass
class RunPage:
    runs: list[RunRecord]
    page: int
    size: int
    has_more: bool
    counts: dict[str, int] | None
    """Runs per status; None while they are being counted."""
    total: int | None
    capped: bool
    """Whether the counts stopped at :data:`COUNT_LIMIT` (or :data:`SCAN_LIMIT`)."""


async def matching_runs(store: Store, selected: RunFilter, limit: int) -> list[RunRecord]:
    """Up to ``limit`` runs the filter selects, newest first."""
    if selected.search:
        return await _search(store, selected)
    wanted = SCAN_LIMIT if selected.scans else limit
    records = await store.list_runs(
        workflow=selected.workflow,
        status=selected.status,
        owner=selected.owner,
        limit=max(wanted, limit),
    )
    return [r for r in records if selected.keeps(r)][:limit]


async def _search(store: Store, selected: RunFilter) -> list[RunRecord]:
    key = selected.search or ""
    run = await store.get_run(key)
    if run is not None:
        return [run] if selected.keeps(run) else []
    listed = await store.list_runs(
        workflow=selected.workflow, status=selected.status, owner=selected.owner, limit=SCAN_LIMIT
    )
    return [r for r in listed if r.idempotency_key == key and selected.keeps(r)]


async def status_counts(store: Store, selected: RunFilter) -> tuple[dict[str, int], bool]:
    """Runs per status among those the filter (its status aside) selects, and whether
    the count stopped at its limit."""
    unfiltered = replace(selected, status=None)
    if unfiltered.search:
        found = await _search(store, unfiltered)
        return dict(Counter(r.status.value for r in found)), False
    limit = SCAN_LIMIT if unfiltered.scans else COUNT_LIMIT
    records = await store.list_runs(
        workflow=unfiltered.workflow, owner=unfiltered.owner, limit=limit
    )
    counts = Counter(r.status.value for r in records if unfiltered.keeps(r))
    return dict(counts), len(records) >= limit


COUNT_MIN_AGE_S = 1.0
COUNT_COST_FACTOR = 10.0
COUNT_CACHE_SIZE = 64


class CostCache:
    """Reads reused while younger than ten times what they cost (at least a second):
    counts and tallies over a large store then take a small share of its time while
    pages stream live, and lag by that much at most."""

    def __init__(self) -> None:
        self._seen: dict[Hashable, tuple[float, float, Any]] = {}
        self._reading: dict[Hashable, asyncio.Task[Any]] = {}

    async def get(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> T:
        hit = self._seen.get(key)
        start = time.monotonic()
        if hit is not None and start - hit[0] < hit[1]:
            found: T = hit[2]
            return found
        value = await read()
        done = time.monotonic()
        age = max(COUNT_MIN_AGE_S, COUNT_COST_FACTOR * (done - start))
        self._seen.pop(key, None)
        self._seen[key] = (done, age, value)
        while len(self._seen) > COUNT_CACHE_SIZE:
            del self._seen[next(iter(self._seen))]
        return value

    def soon(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> T | None:
        """The value as last read, at once, however old (None: never read); a read in
        the background when it is not fresh. A page then never waits for a slow read:
        its live region shows the value when it arrives."""
        hit = self._seen.get(key)
        if hit is not None and time.monotonic() - hit[0] < hit[1]:
            fresh: T = hit[2]
            return fresh
        if key not in self._reading:
            task = asyncio.ensure_future(self.get(key, read))
            self._reading[key] = task
            task.add_done_callback(lambda _: self._reading.pop(key, None))
        stale: T | None = None if hit is None else hit[2]
        return stale

    async def counts(self, store: Store, selected: RunFilter) -> tuple[dict[str, int], bool]:
        key = replace(selected, status=None)
        return await self.get(("counts", key), lambda: status_counts(store, key))

    def counts_soon(self, store: Store, selected: RunFilter) -> tuple[dict[str, int], bool] | None:
        key = replace(selected, status=None)
        return self.soon(("counts", key), lambda: status_counts(store, key))


async def runs_page(
    store: Store,
    selected: RunFilter,
    page: int,
    size: int,
    cache: CostCache | None = None,
    *,
    wait_counts: bool = True,
) -> RunPage:
    """Page ``page`` (from 0) of ``size`` runs, with the counts per status (without
    ``wait_counts``, the counts as last read, None the first time: they arrive later)."""
    end = (page + 1) * size
    records = await matching_runs(store, selected, end + 1)
    if cache is None:
        found: tuple[dict[str, int], bool] | None = await status_counts(store, selected)
    elif wait_counts:
        found = await cache.counts(store, selected)
    else:
        found = cache.counts_soon(store, selected)
    counts, capped = found if found is not None else (None, False)
    total = None
    if counts is not None:
        wanted = selected.status
        total = counts.get(wanted.value, 0) if wanted else sum(counts.values())
    return RunPage(
        runs=records[page * size : end],
        page=page,
        size=size,
        has_more=len(records) > end,
        counts=counts,
        total=total,
        capped=capped,
    )


# -- one run -----------------------------------------------------------------------------
async def run_detail(store: Store, run: RunRecord, now: float) -> dict[str, Any]:
    """The run, its journal as a timeline (each entry with the time since the one before:
    the step's duration, its attempts and error), its parent and its children (the runs
    its journal's ``child`` entries started)."""
    journal = await store.load_journal(run.run_id)
    entries: list[dict[str, Any]] = []
    previous = run.started_at
    for entry in journal:
        shown = render.entry_dict(entry)
        took = None
        if entry.recorded_at and previous is not None:
            took = max(0.0, entry.recorded_at - previous)
        shown["duration_s"] = took
        if entry.recorded_at:
            previous = entry.recorded_at
        entries.append(shown)
    children = []
    for entry in journal:  # a child's start is journaled with its run id as the value
        if entry.kind == CHILD and entry.ok:
            child = await store.get_run(str(json.loads(entry.value)))
            if child is not None:
                children.append(child)
    signals = [e for e in entries if e["kind"] == "signal"]
    return {
        "run": render.run_dict(run, now),
        "journal": entries,
        "children": [_brief(r, now) for r in children],
        "signals": signals,
        "waiting_for_signal": run.wait_signal,
    }


def _brief(run: RunRecord, now: float) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "workflow": run.workflow,
        "status": run.status.value,
        "created_at": render.iso(run.created_at, precise=True),
        "duration_s": render.run_duration(run, now),
    }


# -- overview ----------------------------------------------------------------------------
@dataclass
class Bucket:
    """One minute of the overview."""

    start: float
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    latencies: list[float] = field(default_factory=list)

    @property
    def ended(self) -> int:
        return self.completed + self.failed + self.cancelled

    def as_dict(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        return {
            "start": render.iso(self.start),
            "completed": self.completed,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "failure_rate": (self.failed / self.ended) if self.ended else None,
            "latency_p50_s": _quantile(ordered, 0.5),
            "latency_p95_s": _quantile(ordered, 0.95),
        }


def _quantile(ordered: Sequence[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def ended_since(store: Store, since: float) -> list[RunRecord]:
    """Runs that ended at or after ``since``, in the order they ended."""
    found: list[RunRecord] = []
    cursor: tuple[float, str] | None = (since, "")
    while len(found) < ENDED_LIMIT:
        page = await events_of(store, "the dashboard's overview").ended_runs(cursor, ENDED_PAGE)
        found.extend(page)
        if len(page) < ENDED_PAGE:
            break
        last = page[-1]
        cursor = (last.finished_at or since, last.run_id)
    return found


async def overview(store: Store, now: float, cache: CostCache) -> dict[str, Any]:
    """Per minute of the last hour: runs completed, failed, cancelled, the failure rate
    and the latency (submit to end) p50/p95; and the runs per status now."""
    start = now - WINDOW_S
    first = start - start % BUCKET_S
    buckets = [Bucket(first + i * BUCKET_S) for i in range(int((now - first) // BUCKET_S) + 1)]
    for run in await cache.get("ended-1h", lambda: ended_since(store, start)):
        finished = run.finished_at or now
        index = int((finished - first) // BUCKET_S)
        if not 0 <= index < len(buckets):
            continue
        bucket = buckets[index]
        if run.status is RunStatus.COMPLETED:
            bucket.completed += 1
        elif run.status in FAILED:
            bucket.failed += 1
        else:
            bucket.cancelled += 1
        bucket.latencies.append(max(0.0, finished - run.created_at))
    counts, capped = await cache.counts(store, RunFilter())
    ended = sum(b.ended for b in buckets)
    failed = sum(b.failed for b in buckets)
    every = sorted(x for b in buckets for x in b.latencies)
    return {
        "window_s": WINDOW_S,
        "bucket_s": BUCKET_S,
        "buckets": [b.as_dict() for b in buckets],
        "ended": ended,
        "failed": failed,
        "failure_rate": failed / ended if ended else None,
        "latency_p50_s": _quantile(every, 0.5),
        "latency_p95_s": _quantile(every, 0.95),
        "counts": counts,
        "counts_capped": capped,
    }


# -- queues, owners, workers, dead letters -----------------------------------------------
def queue_of(run: RunRecord) -> str:
    """The queue a run waits in: its workflow's."""
    return run.workflow


async def _active(store: Store, cache: CostCache) -> list[RunRecord]:
    async def read() -> list[RunRecord]:
        runs: list[RunRecord] = []
        for status in ACTIVE:
            runs.extend(await store.list_runs(status=status, limit=COUNT_LIMIT))
        return runs

    return await cache.get("active", read)


async def queues(store: Store, now: float, cache: CostCache) -> list[dict[str, Any]]:
    """Per queue: runs waiting now (due and delayed), running, the oldest due run's
    wait, and runs ended in the last five minutes."""
    rows: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"queued": 0, "delayed": 0, "running": 0, "oldest_wait_s": None, "ended_5m": 0}
    )
    for run in await _active(store, cache):
        row = rows[queue_of(run)]
        if run.status is RunStatus.QUEUED:
            if run.available_at > now:
                row["delayed"] += 1
            else:
                row["queued"] += 1
                waited = now - run.available_at
                row["oldest_wait_s"] = max(row["oldest_wait_s"] or 0.0, waited)
        elif run.status is RunStatus.RUNNING:
            row["running"] += 1
    for run in await cache.get("ended-5m", lambda: ended_since(store, now - 300)):
        rows[queue_of(run)]["ended_5m"] += 1
    return [{"queue": name, **rows[name]} for name in sorted(rows)]


async def owners(store: Store, cache: CostCache) -> list[dict[str, Any]]:
    """Per owner (tenant): runs queued, running, sleeping and waiting."""
    rows: dict[str, Counter[str]] = defaultdict(Counter)
    for run in await _active(store, cache):
        rows[run.owner][run.status.value] += 1
    return [
        {"owner": owner, **{s.value: rows[owner][s.value] for s in ACTIVE}}
        for owner in sorted(rows)
    ]


async def workers(store: Store, now: float, cache: CostCache) -> list[dict[str, Any]]:
    """Every worker the registry lists, alive or not, with what it ended in the last hour
    (read from the runs: the registry keeps liveness and runs in flight only)."""
    ended = await cache.get("ended-1h", lambda: ended_since(store, now - WINDOW_S))
    done: dict[str, Counter[str]] = defaultdict(Counter)
    for run in ended:
        if run.worker_id is None:
            continue
        tally = done[run.worker_id]
        tally["processed"] += 1
        if run.status in FAILED:
            tally["failed"] += 1
        if run.claims > 1:
            tally["retried"] += 1
    rows = []
    for worker in await store.list_workers():
        tally = done[worker.worker_id]
        rows.append(
            {
                "worker_id": worker.worker_id,
                "alive": is_alive(worker, now),
                "workflows": list(worker.workflows),
                "hostname": worker.hostname,
                "pid": worker.pid,
                "running": worker.running,
                "started_at": render.iso(worker.started_at, precise=True),
                "last_seen": render.iso(worker.last_seen, precise=True),
                "last_seen_ago_s": max(0.0, now - worker.last_seen),
                "processed_1h": tally["processed"],
                "failed_1h": tally["failed"],
                "retried_1h": tally["retried"],
            }
        )
    return rows
