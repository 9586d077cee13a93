"""pyrula.workflows: durable workflows whose steps are journaled and survive worker crashes.

A workflow is ``async def f(ctx, **params)`` decorated with :func:`workflow`; each side
effect inside it is a step (:func:`step` or ``await ctx.step(name, fn)``) whose outcome is
journaled in a :class:`Store`. A run whose worker dies is claimed by another worker, which
replays the finished steps from the journal and runs the rest.
"""

from typing import TYPE_CHECKING, Any

from pyrula.workflows.client import RunHandle, WorkflowClient
from pyrula.workflows.context import StepContext, WorkflowContext
from pyrula.workflows.decorators import Step, step, workflow
from pyrula.workflows.engine.inline import InlineWorkflowRunner
from pyrula.workflows.errors import (
    ArchiveSchemaMismatch,
    ConfigurationError,
    DurableInvocationError,
    Fatal,
    IdempotencyConflict,
    InvalidParams,
    InvalidRunState,
    InvalidSchedule,
    LeaseLost,
    NondeterminismError,
    NotJSONSerializable,
    PayloadError,
    PayloadTooLarge,
    Poison,
    PyrulaError,
    ResultTimeout,
    RunCancelled,
    RunDeadLettered,
    RunExpired,
    RunNotFound,
    ScheduleError,
    ScheduleExists,
    ScheduleNotFound,
    SignalTimeout,
    StepError,
    StepInsideStep,
    StepRaisedCancelledError,
    StepTimeout,
    StoreError,
    StoreUnavailable,
    Transient,
    UnknownWorkflow,
    WorkflowError,
)
from pyrula.workflows.options import WorkerOptions
from pyrula.workflows.projections import Projection, projection
from pyrula.workflows.rate import Rate
from pyrula.workflows.records import RunRecord, RunStatus
from pyrula.workflows.registry import WorkflowDefinition
from pyrula.workflows.retry import RetryPolicy
from pyrula.workflows.schedules import Schedule
from pyrula.workflows.stores import open_store
from pyrula.workflows.stores.archive import ArchivingStore, PostgresArchive
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.memory import MemoryStore
from pyrula.workflows.stores.sqlite import SqliteStore
from pyrula.workflows.triggers import BatchTrigger, batch_trigger
from pyrula.workflows.worker import WorkflowWorker

if TYPE_CHECKING:
    from pyrula.workflows.stores.valkey import ValkeyStore


def __getattr__(name: str) -> Any:
    # ValkeyStore is imported on first use, so that `import pyrula.workflows` does not
    # import valkey-py for a project on SQLite or the memory store.
    if name == "ValkeyStore":
        from pyrula.workflows.stores.valkey import ValkeyStore

        return ValkeyStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ArchiveSchemaMismatch",
    "ArchivingStore",
    "BatchTrigger",
    "ConfigurationError",
    "DurableInvocationError",
    "Fatal",
    "IdempotencyConflict",
    "InlineWorkflowRunner",
    "InvalidParams",
    "InvalidRunState",
    "InvalidSchedule",
    "LeaseLost",
    "MemoryStore",
    "NondeterminismError",
    "NotJSONSerializable",
    "PayloadError",
    "PayloadTooLarge",
    "Poison",
    "PostgresArchive",
    "Projection",
    "PyrulaError",
    "Rate",
    "ResultTimeout",
    "RetryPolicy",
    "RunCancelled",
    "RunDeadLettered",
    "RunExpired",
    "RunHandle",
    "RunNotFound",
    "RunRecord",
    "RunStatus",
    "Schedule",
    "ScheduleError",
    "ScheduleExists",
    "ScheduleNotFound",
    "SignalTimeout",
    "SqliteStore",
    "Step",
    "StepContext",
    "StepError",
    "StepInsideStep",
    "StepRaisedCancelledError",
    "StepTimeout",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "Transient",
    "UnknownWorkflow",
    "ValkeyStore",
    "WorkerOptions",
    "WorkflowClient",
    "WorkflowContext",
    "WorkflowDefinition",
    "WorkflowError",
    "WorkflowWorker",
    "batch_trigger",
    "open_store",
    "projection",
    "step",
    "workflow",
]
