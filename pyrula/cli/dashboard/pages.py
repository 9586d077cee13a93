"""HTML pages of the dev dashboard, built from the same dicts the JSON endpoints return.

Every value from the store goes through :func:`html.escape`; nothing here runs
JavaScript. Pages of runs that can still change refresh themselves every few seconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from pyrula.workflows.records import RunStatus

REFRESH_S = 3
"""Seconds between refreshes of a page that can change (the runs list, a live run)."""

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: .5em 0 1.5em; }
th, td { border-bottom: 1px solid #ddd; padding: .25em .6em; text-align: left;
         vertical-align: top; }
th { background: #f4f4f4; }
pre { background: #f7f7f7; padding: .5em; overflow-x: auto; max-width: 100em; margin: 0; }
.s-completed { color: #17702a; } .s-failed, .s-dead, .s-terminated { color: #b00020; }
.s-running { color: #0b55b5; } .s-cancelled { color: #777; }
.muted { color: #777; }
"""


def _text(value: Any) -> str:
    """A cell: ``-`` for None, else the escaped text."""
    return "-" if value is None else escape(str(value))


def _pre(value: Any) -> str:
    """A JSON value, pretty-printed and escaped, in a ``<pre>``."""
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
    return f"<pre>{escape(text)}</pre>"


def _status(status: str) -> str:
    return f'<span class="s-{escape(status)}">{escape(status)}</span>'


def run_href(run_id: str) -> str:
    return "/runs/" + quote(run_id, safe="")


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], empty: str) -> str:
    """A table of already-escaped cells, or a line saying there is nothing."""
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    if not body:
        return f'<p class="muted">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f"<table><tr>{head}</tr>{body}</table>"


def page(title: str, body: str, *, store: str, refresh: bool = False) -> str:
    """A whole HTML document with the navigation bar."""
    meta = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else ""
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8">'
        f"{meta}<title>{escape(title)} - pyrula dev</title><style>{STYLE}</style></head>"
        '<body><nav><b>pyrula dev</b> <a href="/">Runs</a><a href="/workers">Workers</a>'
        f'<a href="/schedules">Schedules</a><span class="muted">store {escape(store)}</span>'
        f"</nav><h1>{escape(title)}</h1>{body}</body></html>\n"
    )


def _filter_form(status: str | None, workflow: str | None, workflows: Sequence[str]) -> str:
    def option(value: str, label: str, chosen: str | None) -> str:
        selected = " selected" if value == (chosen or "") else ""
        return f'<option value="{escape(value)}"{selected}>{escape(label)}</option>'

    statuses = "".join(option(s.value, s.value, status) for s in RunStatus)
    names = sorted({*workflows, *([workflow] if workflow else [])})
    flows = "".join(option(name, name, workflow) for name in names)
    return (
        '<form method="get" action="/">Status <select name="status">'
        f'{option("", "any", status)}{statuses}</select> Workflow <select name="workflow">'
        f"{option('', 'any', workflow)}{flows}</select> <button>Filter</button></form>"
    )


def runs_page(
    runs: Sequence[Mapping[str, Any]],
    *,
    status: str | None,
    workflow: str | None,
    workflows: Sequence[str],
    store: str,
) -> str:
    """The runs list, newest first, with the filter form."""
    rows = [
        (
            f'<a href="{escape(run_href(run["run_id"]))}">{escape(run["run_id"])}</a>',
            _text(run["workflow"]),
            _status(run["status"]) + (" (cancel requested)" if run["cancel_requested"] else ""),
            _text(run["progress_state"]),
            _text(run["owner"] or "(default)"),
            _text(run["created_at"]),
            _text(run["started_at"]),
            _text(run["finished_at"]),
            _text(run["worker_id"]),
        )
        for run in runs
    ]
    headers = ("Run", "Workflow", "Status", "Progress", "Owner", "Created", "Started",
               "Finished", "Worker")  # fmt: skip
    query = urlencode({k: v for k, v in (("status", status), ("workflow", workflow)) if v})
    body = (
        _filter_form(status, workflow, workflows)
        + f"<p>{len(runs)} run{'' if len(runs) == 1 else 's'}, newest first "
        f'(<a href="/api/runs{escape("?" + query if query else "")}">JSON</a>)</p>'
        + _table(headers, rows, "no runs")
    )
    return page("Runs", body, store=store, refresh=True)


