"""The runs list (filters, counts per status, pages, bulk actions, submit) and one run
(record, result or error, journal timeline, children, signals, operator history)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import urlencode

from pyrula.cli.dashboard.pages import (
    Site,
    button,
    json_block,
    pre,
    run_href,
    run_link,
    seconds,
    status,
    table,
    text,
)
from pyrula.cli.dashboard.queries import PAGE_SIZES, RunPage
from pyrula.cli.render import iso
from pyrula.workflows.records import RunStatus

WITHIN = (("", "any time"), ("900", "last 15 min"), ("3600", "last hour"),
          ("86400", "last 24 h"), ("604800", "last 7 days"))  # fmt: skip
"""The created-within choices of the filter form (seconds)."""


def _option(value: str, label: str, chosen: str | None) -> str:
    selected = " selected" if value == (chosen or "") else ""
    return f'<option value="{escape(value)}"{selected}>{escape(label)}</option>'


def filter_form(site: Site, query: Mapping[str, str]) -> str:
    """The runs filter (a GET form: every filtered page has its own address)."""
    statuses = "".join(_option(s.value, s.value, query.get("status")) for s in RunStatus)
    names = sorted({*site.workflows, *([query["workflow"]] if query.get("workflow") else [])})
    flows = "".join(_option(n, n, query.get("workflow")) for n in names)
    within = "".join(_option(v, label, query.get("within")) for v, label in WITHIN)

    def field(name: str, label: str, hint: str, width: int = 12) -> str:
        value = escape(query.get(name, ""))
        return (
            f'<label>{escape(label)} <input name="{name}" value="{value}" '
            f'placeholder="{escape(hint)}" size="{width}"></label> '
        )

    return (
        f'<form method="get" action="{escape(site.href("/"))}" id="filter" class="box">'
        f'<label>Search <input name="q" id="search" value="{escape(query.get("q", ""))}" '
        'placeholder="run id, idempotency key or task id" size="34"></label> '
        f'<label>Workflow <select name="workflow">{_option("", "any", query.get("workflow"))}'
        f"{flows}</select></label> "
        f'<label>Status <select name="status">{_option("", "any", query.get("status"))}'
        f"{statuses}</select></label> "
        + field("owner", "Owner", "tenant, or (default)")
        + field("worker", "Worker", "worker id", 16)
        + f'<label>Created <select name="within">{within}</select></label> '
        + field("since", "from", "2026-01-31T09:00 UTC", 16)
        + field("until", "to", "ISO-8601 UTC", 16)
        + '<input type="hidden" name="size" value="'
        + escape(query.get("size", ""))
        + '"><button>Filter</button></form>'
    )


def bulk_tools(site: Site, query: Mapping[str, str]) -> str:
    """Bulk retry / cancel of every run the current filter selects, with progress."""
    selection = json.dumps({k: v for k, v in query.items() if k not in ("page", "size")})
    return (
        '<div class="box" id="bulk"><b>Every run this filter selects:</b> '
        + button(
            "Retry all",
            "/api/bulk",
            confirm="Retry every ended run this filter selects?",
            body=json.dumps({"action": "retry", "filter": json.loads(selection)}),
            bulk="1",
        )
        + " "
        + button(
            "Cancel all",
            "/api/bulk",
            confirm="Cancel every run this filter selects that has not ended?",
            body=json.dumps({"action": "cancel", "filter": json.loads(selection)}),
            bulk="1",
        )
        + ' <progress id="bulk-progress" max="100" value="0" hidden></progress>'
        '<span id="bulk-status"></span></div>'
    )


def submit_form(site: Site) -> str:
    names = {name: list(params) if params is not None else None for name, params in
             site.workflows.items()}  # fmt: skip
    choices = "".join(f'<option value="{escape(n)}">' for n in sorted(names))
    return (
        '<details class="box" id="submit-box"><summary>Submit a run</summary>'
        '<form id="submit-form" data-action="/api/runs">'
        '<label>Workflow <input name="workflow" list="workflow-names" required size="28" '
        f'autocomplete="off"></label><datalist id="workflow-names">{choices}</datalist> '
        '<span id="param-names" class="muted" '
        f'data-names="{escape(json.dumps(names))}"></span><br>'
        '<label>Params (JSON object)<br><textarea name="params">{}</textarea></label><br>'
        '<label>Owner <input name="owner" size="12"></label> '
        '<label>Idempotency key <input name="idempotency_key" size="20"></label> '
        '<button>Submit</button> <span class="msg form-msg"></span></form></details>'
    )


def runs_live(site: Site, listed: RunPage, query: Mapping[str, str]) -> str:
    """The live part of the runs page: counts per status, one page of runs, the pager."""
    base = {k: v for k, v in query.items() if k not in ("page", "status")}
    counted = listed.counts
    plus = "+" if listed.capped else ""
    if counted is None:
        counts = ['<span class="muted">counting runs&hellip;</span>']
    else:
        counts = [
            f'<a href="{escape(site.href("/?" + urlencode(base)))}">all '
            f"{sum(counted.values())}{plus}</a>"
        ]
        for s in RunStatus:
            href = site.href("/?" + urlencode({**base, "status": s.value}))
            counts.append(
                f'<a href="{escape(href)}" class="s-{s.value}">{s.value} '
                f"{counted.get(s.value, 0)}</a>"
            )
    rows = [
        (
            run_link(site, run.run_id),
            text(run.workflow),
            status(run.status.value) + (" (cancel requested)" if run.cancel_requested else ""),
            text(run.progress_state),
            text(run.owner or "(default)"),
            text(iso(run.created_at)),
            text(iso(run.finished_at)),
            text(run.worker_id),
        )
        for run in listed.runs
    ]
    headers = ("Run", "Workflow", "Status", "Progress", "Owner", "Created", "Finished", "Worker")
    first = listed.page * listed.size
    shown = f"{first + 1}-{first + len(listed.runs)}" if listed.runs else "none"
    of = "" if listed.total is None else f" of {listed.total}{plus}"
    pager = _pager(site, query, listed)
    api = site.href("/api/runs?" + urlencode(query))
    return (
        f'<p class="counts" id="counts">{"".join(counts)}</p>'
        f'<p id="page-info">runs {shown}{of}, '
        f"newest first, page {listed.page + 1} "
        f'(<a href="{escape(api)}">JSON</a>)</p>'
        + pager
        + table(headers, rows, "no runs match", table_id="runs")
        + pager
    )


def _pager(site: Site, query: Mapping[str, str], listed: RunPage) -> str:
    links = []
    if listed.page > 0:
        prev = site.href("/?" + urlencode({**query, "page": str(listed.page - 1)}))
        links.append(f'<a href="{escape(prev)}" rel="prev" class="prev">&larr; newer</a>')
    if listed.has_more:
        nxt = site.href("/?" + urlencode({**query, "page": str(listed.page + 1)}))
        links.append(f'<a href="{escape(nxt)}" rel="next" class="next">older &rarr;</a>')
    sizes = " ".join(
        f'<a href="{escape(site.href("/?" + urlencode({**query, "size": str(n), "page": "0"})))}">'
        f"{n}</a>"
        if n != listed.size
        else f"<b>{n}</b>"
        for n in PAGE_SIZES
    )
    return f'<p class="pager">{" &nbsp; ".join(links)} &nbsp; per page: {sizes}</p>'


def run_tools(site: Site, run: Mapping[str, Any]) -> str:
    """The run's actions: each a confirmed POST; the signal form takes a JSON payload."""
    run_id = run["run_id"]
    base = "/api" + run_href(Site(), run_id)
    return (
        '<div class="box" id="actions">'
        + button("Retry", base + "/retry", confirm=f"Retry run {run_id}?", key="r")
        + " "
        + button("Cancel", base + "/cancel", confirm=f"Cancel run {run_id}?", key="c")
        + " "
        + button(
            "Terminate",
            base + "/terminate",
            confirm=f"Terminate run {run_id} now? A step in progress is abandoned.",
            key="t",
        )
        + f'<form id="signal-form" data-action="{escape(base + "/signal")}" '
        f'data-confirm="{escape(f"Send this signal to run {run_id}?")}">'
        '<b>Signal</b> <label>name <input name="name" id="signal-name" required size="16">'
        '</label> <label>payload (JSON) <input name="payload_text" size="40" '
        'placeholder="null"></label> <button>Send</button> '
        '<span class="msg form-msg"></span></form></div>'
    )


