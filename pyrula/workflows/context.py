"""WorkflowContext (passed to a workflow) and StepContext (passed to a step)."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyrula.workflows.retry import RetryPolicy

if TYPE_CHECKING:
    from pyrula.workflows.engine.execution import RunExecution

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
        self.logger = logging.getLogger(f"pyrula.workflow.{execution.workflow}")

    @property
    def is_replaying(self) -> bool:
        """True while the workflow is re-reading steps already in the journal."""
        return self._execution.is_replaying

    async def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` as the journaled step ``name`` and return its result.

        ``fn`` may be sync (run in a thread, off the event loop) or async. On replay the
        journaled result is returned (or the journaled error raised) without calling it.
        The result must be JSON; what is returned is the JSON round-trip of it, the same
        value a replay returns.
        """
        return await self._run_step(
            name, fn, args, kwargs, retry=retry, timeout=timeout, takes_context=False
        )

    async def _run_step(
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
        return await self._execution.run_step(
            name, fn, args, kwargs, retry=retry, timeout=timeout, takes_context=takes_context
        )


def bind_context(ctx: WorkflowContext) -> contextvars.Token[WorkflowContext | None]:
    return _current.set(ctx)


def unbind_context(token: contextvars.Token[WorkflowContext | None]) -> None:
    _current.reset(token)
