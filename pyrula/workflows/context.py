"""WorkflowContext (passed to a workflow) and StepContext (passed to a step)."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyrula.workflows.engine import operations as ops
from pyrula.workflows.errors import InvalidParams, WorkflowError
from pyrula.workflows.retry import RetryPolicy

if TYPE_CHECKING:
    from pyrula.workflows.engine.execution import RunExecution
    from pyrula.workflows.registry import WorkflowDefinition

_current: contextvars.ContextVar[WorkflowContext | None] = contextvars.ContextVar(
    "pyrula_workflow_context", default=None
)


def current_context() -> WorkflowContext | None:
    """The context of the workflow running in this task, if any."""
    return _current.get()


@dataclass(frozen=True)
class StepContext:
    """What a step function receives first.

    ``attempt`` is 1-based: 1 on the first try, 2 on the first retry.
    """

    run_id: str
    workflow: str
    step: str
    position: int
    attempt: int
    max_attempts: int
    token: int = 0
    """The run's fencing token: larger on every claim. Pass it to external systems that
    can refuse writes from an older claimant."""
    reporter: Callable[[str, Any], None] | None = field(default=None, repr=False, compare=False)

    def set_progress(self, state: str, info: Any = None) -> None:
        """Publish a custom state (e.g. ``"PROGRESS"``) and JSON ``info`` on the run's
        record, visible to every reader (``RunRecord.progress_state/progress_info``).

        From a sync step (a worker thread) it returns once written; from an async step it
        is written in the background, in order.
        """
        if not isinstance(state, str) or not state:
            raise InvalidParams("a progress state must be a non-empty string")
        if self.reporter is None:
            raise WorkflowError("this StepContext is not attached to a running step")
        self.reporter(state, info)


class WorkflowContext:
    """A workflow's handle on the engine. Its first argument: ``async def f(ctx, **params)``.

    Everything with a side effect must go through :meth:`step` (or an ``@step`` function),
    so that it is journaled and not repeated when the run is replayed on another worker.
    Code between steps runs again on every replay and must be deterministic.
    """

    def __init__(self, execution: RunExecution) -> None:
        self._execution = execution
        self.run_id: str = execution.run_id
        self.workflow: str = execution.workflow
        self.owner: str = execution.owner
        self._logger: logging.Logger | None = None

    @property
    def logger(self) -> logging.Logger:
        """The logger ``pyrula.workflow.<workflow name>`` (looked up on first use)."""
        if self._logger is None:
            self._logger = logging.getLogger(f"pyrula.workflow.{self.workflow}")
        return self._logger

    @logger.setter
    def logger(self, value: logging.Logger) -> None:
        self._logger = value

    @property
    def is_replaying(self) -> bool:
        """True while the workflow is re-reading steps already in the journal."""
        return self._execution.is_replaying

    @property
    def lease_lost(self) -> bool:
        """True once this worker has lost the run's lease: the run was terminated, or
        taken over by another worker after this one stalled (or the store stayed away for
        a whole lease). The run then stops on this worker: a refused write raises
        ``LeaseGone``, or a lease renewal cancels its task. False while the lease is
        held, and when the worker stops the run itself (shutdown) or it is cancelled."""
        return self._execution.lost

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Awaitable[Any]:
        """Run ``fn(*args, **kwargs)`` as the journaled step ``name``; await the result.

        ``fn`` may be sync (run in a thread, off the event loop) or async. On replay the
        journaled result is returned (or the journaled error raised) without calling it.
        The result must be JSON; what is returned is the JSON round-trip of it, the same
        value a replay returns.
        """
        return self._run_step(
            name, fn, args, kwargs, retry=retry, timeout=timeout, takes_context=False
        )

    def _run_step(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        retry: RetryPolicy | None,
        timeout: float | None,
        takes_context: bool,
    ) -> Awaitable[Any]:
        return self._execution.step_call(
            name, fn, args, kwargs, retry=retry, timeout=timeout, takes_context=takes_context
        )

    async def sleep(self, duration: float | timedelta, *, name: str = "sleep") -> None:
        """Sleep durably: the run is suspended, its worker freed, and a timer wakes it.

        The wake time is journaled when the sleep is first reached, so a replay after a
        crash sleeps only what is left.
        """
        seconds = ops.seconds_of(duration, "ctx.sleep")
        await ops.sleep_until(self._execution, None, seconds, name)

    async def sleep_until(self, when: datetime, *, name: str = "sleep") -> None:
        """Sleep durably until ``when`` (an aware datetime)."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise InvalidParams(f"ctx.sleep_until needs an aware datetime, got {when!r}")
        await ops.sleep_until(self._execution, when.timestamp(), 0.0, name)

    async def now(self) -> datetime:
        """The store's current time (UTC), journaled so that replays see the same value."""
        return await ops.now(self._execution)

    async def wait_for_signal(self, name: str, *, timeout: float | timedelta | None = None) -> Any:
        """Wait for ``handle.signal(name, payload)`` and return the payload.

        A signal sent before the run gets here is kept and returned at once. Each signal
        is consumed once. The run is suspended (its worker freed) while it waits.
        Raises :class:`~pyrula.workflows.errors.SignalTimeout` after ``timeout``.
        """
        seconds = None if timeout is None else ops.seconds_of(timeout, "timeout")
        return await ops.wait_for_signal(self._execution, name, seconds)

    def run_child(
        self,
        workflow: str | WorkflowDefinition,
        params: Mapping[str, Any] | None = None,
        *,
        owner: str | None = None,
    ) -> Awaitable[Any]:
        """Start a child run (any worker may take it) and await its result.

        The parent is suspended until the child ends; its error is raised as
        :class:`~pyrula.workflows.errors.DurableInvocationError`, a cancellation as
        :class:`~pyrula.workflows.errors.RunCancelled`. Cancelling or terminating the
        parent does the same to the child.
        """
        return self._execution.child_call(workflow, params, owner)

    async def gather(
        self, *operations: Awaitable[Any], return_exceptions: bool = False
    ) -> list[Any]:
        """Run step calls and child runs concurrently; results in argument order.

        Journal positions are taken in argument order, so replays match. Each argument
        is one step call (``ctx.step(...)`` or an ``@step`` function's call) or one
        ``ctx.run_child(...)``; run a branch of several steps as a child workflow.
        """
        return await ops.gather(tuple(operations), return_exceptions)


def bind_context(ctx: WorkflowContext) -> contextvars.Token[WorkflowContext | None]:
    return _current.set(ctx)


def unbind_context(token: contextvars.Token[WorkflowContext | None]) -> None:
    _current.reset(token)