def run_live(site: Site, detail: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> str:
    run = detail["run"]
    fields: list[tuple[str, str]] = [
        ("Run", text(run["run_id"])),
        ("Workflow", text(run["workflow"])),
        (
            "Status",
            status(run["status"]) + (" (cancel requested)" if run["cancel_requested"] else ""),
        ),
        ("Owner", text(run["owner"] or "(default)")),
        ("Idempotency key", text(run["idempotency_key"])),
        ("Created", text(run["created_at"])),
        ("Available at", text(run["available_at"])),
        ("Started", text(run["started_at"])),
        ("Finished", text(run["finished_at"])),
        ("Duration", seconds(run["duration_s"])),
        ("Worker", text(run["worker_id"])),
        ("Claims / recoveries", f"{run['claims']} / {run['recoveries']}"),
        ("Parent run", run_link(site, run["parent_run_id"])),
        ("Waiting for", text(run["wait_signal"] or run["wait_child"])),
        ("Progress", text(run["progress_state"])),
    ]
    if run["progress_info"] is not None:
        fields.append(("Progress info", json_block(run["progress_info"])))
    fields.append(("Params", json_block(run["params"])))
    if run["status"] == RunStatus.COMPLETED.value:
        fields.append(("Result", json_block(run["result"])))
    error = run["error"]
    if error is not None:
        fields.append(("Error", f"<b>{escape(error['type'])}</b>: {escape(error['message'])}"))
        if error["traceback"]:
            fields.append(("Traceback", pre(error["traceback"])))
    record = (
        '<table id="record">'
        + "".join(f"<tr><th>{escape(label)}</th><td>{value}</td></tr>" for label, value in fields)
        + "</table>"
    )
    journal = detail["journal"]
    entries = [
        (
            str(entry["position"]),
            text(entry["kind"]),
            text(entry["name"]),
            '<span class="s-completed">ok</span>' if entry["ok"] else status("failed"),
            str(entry["attempts"]),
            seconds(entry["duration_s"]),
            text(entry["recorded_at"]),
            _entry_value(entry),
        )
        for entry in journal
    ]
    headers = ("Pos", "Kind", "Name", "Outcome", "Attempts", "Took", "Recorded", "Value or error")
    children = [
        (
            run_link(site, c["run_id"]),
            text(c["workflow"]),
            status(c["status"]),
            text(c["created_at"]),
            seconds(c["duration_s"]),
        )
        for c in detail["children"]
    ]
    actions = [
        (
            text(_at(a.get("at"))),
            text(a.get("action")),
            text(a.get("by")),
            json_block(a.get("detail")),
        )
        for a in reversed(history)
    ]
    api = site.href("/api" + run_href(Site(), run["run_id"]))
    return (
        f'{record}<p><a href="{escape(api)}">JSON</a></p>'
        f"<h2>Journal ({len(journal)})</h2>"
        + table(headers, entries, "no journal entries yet", table_id="journal")
        + f"<h2>Children ({len(children)})</h2>"
        + table(("Run", "Workflow", "Status", "Created", "Duration"), children, "no child runs")
        + "<h2>Signals received</h2>"
        + table(
            ("Pos", "Name", "Payload"),
            [
                (str(s["position"]), text(s["name"]), json_block(s["value"]))
                for s in detail["signals"]
            ],
            "no signals received"
            + (f" (waiting for {run['wait_signal']!r})" if run["wait_signal"] else ""),
        )
        + "<h2>Operator actions</h2>"
        + table(("At", "Action", "By", "Detail"), actions, "none", table_id="history")
    )


def _at(ts: Any) -> str | None:
    return iso(ts, precise=True) if isinstance(ts, (int, float)) else None


def _entry_value(entry: Mapping[str, Any]) -> str:
    error = entry["error"]
    if error is None:
        return json_block(entry["value"])
    shown = f"{error['type']}: {error['message']}"
    if error.get("traceback"):
        return (
            pre(shown) + f"<details><summary>traceback</summary>{pre(error['traceback'])}</details>"
        )
    return pre(shown)