def run_page(run: Mapping[str, Any], journal: Sequence[Mapping[str, Any]], *, store: str) -> str:
    """One run: its record, its result or error with the traceback, and its journal."""
    fields: list[tuple[str, str]] = [
        ("Run", _text(run["run_id"])),
        ("Workflow", _text(run["workflow"])),
        ("Status", _status(run["status"])),
        ("Owner", _text(run["owner"] or "(default)")),
        ("Idempotency key", _text(run["idempotency_key"])),
        ("Created", _text(run["created_at"])),
        ("Available at", _text(run["available_at"])),
        ("Started", _text(run["started_at"])),
        ("Finished", _text(run["finished_at"])),
        ("Worker", _text(run["worker_id"])),
        ("Claims / recoveries", f"{run['claims']} / {run['recoveries']}"),
        ("Cancel requested", "yes" if run["cancel_requested"] else "no"),
        ("Parent run", _link_or_dash(run["parent_run_id"])),
        ("Progress", _text(run["progress_state"])),
    ]
    if run["progress_info"] is not None:
        fields.append(("Progress info", _pre(run["progress_info"])))
    fields.append(("Params", _pre(run["params"])))
    if run["status"] == RunStatus.COMPLETED.value:
        fields.append(("Result", _pre(run["result"])))
    error = run["error"]
    if error is not None:
        fields.append(("Error", f"<b>{escape(error['type'])}</b>: {escape(error['message'])}"))
        if error["traceback"]:
            fields.append(("Traceback", _pre(error["traceback"])))
    record = "<table>" + "".join(
        f"<tr><th>{escape(label)}</th><td>{value}</td></tr>" for label, value in fields
    )
    entries = [
        (
            str(entry["position"]),
            _text(entry["kind"]),
            _text(entry["name"]),
            '<span class="s-completed">ok</span>' if entry["ok"] else _status("failed"),
            str(entry["attempts"]),
            _text(entry["recorded_at"]),
            _entry_value(entry),
        )
        for entry in journal
    ]
    headers = ("Pos", "Kind", "Name", "Outcome", "Attempts", "Recorded", "Value or error")
    href = escape("/api" + run_href(run["run_id"]))
    body = (
        f'{record}</table><p><a href="{href}">JSON</a></p>'
        f"<h2>Journal ({len(journal)})</h2>" + _table(headers, entries, "no journal entries yet")
    )
    live = run["status"] not in {s.value for s in RunStatus if s.is_terminal}
    return page(f"Run {run['run_id']}", body, store=store, refresh=live)


def _link_or_dash(run_id: str | None) -> str:
    if run_id is None:
        return "-"
    return f'<a href="{escape(run_href(run_id))}">{escape(run_id)}</a>'


def _entry_value(entry: Mapping[str, Any]) -> str:
    error = entry["error"]
    if error is None:
        return _pre(entry["value"])
    return _pre(f"{error['type']}: {error['message']}")


def workers_page(workers: Sequence[Mapping[str, Any]], *, store: str) -> str:
    rows = [
        (
            _text(w["worker_id"]),
            "yes" if w["alive"] else "no (its heartbeats stopped: killed or stuck)",
            _text(w["hostname"]),
            _text(w["pid"]),
            _text(", ".join(w["workflows"])),
            _text(w["running"]),
            _text(w["started_at"]),
            _text(w["last_seen"]),
        )
        for w in workers
    ]
    headers = ("Worker", "Alive", "Host", "PID", "Workflows", "Running", "Started", "Last seen")
    body = _table(headers, rows, "no workers seen recently") + '<a href="/api/workers">JSON</a>'
    return page("Workers", body, store=store, refresh=True)


def schedules_page(schedules: Sequence[Mapping[str, Any]], *, store: str) -> str:
    rows = [
        (
            _text(s["schedule_id"]),
            _text(s["workflow"]),
            _text(f"cron {s['cron']}" if s["cron"] is not None else f"every {s['every_s']:g}s"),
            _text(s["timezone"]),
            "yes" if s["enabled"] else "no (paused)",
            _text(s["next_fire_at"]),
            _text(s["last_fire_at"]),
            _pre(s["params"]),
        )
        for s in schedules
    ]
    headers = ("Schedule", "Workflow", "When", "Timezone", "Enabled", "Next", "Last", "Params")
    body = _table(headers, rows, "no schedules") + '<a href="/api/schedules">JSON</a>'
    return page("Schedules", body, store=store)


def error_page(code: int, message: str, *, store: str) -> str:
    return page(f"{code}", f"<p>{escape(message)}</p>", store=store)
