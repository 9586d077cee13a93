"""Hooks for metrics and traces: what a run, a step attempt, a submit, a recovery and a
schedule fire tell the instruments installed in this process.

An :class:`Instrument` subclass overrides the hooks it needs (each is a no-op here);
:func:`add` installs it for every client and worker of the process, :func:`remove`
takes it out. With none installed the engine checks one module attribute per hook and
does nothing else, so the hot path is unchanged. Prometheus metrics
(:mod:`pyrula.cli.metrics`) and OpenTelemetry spans (:mod:`pyrula.workflows.tracing`)
are instruments. A hook must not raise.

:func:`queue_of` is where a run's queue label comes from, for every instrument.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyrula.workflows.engine.execution import RunExecution
    from pyrula.workflows.records import Lease, NewRun, RecoveryReport

log = logging.getLogger("pyrula.workflows.telemetry")

CELERY_QUEUE = "celery"
"""The queue label of a Celery task's runs (the drop-in's default queue)."""
TRACE_PARAM = "__traceparent__"
"""The params key that carries a run's W3C ``traceparent`` from its submit to its
worker (:mod:`pyrula.workflows.tracing`); the engine removes it before it calls the
workflow function."""


def queue_of(workflow: str, fn: Any = None) -> str:
    """The queue a run of ``workflow`` waits in, as metrics and spans label it: ``celery``
    for a Celery task (a workflow the drop-in defines, ``fn`` its function), else the
    workflow's name (a worker claims by workflow name)."""
    module = getattr(fn, "__module__", None) or ""
    return CELERY_QUEUE if module.startswith("pyrula_compat") else workflow


class Instrument:
    """What an instrument can hear; every hook is a no-op here. ``*_started`` hooks
    return a scope the matching ``*_ended`` hook gets back."""

    def submitting(self, new: NewRun) -> NewRun:
        """A client is about to store ``new``: returns the run to store (a tracer adds
        its trace context to the params)."""
        return new

    def run_started(self, lease: Lease, queue: str) -> Any:
        """A worker starts executing the claimed run (each execution: a resumed run
        starts again)."""
        return None

    def run_ended(self, scope: Any, lease: Lease, queue: str, end: str) -> None:
        """The execution ended: ``end`` is completed, failed, cancelled, suspended or lost
        (:class:`~pyrula.workflows.engine.runner.RunEnd`'s values)."""

    def step_started(self, execution: RunExecution, name: str, attempt: int) -> Any:
        """A step attempt begins (its code runs after this returns)."""
        return None

    def step_ended(self, scope: Any, execution: RunExecution, name: str, error: Any) -> None:
        """The attempt ended: ``error`` is what it raised, None if it returned."""

    def step_retrying(self, execution: RunExecution, name: str, attempt: int) -> None:
        """The failed attempt ``attempt`` will be retried."""

    def recovered(self, report: RecoveryReport) -> None:
        """A worker's orphan scan requeued or dead-lettered runs whose lease expired."""

    def schedule_fired(self, workflow: str) -> None:
        """A schedule of ``workflow`` fired a run."""


class _Fanout(Instrument):
    """Several instruments heard as one (scopes in a tuple, in order)."""

    def __init__(self, instruments: tuple[Instrument, ...]) -> None:
        self.instruments = instruments

    def submitting(self, new: NewRun) -> NewRun:
        for instrument in self.instruments:
            new = instrument.submitting(new)
        return new

    def run_started(self, lease: Lease, queue: str) -> Any:
        return tuple(i.run_started(lease, queue) for i in self.instruments)

    def run_ended(self, scope: Any, lease: Lease, queue: str, end: str) -> None:
        for instrument, own in zip(self.instruments, scope, strict=True):
            instrument.run_ended(own, lease, queue, end)

    def step_started(self, execution: RunExecution, name: str, attempt: int) -> Any:
        return tuple(i.step_started(execution, name, attempt) for i in self.instruments)

    def step_ended(self, scope: Any, execution: RunExecution, name: str, error: Any) -> None:
        for instrument, own in zip(self.instruments, scope, strict=True):
            instrument.step_ended(own, execution, name, error)

    def step_retrying(self, execution: RunExecution, name: str, attempt: int) -> None:
        for instrument in self.instruments:
            instrument.step_retrying(execution, name, attempt)

    def recovered(self, report: RecoveryReport) -> None:
        for instrument in self.instruments:
            instrument.recovered(report)

    def schedule_fired(self, workflow: str) -> None:
        for instrument in self.instruments:
            instrument.schedule_fired(workflow)


current: Instrument | None = None
"""What the engine calls: None (nothing installed), the one instrument, or a fan-out."""
_installed: list[Instrument] = []
_lock = threading.Lock()


def add(instrument: Instrument) -> None:
    """Install ``instrument`` for every client and worker of this process (once)."""
    global current
    if not isinstance(instrument, Instrument):
        raise TypeError(f"telemetry.add takes an Instrument, got {instrument!r}")
    with _lock:
        if instrument not in _installed:
            _installed.append(instrument)
        current = _combined()


def remove(instrument: Instrument) -> None:
    """Take ``instrument`` out (nothing if it is not installed)."""
    global current
    with _lock:
        if instrument in _installed:
            _installed.remove(instrument)
        current = _combined()


def installed() -> list[Instrument]:
    return list(_installed)


def _combined() -> Instrument | None:
    if not _installed:
        return None
    if len(_installed) == 1:
        return _installed[0]
    return _Fanout(tuple(_installed))


def strip_trace(params: dict[str, Any]) -> str | None:
    """Remove the trace context from a run's decoded params; return it (None if none)."""
    value = params.pop(TRACE_PARAM, None)
    return value if isinstance(value, str) else None
