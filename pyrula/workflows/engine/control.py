"""Internal control flow. These derive from BaseException so that user code's
``except Exception`` cannot swallow them; the runner catches each one.
"""

from __future__ import annotations

import asyncio
import contextvars

from pyrula.workflows.errors import StepInsideStep
from pyrula.workflows.records import Wait

running_step: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "pyrula_running_step", default=None
)
"""The name of the step whose own code runs in this context (its task, or its thread),
else None: set around a step's call by the step runner."""


def refuse_inside_step(what: str) -> None:
    """Raise StepInsideStep if ``what`` (a durable operation) is called from a step's code."""
    outer = running_step.get()
    if outer is not None:
        raise StepInsideStep(
            f"{what} was called inside step {outer!r}: only the workflow function may call "
            "steps, sleeps, child runs and signal waits (a step's own code is not "
            "journaled, so a replay could not find them). Call it from the workflow, or "
            "call the plain function (an @step function's .fn) inside the step"
        )


def being_cancelled() -> bool:
    """Whether the current task is being cancelled: ``Task.cancel()`` was called on it
    (a worker's drain, a lost lease, a timeout, a cancelled ``gather``) and not undone.

    An ``asyncio.CancelledError`` that arrives while this is False was raised by the
    code the task runs (a step, a library leaking one), not by a cancellation.
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class EngineSignal(BaseException):
    """Base of the engine's internal control-flow exceptions."""


class CancelRequested(EngineSignal):
    """The run was asked to cancel; raised at the next step boundary."""


class LeaseGone(EngineSignal):
    """This worker no longer holds the run (reclaimed or terminated): stop, write nothing."""


class Nondeterminism(EngineSignal):
    """Replay reached a different step than the journal recorded; fails the run."""


class Suspend(EngineSignal):
    """The run waits (a sleep, a signal, a child run, a long backoff): release it."""

    def __init__(self, wait: Wait) -> None:
        super().__init__(wait)
        self.wait = wait


class Crash(EngineSignal):
    """A simulated worker death (crash-point testing): the run writes nothing more."""
