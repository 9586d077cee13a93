"""Workflow definitions by name.

``default_registry`` is where ``@workflow`` registers; a worker serves every workflow in
it unless given an explicit list. A second definition under a taken name from a different
function is refused, so two modules can't silently shadow each other.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyrula.workflows.errors import ConfigurationError, InvalidParams, UnknownWorkflow

if TYPE_CHECKING:
    from pyrula.workflows.rate import Rate
    from pyrula.workflows.records import RunRecord

WorkflowFn = Callable[..., Awaitable[Any]]
ExpiredHook = Callable[["RunRecord"], Awaitable[None]]
"""``on_expired``: called with a run of the workflow a claim ended because its
``expires_at`` had passed (see :class:`WorkflowDefinition`)."""


@dataclass(frozen=True)
class WorkflowDefinition:
    """A registered workflow: its name and its ``async def f(ctx, **params)``."""

    name: str
    fn: WorkflowFn
    signature: inspect.Signature = field(compare=False)
    rate_limit: Rate | None = None
    owner_concurrency: int | None = None
    on_expired: ExpiredHook | None = field(default=None, compare=False)
    """Awaited in the worker whose claim found a queued run of this workflow past its
    ``expires_at`` and ended it (``cancelled``, with a ``RunExpired`` error) instead of
    starting it: with the run as it ended, once per run (the store reports each to the
    one claim that ended it), on the worker's event loop, before its next claim. What it
    raises is logged. The Celery drop-in sends ``task_revoked(expired=True)`` from it."""

    def check_params(self, params: Mapping[str, Any]) -> None:
        """Raise InvalidParams when ``params`` don't fit the function's signature."""
        try:
            self.signature.bind(None, **params)
        except TypeError as exc:
            raise InvalidParams(
                f"params for workflow {self.name!r} don't fit "
                f"{self.fn.__qualname__}{self.signature}: {exc}{self._unknown(params, exc)}"
            ) from None

    def _unknown(self, params: Mapping[str, Any], exc: TypeError) -> str:
        """The names in ``params`` the function does not take, when ``exc`` (which stops
        at its first complaint) does not say so already: all of them, at once."""
        taken = list(self.signature.parameters.values())[1:]  # after ctx
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in taken):
            return ""
        names = [p.name for p in taken if p.kind is not inspect.Parameter.VAR_POSITIONAL]
        unknown = [name for name in params if name not in names]
        if not unknown or all(repr(name) in str(exc) for name in unknown):
            return ""
        listed = ", ".join(map(repr, unknown))
        return f" (and it takes no {listed}: its params are {', '.join(names) or 'none'})"

    def __call__(self, ctx: Any, **params: Any) -> Awaitable[Any]:
        return self.fn(ctx, **params)


class Registry:
    """A thread-safe map of workflow name to definition."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, WorkflowDefinition] = {}

    def register(self, definition: WorkflowDefinition) -> None:
        with self._lock:
            existing = self._by_name.get(definition.name)
            if existing is not None and not _same_function(existing.fn, definition.fn):
                raise ConfigurationError(
                    f"workflow name {definition.name!r} is already registered by "
                    f"{existing.fn.__module__}.{existing.fn.__qualname__}; pick another name"
                )
            self._by_name[definition.name] = definition

    def get(self, name: str) -> WorkflowDefinition:
        with self._lock:
            definition = self._by_name.get(name)
        if definition is None:
            raise UnknownWorkflow(
                f"no workflow named {name!r} is registered in this process; import the "
                "module that defines it (registered: "
                f"{', '.join(sorted(self._by_name)) or 'none'})"
            )
        return definition

    def find(self, name: str) -> WorkflowDefinition | None:
        with self._lock:
            return self._by_name.get(name)

    def all(self) -> list[WorkflowDefinition]:
        with self._lock:
            return list(self._by_name.values())


def _same_function(a: WorkflowFn, b: WorkflowFn) -> bool:
    # A module imported twice (as __main__ and by name) defines equal functions twice.
    return a is b or (
        a.__qualname__ == b.__qualname__
        and a.__code__.co_filename == getattr(getattr(b, "__code__", None), "co_filename", None)
    )


default_registry = Registry()
