"""One claimed run while it executes: the journal, its positions, and fenced writes.

Every durable operation of a workflow (a step, a sleep, a signal wait, a child run)
takes the next journal position when it starts, in program order. If the journal
holds an entry there, the operation replays it (after checking it is the same kind
and name, else the run fails as nondeterministic); otherwise this is a boundary
(cancellation and lost leases take effect here) and the operation runs and appends
its outcome, fenced by the lease token.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyrula.workflows.engine import operations, steps
from pyrula.workflows.engine.control import (
    CancelRequested,
    LeaseGone,
    Nondeterminism,
    refuse_inside_step,
)
from pyrula.workflows.errors import LeaseLost, NondeterminismError, StoreUnavailable
from pyrula.workflows.faults import fault_point
from pyrula.workflows.rate import flow_for
from pyrula.workflows.records import NO_FLOW, JournalEntry, Lease, NewRun
from pyrula.workflows.registry import Registry, WorkflowDefinition, default_registry
from pyrula.workflows.retry import RetryPolicy
from pyrula.workflows.serialization import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    ErrorInfo,
    StoredTraceback,
    decode,
)
from pyrula.workflows.stores.base import Store

log = logging.getLogger("pyrula.workflows.engine")


def _background_flush_done(task: asyncio.Task[None]) -> None:
    # A lost lease or a failed write marked the run (lost); its next boundary acts on it.
    if not task.cancelled() and task.exception() is not None:
        log.debug("deferred journal write failed: %r", task.exception())


STORE_RETRY_INITIAL = 0.05
STORE_RETRY_MAX = 2.0
DURABLE_BACKOFF_AFTER = 5.0
"""Retry backoffs at least this long (seconds) suspend the run on a timer instead of
sleeping in the worker."""


async def call_store(operation: Callable[[], Awaitable[Any]], window: float, what: str) -> Any:
    """Run a store operation, retrying StoreUnavailable with backoff for ``window`` seconds.

    Fenced writes are safe to repeat: a repeated journal write is accepted when identical,
    and a repeated finish is refused (LeaseLost) only if someone else took the run.
    """
    deadline = time.monotonic() + window
    delay = STORE_RETRY_INITIAL
    while True:
        try:
            return await operation()
        except StoreUnavailable as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("%s failed (%s); retrying in %.2fs", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, STORE_RETRY_MAX)


@dataclass(frozen=True)
class ExecutionSettings:
    """How a worker (or the inline runner) executes runs."""

    executor: Executor | None = None
    """Where sync steps run (None: the event loop's default executor)."""
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    store_retry_window: float = 30.0
    """How long a fenced write retries through StoreUnavailable before giving up."""
    durable_backoff_after: float = DURABLE_BACKOFF_AFTER
    registry: Registry = field(default_factory=lambda: default_registry)
    observer: ExecutionObserver | None = None
    """Test hooks (``WorkflowTestEnv``'s crash-point checks); None in production."""


class ExecutionObserver(Protocol):
    """Sees each step attempt and each fenced write; may raise ``Crash`` to kill the run."""

    def step_started(self, execution: RunExecution, name: str, attempt: int) -> None: ...

    async def checkpoint(self, execution: RunExecution, point: str) -> None: ...


class RunExecution:
    """State of one claimed run on this worker."""

    def __init__(
        self,
        store: Store,
        lease: Lease,
        journal: dict[int, JournalEntry],
        settings: ExecutionSettings,
    ) -> None:
        run = lease.run
        self.store = store
        self.run_id = run.run_id
        self.workflow = run.workflow
        self.owner = run.owner
        self.params_text = run.params
        self.token = lease.token
        self.cancel_requested = run.cancel_requested
        self.lost = False
        self.journal = journal
        self.executor = settings.executor
        self.max_payload = settings.max_payload_bytes
        self.durable_backoff_after = settings.durable_backoff_after
        self.registry = settings.registry
        self.observer = settings.observer
        self._store_window = settings.store_retry_window
        self._next_position = 0
        self.failed_steps: dict[int, int] = {}
        """id(exception) -> journal position, for step errors raised into the workflow."""
        self.pending: JournalEntry | None = None
        """The last step's entry, not yet written: see :meth:`defer`."""
        self.running_steps = 0
        self._flushing = asyncio.Lock()

    # -- positions -----------------------------------------------------------------------
    @property
    def is_replaying(self) -> bool:
        """True while the next position already holds an entry."""
        return self._next_position in self.journal

    def reserve(self, count: int = 1) -> int:
        """Take the next ``count`` positions; return the first. Raises StepInsideStep
        from a step's own code (the positions are the workflow function's)."""
        refuse_inside_step("a durable operation (a step, sleep, child run or signal wait)")
        position = self._next_position
        self._next_position += count
        return position

    def recorded(self, position: int, kind: str, name: str) -> JournalEntry | None:
        """The entry at ``position``, checked to be ``kind``/``name``; None if unwritten."""
        entry = self.journal.get(position)
        if entry is not None and (entry.kind != kind or entry.name != name):
            raise Nondeterminism(
                f"run {self.run_id!r} reached {kind} {name!r} at journal position {position}, "
                f"but the journal recorded {entry.kind} {entry.name!r} there; workflow code "
                "between steps must be deterministic (did a deploy change the step order?)"
            )
        return entry

    def check_journal_used(self) -> None:
        """Raise Nondeterminism if the journal holds operations past the last position the
        workflow reached: it ended (returned or raised) before operations an earlier
        execution of the run journaled, as when a deploy removed them from the end.
        (Backoff entries, at negative positions, are a step's own.)"""
        left = sorted(p for p in self.journal if p >= self._next_position)
        if left:
            entry = self.journal[left[0]]
            more = f" and {len(left) - 1} more" if len(left) > 1 else ""
            raise Nondeterminism(
                f"run {self.run_id!r} ended after {self._next_position} journal positions, but "
                f"the journal recorded {entry.kind} {entry.name!r} at position {entry.position}"
                f"{more}: the workflow code no longer reaches operations this run already "
                "journaled (did a deploy remove them? version the workflow name instead)"
            )

    def outcome(self, entry: JournalEntry) -> Any:
        """Return a journaled result, or raise the journaled error."""
        if entry.ok:
            return decode(entry.value)
        info = ErrorInfo.from_json(entry.value)
        error = info.rebuild()
        if info.traceback and error.__cause__ is None:  # the run records the step's own
            error.__cause__ = StoredTraceback(info.traceback)
        self.failed_steps[id(error)] = entry.position
        raise error

    # -- boundaries and writes ----------------------------------------------------------
    def check_boundary(self) -> None:
        """Raise the control signal that applies at a boundary, if any."""
        if self.lost:
            raise LeaseGone()
        if self.cancel_requested:
            raise CancelRequested()

    async def store_now(self) -> float:
        """The store's clock, which decides every durable time."""
        now: float = await call_store(self.store.now, self._store_window, "store time")
        return now

    async def append(self, entry: JournalEntry) -> None:
        """Write ``entry`` fenced by this lease; a lost lease raises LeaseGone."""
        await self.flush()
        await self._write(entry)

    def defer(self, entry: JournalEntry) -> None:
        """Keep a finished step's entry to write with the run's next store write.

        Every step, child, signal, timer and the outcome writes it first (:meth:`fenced`,
        or ``finish_run`` carrying it: :meth:`take_pending`), and if the workflow awaits
        anything else first, it is written as soon as the workflow yields to the event
        loop. A crash in between re-runs the step, as a crash just before an immediate
        write would. What it saves is a round trip for the step a run ends with: the
        outcome carries its entry.
        """
        self.pending = entry
        self.journal[entry.position] = entry
        asyncio.get_running_loop().call_soon(self._flush_if_waiting, entry)

    def _flush_if_waiting(self, entry: JournalEntry) -> None:
        if self.pending is entry:  # the workflow yielded with it still unwritten
            task = asyncio.ensure_future(self.flush())
            task.add_done_callback(_background_flush_done)

    async def flush(self) -> None:
        """Write the deferred entry, if any; wait for a write of it already under way."""
        if self.pending is None and not self._flushing.locked():
            return
        async with self._flushing:
            entry, self.pending = self.pending, None
            if entry is not None:
                await self._write(entry)

    async def take_pending(self) -> JournalEntry | None:
        """The deferred entry, for the outcome to carry (after a write of it under way)."""
        if self._flushing.locked():
            async with self._flushing:
                pass
        entry, self.pending = self.pending, None
        return entry

    async def _write(self, entry: JournalEntry) -> None:
        async def write() -> bool:
            cancel = await self.store.append_journal(self.token, entry)
            fault_point("after_journal_before_reply")
            return cancel

        cancel = await self._fenced(write, f"{entry.kind} {entry.name!r} at {entry.position}")
        if cancel:
            self.cancel_requested = True
        self.journal[entry.position] = entry

    async def fenced(self, operation: Callable[[], Awaitable[Any]], what: str) -> Any:
        """Run a fenced store write (after the deferred entry), translating failures
        into control signals."""
        await self.flush()
        return await self._fenced(operation, what)

    async def _fenced(self, operation: Callable[[], Awaitable[Any]], what: str) -> Any:
        observer = self.observer
        try:
            if observer is not None:
                await observer.checkpoint(self, f"before {what}")
            result = await call_store(operation, self._store_window, what)
            if observer is not None:
                await observer.checkpoint(self, f"after {what}")
            return result
        except LeaseLost:
            self.lost = True
            raise LeaseGone() from None
        except StoreUnavailable as exc:
            # Not the workflow's failure: the store stayed away for a whole lease, so the
            # lease has lapsed too. Abandon the run; the orphan scan hands it on and the
            # next claimant replays the journal (which may already hold this entry).
            log.warning("run %s: %s failed (%s); abandoning the run", self.run_id, what, exc)
            self.lost = True
            raise LeaseGone() from None
        except NondeterminismError as exc:
            raise Nondeterminism(str(exc)) from None

    # -- the operations a WorkflowContext offers ------------------------------------------
    def step_call(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        retry: RetryPolicy | None,
        timeout: float | None,
        takes_context: bool,
    ) -> operations.Operation:
        refuse_inside_step(f"step {name!r}")  # here too: a sync step's call is never awaited
        return operations.Operation(
            self,
            1,
            lambda position: steps.run_step(
                self,
                position,
                name,
                fn,
                args,
                kwargs,
                retry=retry,
                timeout=timeout,
                takes_context=takes_context,
            ),
        )

    def child_call(
        self,
        workflow: str | WorkflowDefinition,
        params: Mapping[str, Any] | None,
        owner: str | None,
    ) -> operations.Operation:
        name, text, definition = operations.child_params(self.registry, workflow, params)

        def new_run(child_id: str) -> NewRun:
            return NewRun(
                run_id=child_id,
                workflow=name,
                params=text,
                owner=self.owner if owner is None else owner,
                parent_run_id=self.run_id,
                flow=flow_for(definition, decode(text)) if definition is not None else NO_FLOW,
            )

        return operations.Operation(
            self, 2, lambda position: operations.run_child(self, position, name, text, new_run)
        )
