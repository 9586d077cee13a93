"""Every error pyrula raises, in one tree.

::

    PyrulaError
    ├── ConfigurationError          bad settings, caught at construction or decoration time
    ├── StoreError
    │   ├── StoreUnavailable        the store cannot be reached or lost its data
    │   ├── RunNotFound             no run with that id
    │   ├── IdempotencyConflict     a key reused with different params or workflow
    │   ├── InvalidRunState         the operation does not apply to the run's current status
    │   ├── LeaseLost               a write carried a stale fencing token
    │   └── ArchiveSchemaMismatch   the Postgres archive's schema is missing or another version's
    ├── PayloadError                params or a result that cannot be stored
    │   ├── NotJSONSerializable     not JSON (names the offending path)
    │   └── PayloadTooLarge         over the configured maximum
    ├── WorkflowError
    │   ├── UnknownWorkflow         no workflow registered under that name
    │   ├── InvalidParams           params that do not fit the workflow's signature
    │   ├── NondeterminismError     a replay reached a different step than the journal recorded
    │   └── StepInsideStep          a durable operation was called from inside a step
    ├── DurableInvocationError      a run ended in failure; carries the original error
    ├── ScheduleError
    │   ├── InvalidSchedule         a cron expression, interval or timezone that can't work
    │   ├── ScheduleExists          that schedule id is taken
    │   └── ScheduleNotFound        no schedule with that id
    ├── SignalTimeout               wait_for_signal's timeout elapsed (also a TimeoutError)
    ├── StepTimeout                 an async step overran its timeout (also a TimeoutError)
    ├── StepRaisedCancelledError    a step raised CancelledError while not being cancelled
    ├── RunCancelled                the run was cancelled or terminated
    ├── RunDeadLettered             the run kept killing its workers
    ├── RunExpired                  the run was still queued at its expiry time
    └── ResultTimeout               ``result(timeout=)`` elapsed (also a ``TimeoutError``)

    StepError                       base of the classification errors raised by user code:
    ├── Transient                   always retried (within the policy's attempts)
    ├── Poison                      never retried: the input is bad
    └── Fatal                       never retried: the failure is unrecoverable
"""

from __future__ import annotations


class PyrulaError(Exception):
    """Root of every error pyrula raises on its own account."""


class ConfigurationError(PyrulaError, ValueError):
    """A setting or a decoration is invalid. Raised early, never at run time."""


class StoreError(PyrulaError):
    """A store operation could not be carried out."""


class StoreUnavailable(StoreError):
    """The store cannot be reached, or it lost its data. The message names the URL."""


class RunNotFound(StoreError, LookupError):
    """No run exists with the given id."""


class IdempotencyConflict(StoreError):
    """An idempotency key was reused with a different workflow or different params."""


class InvalidRunState(StoreError):
    """The operation does not apply to the run in its current status."""


class LeaseLost(StoreError):
    """A journal or outcome write carried a fencing token that is no longer current.

    The run was reclaimed by another worker (or terminated); the writer must stop
    working on it and discard what it computed.
    """


class ArchiveSchemaMismatch(StoreError):
    """The Postgres archive has no pyrula schema, or one that another pyrula version
    migrated. The message says what to do: run ``pyrula db migrate``, or, for another
    version's schema, recreate the database and migrate it again (there is no upgrade
    path between versions)."""


class PayloadError(PyrulaError, ValueError):
    """A payload cannot be stored."""


class NotJSONSerializable(PayloadError, TypeError):
    """A value is not plain JSON. ``path`` names where, e.g. ``params['items'][2]``."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class PayloadTooLarge(PayloadError):
    """An encoded payload is larger than the configured maximum."""


class WorkflowError(PyrulaError):
    """A problem with a workflow definition or its invocation."""


class UnknownWorkflow(WorkflowError, LookupError):
    """No workflow is registered under that name."""


class InvalidParams(WorkflowError, TypeError):
    """Params do not fit the workflow function's signature."""


class NondeterminismError(WorkflowError):
    """Replay reached a different step than the journal recorded at that position."""


class StepInsideStep(WorkflowError):
    """A step (or another durable operation: a sleep, a child, a signal wait) was called
    from inside a running step. Only the workflow function may call them: a step's own
    code is not journaled, so a replay could not find them again. Never retried."""


class RunCancelled(PyrulaError):
    """The run was cancelled or terminated before it finished."""

    def __init__(self, message: str, status: str = "cancelled") -> None:
        super().__init__(message)
        self.status = status


class ResultTimeout(PyrulaError, TimeoutError):
    """``result(timeout=...)`` returned before the run finished."""


class DurableInvocationError(PyrulaError):
    """A run failed. Carries the original exception's type, message and traceback text.

    ``error_type`` is the qualified name (``module.QualName``), ``error_message`` the
    original message, ``remote_traceback`` the formatted traceback from the worker.
    ``original`` is the rebuilt exception when its class could be imported, else None.
    """

    def __init__(
        self,
        message: str,
        *,
        error_type: str,
        error_message: str,
        remote_traceback: str,
        original: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.error_message = error_message
        self.remote_traceback = remote_traceback
        self.original = original


class StepError(Exception):
    """Base of the errors user code raises to say how a failure should be treated."""


class Transient(StepError):
    """A temporary failure: always retried, up to the step's ``max_attempts``."""


class Poison(StepError):
    """The input can never succeed: not retried, the step fails at once."""


class Fatal(StepError):
    """An unrecoverable failure: not retried, the step fails at once (the workflow sees
    the error and, unless it catches it, the run fails)."""


class RunDeadLettered(PyrulaError):
    """A run lost its worker more than ``max_recoveries`` times and was set aside."""


class ScheduleError(PyrulaError):
    """A problem with a schedule."""


class InvalidSchedule(ScheduleError, ConfigurationError):
    """A cron expression, interval or timezone that cannot work; raised at creation."""


class ScheduleExists(ScheduleError, StoreError):
    """A schedule with that id exists already (pass ``replace=True`` to overwrite it)."""


class ScheduleNotFound(ScheduleError, StoreError, LookupError):
    """No schedule with that id."""


class SignalTimeout(PyrulaError, TimeoutError):
    """``ctx.wait_for_signal(..., timeout=)`` elapsed before the signal came."""


class StepTimeout(PyrulaError, TimeoutError):
    """An async step ran longer than its ``timeout`` and was cancelled (retried per policy)."""


class StepRaisedCancelledError(PyrulaError):
    """A step raised ``asyncio.CancelledError`` although its run was not being cancelled
    (user code raised it, or a library leaked one). It is a failure of the step like any
    ``Exception``: retried per the step's policy, then raised into the workflow. The
    original ``CancelledError`` is its ``__cause__``."""


class RunExpired(PyrulaError):
    """A run was still queued at its ``expires_at``; it was cancelled, never started."""
