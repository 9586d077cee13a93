"""Internal control flow. These derive from BaseException so that user code's
``except Exception`` cannot swallow them; the runner catches each one.
"""

from __future__ import annotations

import asyncio

from pyrula.workflows.records import Wait


def being_cancelled(*, if_unknown: bool = True) -> bool:
    """Whether the current task is being cancelled: ``Task.cancel()`` was called on it
    (a worker's drain, a lost lease, a timeout, a cancelled ``gather``) and not undone.

    An ``asyncio.CancelledError`` that arrives while this is False was raised by the
    code the task runs (a step, a library leaking one), not by a cancellation. Python
    3.10 cannot tell the two apart (``Task.cancelling()`` is 3.11+): there this returns
    ``if_unknown``.
    """
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return if_unknown if cancelling is None else cancelling() > 0


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
