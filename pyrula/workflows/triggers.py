"""Batch triggers: events go into a durable buffer; a run takes them a batch at a time.

A :class:`BatchTrigger` names a buffer and the workflow its batches start. Clients
append events (``WorkflowClient.send_events``); every worker that serves the workflow
runs the trigger loop (:mod:`pyrula.workflows.triggering`), which starts one run per
batch: as soon as ``max_size`` events are waiting, or when the oldest has waited
``max_wait`` seconds. The run gets the events' values, oldest first, as its ``events``
parameter (another name with ``param=``)::

    @workflow
    async def index_documents(ctx, events: list[dict]) -> int: ...

    batch_trigger("documents", index_documents, max_size=500, max_wait=5.0)

    await client.send_events("documents", [{"id": 1}, {"id": 2}])

Every event is in exactly one run, with any number of workers: a batch's run has an id
and an idempotency key derived from the trigger and the batch's first event, and the
events leave the buffer only after that run exists (``Store.consume_events`` is a
compare-and-set on the oldest event). This is Celery's ``celery-batches`` (``Batches``
tasks with ``flush_every`` / ``flush_interval``), durable: a crashed worker loses no
buffered event and runs no batch twice.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from pyrula.workflows.errors import ConfigurationError
from pyrula.workflows.registry import WorkflowDefinition

MAX_NAME_LENGTH = 200
DEFAULT_MAX_SIZE = 100
DEFAULT_MAX_WAIT = 10.0
MAX_BATCH_SIZE = 10_000


def check_name(name: object, what: str = "trigger name") -> str:
    """``name`` if it can name a trigger (or a projection) in every store: a non-empty
    string of at most 200 characters of valid UTF-8 text without control characters;
    else ConfigurationError saying why."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"{what} must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigurationError(
            f"{what} {name[:40]!r}... is {len(name)} characters; at most {MAX_NAME_LENGTH}"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ConfigurationError(f"{what} {name!r} holds a control character")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(f"{what} {name!r} is not valid UTF-8 text") from None
    return name


@dataclass(frozen=True)
class BatchTrigger:
    """A durable event buffer whose batches start runs of ``workflow``.

    * ``max_size``: events per run, at most; a run starts as soon as this many wait.
    * ``max_wait``: seconds the oldest waiting event waits at most (measured on the
      store's clock); then a run starts with what is there.
    * ``param``: the workflow parameter the list of events is passed as.
    """

    name: str
    workflow: str
    max_size: int = DEFAULT_MAX_SIZE
    max_wait: float = DEFAULT_MAX_WAIT
    param: str = "events"

    def __post_init__(self) -> None:
        check_name(self.name)
        check_name(self.workflow, "workflow name")
        check_name(self.param, "param")
        size = self.max_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_BATCH_SIZE:
            raise ConfigurationError(
                f"trigger {self.name!r}: max_size must be an int from 1 to {MAX_BATCH_SIZE}, "
                f"got {size!r}"
            )
        wait = self.max_wait
        if (
            isinstance(wait, bool)
            or not isinstance(wait, (int, float))
            or not math.isfinite(wait)
            or wait < 0
        ):
            raise ConfigurationError(
                f"trigger {self.name!r}: max_wait must be a finite number of seconds >= 0, "
                f"got {wait!r}"
            )
        object.__setattr__(self, "max_wait", float(wait))


class TriggerRegistry:
    """Batch triggers by name (thread-safe). ``default_triggers`` is where
    :func:`batch_trigger` registers; a worker runs those of the workflows it serves."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, BatchTrigger] = {}

    def register(self, trigger: BatchTrigger) -> BatchTrigger:
        with self._lock:
            existing = self._by_name.get(trigger.name)
            if existing is not None and existing != trigger:
                raise ConfigurationError(
                    f"trigger {trigger.name!r} is already defined as {existing}; a trigger "
                    "name holds one definition per process (pick another name)"
                )
            self._by_name[trigger.name] = trigger
        return trigger

    def find(self, name: str) -> BatchTrigger | None:
        with self._lock:
            return self._by_name.get(name)

    def all(self) -> list[BatchTrigger]:
        with self._lock:
            return sorted(self._by_name.values(), key=lambda t: t.name)

    def unregister(self, name: str) -> None:
        with self._lock:
            self._by_name.pop(name, None)


default_triggers = TriggerRegistry()


def batch_trigger(
    name: str,
    workflow: str | WorkflowDefinition,
    *,
    max_size: int = DEFAULT_MAX_SIZE,
    max_wait: float = DEFAULT_MAX_WAIT,
    param: str = "events",
    registry: TriggerRegistry | None = None,
) -> BatchTrigger:
    """Define (and register) a batch trigger: see the module docstring.

    ``workflow`` is a ``@workflow`` function or a workflow name; a function is checked to
    take ``param`` (``events``) as a keyword. Registered in ``default_triggers`` unless
    another ``registry`` is given.
    """
    if isinstance(workflow, WorkflowDefinition):
        params = workflow.signature.parameters
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
        if param not in params and not takes_kwargs:
            raise ConfigurationError(
                f"trigger {name!r}: workflow {workflow.name!r} has no parameter {param!r} "
                f"to receive the batch ({workflow.fn.__qualname__}{workflow.signature}); "
                f"add it, or pass param= the parameter's name"
            )
        workflow = workflow.name
    trigger = BatchTrigger(
        name=name, workflow=workflow, max_size=max_size, max_wait=max_wait, param=param
    )
    return (registry or default_triggers).register(trigger)
