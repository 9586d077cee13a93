"""Projections: keep a read model of your own up to date from the runs that end.

A projection is a function that gets every run that ends, in the order they ended, a
batch at a time, and updates something of yours: a table of order states, counters on
a dashboard, a search index, a webhook::

    @projection(workflows=["checkout"])
    async def order_states(runs: list[RunRecord]) -> None:
        for run in runs:
            await db.upsert(run.run_id, run.status.value, run.result)

Every worker whose process defines it runs its projection loop; a lease lets one worker
at a time deliver a projection's batches (renewed at every look and every third of
its TTL while a batch is being delivered; a worker that dies is replaced after its
``lock_ttl``, as for the runs it held). The projection's place is a cursor in the
store (``Store.get_cursor`` / ``swap_cursor``), moved after each batch the function
returned from: a worker that crashes mid-batch leaves the cursor where it was, and the
batch is delivered again (at least once: write the function so that a repeat is
harmless, an upsert by run id). A function that raises gets the same batch again at
the next look; the projection waits for it (a log line each time), it never skips.

What is delivered: every run that ended (completed, failed, cancelled, terminated,
dead), from the store's ``ended_runs`` feed: when a projection first starts, the ended
runs the store still holds, then each run as it ends. A run that is retried and ends
again is delivered again. A run is delivered once it
ended ``settle`` seconds ago (store time): on a Valkey cluster each node stamps ends
with its own clock, and the wait keeps a run stamped a little in the past from being
passed over. Runs purged (``run_retention``) or expired from the live store of an
``ArchivingStore`` before the projection reached them are not delivered: keep those
longer than a projection may lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import math
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyrula.workflows.errors import ConfigurationError, StoreError
from pyrula.workflows.records import RunRecord
from pyrula.workflows.stores.base import events_of
from pyrula.workflows.triggers import check_name

if TYPE_CHECKING:
    from pyrula.workflows.stores.base import Store
    from pyrula.workflows.worker import WorkflowWorker

log = logging.getLogger("pyrula.workflows.worker")

ProjectionFn = Callable[[list[RunRecord]], Awaitable[None] | None]

DEFAULT_BATCH_SIZE = 100
DEFAULT_SETTLE = 1.0
LEASE_TTL = 30.0
"""Seconds a worker holds a projection after its last look, unless told otherwise (a
worker's projection loop uses its ``lock_ttl``, as for the runs it holds); another
worker takes it over then."""


def cursor_name(name: str) -> str:
    """The store cursor that keeps projection ``name``'s place."""
    return f"projection:{name}"


def lease_name(name: str) -> str:
    """The store cursor that names the worker delivering projection ``name``."""
    return f"projection-lease:{name}"


@dataclass(frozen=True)
class Projection:
    """A function fed the runs that end (see the module docstring).

    * ``workflows``: deliver only runs of these workflows (None: every run);
    * ``batch_size``: runs per call, at most;
    * ``settle``: seconds after its end a run is delivered (store time).
    """

    name: str
    fn: ProjectionFn
    workflows: frozenset[str] | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    settle: float = DEFAULT_SETTLE

    def __post_init__(self) -> None:
        check_name(self.name, "projection name")
        if not callable(self.fn):
            raise ConfigurationError(f"projection {self.name!r} needs a function, got {self.fn!r}")
        size = self.batch_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 10_000:
            raise ConfigurationError(
                f"projection {self.name!r}: batch_size must be an int from 1 to 10000, got {size!r}"
            )
        settle = self.settle
        if (
            isinstance(settle, bool)
            or not isinstance(settle, (int, float))
            or not math.isfinite(settle)
            or settle < 0
        ):
            raise ConfigurationError(
                f"projection {self.name!r}: settle must be a finite number of seconds >= 0, "
                f"got {settle!r}"
            )

    @property
    def cursor_name(self) -> str:
        return cursor_name(self.name)

    @property
    def lease_name(self) -> str:
        return lease_name(self.name)

    async def deliver(self, runs: list[RunRecord]) -> None:
        """Call the function; a plain ``def`` runs in a thread, so that its I/O does not
        hold up the worker's event loop."""
        if inspect.iscoroutinefunction(self.fn):
            await self.fn(runs)
        else:
            result = await asyncio.to_thread(self.fn, runs)
            if inspect.isawaitable(result):
                await result


class ProjectionRegistry:
    """Projections by name (thread-safe). ``default_projections`` is where
    :func:`projection` registers; a worker runs every one in it unless given a list."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, Projection] = {}

    def register(self, item: Projection) -> Projection:
        with self._lock:
            existing = self._by_name.get(item.name)
            if existing is not None and existing.fn is not item.fn:
                raise ConfigurationError(
                    f"projection {item.name!r} is already defined by "
                    f"{getattr(existing.fn, '__qualname__', existing.fn)!r}; pick another name"
                )
            self._by_name[item.name] = item
        return item

    def all(self) -> list[Projection]:
        with self._lock:
            return sorted(self._by_name.values(), key=lambda p: p.name)

    def unregister(self, name: str) -> None:
        with self._lock:
            self._by_name.pop(name, None)


default_projections = ProjectionRegistry()


def projection(
    name: str | None = None,
    *,
    workflows: Iterable[str] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    settle: float = DEFAULT_SETTLE,
    registry: ProjectionRegistry | None = None,
) -> Callable[[ProjectionFn], Projection]:
    """Decorate ``fn(runs: list[RunRecord])`` (async or not) as a projection named
    ``name`` (default: the function's ``__qualname__`` in its module) and register it."""
    if isinstance(workflows, str):
        raise ConfigurationError(f"workflows= takes a list of names, got {workflows!r}")

    def decorate(fn: ProjectionFn) -> Projection:
        item = Projection(
            name=name or f"{fn.__module__}.{fn.__qualname__}",
            fn=fn,
            workflows=None if workflows is None else frozenset(workflows),
            batch_size=batch_size,
            settle=settle,
        )
        return (registry or default_projections).register(item)

    return decorate


def encode_cursor(run: RunRecord) -> str:
    return json.dumps([run.finished_at, run.run_id])


def decode_cursor(text: str | None) -> tuple[float, str] | None:
    if text is None:
        return None
    at, run_id = json.loads(text)
    return float(at), str(run_id)


async def next_delivery_at(store: Store, item: Projection) -> float | None:
    """Store time at which ``item``'s next undelivered run is (or was) ready, None when
    it is caught up (``WorkflowTestEnv`` skips virtual time to it)."""
    events = events_of(store, "projections")
    text = await events.get_cursor(item.cursor_name)
    page = await events.ended_runs(decode_cursor(text), 1)
    if not page:
        return None
    return (page[0].finished_at or 0.0) + item.settle


class ProjectionRunner:
    """Delivers one projection's batches from one store, for one worker."""

    def __init__(
        self, store: Store, item: Projection, worker_id: str, lease_ttl: float = LEASE_TTL
    ) -> None:
        self.store = store
        self.events = events_of(store, "projections")
        self.item = item
        self.worker_id = worker_id
        self.lease_ttl = lease_ttl

    async def hold(self) -> bool:
        """Take or renew this worker's lease on the projection; False if another worker
        holds it."""
        current = await self.events.get_cursor(self.item.lease_name)
        now = await self.store.now()
        if current is not None:
            held: dict[str, Any] = json.loads(current)
            if held.get("worker") != self.worker_id and float(held.get("until", 0)) > now:
                return False
        value = json.dumps({"worker": self.worker_id, "until": now + self.lease_ttl})
        return await self.events.swap_cursor(self.item.lease_name, current, value)

    async def release(self) -> None:
        """Let the lease go (a clean stop), so another worker takes over at once."""
        current = await self.events.get_cursor(self.item.lease_name)
        if current is not None and json.loads(current).get("worker") == self.worker_id:
            await self.events.swap_cursor(self.item.lease_name, current, json.dumps({}))

    async def step(self) -> int:
        """Deliver the next batch, if any run is ready; return how many runs the store
        listed (0: caught up). The caller holds the lease."""
        text = await self.events.get_cursor(self.item.cursor_name)
        page = await self.events.ended_runs(decode_cursor(text), self.item.batch_size)
        if not page:
            return 0
        ripe_before = await self.store.now() - self.item.settle
        page = [run for run in page if (run.finished_at or 0.0) <= ripe_before]
        if not page:
            return 0
        wanted = self.item.workflows
        runs = page if wanted is None else [run for run in page if run.workflow in wanted]
        if runs:
            await self._deliver_holding(runs)
        if not await self.events.swap_cursor(self.item.cursor_name, text, encode_cursor(page[-1])):
            log.warning(
                "projection %r: its cursor moved under worker %s (another worker took the "
                "projection over); the batch may be delivered twice",
                self.item.name,
                self.worker_id,
            )
            return 0
        return len(page)

    async def _deliver_holding(self, runs: list[RunRecord]) -> None:
        """Deliver ``runs``, renewing the lease every third of its TTL meanwhile, so a
        function slower than the TTL is not joined by another worker on the same batch."""
        renewing = asyncio.create_task(self._renew_while_delivering())
        try:
            await self.item.deliver(runs)
        finally:
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)

    async def _renew_while_delivering(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                if not await self.hold():
                    log.warning(
                        "projection %r: worker %s lost its lease while delivering a batch; "
                        "the batch may be delivered twice",
                        self.item.name,
                        self.worker_id,
                    )
                    return
            except StoreError as exc:
                log.warning("projection %r: renewing its lease failed: %s", self.item.name, exc)


async def projection_loop(worker: WorkflowWorker, items: Sequence[Projection]) -> None:
    """Deliver the projections' batches while this worker holds them; look again every
    ``projection_poll_interval`` (at once while a projection has more to deliver)."""
    ttl = worker.options.lock_ttl
    runners = [ProjectionRunner(worker.store, item, worker.worker_id, ttl) for item in items]
    try:
        while True:
            busy = False
            for runner in runners:
                busy = await _look(runner) or busy
            if not busy:
                await worker.wait_stop_or(worker.options.projection_poll_interval)
    finally:
        for runner in runners:
            with contextlib.suppress(StoreError, asyncio.CancelledError):
                await asyncio.shield(runner.release())


async def _look(runner: ProjectionRunner) -> bool:
    """One look at one projection; True when it delivered a full page (more may wait)."""
    try:
        if not await runner.hold():
            return False
        return await runner.step() >= runner.item.batch_size
    except StoreError as exc:
        log.warning("projection %r: %s", runner.item.name, exc)
    except Exception:  # the function raised: the same batch again at the next look
        log.exception("projection %r failed; its batch is delivered again", runner.item.name)
    return False
