"""OpenTelemetry spans of submits, runs and steps (the ``otel`` extra:
``opentelemetry-api``).

``tracing.enable()`` (in the process that submits, and in the worker's: the module a
worker imports, or a Celery app's) installs :class:`Tracing`, a
:class:`~pyrula.workflows.telemetry.Instrument`:

* each submit gets a ``submit <workflow>`` span (kind PRODUCER), a child of the span
  current where ``submit`` was called, and its W3C ``traceparent`` rides in the run's
  params under :data:`~pyrula.workflows.telemetry.TRACE_PARAM` (the engine removes it
  before it calls the workflow function, so no store keeps a field of its own for it);
* each execution of a run on a worker gets a ``run <workflow>`` span (kind CONSUMER),
  a child of its submit's span, current while the workflow code runs;
* each step attempt a ``step <name>`` span under it, current while the step's code runs
  (a sync step's thread too), with the exception and an error status when it raised.

A submit with an ``idempotency_key`` carries no trace context: the key's repeats must
send the same params, which a new trace each time would change. Its run's spans start
a trace of their own.

The tracer comes from the ``TracerProvider`` given, else from the global one whenever a
span starts: an application's own provider (its exporters, its sampler) is used as it
is, and pyrula never sets one.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import TYPE_CHECKING, Any

from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pyrula.workflows import telemetry
from pyrula.workflows.records import NewRun

if TYPE_CHECKING:
    from pyrula.workflows.engine.execution import RunExecution
    from pyrula.workflows.records import Lease

TRACER_NAME = "pyrula"
_W3C = TraceContextTextMapPropagator()
_CARRIED = re.compile(r'"' + re.escape(telemetry.TRACE_PARAM) + r'":("[^"]*")')


class Tracing(telemetry.Instrument):
    """Spans for submits, runs and steps, from ``tracer_provider`` (None: the global)."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)

    def submitting(self, new: NewRun) -> NewRun:
        attributes = {"pyrula.run_id": new.run_id, "pyrula.workflow": new.workflow}
        with self.tracer.start_as_current_span(
            f"submit {new.workflow}", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            if new.idempotency_key is not None or telemetry.TRACE_PARAM in new.params:
                return new
            carrier: dict[str, str] = {}
            _W3C.inject(carrier)
            parent = carrier.get("traceparent")
            if parent is None:  # a non-recording span (no SDK): nothing to join
                return new
            return _with_param(new, parent)

    def run_started(self, lease: Lease, queue: str) -> Any:
        run = lease.run
        parent = None
        found = _CARRIED.search(run.params) if telemetry.TRACE_PARAM in run.params else None
        if found is not None:
            parent = _W3C.extract({"traceparent": json.loads(found.group(1))})
        span = self.tracer.start_span(
            f"run {run.workflow}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "pyrula.run_id": run.run_id, "pyrula.workflow": run.workflow,
                "pyrula.queue": queue, "pyrula.claims": run.claims, "pyrula.owner": run.owner,
            },
        )  # fmt: skip
        return span, context.attach(trace.set_span_in_context(span))

    def run_ended(self, scope: Any, lease: Lease, queue: str, end: str) -> None:
        span, token = scope
        span.set_attribute("pyrula.run.end", end)
        if end == "failed":
            span.set_status(Status(StatusCode.ERROR, "the run failed"))
        context.detach(token)
        span.end()

    def step_started(self, execution: RunExecution, name: str, attempt: int) -> Any:
        span = self.tracer.start_span(
            f"step {name}",
            attributes={"pyrula.run_id": execution.run_id, "pyrula.step": name,
                        "pyrula.attempt": attempt},
        )  # fmt: skip
        return span, context.attach(trace.set_span_in_context(span))

    def step_ended(self, scope: Any, execution: RunExecution, name: str, error: Any) -> None:
        span, token = scope
        if isinstance(error, BaseException):
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        context.detach(token)
        span.end()


def _with_param(new: NewRun, traceparent: str) -> NewRun:
    """``new`` with ``traceparent`` added to its params (JSON text, an object)."""
    text = new.params
    entry = f"{json.dumps(telemetry.TRACE_PARAM)}:{json.dumps(traceparent)}"
    params = "{" + entry + "}" if text == "{}" else text[:-1] + "," + entry + "}"
    return dataclasses.replace(new, params=params)


_enabled: Tracing | None = None


def enable(tracer_provider: trace.TracerProvider | None = None) -> Tracing:
    """Install :class:`Tracing` for this process's clients and workers (once: a second
    call replaces the first); returns it."""
    global _enabled
    disable()
    _enabled = Tracing(tracer_provider)
    telemetry.add(_enabled)
    return _enabled


def disable() -> None:
    """Remove what :func:`enable` installed."""
    global _enabled
    if _enabled is not None:
        telemetry.remove(_enabled)
        _enabled = None
