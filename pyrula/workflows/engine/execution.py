"""One claimed run while it executes: the journal cursor and the step protocol.

For each step call, in order: if the journal holds an entry at this position, check
that it is the same step (else the run fails as nondeterministic) and return its
recorded result or raise its recorded error; otherwise this is a step boundary
(cancellation and lost leases take effect here), then the step runs under its retry
policy and its final outcome is appended to the journal, fenced by the lease token.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

from pyrula.workflows.context import StepContext
from pyrula.workflows.engine.control import CancelRequested, LeaseGone, Nondeterminism
from pyrula.workflows.errors import (
    LeaseLost,
    NondeterminismError,
    PayloadError,
    StoreUnavailable,
)
from pyrula.workflows.faults import fault_point
from pyrula.workflows.records import JournalEntry, Lease
from pyrula.workflows.retry import RetryPolicy
from pyrula.workflows.serialization import ErrorInfo, decode, encode
from pyrula.workflows.stores.base import Store

log = logging.getLogger("pyrula.workflows.engine")

DEFAULT_STEP_RETRY = RetryPolicy()
"""Used by steps that don't name a policy: 3 attempts, 1 s then 2 s backoff."""

STORE_RETRY_INITIAL = 0.05
STORE_RETRY_MAX = 2.0


class StepTimeout(TimeoutError):
    """An async step ran longer than its ``timeout`` and was cancelled."""


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


async def _guarded(awaitable: Awaitable[Any]) -> tuple[bool, Any]:
    """Await user code, turning any exception (even SystemExit) into a value.

    Only cancellation of this task passes through, so a step can never stop the loop.
    """
    try:
        return True, await awaitable
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        return False, exc


class RunExecution:
    """State of one claimed run on this worker."""

    def __init__(
        self,
        store: Store,
        lease: Lease,
        journal: list[JournalEntry],
        *,
        executor: Executor | None,
        max_payload_bytes: int,
        store_retry_window: float,
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
        self._journal = journal
        self._position = 0
        self._executor = executor
        self._max_payload = max_payload_bytes
        self._store_window = store_retry_window

    @property
    def is_replaying(self) -> bool:
        return self._position < len(self._journal)

    def check_boundary(self) -> None:
        """Raise the control signal that applies at a step boundary, if any."""
        if self.lost:
            raise LeaseGone()
        if self.cancel_requested:
            raise CancelRequested()

    async def run_step(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        retry: RetryPolicy | None,
        timeout: float | None,
        takes_context: bool,
    ) -> Any:
        position = self._position
        self._position += 1
        if position < len(self._journal):
            return self._replay(self._journal[position], name)
        self.check_boundary()
        policy = retry or DEFAULT_STEP_RETRY
        attempt = 1
        while True:
            fault_point("step_started")
            call_args = args
            if takes_context:
                step_ctx = StepContext(
                    run_id=self.run_id,
                    workflow=self.workflow,
                    step=name,
                    position=position,
                    attempt=attempt,
                    max_attempts=policy.max_attempts,
                )
                call_args = (step_ctx, *args)
            ok, value = await self._call(name, fn, call_args, kwargs, timeout)
            if ok:
                try:
                    text = encode(
                        value, what=f"result of step {name!r}", max_bytes=self._max_payload
                    )
                    break
                except PayloadError as exc:
                    # The step ran and its effects happened: retrying would repeat them
                    # only to return the same unstorable value. Fail the step now.
                    ok, value = False, exc
                    text = ErrorInfo.from_exception(value).to_json()
                    break
            if not policy.should_retry(value, attempt):
                text = ErrorInfo.from_exception(value).to_json()
                break
            delay = policy.backoff(attempt)
            log.warning(
                "run %s step %r attempt %d failed (%s: %s); retrying in %.2fs",
                self.run_id,
                name,
                attempt,
                type(value).__name__,
                value,
                delay,
            )
            await asyncio.sleep(delay)
            self.check_boundary()
            attempt += 1
        fault_point("after_step_before_journal")
        entry = JournalEntry(
            run_id=self.run_id,
            position=position,
            kind="step",
            name=name,
            ok=ok,
            value=text,
            attempts=attempt,
        )
        await self.append(entry)
        if ok:
            return decode(text)
        raise value

    def _replay(self, entry: JournalEntry, name: str) -> Any:
        if entry.kind != "step" or entry.name != name:
            raise Nondeterminism(
                f"run {self.run_id!r} replayed step {name!r} at position {entry.position}, "
                f"but the journal recorded {entry.kind} {entry.name!r} there; workflow code "
                "between steps must be deterministic (a deploy changed the step order?)"
            )
        if entry.ok:
            return decode(entry.value)
        raise ErrorInfo.from_json(entry.value).rebuild()

    async def _call(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None,
    ) -> tuple[bool, Any]:
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - async callables
        ):
            try:
                return await asyncio.wait_for(_guarded(fn(*args, **kwargs)), timeout)
            except asyncio.TimeoutError:
                return False, StepTimeout(f"step {name!r} did not finish within {timeout}s")
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        ok, value = await _guarded(loop.run_in_executor(self._executor, call))
        if ok and inspect.isawaitable(value):
            ok, value = await _guarded(value)  # a sync callable that returned a coroutine
        elapsed = time.monotonic() - started
        if timeout is not None and elapsed > timeout:
            log.warning(
                "run %s sync step %r took %.1fs, over its %.1fs timeout; sync steps are never "
                "killed, so its outcome stands",
                self.run_id,
                name,
                elapsed,
                timeout,
            )
        return ok, value

    async def append(self, entry: JournalEntry) -> None:
        """Write ``entry`` fenced by this lease; a lost lease raises LeaseGone."""

        async def write() -> bool:
            cancel = await self.store.append_journal(self.token, entry)
            fault_point("after_journal_before_reply")
            return cancel

        try:
            cancel = await call_store(write, self._store_window, f"journal write for {self.run_id}")
        except LeaseLost:
            self.lost = True
            raise LeaseGone() from None
        except StoreUnavailable as exc:
            # Not the workflow's failure: the store stayed away for a whole lease, so the
            # lease has lapsed too. Abandon the run; the orphan scan hands it on and the
            # next claimant replays the journal (which may already hold this entry).
            log.warning("run %s: journal write failed (%s); abandoning the run", self.run_id, exc)
            self.lost = True
            raise LeaseGone() from None
        except NondeterminismError as exc:
            raise Nondeterminism(str(exc)) from None
        if cancel:
            self.cancel_requested = True
        self._journal.append(entry)
