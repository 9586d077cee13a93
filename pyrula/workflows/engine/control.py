"""Internal control flow. These derive from BaseException so that user code's
``except Exception`` cannot swallow them; the runner catches each one.
"""

from __future__ import annotations


class EngineSignal(BaseException):
    """Base of the engine's internal control-flow exceptions."""


class CancelRequested(EngineSignal):
    """The run was asked to cancel; raised at the next step boundary."""


class LeaseGone(EngineSignal):
    """This worker no longer holds the run (reclaimed or terminated): stop, write nothing."""


class Drain(EngineSignal):
    """The worker is stopping: hand the run back to the queue at this step boundary."""


class Nondeterminism(EngineSignal):
    """Replay reached a different step than the journal recorded; fails the run."""
