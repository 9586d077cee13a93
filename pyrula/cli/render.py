"""Output of the CLI: aligned tables for people, one JSON document for scripts, error lines.

Times are shown as ISO-8601 UTC (``2024-05-01T12:00:00Z``); durations as ``1.2s``,
``3m04s``, ``2h05m``. Tables truncate payloads; JSON always carries them whole.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import click

from pyrula.workflows.records import NO_FLOW, FlowControl, JournalEntry, RunRecord, RunStatus
from pyrula.workflows.serialization import ErrorInfo

CELL_WIDTH = 60
"""Widest payload shown in a table cell."""
FIELD_WIDTH = 200
"""Widest payload shown on one line of ``runs show``."""

EXIT_ERROR = 1
"""A command that parsed but could not be carried out (no such run, store down, ...)."""
EXIT_USAGE = 2
"""Bad flags, a workflow module that does not import, bad option values."""


class CliError(click.ClickException):
    """One ``Error: ...`` line on stderr and exit code 1; never a traceback."""

    exit_code = EXIT_ERROR


class CliUsageError(CliError):
    """Like :class:`CliError`, with exit code 2: the command line itself is wrong."""

    exit_code = EXIT_USAGE


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, for messages and logs."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


# -- scalars ---------------------------------------------------------------------------
def iso(ts: float | None, *, precise: bool = False) -> str | None:
    """Epoch seconds as ISO-8601 UTC with a ``Z``; milliseconds when ``precise``."""
    if ts is None:
        return None
    moment = datetime.fromtimestamp(ts, UTC)
    text = moment.isoformat(timespec="milliseconds" if precise else "seconds")
    return text.replace("+00:00", "Z")


def duration_text(seconds: float | None) -> str:
    """``0.25s``, ``12.0s``, ``3m04s``, ``2h05m``, ``3d04h``; ``-`` for None."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.2f}s" if seconds < 1 else f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def run_duration(run: RunRecord, now: float) -> float | None:
    """Seconds from first claim to the end, or to ``now`` while running; else None."""
    if run.started_at is None:
        return None
    if run.finished_at is not None:
        return run.finished_at - run.started_at
    if run.status is RunStatus.RUNNING:
        return now - run.started_at
    return None


def clip(text: str, width: int = CELL_WIDTH) -> str:
    """One line of at most ``width`` characters, ``...`` marking a cut."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


def json_value(text: str | None) -> Any:
    """Stored JSON text as a value; text that is not JSON is returned as it is."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def error_info(text: str) -> ErrorInfo | None:
    """The stored error, or None if it is not one (shown raw: the store may hold anything
    someone wrote to it)."""
    try:
        return ErrorInfo.from_json(text)
    except ValueError:
        return None


def _error(text: str | None) -> dict[str, str] | None:
    if text is None:
        return None
    info = error_info(text)
    if info is None:
        return {"type": "(not an error record)", "message": text, "traceback": ""}
    return {"type": info.qualified_type, "message": info.message, "traceback": info.traceback}


# -- JSON ------------------------------------------------------------------------------
def run_dict(run: RunRecord, now: float) -> dict[str, Any]:
    """Every field of a run, payloads decoded, times ISO-8601 UTC."""
    return {
        "run_id": run.run_id,
        "workflow": run.workflow,
        "status": run.status.value,
        "owner": run.owner,
        "idempotency_key": run.idempotency_key,
        "params": json_value(run.params),
        "result": json_value(run.result),
        "error": _error(run.error),
        "created_at": iso(run.created_at, precise=True),
        "available_at": iso(run.available_at, precise=True),
        "updated_at": iso(run.updated_at, precise=True),
        "started_at": iso(run.started_at, precise=True),
        "finished_at": iso(run.finished_at, precise=True),
        "duration_s": run_duration(run, now),
        "worker_id": run.worker_id,
        "lease_token": run.lease_token,
        "lease_expires_at": iso(run.lease_expires_at, precise=True),
        "cancel_requested": run.cancel_requested,
        "recoveries": run.recoveries,
        "claims": run.claims,
        "parent_run_id": run.parent_run_id,
        "wake_at": iso(run.wake_at, precise=True),
        "wait_signal": run.wait_signal,
        "wait_child": run.wait_child,
        "expires_at": iso(run.expires_at, precise=True),
        "flow": _flow(run.flow),
        "progress_state": run.progress_state,
        "progress_info": json_value(run.progress_info),
        "failed_position": run.failed_position,
    }


def _flow(flow: FlowControl) -> dict[str, Any] | None:
    """A run's flow control (rate key and limit, owner cap), or None for none."""
    if flow == NO_FLOW:
        return None
    return {
        "rate_key": flow.rate_key,
        "rate_per_second": flow.rate_per_second,
        "rate_burst": flow.rate_burst,
        "owner_concurrency": flow.owner_concurrency,
    }


def _has_value(entry: JournalEntry) -> bool:
    """Whether the entry's value is a value rather than an error. A ``backoff`` entry
    (a failed attempt waiting on a timer) is not ok, yet holds ``{attempt, wake_at}``;
    a ``child_result`` of a child that did not complete holds ``{status, result, error}``."""
    return entry.ok or entry.kind in ("backoff", "child_result")


