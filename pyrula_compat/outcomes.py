"""How a task attempt's outcome is journaled, and read back on replay.

Each attempt is a journaled step (``attempt-N``). A success, a replacement
(``self.replace``) and an expiry are the step's value, a JSON object whose ``kind``
says which. A failure and a retry are failed steps, so that ``pyrula runs show`` and
the dashboard show them failed and ``pyrula runs retry`` (``handle.retry()``) removes
the failed attempt and runs the body again:

- a task that failed for good journals its own exception (type, message, args) with
  the traceback of its body;
- an attempt that asked for a retry (``self.retry()``, ``autoretry_for``,
  ``Reject(requeue=True)``) journals a :class:`RetryScheduled` whose message is
  Celery's (``Retry in 10s: ConnectionError('down')``), whose traceback is the
  reason's, and whose second argument is the decision (countdown or eta, the next
  attempt's arguments), so a replay waits and retries as the first execution decided.

A decision too large to travel as an exception's arguments
(:data:`~pyrula.workflows.serialization.MAX_ERROR_ARGS_BYTES`: a retry with large
replaced arguments) is journaled as a value of kind ``retry`` instead, as every retry
was before failed attempts were journaled as failures; such values, and ``error``
values of that time, still replay as they did.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from pyrula.workflows import StepContext
from pyrula.workflows.engine.control import LeaseGone
from pyrula.workflows.records import JournalEntry
from pyrula.workflows.serialization import MAX_ERROR_ARGS_BYTES, ErrorInfo
from pyrula_compat import codec, errors, states
from pyrula_compat.execution import Attempt

_STRICT_JSON = json.JSONEncoder(allow_nan=False)  # built once: json.dumps builds one a call


class RetryScheduled(Exception):
    """The journaled failure of an attempt that asked for a retry. ``args`` is
    (Celery's retry message, the decision: ``countdown``, ``eta``, ``retry_eta`` and
    optionally ``args``/``kwargs`` of the next attempt)."""

    def __init__(self, message: str, decision: dict[str, Any] | None = None) -> None:
        super().__init__(message, decision if decision is not None else {})

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    @property
    def decision(self) -> dict[str, Any]:
        value = self.args[1] if len(self.args) > 1 else None
        return dict(value) if isinstance(value, dict) else {}


def journal(attempt: Attempt, name: str, step_ctx: StepContext) -> dict[str, Any]:
    """The attempt step's value, or raise its failure (see the module docstring)."""
    if attempt.kind == "lost":  # nobody reads it: the run is no longer this worker's
        raise LeaseGone(f"task {name}[{step_ctx.run_id}]: the worker lost the run")
    if attempt.kind == "ok":
        value = codec.to_json(attempt.value)
        _check_json(value, f"the result of task {name}")
        return {"kind": "ok", "value": value, "chain_stopped": attempt.chain_stopped}
    if attempt.kind == "replace":
        out = {"kind": "replace", **attempt.value, "chain_stopped": attempt.chain_stopped}
        _check_json(out, f"the replacement of task {name}")
        return out
    exc = attempt.exc
    assert exc is not None
    body_traceback = attempt.einfo.traceback if attempt.einfo is not None else None
    if attempt.kind == "retry":
        step_ctx.set_progress(states.RETRY, {"error": errors.to_json(exc)})
        decision = _decision(attempt)
        scheduled = RetryScheduled(attempt.retry_text or f"Retry: {exc!r}", decision)
        if _fits(scheduled):
            raise scheduled from errors.RemoteTraceback(body_traceback or errors.format_exc(exc))
        return {"kind": "retry", **decision}
    if body_traceback:
        raise exc from errors.RemoteTraceback(body_traceback)
    raise exc


def _check_json(value: Any, what: str) -> None:
    try:
        _STRICT_JSON.encode(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} is not JSON serializable: {exc}") from None


def _decision(attempt: Attempt) -> dict[str, Any]:
    out: dict[str, Any] = {"countdown": attempt.countdown, "eta": attempt.eta}
    at = attempt.eta if attempt.eta is not None else time.time() + (attempt.countdown or 0)
    out["retry_eta"] = datetime.fromtimestamp(at, UTC).isoformat()
    if attempt.args is not None:
        out["args"] = codec.to_json(list(attempt.args))
    if attempt.kwargs is not None:
        out["kwargs"] = codec.to_json(dict(attempt.kwargs))
    return out


def _fits(scheduled: RetryScheduled) -> bool:
    """Whether the journal keeps ``scheduled``'s arguments, so a replay reads the
    decision back (else the decision is journaled as the step's value)."""
    try:
        text = _STRICT_JSON.encode(list(scheduled.args))
    except (TypeError, ValueError):
        return False
    return len(text.encode()) <= MAX_ERROR_ARGS_BYTES


def retry_decision(entry: JournalEntry) -> dict[str, Any] | None:
    """The retry decision journaled by an ``attempt-N`` entry, in either form, or None
    when the attempt did not ask for a retry."""
    if not entry.ok:
        try:
            info = ErrorInfo.from_json(entry.value)
        except ValueError:
            return None
        mine = info.type_module == __name__ and info.type_name == RetryScheduled.__qualname__
        if not mine or info.args is None or len(info.args) < 2:
            return None
        return dict(info.args[1]) if isinstance(info.args[1], dict) else None
    try:
        value = json.loads(entry.value)
    except ValueError:
        return None
    if isinstance(value, dict) and value.get("kind") == "retry":
        return value
    return None
