"""``@workflow`` and ``@step``."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

from pyrula.workflows.errors import ConfigurationError, WorkflowError
from pyrula.workflows.hard_limits import HardTimeout
from pyrula.workflows.rate import Rate, check_owner_concurrency
from pyrula.workflows.registry import ExpiredHook, Registry, WorkflowDefinition, default_registry
from pyrula.workflows.retry import RetryPolicy

R = TypeVar("R")


@overload
def workflow(fn: Callable[..., Awaitable[Any]]) -> WorkflowDefinition: ...


@overload
def workflow(
    *,
    name: str | None = None,
    registry: Registry | None = None,
    rate_limit: Rate | None = None,
    owner_concurrency: int | None = None,
    on_expired: ExpiredHook | None = None,
) -> Callable[[Callable[..., Awaitable[Any]]], WorkflowDefinition]: ...


def workflow(
    fn: Callable[..., Awaitable[Any]] | None = None,
    *,
    name: str | None = None,
    registry: Registry | None = None,
    rate_limit: Rate | None = None,
    owner_concurrency: int | None = None,
    on_expired: ExpiredHook | None = None,
) -> WorkflowDefinition | Callable[[Callable[..., Awaitable[Any]]], WorkflowDefinition]:
    """Register ``async def f(ctx: WorkflowContext, **params)`` as a workflow.

    ``name`` is what callers submit (default: the function's ``__name__``). It must stay
    the same across deployments: queued runs refer to it.
    Use bare (``@workflow``) or with arguments (``@workflow(name="orders.process")``).
    ``rate_limit`` (a :class:`~pyrula.workflows.rate.Rate`) and ``owner_concurrency`` are
    enforced by the store across every worker; see :mod:`pyrula.workflows.rate`.
    ``on_expired`` (``async def hook(run)``) is awaited in the worker whose claim ended a
    run of the workflow because it was still queued at its ``expires_at``; see
    :attr:`WorkflowDefinition.on_expired`.
    """
    if rate_limit is not None and not isinstance(rate_limit, Rate):
        raise ConfigurationError(f"rate_limit takes a Rate(...), got {rate_limit!r}")
    owner_limit = check_owner_concurrency(owner_concurrency)
    if on_expired is not None and not callable(on_expired):
        raise ConfigurationError(
            f"on_expired takes an async function of the run, got {on_expired!r}"
        )

    def decorate(func: Callable[..., Awaitable[Any]]) -> WorkflowDefinition:
        if not inspect.iscoroutinefunction(func):
            raise ConfigurationError(
                f"@workflow needs an async def function; {func.__qualname__} is not one"
            )
        signature = inspect.signature(func)
        if not signature.parameters:
            raise ConfigurationError(
                f"workflow {func.__qualname__} must take the WorkflowContext as its first "
                "argument: async def f(ctx, **params)"
            )
        workflow_name = name if name is not None else func.__name__
        if not isinstance(workflow_name, str) or not workflow_name.strip():
            raise ConfigurationError("a workflow name must be a non-empty string")
        definition = WorkflowDefinition(
            name=workflow_name,
            fn=func,
            signature=signature,
            rate_limit=rate_limit,
            owner_concurrency=owner_limit,
            on_expired=on_expired,
        )
        (registry or default_registry).register(definition)
        return definition

    if fn is not None:
        return decorate(fn)
    return decorate


class Step:
    """A function decorated with ``@step``; awaiting a call runs it as a journaled step.

    Calling it inside a workflow (``await charge(amount)``) records its outcome under
    ``name`` in the current run's journal; the function itself receives a
    :class:`StepContext` first, then the call's arguments.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        hard: bool = False,
    ) -> None:
        if timeout is not None and timeout <= 0:
            raise ConfigurationError(f"step timeout must be > 0 seconds, got {timeout!r}")
        if hard and timeout is None:
            raise ConfigurationError("step hard=True needs a timeout (seconds)")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError("step retry= takes a RetryPolicy")
        self.fn = fn
        self.name = name if name is not None else fn.__name__
        self.retry = retry
        self.timeout = HardTimeout(timeout) if hard and timeout is not None else timeout
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        from pyrula.workflows.context import current_context

        ctx = current_context()
        if ctx is None:
            raise WorkflowError(
                f"step {self.name!r} was called outside a running workflow; steps run only "
                "inside a @workflow function (call the plain function via .fn to test it)"
            )
        return ctx._run_step(
            self.name,
            self.fn,
            args,
            kwargs,
            retry=self.retry,
            timeout=self.timeout,
            takes_context=True,
        )


@overload
def step(fn: Callable[..., Any]) -> Step: ...


@overload
def step(
    *,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
    hard: bool = False,
) -> Callable[[Callable[..., Any]], Step]: ...


def step(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
    hard: bool = False,
) -> Step | Callable[[Callable[..., Any]], Step]:
    """Make a sync or async function a journaled step: ``@step`` or ``@step(retry=, timeout=)``.

    The function's first argument is a :class:`StepContext` (``attempt`` is 1-based).
    ``timeout`` (seconds) cancels async code; a sync step is not killed (Python cannot
    stop a thread): the engine waits for it and logs an overrun. With ``hard=True``, in
    a pool process (``pyrula worker --processes N``) the process is killed at the
    timeout and the run fails with :class:`~pyrula.workflows.errors.StepTimeout` (no
    retry: the step may have left anything half done); elsewhere it acts as without.
    """
    if fn is not None:
        return Step(fn)

    def decorate(func: Callable[..., Any]) -> Step:
        return Step(func, name=name, retry=retry, timeout=timeout, hard=hard)

    return decorate