def entry_dict(entry: JournalEntry) -> dict[str, Any]:
    """A journal entry; ``value`` when ok (or a backoff), ``error`` when not."""
    return {
        "position": entry.position,
        "kind": entry.kind,
        "name": entry.name,
        "ok": entry.ok,
        "attempts": entry.attempts,
        "recorded_at": iso(entry.recorded_at, precise=True) if entry.recorded_at else None,
        "value": json_value(entry.value) if _has_value(entry) else None,
        "error": None if _has_value(entry) else _error(entry.value),
    }


def to_json(document: Any) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False)


# -- tables ----------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, headers first."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [list(headers), *rows]
    ]
    return "\n".join(lines)


def owner_text(owner: str) -> str:
    return owner if owner else "(default)"


def runs_table(runs: Sequence[RunRecord], now: float) -> str:
    if not runs:
        return "no runs"
    headers = ("RUN ID", "WORKFLOW", "STATUS", "OWNER", "CREATED", "DURATION", "WORKER")
    rows = [
        (
            run.run_id,
            run.workflow,
            run.status.value + (" (cancel requested)" if run.cancel_requested else ""),
            owner_text(run.owner),
            iso(run.created_at) or "-",
            duration_text(run_duration(run, now)),
            run.worker_id or "-",
        )
        for run in runs
    ]
    return table(headers, rows)


def error_line(text: str) -> str:
    info = error_info(text)
    if info is None:
        return f"(not an error record) {clip(text)}"
    return f"{info.qualified_type}: {info.message}"


def journal_table(journal: Sequence[JournalEntry]) -> str:
    headers = ("POS", "KIND", "NAME", "OK", "ATTEMPTS", "RECORDED", "VALUE")
    rows = [
        (
            str(entry.position),
            entry.kind,
            entry.name,
            "yes" if entry.ok else "no",
            str(entry.attempts),
            (iso(entry.recorded_at) or "-") if entry.recorded_at else "-",
            clip(entry.value if _has_value(entry) else error_line(entry.value)),
        )
        for entry in journal
    ]
    return table(headers, rows)


def run_detail(run: RunRecord, journal: Sequence[JournalEntry], now: float) -> str:
    """``runs show``: the record as label/value lines, its error, then its journal."""
    fields: list[tuple[str, str]] = [
        ("Run", run.run_id),
        ("Workflow", run.workflow),
        ("Status", run.status.value),
        ("Owner", owner_text(run.owner)),
        ("Idempotency key", run.idempotency_key or "-"),
        ("Created", iso(run.created_at) or "-"),
        ("Available at", iso(run.available_at) or "-"),
        ("Started", iso(run.started_at) or "-"),
        ("Finished", iso(run.finished_at) or "-"),
        ("Duration", duration_text(run_duration(run, now))),
        ("Worker", run.worker_id or "-"),
        ("Claims", str(run.claims)),
        ("Recoveries", str(run.recoveries)),
    ]
    if run.status is RunStatus.RUNNING:
        fields.append(
            ("Lease", f"token {run.lease_token}, expires {iso(run.lease_expires_at) or '-'}")
        )
    if run.cancel_requested:
        fields.append(("Cancel requested", "yes"))
    fields.append(("Params", clip(run.params, FIELD_WIDTH)))
    if run.result is not None:
        fields.append(("Result", clip(run.result, FIELD_WIDTH)))
    info = error_info(run.error) if run.error is not None else None
    if run.error is not None:
        fields.append(("Error", error_line(run.error)))
    width = max(len(label) for label, _ in fields)
    lines = [f"{label.ljust(width)}  {value}" for label, value in fields]
    if info is not None and info.traceback:
        lines += ["", "Traceback (from the worker):", info.traceback.rstrip()]
    count = len(journal)
    lines += ["", f"Journal ({count} {'entry' if count == 1 else 'entries'})"]
    if journal:
        lines.append(journal_table(journal))
    return "\n".join(lines)


def change_line(action: str, run: RunRecord) -> str:
    """One line saying what ``retry`` or ``cancel`` did to ``run``."""
    if run.status is RunStatus.RUNNING and run.cancel_requested:
        return (
            f"run {run.run_id} ({run.workflow}): cancel requested; it stops at its next "
            "step boundary"
        )
    if action == "retry":
        return (
            f"run {run.run_id} ({run.workflow}) is {run.status.value} again; finished steps "
            "will replay"
        )
    return f"run {run.run_id} ({run.workflow}) {run.status.value}"


def echo_json(document: Any) -> None:
    click.echo(to_json(document))


def parse_json(text: str, flag: str) -> Any:
    """``text`` as a JSON value; NaN and Infinity are refused as the store would."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not allowed")

    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError as exc:
        raise CliUsageError(f"{flag} is not valid JSON ({exc}): {clip(text)}") from None


def parse_json_object(text: str | None, flag: str) -> dict[str, Any]:
    """``text`` as a JSON object (None: an empty one); anything else is a usage error."""
    value = {} if text is None else parse_json(text, flag)
    if not isinstance(value, dict):
        raise CliUsageError(f"{flag} must be a JSON object, got {clip(text or '')}")
    return value


def parse_json_array(text: str | None, flag: str) -> list[Any]:
    """``text`` as a JSON array (None: an empty one); anything else is a usage error."""
    value = [] if text is None else parse_json(text, flag)
    if not isinstance(value, list):
        raise CliUsageError(f"{flag} must be a JSON array, got {clip(text or '')}")
    return value
