"""Internal control flow. These derive from BaseException so that user code's
``except Exception`` cannot swallow them; the runner catches each one.
"""

from __future__ import annotations

from pyrula.workflows.records import Wait


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
